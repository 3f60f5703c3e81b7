"""Business logic scripting: Python models that call other models of the server
(``pb_utils.InferenceRequest(model_name=..., ...).exec()``, ``async_exec()``, and
``exec(decoupled=True)`` over a decoupled model), as Triton's BLS examples do."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_decoupled import write_repository as write_decoupled
from tests.serverctl import ShoalServer, served, shm_segments_of
from tools import modelgen

# IN0, IN1: INT32 [16]; the request parameter "target" names the model it calls ("simple"
# adds and subtracts); OUT = that model's OUTPUT0, or its error as this model's.
SYNC = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            params = json.loads(request.parameters())
            forward = params.get("forward")  # a parameter passed on, set to 1
            call = pb_utils.InferenceRequest(
                model_name=params.get("target", "simple"),
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a[None]), pb_utils.Tensor("INPUT1", b[None])],
                parameters={forward: 1} if forward else {},
            )
            answer = call.exec()
            if answer.has_error():
                error = pb_utils.TritonError(answer.error().message())
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
# Two calls at once (async_exec): OUT = (a + b) + (a - b) = 2a.
ASYNC = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()[None]
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()[None]
            calls = [
                pb_utils.InferenceRequest(
                    model_name="simple", requested_output_names=[name],
                    inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
                ).async_exec()
                for name in ("OUTPUT0", "OUTPUT1")
            ]
            plus, minus = await asyncio.gather(*calls)
            out = plus.output_tensors()[0].as_numpy() + minus.output_tensors()[0].as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out[0])]))
        return responses
"""
# A decoupled model's responses: OUT[i] = the i-th response's OUT, over repeat_inline.
STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            delay = pb_utils.Tensor("DELAY_MS", np.zeros(1, np.uint32))
            call = pb_utils.InferenceRequest(
                model_name="repeat_inline", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", a), delay],
            )
            got = [r.output_tensors()[0].as_numpy()[0] for r in call.exec(decoupled=True)]
            out = np.array(got, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
# The same through async_exec(decoupled=True), two calls at once: each awaits its first
# response off the event loop (Triton's), then iterates the rest.
ASYNC_STREAM = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def call(self, values):
        call = pb_utils.InferenceRequest(
            model_name="repeat_inline", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", values),
                    pb_utils.Tensor("DELAY_MS", np.array([50], np.uint32))],
        )
        responses = await call.async_exec(decoupled=True)
        return [r.output_tensors()[0].as_numpy()[0] for r in responses]

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            first, second = await asyncio.gather(self.call(a), self.call(a * 10))
            out = np.array(first + second, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
# Iterates a decoupled model's responses and lets go after the first two (the called
# model, streaming 200 from its thread, must see its request cancelled).
BREAK = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="repeat_cancellable", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.arange(200, dtype=np.int32)),
                        pb_utils.Tensor("DELAY_MS", np.array([20], np.uint32))],
            )
            got = []
            for r in call.exec(decoupled=True):
                got.append(r.output_tensors()[0].as_numpy()[0])
                if len(got) == 2:
                    break
            out = np.array(got, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "IN0" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "IN1" data_type: TYPE_INT32 dims: [ -1 ] }}
]
output [{{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }}]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("bls")
    modelgen.write_shipped_repository(repo, ("simple",))
    write_decoupled(repo)
    models = (
        ("bls_sync", SYNC),
        ("bls_async", ASYNC),
        ("bls_stream", STREAM),
        ("bls_async_stream", ASYNC_STREAM),
        ("bls_break", BREAK),
    )
    for name, code in models:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    with served(repo) as srv:
        srv.wait_ready()
        yield srv


def _call(server: ShoalServer, model: str, a: np.ndarray, **params: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for name, value in (("IN0", a), ("IN1", np.ones_like(a))):
        t = httpclient.InferInput(name, list(value.shape), "INT32")
        t.set_data_from_numpy(value)
        inputs.append(t)
    result = client.infer(model, inputs, parameters=params or None)
    out = result.as_numpy("OUT")
    assert out is not None
    return out


def _count(server: ShoalServer, model: str) -> int:
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats.get("inference_count", 0))


