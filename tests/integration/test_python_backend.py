"""Triton Python models (``backend: "python"``, ``model.py``) served by shoal's workers,
driven by tritonclient over HTTP and gRPC.

The models are written as Triton's documentation and examples write them (``import
triton_python_backend_utils as pb_utils``, ``TritonPythonModel`` with ``initialize``,
``execute`` and ``finalize``); one runs ONNX Runtime inside a Python model, as the
benchmark's Triton peer does."""

from __future__ import annotations

import json
import shutil
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if (a < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]))
        return responses
"""
MODELS = {
    "raiser": """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("boom")
""",
    "too_few": """
class TritonPythonModel:
    def execute(self, requests):
        return []
""",
    "half": """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a)]))
        return out
""",
    "upper": """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            words = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            upper = np.array([w.upper() for w in words.reshape(-1)], dtype=object)
            upper = pb_utils.Tensor("UPPER", upper.reshape(words.shape))
            out.append(pb_utils.InferenceResponse([upper]))
        return out
""",
    "args": """
import json
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = {**args, "sys.argv": sys.argv}

    def execute(self, requests):
        text = np.array([json.dumps(self.args).encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text)]) for _ in requests]
""",
    "ort": """
import os
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        batch = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        (out,) = self.session.run(["OUTPUT0"], {"INPUT0": np.concatenate(batch)})
        parts = np.split(out, np.cumsum([len(b) for b in batch])[:-1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", p)]) for p in parts]

    def finalize(self):
        self.session = None
""",
    "inplace": """
import triton_python_backend_utils as pb_utils
from helper import TWICE  # a file beside model.py, as Triton's stub finds it

class TritonPythonModel:
    async def execute(self, requests):  # an async execute, as Triton allows
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            a *= TWICE  # its own copy: the request's bytes are not touched
            extra = {"id": r.request_id(), "params": r.parameters()}
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a)],
                                                  parameters=extra))
        self.last = extra
        return out
""",
    "params": """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            seen = {"id": r.request_id(), "params": json.loads(r.parameters())}
            text = np.array([json.dumps(seen).encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text)]))
        return out
""",
    "sloppy": """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        kind = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()[0][0]
        if kind == 1:  # not a pb_utils.Tensor
            return [pb_utils.InferenceResponse([np.zeros(4)]) for _ in requests]
        # text where the config says FP32
        bad = np.array([["a"] * 4], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", bad)]) for _ in requests]
""",
    "waiter": """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # INPUT0: how long to wait for a cancel (s)
        out = []
        for r in requests:
            limit = float(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0])
            pb_utils.Logger.log_info(f"waiter: waiting {limit} s")
            end = time.monotonic() + limit
            while not r.is_cancelled() and time.monotonic() < end:
                time.sleep(0.01)
            said = "cancelled" if r.is_cancelled() else "not cancelled"
            pb_utils.Logger.log_info(f"waiter: {said}")
            text = np.array([said.encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text)]))
        return out
""",
    "async_wait": """
import asyncio
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):  # as "waiter", awaiting between its looks
        out = []
        for r in requests:
            limit = float(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0])
            pb_utils.Logger.log_info(f"async_wait: waiting {limit} s")
            end = time.monotonic() + limit
            while not r.is_cancelled() and time.monotonic() < end:
                await asyncio.sleep(0.01)
            said = "cancelled" if r.is_cancelled() else "not cancelled"
            pb_utils.Logger.log_info(f"async_wait: {said}")
            text = np.array([said.encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text)]))
        return out
""",
    "gated": """
