"""Tree models (backend "fil") through the real server and tritonclient: each model_type
Triton's FIL backend reads, output_class / is_classifier, predict_proba and threshold as it
applies them, SHAP values, dynamic batching, client shared memory, and the load errors of
bad models. Every answer is checked against the training library's own prediction of the
same model (XGBoost, LightGBM), trained here at test time."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lightgbm
import numpy as np
import pytest
import treelite
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
import xgboost

from tests.serverctl import ShoalServer, settled_server
from tools import treegen
from tools.treegen import fil_config, write_fil_model

# A server of many models of a heavy framework (a worker per model, each importing it)
# starts slowly on a busy 2-core host: more than the usual 120 s for the module's first test.
pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).resolve().parents[1] / "data" / "fil"
F = 6  # features of the trained models
SHAP = 'output [ {{ name: "treeshap_output" data_type: TYPE_FP32 dims: [ {dims} ] }} ]'
CLASSIFIER = {"output_class": "true", "threshold": "0.5"}
X = treegen.sample(16, F, seed=11)


def _high_threshold(m: dict[str, Any]) -> float:
    """A threshold between the binary model's second and third highest scores on X."""
    top = np.unique(m["xgb_binary"].inplace_predict(X))[-3:]
    return float((top[0] + top[1]) / 2)


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {
        "xgb_binary": treegen.train_xgboost("binary"),
        "xgb_multi": treegen.train_xgboost("multiclass"),
        "xgb_softmax": treegen.train_xgboost("softmax"),
        "xgb_reg": treegen.train_xgboost("regression"),
        "lgb_binary": treegen.train_lightgbm("binary"),
        "lgb_multi": treegen.train_lightgbm("multiclass"),
        "lgb_reg": treegen.train_lightgbm("regression"),
    }


# name -> (trained model, model_type, output dims, parameters besides model_type, extra)
Spec = tuple[str, str, list[int], dict[str, str], str]
PROBA = {"predict_proba": "true", **CLASSIFIER}
REGRESSOR = {"is_classifier": "false"}
# Six requests make the preferred size: one execution once all six are queued.
BATCHING = "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 10000000 }"
SPECS: dict[str, Spec] = {
    "xgb_class": ("xgb_binary", "xgboost_json", [1], CLASSIFIER, ""),
    "xgb_threshold": ("xgb_binary", "xgboost_ubj", [1], {"is_classifier": "true"}, ""),
    "xgb_proba_pair": ("xgb_binary", "xgboost_json", [2], PROBA, SHAP.format(dims=F + 1)),
    "xgb_multi_proba": ("xgb_multi", "xgboost_ubj", [3], PROBA, ""),
    "xgb_softmax_class": ("xgb_softmax", "xgboost_json", [1], CLASSIFIER, ""),
    "xgb_reg": ("xgb_reg", "xgboost_json", [1], {"output_class": "false"}, ""),
    "lgb_proba": ("lgb_binary", "lightgbm", [1], PROBA, ""),
    "lgb_multi_class": ("lgb_multi", "lightgbm", [1], CLASSIFIER, SHAP.format(dims=f"3, {F + 1}")),
    "lgb_reg": ("lgb_reg", "lightgbm", [1], REGRESSOR, ""),
    "tl_checkpoint": ("xgb_multi", "treelite_checkpoint", [3], PROBA, ""),
    "batched": ("xgb_reg", "xgboost_json", [1], REGRESSOR, BATCHING),
    # Bad models: each fails its load with the reason.
    "no_classifier_flag": ("xgb_binary", "xgboost_json", [1], {}, ""),
    "no_threshold": ("xgb_binary", "xgboost_json", [1], {"is_classifier": "true"}, ""),
    "wrong_output": ("xgb_multi", "xgboost_json", [2], PROBA, ""),
}


