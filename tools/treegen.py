"""Tree models for tests and benchmarks (needs xgboost and lightgbm; treelite for
checkpoints; the server imports this never).

``train_xgboost(task, ...)`` and ``train_lightgbm(task, ...)`` fit a small model on
deterministic random data; ``task`` is ``binary``, ``multiclass`` (3 classes; XGBoost's
``multi:softprob``), ``softmax`` (XGBoost's ``multi:softmax``, whose own prediction is the
class) or ``regression``. ``write_fil_model`` writes one into a repository as Triton's FIL
backend wants it: ``<repo>/<name>/1/<the model_type's file>`` and a ``config.pbtxt``
from ``fil_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shoal.configs.fil_params import MODEL_FILES

CLASSES = 3


def sample(rows: int, features: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, features), dtype=np.float32)


def _labels(x: np.ndarray, task: str) -> np.ndarray:
    if task == "binary":
        return (x[:, 0] + x[:, 1] > 1).astype(np.int32)
    if task in ("multiclass", "softmax"):
        return np.minimum((x[:, 0] * CLASSES).astype(np.int32), CLASSES - 1)
    return (x[:, 0] * 2 + x[:, 1] ** 2).astype(np.float32)


def train_xgboost(
    task: str, features: int = 6, rows: int = 400, trees: int = 8, depth: int = 4
) -> Any:
    import xgboost

    objective = {
        "binary": "binary:logistic",
        "multiclass": "multi:softprob",
        "softmax": "multi:softmax",
        "regression": "reg:squarederror",
    }[task]
    params: dict[str, Any] = {"objective": objective, "max_depth": depth, "nthread": 1}
    if task in ("multiclass", "softmax"):
        params["num_class"] = CLASSES
    x = sample(rows, features)
    return xgboost.train(params, xgboost.DMatrix(x, label=_labels(x, task)), trees)


def train_lightgbm(task: str, features: int = 6, rows: int = 400, trees: int = 8) -> Any:
    import lightgbm

    params: dict[str, Any] = {
        "objective": {"binary": "binary", "multiclass": "multiclass"}.get(task, "regression"),
        "num_leaves": 8,
        "min_data_in_leaf": 5,
        "num_threads": 1,
        "verbose": -1,
    }
    if task == "multiclass":
        params["num_class"] = CLASSES
    x = sample(rows, features)
    return lightgbm.train(params, lightgbm.Dataset(x, label=_labels(x, task)), trees)


def fil_config(
    name: str,
    features: int,
    out_dims: list[int],
    params: dict[str, str],
    *,
    max_batch_size: int = 256,
    extra: str = "",
) -> str:
    """A FIL config: ``input__0`` [features], ``output__0`` ``out_dims``, the
    ``parameters``, ``extra`` text appended (another output, dynamic_batching...)."""
    entries = "\n".join(
        f'  {{ key: "{k}" value {{ string_value: "{v}" }} }},' for k, v in params.items()
    ).rstrip(",")
    return (
        f'name: "{name}"\nbackend: "fil"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]\n'
        f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: {out_dims} }} ]\n'
        f"instance_group [ {{ kind: KIND_CPU }} ]\n"
        f"parameters [\n{entries}\n]\n{extra}"
    )


def write_fil_model(repo: Path, name: str, model: Any, model_type: str, config_text: str) -> Path:
    """``model`` (an XGBoost or LightGBM Booster, a treelite Model, or the file's bytes)
    saved in ``model_type``'s format as ``<repo>/<name>/1/<its file>``; returns that
    file."""
    path = Path(repo) / name / "1" / MODEL_FILES[model_type]
    path.parent.mkdir(parents=True, exist_ok=True)
    (Path(repo) / name / "config.pbtxt").write_text(config_text)
    if isinstance(model, bytes):
        path.write_bytes(model)
    elif model_type == "treelite_checkpoint":
        model.serialize(str(path))
    else:
        model.save_model(str(path))  # (XGBoost picks JSON or UBJSON by the suffix)
    return path
