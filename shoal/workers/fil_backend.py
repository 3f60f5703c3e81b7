"""Tree models (``backend: "fil"``): XGBoost, LightGBM and Treelite models served as Triton's
FIL backend serves them, on the CPU.

The config, as Triton's FIL backend wants it: one input ``input__0`` (TYPE_FP32, dims
[features]), the output ``output__0`` (TYPE_FP32) and optionally ``treeshap_output``
(TYPE_FP32, dims [features + 1], or [classes, features + 1] for more than two classes),
and the parameters shoal.configs.fil_params reads. FIL has no auto-complete: the config
lists them. shoal checks them against the model at load (Triton does not: a wrong
feature count or output size there gives wrong answers), naming what the model has.

``output__0`` per sample, as FIL computes it from the model's prediction (one score per
class, see shoal.workers.fil_forests):

- a regressor (``is_classifier`` false): the prediction;
- a classifier, ``predict_proba`` false: the class, as a float: the best-scoring class,
  or for a binary classifier 1 where its score is above ``threshold``, else 0;
- a classifier, ``predict_proba`` true: each class's score; a binary classifier has one
  score (its dims [1]) or, with dims [2], the pair [1 - score, score].

Outputs have FIL's shape: the batch dimension, then the config dims without their 1s
(FIL's ``squeeze_output``): dims [1] answer [batch], dims [3] answer [batch, 3].

Inputs are numpy views of shared memory, read in place by XGBoost and LightGBM. One
instance runs on the CPU only (a KIND_GPU instance fails its load), with the intra-op
thread count the worker gives it unless ``cpu_nthread`` sets one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from shoal.configs.fil_params import INPUT, MODEL_FILES, OUTPUT, SHAP_OUTPUT, FilParams, fil_params
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError
from shoal.workers import fil_forests
from shoal.workers.fil_forests import Forest, ForestError

log = logging.getLogger("shoal.worker")


class FilBackend:
    def __init__(self) -> None:
        self._forest: Forest | None = None
        self._params: FilParams | None = None
        self._shapes: dict[str, list[int]] = {}  # output -> its per-sample shape (squeezed)

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        name = config.name
        if gpu:
            raise RuntimeError(
                "KIND_GPU instance, but shoal's FIL backend runs tree models on the CPU "
                "only (use KIND_CPU or KIND_AUTO)"
            )
        params = fil_params(config)
        for note in params.notes:
            log.warning("%s", note)
        path = model_file / MODEL_FILES[params.model_type] if model_file.is_dir() else model_file
        nthread = params.cpu_nthread if params.cpu_nthread > 0 else threads
        try:
            forest = fil_forests.load(
                params.model_type, path, nthread, params.xgboost_allow_unknown_field
            )
        except ForestError as exc:
            raise ConfigError(name, f"unable to load model '{name}': {exc}") from None
        self._shapes = _check_config(config, forest, params)
        log.info(
            "model '%s': %s model, %d features, %d class score(s), read by %s",
            name, params.model_type, forest.num_features, forest.num_classes, forest.library,
        )  # fmt: skip
        self._forest, self._params = forest, params

    def io_spec(self) -> None:
        """None: Triton's FIL backend has no auto-complete; the config lists the tensors."""
        return None

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,  # the libraries allocate
    ) -> list[np.ndarray]:
        assert self._forest is not None and self._params is not None
        x = inputs[INPUT]
        x = x.reshape(len(x), -1) if x.ndim != 2 else x
        result = []
        for out in outputs:
            if out == OUTPUT:
                scores = self._forest.predict(x)
                value = fil_output(scores, self._params, math.prod(self._shapes[out]))
            else:
                shap = self._forest.contributions(x)  # (load checked it has them)
                assert shap is not None
                value = shap
            result.append(value.reshape(len(x), *self._shapes[out]))
        return result

    def unload(self) -> None:
        self._forest = None


def fil_output(scores: np.ndarray, params: FilParams, width: int) -> np.ndarray:
    """``output__0`` from the model's (n, classes) scores, as FIL computes it; ``width``
    is the output's size per sample (2 asks a binary classifier for both classes)."""
    classes = scores.shape[1]
    if not params.is_classifier:
        return scores
    if not params.predict_proba:
        if classes > 1:
            return scores.argmax(axis=1).astype(np.float32)
        return (scores[:, 0] > params.threshold).astype(np.float32)
    if classes == 1 and width == 2:
        return np.stack([1 - scores[:, 0], scores[:, 0]], axis=1)
    return scores


def _check_config(config: ModelSpec, forest: Forest, params: FilParams) -> dict[str, list[int]]:
    """The outputs' per-sample shapes (FIL's: config dims without their 1s); raises
    ConfigError where the config does not fit the model."""
    name = config.name
    batch = 1 if config.max_batch_size == 0 else 0  # leading config dims that are the batch

    def fail(why: str) -> ConfigError:
        return ConfigError(name, f"unable to load model '{name}', {why}")

    if [i.name for i in config.inputs] != [INPUT]:
        got = ", ".join(i.name for i in config.inputs) or "none"
        raise fail(f"the FIL backend takes one input named '{INPUT}' (the config has {got})")
    given = config.inputs[0]
    if given.datatype != "FP32":
        raise fail(f"input '{INPUT}' must be TYPE_FP32 (the FIL backend computes in FP32)")
    dims = list(given.dims)[batch:]
    if len(dims) != 1 or dims[0] not in (-1, forest.num_features):
        raise fail(
            f"input '{INPUT}' has dims {dims}, but the model takes {forest.num_features} "
            f"features: dims [ {forest.num_features} ]"
        )
    shapes: dict[str, list[int]] = {}
    classes, features = forest.num_classes, forest.num_features
    for out in config.outputs:
        if out.name not in (OUTPUT, SHAP_OUTPUT):
            raise fail(
                f"unexpected output '{out.name}': the FIL backend has '{OUTPUT}' and "
                f"'{SHAP_OUTPUT}'"
            )
        if out.datatype != "FP32":
            raise fail(f"output '{out.name}' must be TYPE_FP32")
        out_dims = list(out.dims)[batch:]
        size = math.prod(out_dims)
        if out.name == OUTPUT:
            allowed = _output_sizes(params, classes)
            what = "score" if params.is_classifier and params.predict_proba else "value"
        else:
            allowed = [features + 1] if classes == 1 else [classes * (features + 1)]
            what = "SHAP value"
            if forest.contributions(np.zeros((1, features), np.float32)) is None:
                raise fail(f"output '{SHAP_OUTPUT}' needs xgboost or lightgbm to read the model")
        if size not in allowed:
            plural = "s" if max(allowed) > 1 else ""
            raise fail(
                f"output '{out.name}' has dims {out_dims}, but the model gives "
                f"{' or '.join(map(str, allowed))} {what}{plural} per sample"
            )
        shapes[out.name] = [d for d in out_dims if d != 1]
    if OUTPUT not in shapes:
        raise fail(f"the FIL backend needs the output '{OUTPUT}' in the config")
    return shapes


def _output_sizes(params: FilParams, classes: int) -> list[int]:
    if params.is_classifier and not params.predict_proba:
        return [1]
    if params.is_classifier and classes == 1:
        return [1, 2]
    return [classes]
