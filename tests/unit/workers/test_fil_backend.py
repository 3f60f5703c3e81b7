"""The FIL backend in process: FIL's output rules and the load-time checks of a config
against its model (small models trained here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shoal.configs.fil_params import FilParams
from shoal.configs.model_config import ConfigError, parse_config_text
from shoal.configs.spec_reader import read_spec
from shoal.workers.fil_backend import FilBackend, fil_output
from tools import treegen

SCORES = np.array([[0.2], [0.6], [0.9]], dtype=np.float32)
EXTRA = 'output [ {{ name: "{}" data_type: TYPE_FP32 dims: [ {} ] }} ]'
MULTI = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], dtype=np.float32)


def params(**kw: Any) -> FilParams:
    return FilParams(model_type="xgboost_json", is_classifier=kw.pop("is_classifier", True), **kw)


def test_a_binary_classifier_class_is_its_score_above_the_threshold() -> None:
    np.testing.assert_array_equal(fil_output(SCORES, params(threshold=0.5), 1), [0, 1, 1])
    np.testing.assert_array_equal(fil_output(SCORES, params(threshold=0.6), 1), [0, 0, 1])


def test_a_multiclass_class_is_the_best_score() -> None:
    np.testing.assert_array_equal(fil_output(MULTI, params(), 1), [1, 0])


def test_scores_of_a_binary_classifier_one_or_both_classes() -> None:
    proba = params(predict_proba=True)
    np.testing.assert_array_equal(fil_output(SCORES, proba, 1), SCORES)
    pair = fil_output(SCORES, proba, 2)
    np.testing.assert_allclose(pair, [[0.8, 0.2], [0.4, 0.6], [0.1, 0.9]], rtol=1e-6)


def test_a_regressor_answers_its_prediction_whatever_the_flags() -> None:
    out = fil_output(SCORES, params(is_classifier=False, predict_proba=True), 1)
    np.testing.assert_array_equal(out, SCORES)


def _load(tmp_path: Path, model: Any, model_type: str, dims: list[int], extra: str = "",
          features: int = 6, **kw: str) -> FilBackend:  # fmt: skip
    text = treegen.fil_config("m", features, dims, {"model_type": model_type, **kw}, extra=extra)
    path = treegen.write_fil_model(tmp_path, "m", model, model_type, text)
    backend = FilBackend()
    backend.load(path.parent, read_spec(parse_config_text(text, "m")), 1, False)
    return backend


def test_outputs_take_fils_squeezed_shape(tmp_path: Path) -> None:
    booster = treegen.train_xgboost("multiclass", trees=2)
    x = treegen.sample(5, 6)
    b = _load(tmp_path, booster, "xgboost_ubj", [1, 3], is_classifier="true", threshold="0.5",
              predict_proba="true")  # fmt: skip
    (out,) = b.execute({"input__0": x}, ["output__0"])
    assert out.shape == (5, 3)
    np.testing.assert_allclose(out, booster.inplace_predict(x), rtol=1e-6)


def test_a_read_only_view_is_read_in_place(tmp_path: Path) -> None:
    booster = treegen.train_xgboost("regression", trees=2)
    b = _load(tmp_path, booster, "xgboost_json", [1], is_classifier="false")
    x = treegen.sample(4, 6)
    view = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(4, 6)
    assert not view.flags.writeable
    (out,) = b.execute({"input__0": view}, ["output__0"])
    np.testing.assert_allclose(out, booster.inplace_predict(x), rtol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"features": 5}, "input 'input__0' has dims [5], but the model takes 6 features"),
        ({"dims": [3]}, "output 'output__0' has dims [3], but the model gives 1 value per sample"),
        ({"extra": EXTRA.format("extra", 1)}, "unexpected output 'extra'"),
        (
            {"extra": EXTRA.format("treeshap_output", 6)},
            "output 'treeshap_output' has dims [6], but the model gives 7 SHAP values",
        ),
    ],
)
def test_a_config_that_does_not_fit_the_model_fails_the_load(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    booster = treegen.train_xgboost("binary", trees=2)
    kw: dict[str, Any] = {"dims": [1], "features": 6, "extra": "", **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        _load(tmp_path, booster, "xgboost_json", kw["dims"], kw["extra"], kw["features"],
              is_classifier="true", threshold="0.5")  # fmt: skip


def test_shap_values_need_a_library_that_has_them(tmp_path: Path) -> None:
    import treelite

    model = treelite.frontend.from_xgboost(treegen.train_xgboost("binary", trees=2))
    shap = 'output [ { name: "treeshap_output" data_type: TYPE_FP32 dims: [ 7 ] } ]'
    with pytest.raises(ConfigError, match="'treeshap_output' needs xgboost or lightgbm"):
        _load(tmp_path, model, "treelite_checkpoint", [1], shap, is_classifier="false")


def test_a_gpu_instance_is_refused(tmp_path: Path) -> None:
    text = treegen.fil_config("m", 6, [1], {"is_classifier": "false"})
    with pytest.raises(RuntimeError, match="on the CPU only"):
        FilBackend().load(tmp_path, read_spec(parse_config_text(text, "m")), 1, True)
