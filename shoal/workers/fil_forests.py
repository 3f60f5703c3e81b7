"""Tree models loaded by the library made for each file format, behind one small interface.

What Triton's FIL backend computes on the CPU is Treelite's GTIL prediction: per sample,
the model's own output transform applied (a sigmoid for a binary classifier, a softmax
for a multi-class one, nothing for a regressor), one value per class. Each `Forest` here
gives exactly that, ``predict(x) -> (n, num_classes)`` float32, from its own library:

- XGBoost JSON and UBJSON: XGBoost's ``Booster.inplace_predict``, which reads the numpy
  array in place (no DMatrix, no copy). ``multi:softmax`` (whose XGBoost prediction is
  the class) is read as margins and softmaxed, as Treelite does;
- LightGBM's text format: LightGBM's ``Booster.predict``, which reads a C-contiguous
  float32 array in place;
- XGBoost's legacy binary format (which XGBoost 3.1 no longer reads) and Treelite
  checkpoints: Treelite's GTIL. Treelite also stands in for XGBoost or LightGBM when
  that library is not installed.

``contributions(x)``: SHAP values in margin space, (n, [classes,] features + 1), as FIL's
``treeshap_output``; None where the library has none (Treelite).

A Forest is used by one thread (the worker's). The libraries are imported here only.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# OpenMP threads must sleep when idle (the cores are shared with other processes), read
# by libgomp when XGBoost or LightGBM loads it: set before either is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class Forest(Protocol):
    num_features: int
    num_classes: int  # 1 for a binary classifier and for a regressor
    library: str

    def predict(self, x: np.ndarray) -> np.ndarray: ...

    def contributions(self, x: np.ndarray) -> np.ndarray | None: ...


class ForestError(Exception):
    """The model file cannot be read, or holds a model FIL cannot serve."""


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def load(model_type: str, path: Path, threads: int, allow_unknown_field: bool) -> Forest:
    """The model in ``path`` (``model_type`` as fil_params.MODEL_FILES), predicting with
    ``threads`` threads (<= 0: the library's default). Raises ForestError."""
    if not path.is_file():
        raise ForestError(f"Could not open model file {path}")
    try:
        if model_type in ("xgboost_json", "xgboost_ubj") and _has("xgboost"):
            forest: Forest = XGBoostForest(path, threads)
        elif model_type == "lightgbm" and _has("lightgbm"):
            forest = LightGBMForest(path, threads)
        elif _has("treelite"):
            forest = TreeliteForest(model_type, path, threads, allow_unknown_field)
        else:
            library = {"lightgbm": "lightgbm or treelite"}.get(model_type, "treelite")
            if model_type.startswith("xgboost_"):
                library = "xgboost or treelite"
            raise ForestError(
                f"model_type '{model_type}' needs the {library} package, which is not "
                "installed (pip install 'shoal[fil]')"
            )
    except ForestError:
        raise
    except Exception as exc:  # the library's own error: a bad or foreign file
        why = str(exc).split("\nStack trace:")[0].strip()  # (XGBoost appends its C++ stack)
        raise ForestError(f"{type(exc).__name__}: {why}") from None
    return forest


class XGBoostForest:
    library = "xgboost"

    def __init__(self, path: Path, threads: int) -> None:
        import xgboost

        self._xgb = xgboost
        self._booster = xgboost.Booster(model_file=str(path))
        learner = json.loads(self._booster.save_config())["learner"]
        params = learner["learner_model_param"]
        if int(params.get("num_target", "1")) > 1:
            raise ForestError("Multi-target model not supported")
        self.num_features = self._booster.num_features()
        self.num_classes = max(int(params.get("num_class", "0")), 1)
        self._margins = learner["objective"]["name"] == "multi:softmax"
        self._booster.set_param({"nthread": max(threads, 0)})

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self._margins:
            m = self._booster.inplace_predict(x, predict_type="margin", validate_features=False)
            return _softmax(np.asarray(m, dtype=np.float32).reshape(len(x), -1))
        out = self._booster.inplace_predict(x, validate_features=False)
        return np.asarray(out, dtype=np.float32).reshape(len(x), -1)

    def contributions(self, x: np.ndarray) -> np.ndarray:
        dm = self._xgb.DMatrix(x, nthread=-1)
        return np.asarray(self._booster.predict(dm, pred_contribs=True), dtype=np.float32)


class LightGBMForest:
    library = "lightgbm"

    def __init__(self, path: Path, threads: int) -> None:
        import lightgbm

        self._booster = lightgbm.Booster(model_file=str(path))
        self.num_features = self._booster.num_feature()
        self.num_classes = self._booster.num_model_per_iteration()
        self._kw: dict[str, Any] = {"num_threads": threads} if threads > 0 else {}

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self._booster.predict(x, **self._kw)
        return np.asarray(out, dtype=np.float32).reshape(len(x), -1)

    def contributions(self, x: np.ndarray) -> np.ndarray:
        out = np.asarray(self._booster.predict(x, pred_contrib=True, **self._kw), np.float32)
        if self.num_classes > 1:
            return out.reshape(len(x), self.num_classes, self.num_features + 1)
        return out


class TreeliteForest:
    library = "treelite"

    def __init__(self, model_type: str, path: Path, threads: int, allow_unknown: bool) -> None:
        import treelite

        self._gtil = treelite.gtil
        frontend = treelite.frontend
        if model_type == "xgboost":
            model = frontend.load_xgboost_model_legacy_binary(str(path))
        elif model_type in ("xgboost_json", "xgboost_ubj"):
            choice = "json" if model_type == "xgboost_json" else "ubjson"
            model = frontend.load_xgboost_model(
                str(path), format_choice=choice, allow_unknown_field=allow_unknown
            )
        elif model_type == "lightgbm":
            model = frontend.load_lightgbm_model(str(path))
        else:
            model = treelite.Model.deserialize(str(path))
        header = model.get_header_accessor()
        if int(header.get_field("num_target")[0]) != 1:
            raise ForestError("Multi-target model not supported")
        self._model = model
        self.num_features = int(header.get_field("num_feature")[0])
        self.num_classes = int(header.get_field("num_class")[0])
        self._threads = threads if threads > 0 else -1

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self._gtil.predict(self._model, x, nthread=self._threads)
        return np.asarray(out, dtype=np.float32).reshape(len(x), -1)

    def contributions(self, x: np.ndarray) -> None:
        return None


def _softmax(m: np.ndarray) -> np.ndarray:
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