def test_a_model_calls_another_and_its_request_counts_there(server: ShoalServer) -> None:
    a = np.arange(16, dtype=np.int32)
    before = _count(server, "simple")
    np.testing.assert_array_equal(_call(server, "bls_sync", a), a + 1)
    assert _count(server, "simple") == before + 1


def test_an_error_of_the_called_model_comes_back_in_its_response(server: ShoalServer) -> None:
    a = np.arange(16, dtype=np.int32)
    with pytest.raises(InferenceServerException) as err:
        _call(server, "bls_sync", a, target="nope")
    assert err.value.message() == "Request for unknown model: 'nope' is not found"
    with pytest.raises(InferenceServerException) as err:  # a request the model refuses
        _call(server, "bls_sync", np.arange(4, dtype=np.int32))
    assert err.value.message().startswith(
        "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'simple'. "
        "Expected [-1,16], got [1,4]"
    )
    np.testing.assert_array_equal(_call(server, "bls_sync", a), a + 1)  # serving still


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"target": "repeat_inline"},
         "model 'repeat_inline' is decoupled: call it with exec(decoupled=True)"),
        ({"forward": "priority"}, "parameter 'priority' is reserved for Triton usage: a "
         "scripted request sets it through its own argument"),
    ],
)  # fmt: skip
def test_a_call_the_server_cannot_take_is_answered_so(
    server: ShoalServer, params: dict[str, str], message: str
) -> None:
    with pytest.raises(InferenceServerException) as err:
        _call(server, "bls_sync", np.arange(16, dtype=np.int32), **params)
    assert err.value.message() == message


def test_a_decoupled_call_let_go_of_early_is_cancelled(server: ShoalServer) -> None:
    before = server.log().count("cancelled after")
    np.testing.assert_array_equal(_call(server, "bls_break", np.zeros(1, np.int32)), [0, 1])
    deadline = time.monotonic() + 10
    while server.log().count("cancelled after") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count("cancelled after") == before + 1


def test_async_calls_run_together(server: ShoalServer) -> None:
    a = np.arange(16, dtype=np.int32)
    np.testing.assert_array_equal(_call(server, "bls_async", a), 2 * a)


def test_a_decoupled_models_responses_are_iterated(server: ShoalServer) -> None:
    a = np.array([4, 5, 6], dtype=np.int32)
    np.testing.assert_array_equal(_call(server, "bls_stream", a), a)


def test_a_killed_callers_connection_and_memory_go_with_it(tmp_path: Path) -> None:
    """SIGKILL of a worker that scripted requests: its shared memory is removed (the
    broker knew its connection as a frontend's), its restart scripts again, and the
    server stops leaving nothing behind (``served`` checks /dev/shm and processes)."""
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    (tmp_path / "bls_sync" / "1").mkdir(parents=True)
    (tmp_path / "bls_sync" / "1" / "model.py").write_text(textwrap.dedent(SYNC))
    (tmp_path / "bls_sync" / "config.pbtxt").write_text(CONFIG.format(name="bls_sync"))
    with served(tmp_path) as srv:
        srv.wait_ready()
        a = np.arange(16, dtype=np.int32)
        np.testing.assert_array_equal(_call(srv, "bls_sync", a), a + 1)
        pid = srv.worker_pid("bls_sync")
        assert any(f"-{pid}-" in seg for seg in shm_segments_of({pid}))  # its pool
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while shm_segments_of({pid}) or srv.model_version("bls_sync")["state"] != "READY":
            assert time.monotonic() < deadline, shm_segments_of({pid})
            time.sleep(0.1)
        np.testing.assert_array_equal(_call(srv, "bls_sync", a), a + 1)


def test_async_exec_of_a_decoupled_model_gives_its_responses_in_order(server: ShoalServer) -> None:
    out = _call(server, "bls_async_stream", np.array([1, 2, 3], np.int32))
    assert out.tolist() == [1, 2, 3, 10, 20, 30]