def _repo(repo: Path, m: dict[str, Any]) -> None:
    for name, (model, model_type, dims, params, extra) in SPECS.items():
        params = {"model_type": model_type, **params}
        if name == "xgb_threshold":
            params["threshold"] = repr(_high_threshold(m))
        trained = m[model]
        if model_type == "treelite_checkpoint":
            trained = treelite.frontend.from_xgboost(trained)
        text = fil_config(name, F, dims, params, extra=extra)
        write_fil_model(repo, name, trained, model_type, text)
    legacy = (DATA / "xgboost_legacy.model").read_bytes()
    text = fil_config("xgb_legacy", 4, [1], {"model_type": "xgboost", **PROBA})
    write_fil_model(repo, "xgb_legacy", legacy, "xgboost", text)
    bad_type = fil_config("bad_model_type", F, [1], {"model_type": "xgboost_bin", **CLASSIFIER})
    write_fil_model(repo, "bad_model_type", m["xgb_binary"], "xgboost_json", bad_type)
    more_features = fil_config(
        "wrong_features", F + 2, [1], {"model_type": "xgboost_json", **CLASSIFIER}
    )
    write_fil_model(repo, "wrong_features", m["xgb_binary"], "xgboost_json", more_features)
    # the config names UBJSON, the folder holds JSON
    no_file = fil_config("no_file", F, [1], {"model_type": "xgboost_ubj", **CLASSIFIER})
    write_fil_model(repo, "no_file", m["xgb_binary"], "xgboost_json", no_file)
    corrupt = fil_config("corrupt", F, [1], {"model_type": "lightgbm", **CLASSIFIER})
    write_fil_model(repo, "corrupt", b"not a tree model", "lightgbm", corrupt)


GOOD = (
    "xgb_class", "xgb_threshold", "xgb_proba_pair", "xgb_multi_proba", "xgb_softmax_class",
    "xgb_reg", "lgb_proba", "lgb_multi_class", "lgb_reg", "tl_checkpoint", "xgb_legacy", "batched",
)  # fmt: skip
BAD = (
    "no_classifier_flag", "no_threshold", "bad_model_type", "wrong_features", "wrong_output",
    "no_file", "corrupt",
)  # fmt: skip


@pytest.fixture(scope="module")
def fil_server(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Any]
) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("fil-repo")
    _repo(repo, models)
    with settled_server(repo, GOOD + BAD, "--allow-client-shm=true") as srv:
        yield srv


def _infer(srv: ShoalServer, model: str, x: np.ndarray, outputs: tuple[str, ...] = ("output__0",),
           protocol: str = "http") -> dict[str, np.ndarray]:  # fmt: skip
    url, module = srv.client(protocol)
    client = module.InferenceServerClient(url)
    inp = module.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], outputs=[module.InferRequestedOutput(o) for o in outputs])
    client.close()
    return {o: result.as_numpy(o) for o in outputs}


def test_every_good_model_loads(fil_server: ShoalServer) -> None:
    states = {m: fil_server.model_version(m) for m in GOOD}
    assert all(v["state"] == "READY" for v in states.values()), states


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_binary_classifier_answers_the_class_at_its_threshold(
    fil_server: ShoalServer, models: dict[str, Any], protocol: str
) -> None:
    p = models["xgb_binary"].inplace_predict(X)
    out = _infer(fil_server, "xgb_class", X, protocol=protocol)["output__0"]
    assert out.shape == (16,) and out.dtype == np.float32  # dims [1]: squeezed, as FIL's
    np.testing.assert_array_equal(out, (p > 0.5).astype(np.float32))
    strict = _infer(fil_server, "xgb_threshold", X, protocol=protocol)["output__0"]
    np.testing.assert_array_equal(strict, (p > _high_threshold(models)).astype(np.float32))
    assert 0 < strict.sum() < out.sum()  # the threshold took effect


def test_binary_scores_as_a_pair_and_shap_values(
    fil_server: ShoalServer, models: dict[str, Any]
) -> None:
    booster = models["xgb_binary"]
    p = booster.inplace_predict(X)
    out = _infer(fil_server, "xgb_proba_pair", X, ("output__0", "treeshap_output"))
    np.testing.assert_allclose(out["output__0"], np.stack([1 - p, p], axis=1), rtol=1e-6)
    contribs = booster.predict(xgboost.DMatrix(X), pred_contribs=True)
    assert out["treeshap_output"].shape == (16, F + 1)
    np.testing.assert_allclose(out["treeshap_output"], contribs, rtol=1e-5, atol=1e-6)


def test_multiclass_scores_and_classes(fil_server: ShoalServer, models: dict[str, Any]) -> None:
    proba = models["xgb_multi"].inplace_predict(X)
    got = _infer(fil_server, "xgb_multi_proba", X, protocol="grpc")["output__0"]
    assert got.shape == (16, 3)
    np.testing.assert_allclose(got, proba, rtol=1e-6)
    # multi:softmax: XGBoost's own prediction is the class; FIL's is the best class too
    softmax = models["xgb_softmax"]
    classes = _infer(fil_server, "xgb_softmax_class", X)["output__0"]
    np.testing.assert_array_equal(classes, softmax.inplace_predict(X))