import time
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.mode = Path(args["model_repository"]) / "mode"

    def is_ready(self):  # as its folder's file "mode" says
        mode = self.mode.read_text() if self.mode.exists() else "true"
        if mode == "raise":
            raise RuntimeError("the feature store is unreachable")
        return 1 if mode == "int" else mode == "true"

    def execute(self, requests):  # an identity; INPUT0's first value: seconds to take
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.flat[0]:
                pb_utils.Logger.log_info(f"gated: taking {x.flat[0]} s")
                time.sleep(float(x.flat[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
""",
    "gated_async": """
import asyncio
from pathlib import Path

class TritonPythonModel:
    def initialize(self, args):
        self.warm = Path(args["model_repository"]) / "warm"

    async def is_ready(self):  # ready once its folder's file "warm" exists
        await asyncio.sleep(0)
        return self.warm.exists()

    def execute(self, requests):
        return []
""",
    "broken": """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot start")
""",
}


def _config(name: str, ins: str, outs: str, mbs: int = 8, extra: str = "") -> str:
    head = f'name: "{name}"\nbackend: "python"\nmax_batch_size: {mbs}\n'
    return f"{head}input [ {ins} ]\noutput [ {outs} ]\n{extra}"


def _io(name: str, dtype: str = "TYPE_FP32", dims: str = "4") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}'


def _write(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("python-repo")
    two_in = f"{_io('INPUT0')}, {_io('INPUT1')}"
    two_out = f"{_io('OUTPUT0')}, {_io('OUTPUT1')}"
    batching = "dynamic_batching { max_queue_delay_microseconds: 300000 }"
    _write(repo, "add_sub", ADD_SUB, _config("add_sub", two_in, two_out, extra=batching))
    for name in ("raiser", "too_few", "half"):
        _write(repo, name, MODELS[name], _config(name, _io("INPUT0"), two_out))
    text = _io("TEXT", "TYPE_STRING", "-1")
    _write(
        repo, "upper", MODELS["upper"], _config("upper", text, _io("UPPER", "TYPE_STRING", "-1"))
    )
    _write(
        repo,
        "args",
        MODELS["args"],
        _config("args", _io("INPUT0"), _io("ARGS", "TYPE_STRING", "1"), mbs=0),
    )
    _write(repo, "broken", MODELS["broken"], _config("broken", _io("INPUT0"), _io("OUTPUT0")))
    _write(repo, "inplace", MODELS["inplace"], _config("inplace", _io("INPUT0"), _io("OUTPUT0")))
    (repo / "inplace" / "1" / "helper.py").write_text("TWICE = 2\n")
    _write(
        repo,
        "params",
        MODELS["params"],
        _config("params", _io("INPUT0"), _io("ARGS", "TYPE_STRING", "1"), mbs=0),
    )
    _write(repo, "sloppy", MODELS["sloppy"], _config("sloppy", _io("INPUT0"), _io("OUTPUT0")))
    waits = _config("waiter", _io("INPUT0", dims="1"), _io("ARGS", "TYPE_STRING", "1"), mbs=0)
    _write(repo, "waiter", MODELS["waiter"], waits)
    _write(repo, "async_wait", MODELS["async_wait"], waits.replace('"waiter"', '"async_wait"'))
    for name in ("gated", "gated_async"):
        _write(repo, name, MODELS[name], _config(name, _io("INPUT0"), _io("OUTPUT0"), mbs=0))
    decoupled = "model_transaction_policy { decoupled: true }\n" + (
        "dynamic_batching { preserve_ordering: true }"
    )
    _write(
        repo,
        "decoupled",
        MODELS["half"],
        _config("decoupled", _io("INPUT0"), _io("OUTPUT0"), extra=decoupled),
    )
    modelgen.write_shipped_repository(repo, ("mlp",))
    shutil.copytree(repo / "mlp", repo / "ort_mlp")  # its model.onnx, for the model.py
    (repo / "ort_mlp" / "1" / "model.py").write_text(textwrap.dedent(MODELS["ort"]))
    mlp_config = (repo / "mlp" / "config.pbtxt").read_text()
    (repo / "ort_mlp" / "config.pbtxt").write_text(
        mlp_config.replace('name: "mlp"', 'name: "ort_mlp"\nbackend: "python"').replace(
            'platform: "onnxruntime_onnx"\n', ""
        )
    )
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        settled = ("add_sub", "ort_mlp", "broken", "args", "inplace", "decoupled", "waiter")
        srv.wait_settled((*settled, "async_wait", "gated", "gated_async"))
        yield srv


def _pair(mod: Any, a: np.ndarray, b: np.ndarray) -> list:
    out = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        t = mod.InferInput(name, list(value.shape), "FP32")
        t.set_data_from_numpy(value)
        out.append(t)
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_python_model_answers(server: ShoalServer, protocol: str) -> None:
    url, mod = server.client(protocol)
    client = mod.InferenceServerClient(url)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    result = client.infer("add_sub", _pair(mod, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_batched_requests_reach_execute_together_and_fail_alone(server: ShoalServer) -> None:
    """Three requests within the queue delay: one execute call with three requests. The
    one the model answers with an error fails alone, with the model's code and words."""
    before = _stats(server, "add_sub")
    outcomes: dict[int, Any] = {}

    def call(i: int) -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        a = np.full((1, 4), -1.0 if i == 1 else float(i), np.float32)
        try:
            outcomes[i] = client.infer("add_sub", _pair(httpclient, a, a)).as_numpy("OUTPUT0")
        except InferenceServerException as exc:
            outcomes[i] = exc
        client.close()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes[0].tolist() == [[0.0] * 4] and outcomes[2].tolist() == [[4.0] * 4]
    error = outcomes[1]
    assert isinstance(error, InferenceServerException)
    assert (error.status(), error.message()) == ("400", "negative input")
    after = _stats(server, "add_sub")
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 2  # the successes


def _stats(server: ShoalServer, model: str) -> dict:
    status, body = server.http(f"/v2/models/{model}/stats")
    assert status == 200
    return dict(json.loads(body)["model_stats"][0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_the_model_did_not_give_is_left_out(server: ShoalServer, protocol: str) -> None:
    """As Triton's Python backend answers: the outputs the model gave, no error."""
    mod = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else f"127.0.0.1:{server.grpc_port}"
    client = mod.InferenceServerClient(url)
    x = mod.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), 3.0, np.float32))
    asked = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer("half", [x], outputs=asked)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 3.0, np.float32))
    assert result.as_numpy("OUTPUT1") is None


