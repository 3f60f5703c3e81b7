"""OpenVINO models (backend "openvino") through the real server and tritonclient: IRs built
from ONNX graphs at test time, auto-complete from the IR, dynamic and fixed batches
(SKIP_OV_DYNAMIC_BATCHSIZE, ENABLE_BATCH_PADDING), RESHAPE_IO_LAYERS, data types the
config converts, OpenVINO's properties, client shared memory, and the load errors of bad
models with Triton's messages. Answers are compared with the graph computed in numpy
(OpenVINO's CPU plugin may compute in BF16 where the CPU has it, as under Triton: a 3%
tolerance)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, settled_server
from tools import ovgen

# A server of many models of a heavy framework (a worker per model, each importing it)
# starts slowly on a busy 2-core host: more than the usual 120 s for the module's first test.
pytestmark = pytest.mark.timeout(300)

TOL = {"rtol": 3e-2, "atol": 3e-2}
BATCHED = (
    'backend: "openvino"\nmax_batch_size: 4\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 8 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)
UNBATCHED = (
    'backend: "openvino"\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
)


def _params(**kv: str) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in kv.items()
    )


def _repo(repo: Path) -> None:
    dynamic, static = ovgen.mlp_onnx(), ovgen.mlp_onnx(batch=1)

    def ir(name: str, config: str | None, onnx: bytes = dynamic, layout: str | None = None) -> None:
        ovgen.write_ir(
            repo, name, onnx, None if config is None else f'name: "{name}"\n{config}', layout
        )

    ir("auto_plain", None)  # no config at all: found by its model.xml, completed from the IR
    ir("auto_batch", None, layout="NC")  # layouts with a batch dimension: it batches
    ir("skip_dynamic", BATCHED + _params(SKIP_OV_DYNAMIC_BATCHSIZE="YES"))
    ir("padded", BATCHED + _params(SKIP_OV_DYNAMIC_BATCHSIZE="yes", ENABLE_BATCH_PADDING="YES"))
    ir("reshaped", UNBATCHED + _params(RESHAPE_IO_LAYERS="yes"), static)
    ir("fp16_io", BATCHED.replace("TYPE_FP32", "TYPE_FP16"))
    tuned = _params(
        NUM_STREAMS="1", INFERENCE_NUM_THREADS="1", PERFORMANCE_HINT="throughput",
        COMPILATION_NUM_THREADS="1",
    )  # fmt: skip
    ir("tuned", BATCHED + tuned)
    from_onnx = repo / "from_onnx" / "1"
    from_onnx.mkdir(parents=True)
    (from_onnx / "model.onnx").write_bytes(dynamic)
    (repo / "from_onnx" / "config.pbtxt").write_text(
        f'name: "from_onnx"\n{BATCHED}default_model_filename: "model.onnx"\n'
    )
    # Bad models: each fails its load with Triton's message.
    ir("not_reshaped", UNBATCHED, static)
    ir("bad_streams", BATCHED + _params(NUM_STREAMS="many"))
    ir("wrong_input", BATCHED.replace('name: "X"', 'name: "Z"'))
    ir("fp64", BATCHED.replace("TYPE_FP32", "TYPE_FP64"))
    ir(
        "two_inputs",
        BATCHED.replace("input [ {", 'input [ { name: "X2" data_type: TYPE_FP32 dims: [ 8 ] }, {'),
    )
    missing = repo / "missing" / "1"
    missing.mkdir(parents=True)
    (missing / "model.bin").write_bytes(b"")
    (repo / "missing" / "config.pbtxt").write_text(f'name: "missing"\n{BATCHED}')


GOOD = (
    "auto_plain", "auto_batch", "skip_dynamic", "padded", "reshaped", "fp16_io", "tuned",
    "from_onnx",
)  # fmt: skip
BAD = ("not_reshaped", "bad_streams", "wrong_input", "fp64", "two_inputs", "missing")


@pytest.fixture(scope="module")
def ov_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("openvino-repo")
    _repo(repo)
    with settled_server(repo, GOOD + BAD, "--allow-client-shm=true") as srv:
        yield srv


def _infer(srv: ShoalServer, model: str, x: np.ndarray, protocol: str = "http") -> np.ndarray:
    url, module = srv.client(protocol)
    client = module.InferenceServerClient(url)
    datatype = "FP16" if x.dtype == np.float16 else "FP32"
    inp = module.InferInput("X", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    try:
        return np.asarray(client.infer(model, [inp]).as_numpy("Y"))
    finally:
        client.close()


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 8), dtype=np.float32)


def _config(srv: ShoalServer, model: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/{model}/config", timeout=5) as r:
        return dict(json.loads(r.read()))


def test_every_good_model_loads(ov_server: ShoalServer) -> None:
    states = {m: ov_server.model_version(m) for m in GOOD}
    assert all(v["state"] == "READY" for v in states.values()), states


def test_an_ir_without_layouts_completes_without_batching(ov_server: ShoalServer) -> None:
    config = _config(ov_server, "auto_plain")
    assert config["backend"] == "openvino"
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [-1, 8]  # type: ignore[index]
    assert config["output"][0]["dims"] == [-1, 4]  # type: ignore[index]
    x = _x(3)
    np.testing.assert_allclose(_infer(ov_server, "auto_plain", x), ovgen.reference(x), **TOL)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ir_with_batch_layouts_batches_any_size(ov_server: ShoalServer, protocol: str) -> None:
    config = _config(ov_server, "auto_batch")
    assert config["max_batch_size"] == 4  # the server's default-max-batch-size
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]  # type: ignore[index]
    assert config["input"][0]["dims"] == [8]  # type: ignore[index]
    for n in (1, 3, 4):  # Triton's fixed batch would take only 4
        x = _x(n, seed=n)
        got = _infer(ov_server, "auto_batch", x, protocol)
        assert got.shape == (n, 4)
        np.testing.assert_allclose(got, ovgen.reference(x), **TOL)


def test_concurrent_requests_each_get_their_own_answer(ov_server: ShoalServer) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: (i, _infer(ov_server, "auto_batch", _x(1, i))), range(8)))
    for i, got in results:
        np.testing.assert_allclose(got, ovgen.reference(_x(1, i)), **TOL)


def test_a_fixed_batch_takes_only_max_batch_size_unless_padded(ov_server: ShoalServer) -> None:
    x4 = _x(4)
    np.testing.assert_allclose(_infer(ov_server, "skip_dynamic", x4), ovgen.reference(x4), **TOL)
    with pytest.raises(InferenceServerException) as e:
        _infer(ov_server, "skip_dynamic", _x(2))
    assert e.value.status() == "500"
    assert "expected requests with batch size '4', got '2'... this error can be avoided by " \
        "setting 'ENABLE_BATCH_PADDING'" in e.value.message()  # fmt: skip
    x2 = _x(2)
    got = _infer(ov_server, "padded", x2)
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, ovgen.reference(x2), **TOL)


def test_reshape_io_layers_takes_the_config_dims(ov_server: ShoalServer) -> None:
    x = _x(5)  # the ONNX graph was [1, 8]
    np.testing.assert_allclose(_infer(ov_server, "reshaped", x), ovgen.reference(x), **TOL)


def test_the_config_data_type_is_converted_to_the_models(ov_server: ShoalServer) -> None:
    x = _x(2).astype(np.float16)
    got = _infer(ov_server, "fp16_io", x, "grpc")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ovgen.reference(x), **TOL)


def test_openvino_properties_reach_the_compiled_model(ov_server: ShoalServer) -> None:
    x = _x(2)
    np.testing.assert_allclose(_infer(ov_server, "tuned", x), ovgen.reference(x), **TOL)
    log = ov_server.log()
    assert "model 'tuned' compiled for CPU: 1 streams, 1 threads, THROUGHPUT hint" in log
    assert "model 'tuned': CPU does not take COMPILATION_NUM_THREADS; left out" in log


def test_openvino_reads_onnx_named_by_default_model_filename(ov_server: ShoalServer) -> None:
    x = _x(3)
    np.testing.assert_allclose(_infer(ov_server, "from_onnx", x), ovgen.reference(x), **TOL)


def test_inputs_from_client_shared_memory(ov_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(ov_server.url)
    x = _x(4, seed=9)
    key, size = f"/ov_in_{ov_server.http_port}", x.nbytes
    handle = shm.create_shared_memory_region("ov_in", key, size)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("ov_in", key, size)
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_shared_memory("ov_in", size)
        got = client.infer("auto_batch", [inp]).as_numpy("Y")
        np.testing.assert_allclose(got, ovgen.reference(x), **TOL)
    finally:
        client.unregister_system_shared_memory("ov_in")
        shm.destroy_shared_memory_region(handle)
        client.close()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("not_reshaped", "model 'not_reshaped', tensor 'X': the model expects 2 dimensions "
         "(shape [1,8]) but the model configuration specifies 2 dimensions (shape [-1,8])"),
        ("bad_streams", "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/"
         "<int_value>, got many"),
        ("wrong_input", "unexpected inference input 'Z', allowed inputs are: X"),
        ("fp64", "unsupported datatype TYPE_FP64 for input 'X' for model 'fp64'"),
        ("two_inputs", "unable to load model 'two_inputs', configuration expects 2 inputs, "
         "model provides 1"),
        ("missing", "/missing/1/model.xml' for model 'missing'"),
    ],
)  # fmt: skip
def test_a_bad_model_fails_its_load_with_the_reason(
    ov_server: ShoalServer, model: str, reason: str
) -> None:
    version = ov_server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert reason in version["reason"], version["reason"]