def test_regressors_answer_the_prediction(fil_server: ShoalServer, models: dict[str, Any]) -> None:
    np.testing.assert_allclose(
        _infer(fil_server, "xgb_reg", X)["output__0"], models["xgb_reg"].inplace_predict(X),
        rtol=1e-6,
    )  # fmt: skip
    np.testing.assert_allclose(
        _infer(fil_server, "lgb_reg", X)["output__0"], models["lgb_reg"].predict(X), rtol=1e-5
    )


def test_lightgbm_classifiers(fil_server: ShoalServer, models: dict[str, Any]) -> None:
    binary: lightgbm.Booster = models["lgb_binary"]
    got = _infer(fil_server, "lgb_proba", X)["output__0"]
    assert got.shape == (16,)  # one score per sample: dims [1]
    np.testing.assert_allclose(got, binary.predict(X), rtol=1e-5)
    multi: lightgbm.Booster = models["lgb_multi"]
    out = _infer(fil_server, "lgb_multi_class", X, ("output__0", "treeshap_output"))
    np.testing.assert_array_equal(out["output__0"], multi.predict(X).argmax(axis=1))
    shap_values = multi.predict(X, pred_contrib=True).reshape(16, 3, F + 1)
    np.testing.assert_allclose(out["treeshap_output"], shap_values, rtol=1e-4, atol=1e-6)


def test_treelite_checkpoint_and_legacy_xgboost_binary(
    fil_server: ShoalServer, models: dict[str, Any]
) -> None:
    got = _infer(fil_server, "tl_checkpoint", X)["output__0"]
    np.testing.assert_allclose(got, models["xgb_multi"].inplace_predict(X), rtol=1e-5)
    x4 = np.ascontiguousarray(X[:, :4])
    twin = xgboost.Booster(model_file=str(DATA / "xgboost_legacy_twin.json"))
    legacy = _infer(fil_server, "xgb_legacy", x4)["output__0"]
    np.testing.assert_allclose(legacy, twin.inplace_predict(x4), rtol=1e-5)


def test_concurrent_requests_are_batched_and_answered_each_their_own(
    fil_server: ShoalServer, models: dict[str, Any]
) -> None:
    def one(i: int) -> tuple[int, np.ndarray]:
        return i, _infer(fil_server, "batched", X[i : i + 1])["output__0"]

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    want = models["xgb_reg"].inplace_predict(X[:6])
    for i, out in results:
        np.testing.assert_allclose(out, want[i : i + 1], rtol=1e-6)
    url = f"http://{fil_server.url}/v2/models/batched/stats"
    with urllib.request.urlopen(url, timeout=5) as r:
        stats = json.loads(r.read())["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 1)


def test_inputs_from_client_shared_memory(fil_server: ShoalServer, models: dict[str, Any]) -> None:
    """The model reads the client's region in place (a read-only view of it)."""
    client = httpclient.InferenceServerClient(fil_server.url)
    key, size = f"/fil_in_{fil_server.http_port}", X.nbytes
    handle = shm.create_shared_memory_region("fil_in", key, size)
    try:
        shm.set_shared_memory_region(handle, [X])
        client.register_system_shared_memory("fil_in", key, size)
        inp = httpclient.InferInput("input__0", list(X.shape), "FP32")
        inp.set_shared_memory("fil_in", size)
        out = client.infer("xgb_multi_proba", [inp]).as_numpy("output__0")
        np.testing.assert_allclose(out, models["xgb_multi"].inplace_predict(X), rtol=1e-6)
    finally:
        client.unregister_system_shared_memory("fil_in")
        shm.destroy_shared_memory_region(handle)
        client.close()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("no_classifier_flag", "Required parameter is_classifier not found in config"),
        ("no_threshold", "Required parameter threshold not found in config"),
        ("bad_model_type", "xgboost_bin not recognized as a valid serialization format."),
        ("wrong_features", "input 'input__0' has dims [8], but the model takes 6 features"),
        ("wrong_output", "output 'output__0' has dims [2], but the model gives 3 scores"),
        ("no_file", "Could not open model file"),
        ("corrupt", "unable to load model 'corrupt'"),
    ],
)
def test_a_bad_model_fails_its_load_with_the_reason(
    fil_server: ShoalServer, model: str, reason: str
) -> None:
    version = fil_server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert reason in version["reason"], version["reason"]


def test_metadata_and_config(fil_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{fil_server.grpc_port}")
    meta = client.get_model_metadata("xgb_class", as_json=True)
    assert meta["platform"] == "fil"
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": ["-1", str(F)]}]
    config = client.get_model_config("xgb_class", as_json=True)["config"]
    assert config["backend"] == "fil"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