@pytest.mark.parametrize(
    ("model", "status", "message"),
    [
        ("raiser", "500", "Failed to process the request(s) for model instance 'raiser_0', "
         "message: ValueError: boom"),
        ("too_few", "500", "Failed to process the request(s) for model instance 'too_few_0', "
         "message: Number of InferenceResponse objects do not match the number of "
         "InferenceRequest objects. InferenceRequest(s) size is:1, and InferenceResponse(s) "
         "size is:0"),
    ],
)  # fmt: skip
def test_a_model_that_fails_fails_its_requests_and_nothing_else(
    server: ShoalServer, model: str, status: str, message: str
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, [x])
    assert (err.value.status(), err.value.message()) == (status, message)
    assert server.model_version(model)["state"] == "READY"  # the worker lives on
    result = client.infer(
        "add_sub", _pair(httpclient, np.ones((1, 4), np.float32), np.ones((1, 4), np.float32))
    )
    assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]


def test_a_requested_output_the_model_does_not_give_is_left_out(server: ShoalServer) -> None:
    """As Triton's Python backend: the response has the outputs the model gave."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), 3.0, np.float32))
    asked = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("half", [x], outputs=asked)
    assert result.as_numpy("OUTPUT0").tolist() == [[3.0] * 4]
    assert result.as_numpy("OUTPUT1") is None
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT0"]


def test_bytes_tensors_are_bytes_objects(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    text = np.array([[b"triton", b"shoal"]], dtype=object)
    x = httpclient.InferInput("TEXT", [1, 2], "BYTES")
    x.set_data_from_numpy(text)
    assert client.infer("upper", [x]).as_numpy("UPPER").tolist() == [[b"TRITON", b"SHOAL"]]


def test_initialize_gets_tritons_args(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, np.float32))
    args = json.loads(client.infer("args", [x]).as_numpy("ARGS")[0])
    assert args["model_name"] == "args" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_name"] == "args_0"
    assert args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]).name == "args"  # the model's own folder
    assert json.loads(args["model_config"])["backend"] == "python"
    # as in Triton's stub, an interpreter with no arguments (not the worker's: a model
    # that runs unittest.main() would parse them; L0_backend_python argument_validation)
    assert args["sys.argv"] == [""]


def test_a_model_that_cannot_initialize_is_unavailable_saying_why(server: ShoalServer) -> None:
    state = server.model_version("broken")
    assert state["state"] == "UNAVAILABLE"
    assert "RuntimeError: cannot start" in state["reason"]


def test_onnx_runtime_inside_a_python_model_matches_the_onnx_model(
    server: ShoalServer,
) -> None:
    """A model.py that runs the model.onnx beside it (what the benchmark's Triton peer
    serves) gives what that ONNX model served directly gives."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [3, 256], "FP32")
    x.set_data_from_numpy(np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32))
    direct = client.infer("mlp", [x]).as_numpy("OUTPUT0")
    wrapped = client.infer("ort_mlp", [x]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(wrapped, direct, rtol=1e-5, atol=1e-6)


def test_a_model_gets_its_own_inputs_and_helpers_and_may_be_async(server: ShoalServer) -> None:
    """It may write into its inputs (its copy: Triton's stub copies them too), import a
    file beside model.py, and define execute as a coroutine."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    x.set_data_from_numpy(data)
    for _ in range(2):  # the same bytes twice: the first call changed nothing of them
        np.testing.assert_array_equal(client.infer("inplace", [x]).as_numpy("OUTPUT0"), 2 * data)


def test_a_model_sees_the_request_id_and_its_own_parameters(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, np.float32))
    result = client.infer(
        "params", [x], request_id="r-7", parameters={"max_tokens": 5, "mode": "fast"}
    )
    seen = json.loads(result.as_numpy("ARGS")[0])
    assert seen == {"id": "r-7", "params": {"max_tokens": 5, "mode": "fast"}}


def _logged(server: ShoalServer, line: str, count: int, timeout: float = 20.0) -> int:
    """How often ``line`` is in the server's log once it is there ``count`` times (or
    ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while server.log().count(line) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.log().count(line)


@pytest.mark.parametrize("model", ["waiter", "async_wait"])
def test_a_cancelled_grpc_request_reaches_a_model_that_is_not_decoupled(
    server: ShoalServer, model: str
) -> None:
    """The client cancels while execute runs: ``request.is_cancelled()`` says so (as in
    Triton's Python backend), the model returns early, and the instance serves on. An
    async execute sees it while it awaits (the worker reads its cancels meanwhile)."""
    cancels = server.log().count(f"{model}: cancelled")
    waits = server.log().count(f"{model}: waiting 30.0 s")
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        x = grpcclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([30.0], np.float32))
        answers: list[Any] = []
        call = client.async_infer(model, [x], lambda result, error: answers.append(error))
        assert _logged(server, f"{model}: waiting 30.0 s", waits + 1) == waits + 1
        started = time.monotonic()
        call.cancel()
        assert _logged(server, f"{model}: cancelled", cancels + 1) == cancels + 1
        assert time.monotonic() - started < 10  # (not the 30 s the model would wait)
        x.set_data_from_numpy(np.array([0.0], np.float32))
        assert client.infer(model, [x]).as_numpy("ARGS")[0] == b"not cancelled"
    assert len(answers) == 1 and answers[0].status() == "StatusCode.CANCELLED"


