"""The parameters of a tree model (``backend: "fil"``), read as Triton's FIL backend reads
them (its RapidsSharedState::load, through RAPIDS-Triton's get_config_param).

Every value is a ``string_value`` read with a C++ ``istream``: a string is its first
whitespace-separated word, a bool ``true`` or ``false`` (``std::boolalpha``: nothing
else), a number the longest prefix that reads as one ("0.3abc" is 0.3). A value that does
not read falls back to the key's default, silently, where the key has one; where it has
none the load fails with "Bad input for parameter <key>", and a missing one with
"Required parameter <key> not found in config". Keys in Triton's order:

- ``predict_proba`` (false): a classifier's score for each class instead of the class;
- ``model_type`` (``xgboost``): the file format, one of `MODEL_FILES`; any other fails
  with "<value> not recognized as a valid serialization format.";
- ``xgboost_allow_unknown_field`` (false): for Treelite's XGBoost JSON loader;
- ``is_classifier``, required; ``output_class``, its name before Triton 25.09, is read
  first where it is exactly ``true`` or ``false``;
- ``threshold``, required for a classifier: a binary classifier's score above it is
  class 1 (0.5 for a regressor, where it is never used);
- ``cpu_nthread`` (-1, every thread): threads per prediction.

The GPU-only tuning keys (``layout``, ``chunk_size``, ``transfer_threshold``,
``use_experimental_optimizations`` and the older ``algo``, ``threads_per_tree``,
``storage_type``, ``blocks_per_sm``) change no prediction and do nothing on shoal's CPU
backend; setting one gives a note for the log.

Pure: no xgboost, lightgbm or treelite import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeVar

from shoal.configs.backend_params import ParamSource, parameters
from shoal.configs.schema import ConfigError

#: model_type -> the file Triton's FIL backend reads in the version folder.
MODEL_FILES: Final[dict[str, str]] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
INPUT: Final = "input__0"
OUTPUT: Final = "output__0"
SHAP_OUTPUT: Final = "treeshap_output"
_GPU_ONLY: Final = (
    "layout", "chunk_size", "transfer_threshold", "use_experimental_optimizations",
    "algo", "threads_per_tree", "storage_type", "blocks_per_sm",
)  # fmt: skip
_SPACE: Final = " \t\n\v\f\r"
_FLOAT: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INT: Final = re.compile(r"[+-]?[0-9]+")

T = TypeVar("T", bool, int, float, str)


@dataclass(frozen=True, slots=True)
class FilParams:
    model_type: str
    is_classifier: bool
    predict_proba: bool = False
    threshold: float = 0.5
    xgboost_allow_unknown_field: bool = False
    cpu_nthread: int = -1
    notes: tuple[str, ...] = ()  # for the log: keys that do nothing here


def _read(kind: type[T], text: str) -> T | None:
    """``text`` as ``istream >> value`` reads a ``kind``; None where the read fails."""
    text = text.lstrip(_SPACE)
    if kind is str:
        words = text.split(maxsplit=1)
        return words[0] if words else None  # type: ignore[return-value]
    if kind is bool:
        for spelled, value in (("true", True), ("false", False)):
            if text.startswith(spelled):
                return value  # type: ignore[return-value]
        return None
    match = (_INT if kind is int else _FLOAT).match(text)
    if match is None:
        return None
    return kind(float(match.group()) if kind is float else int(match.group()))  # type: ignore[return-value]


def _param(config: ParamSource, key: str, kind: type[T], default: T | None = None) -> T:
    if key not in parameters(config):
        if default is None:
            raise ConfigError(config.name, f"Required parameter {key} not found in config")
        return default
    value = _read(kind, parameters(config)[key])
    if value is None:
        if default is None:
            raise ConfigError(config.name, f"Bad input for parameter {key}")
        return default
    return value


def fil_params(config: ParamSource) -> FilParams:
    """The FIL parameters of ``config``; raises ConfigError with Triton's message for the
    first bad or missing one, in Triton's order."""
    predict_proba = _param(config, "predict_proba", bool, False)
    model_type = _param(config, "model_type", str, "xgboost")
    if model_type not in MODEL_FILES:
        raise ConfigError(
            config.name, f"{model_type} not recognized as a valid serialization format."
        )
    allow_unknown = _param(config, "xgboost_allow_unknown_field", bool, False)
    legacy = parameters(config).get("output_class", "")
    if legacy in ("true", "false"):
        is_classifier = legacy == "true"
    else:
        is_classifier = _param(config, "is_classifier", bool)
    threshold = _param(config, "threshold", float) if is_classifier else 0.5
    nthread = _param(config, "cpu_nthread", int, -1)
    notes = tuple(
        f"model '{config.name}': parameter {key} tunes FIL on a GPU; shoal runs tree models "
        "on the CPU, where it does nothing"
        for key in _GPU_ONLY
        if key in parameters(config)
    )
    return FilParams(
        model_type, is_classifier, predict_proba, threshold, allow_unknown, nthread, notes
    )