def test_an_http_client_that_hangs_up_cancels_its_request(server: ShoalServer) -> None:
    """Its connection closed while the model runs: the model sees the request cancelled
    (Triton's HTTP side does not tell; shoal's does), and the instance serves on."""
    cancels = server.log().count("waiter: cancelled")
    waits = server.log().count("waiter: waiting 30.0 s")
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [30.0]}]}
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port)) as conn:
        conn.sendall(
            b"POST /v2/models/waiter/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert _logged(server, "waiter: waiting 30.0 s", waits + 1) == waits + 1
    assert _logged(server, "waiter: cancelled", cancels + 1) == cancels + 1
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([0.0], np.float32))
    assert client.infer("waiter", [x]).as_numpy("ARGS")[0] == b"not cancelled"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (1.0, "Failed to process the request(s) for model instance 'sloppy_0', message: "
         "TritonModelException: InferenceResponse output_tensors must be "
         "pb_utils.Tensor objects, not ndarray"),
        (2.0, "output 'OUTPUT0' of model 'sloppy' has data type object, which its config's "
         "FP32 cannot hold"),
    ],
)  # fmt: skip
def test_a_models_mistakes_are_its_own(server: ShoalServer, kind: float, message: str) -> None:
    """Answers that are not what the config says fail the request (500), not the client
    (400), and the worker lives on."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.full((1, 4), kind, np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("sloppy", [x])
    assert (err.value.status(), err.value.message()) == ("500", message)
    assert server.model_version("sloppy")["state"] == "READY"


def test_a_decoupled_model_that_preserves_ordering_is_refused_at_load(
    server: ShoalServer,
) -> None:
    """(Decoupled models themselves are served: tests/integration/test_decoupled.py.)"""
    state = server.model_version("decoupled")
    assert state["state"] == "UNAVAILABLE"
    assert state["reason"] == (
        "failed to load 'decoupled': decoupled models are supported for Python models only, "
        "without preserve_ordering or Direct sequence batching (this one has "
        "dynamic_batching.preserve_ordering)"
    )


def _ready(server: ShoalServer, model: str) -> tuple[bool, bool, int]:
    """What the gRPC and HTTP clients, and the HTTP status, say of ``model``'s readiness."""
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    http = httpclient.InferenceServerClient(server.url)
    return (
        grpc.is_model_ready(model),
        http.is_model_ready(model),
        server.http_status(f"/v2/models/{model}/ready"),
    )


def _identity(server: ShoalServer, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    t = httpclient.InferInput("INPUT0", [4], "FP32")
    t.set_data_from_numpy(x)
    return client.infer("gated", [t]).as_numpy("OUTPUT0")


@pytest.mark.parametrize(
    ("mode", "ready"), [("true", True), ("false", False), ("raise", False), ("int", False)]
)
def test_is_ready_answers_each_readiness_probe(server: ShoalServer, mode: str, ready: bool) -> None:
    """The model's ``is_ready`` answers ``/v2/models/{m}/ready`` and ModelReady: False,
    an exception or a value that is not a bool is not ready (HTTP 400). Inference goes
    on as before, and the version stays READY in the repository's index. The server's
    readiness does not ask it here: this server's readiness is not strict."""
    (server.repo / "gated" / "mode").write_text(mode)
    try:
        assert _ready(server, "gated") == (ready, ready, 200 if ready else 400)
        assert server.http_status("/v2/health/ready") == 200
        x = np.arange(4, dtype=np.float32) * 0
        np.testing.assert_array_equal(_identity(server, x), x)
        assert server.model_version("gated")["state"] == "READY"
    finally:
        (server.repo / "gated" / "mode").unlink()


def test_an_async_is_ready_is_awaited(server: ShoalServer) -> None:
    assert _ready(server, "gated_async")[:2] == (False, False)
    (server.repo / "gated_async" / "warm").touch()
    assert _ready(server, "gated_async")[:2] == (True, True)


def test_is_ready_answers_while_execute_runs(server: ShoalServer) -> None:
    """The check runs beside ``execute`` (as Triton's stub runs it): a probe of an
    instance busy with a request is answered before that request is."""
    x = np.full(4, 3.0, dtype=np.float32)  # execute takes 3 s
    answered: list[float] = []
    taking = server.log().count("gated: taking 3.0 s")
    busy = threading.Thread(target=lambda: answered.append(_identity(server, x)[0]))
    busy.start()
    try:
        assert _logged(server, "gated: taking 3.0 s", taking + 1) == taking + 1
        assert _ready(server, "gated")[0] is True
        assert not answered  # (the request still runs)
    finally:
        busy.join(30)
    assert answered == [3.0]


def test_many_probes_at_once_are_each_answered(server: ShoalServer) -> None:
    """Probes that come together (Triton's test sends 16) share the running check, and
    none is turned away (a refused connection would read as "not ready")."""
    statuses: list[int] = []
    probes = [
        threading.Thread(
            target=lambda: statuses.append(server.http_status("/v2/models/gated/ready"))
        )
        for _ in range(32)
    ]
    for probe in probes:
        probe.start()
    for probe in probes:
        probe.join(30)
    assert statuses == [200] * 32
