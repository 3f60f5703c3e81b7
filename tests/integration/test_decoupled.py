"""Decoupled Python models (``model_transaction_policy { decoupled: true }``): any number
of responses per request, sent through the request's response sender during ``execute``
or after it from the model's own threads, streamed to tritonclient over gRPC.

The models are written as Triton's decoupled examples write them (``repeat_int32``,
``square_int32``): responses, then the final flag, alone or with the last response."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served

# IN: INT32 [-1]; one response per element (OUT = the element, IDX = its position), each
# after DELAY_MS, then the final flag: alone, or with the last response (LAST_FINAL).
REPEAT = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
MODE = "{mode}"


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def respond(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0] / 1000
        for i, v in enumerate(values):
            if delay:
                time.sleep(delay)
            if MODE.startswith("cancellable") and request.is_cancelled():
                pb_utils.Logger.log_info(f"cancelled after {{i}} response(s)")
                sender.send(flags=FINAL)
                return
            if MODE == "errors" and v < 0:
                error = pb_utils.TritonError(f"negative value at {{i}}")
                sender.send(pb_utils.InferenceResponse(error=error))
                continue
            out = np.array([v], np.int32)
            if MODE == "bad_output":
                out = out + 0.5
            params = None
            if "respond_with_parameters" in request.parameters():
                params = {{"index": i, "even": bool(v % 2 == 0), "of": "repeat"}}
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", out),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ], parameters=params)
            last = i == len(values) - 1
            sender.send(response, FINAL if last and MODE == "last_final" else 0)
        if MODE == "dropped" or (MODE in ("raises", "returns_list") and len(values) == 0):
            return  # the final flag never sent (by the model)
        if MODE == "slow_final":
            time.sleep(0.3)  # the final flag comes well after the last response
        if MODE != "last_final" or len(values) == 0:
            sender.send(flags=FINAL)

    def execute(self, requests):
        for request in requests:
            if MODE in ("threaded", "cancellable"):
                t = threading.Thread(target=self.respond, args=(request,))
                t.start()
                self.threads.append(t)
            else:
                self.respond(request)
        if MODE == "raises":
            raise RuntimeError("execute failed")
        if MODE == "returns_list":
            return [None] * len(requests)
        return None

    def finalize(self):
        for t in self.threads:
            t.join()
"""
MODES = ("inline", "last_final", "threaded", "cancellable", "cancellable_inline", "errors",
         "dropped", "raises", "returns_list", "bad_output")  # fmt: skip
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "DELAY_MS" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
instance_group [{{ count: 1 kind: KIND_CPU }}]
"""


# A model that is not decoupled, for the generate extension: it echoes its text and the
# request's parameters; a text that is a JSON object is its response's parameters.
TEXT = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0].decode()
            n = pb_utils.get_input_tensor_by_name(r, "n")
            count = int(n.as_numpy()[0]) if n is not None else 1
            if text == "fail":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("gen failed")))
                continue
            echo = np.array([("echo:" + text) * count], dtype=object)
            try:
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", echo),
                    pb_utils.Tensor("params", np.array([r.parameters()], dtype=object)),
                    pb_utils.Tensor("score", np.array([0.5, 1.25], np.float32)),
                ], parameters=json.loads(text) if text.startswith("{") else None))
            except pb_utils.TritonModelException as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                out.append(pb_utils.InferenceResponse(error=error))
        return out
"""
TEXT_CONFIG = """
name: "text"
backend: "python"
max_batch_size: 0
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "n" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "params" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "score" data_type: TYPE_FP32 dims: [ 2 ] }
]
"""


# An async execute: it awaits DELAY_MS, then answers each element; it raises for none.
ASYNC = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]
            await asyncio.sleep(delay / 1000)
            if len(values) == 0:
                raise ValueError("nothing to repeat")
            sender = request.get_response_sender()
            for i, v in enumerate(values):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([v], np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], np.uint32)),
                ]))
            sender.send(flags=FINAL)
        return None
"""


def write_repository(repo: Path) -> None:
    for mode in MODES:
        name = f"repeat_{mode}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(REPEAT.format(mode=mode)))
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / "repeat_async" / "1").mkdir(parents=True)
    (repo / "repeat_async" / "1" / "model.py").write_text(ASYNC)
    (repo / "repeat_async" / "config.pbtxt").write_text(CONFIG.format(name="repeat_async"))
    (repo / "text" / "1").mkdir(parents=True)
    (repo / "text" / "1" / "model.py").write_text(TEXT)
    (repo / "text" / "config.pbtxt").write_text(TEXT_CONFIG)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("decoupled")
    write_repository(repo)
    with served(repo) as srv:
        srv.wait_ready()
        yield srv


def _inputs(values: list[int], delay_ms: int = 0) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("IN", [len(values)], "INT32")
    x.set_data_from_numpy(np.array(values, np.int32))
    d = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
    d.set_data_from_numpy(np.array([delay_ms], np.uint32))
    return [x, d]


class Stream:
    """A tritonclient stream whose answers (results or errors) land in a queue."""

    def __init__(self, server: ShoalServer, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.answers: queue.Queue[Any] = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.answers.put(error or result), headers=headers
        )

    def send(self, model: str, values: list[int], delay_ms: int = 0, **kwargs: Any) -> None:
        self.client.async_stream_infer(model, _inputs(values, delay_ms), **kwargs)

    def take(self, count: int, timeout: float = 20.0) -> list[Any]:
        return [self.answers.get(timeout=timeout) for _ in range(count)]

    def quiet(self, seconds: float = 0.5) -> bool:
        """Nothing more arrives within ``seconds``."""
        try:
            extra = self.answers.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected answer: {extra}")

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ShoalServer) -> Iterator[Stream]:
    s = Stream(server)
    yield s
    s.close()


def _values(answers: list[Any]) -> list[tuple[int, int]]:
    out = []
    for a in answers:
        assert not isinstance(a, InferenceServerException), a
        out.append((int(a.as_numpy("OUT")[0]), int(a.as_numpy("IDX")[0])))
    return out


def _final(answer: Any) -> bool:
    return bool(answer.get_response().parameters["triton_final_response"].bool_param)


@pytest.mark.parametrize("mode", ["inline", "last_final", "threaded"])
def test_one_request_many_responses_in_order(stream: Stream, mode: str) -> None:
    stream.send(f"repeat_{mode}", [5, 6, 7, 8], request_id="r1")
    answers = stream.take(4)
    assert _values(answers) == [(5, 0), (6, 1), (7, 2), (8, 3)]
    assert all(a.get_response().id == "r1" for a in answers)
    assert [_final(a) for a in answers] == [False, False, False, mode == "last_final"]
    assert stream.quiet()  # the final flag alone is not a response


def test_the_empty_final_response_when_asked_for(stream: Stream) -> None:
    stream.send("repeat_inline", [1, 2], enable_empty_final_response=True)
    answers = stream.take(3)
    assert _values(answers[:2]) == [(1, 0), (2, 1)]
    assert [_final(a) for a in answers] == [False, False, True]
    assert answers[2].get_response().outputs == []
    assert answers[2].get_response().model_version == ""  # as Triton 2.51 sends it
    stream.send("repeat_inline", [], enable_empty_final_response=True)  # no response at all
    (only,) = stream.take(1)
    assert _final(only) and only.get_response().outputs == []
    assert stream.quiet()


def test_responses_of_concurrent_requests_interleave(stream: Stream) -> None:
    """Two requests whose responses come from the model's threads, 30 ms apart: both
    stream at once (neither waits for the other's end), each in its own order."""
    stream.send("repeat_threaded", [1, 2, 3, 4], delay_ms=30, request_id="a")
    stream.send("repeat_threaded", [11, 12, 13, 14], delay_ms=30, request_id="b")
    answers = stream.take(8)
    by_id: dict[str, list[int]] = {"a": [], "b": []}
    order = []
    for a in answers:
        by_id[a.get_response().id].append(int(a.as_numpy("OUT")[0]))
        order.append(a.get_response().id)
    assert by_id == {"a": [1, 2, 3, 4], "b": [11, 12, 13, 14]}
    assert order[:4] != ["a"] * 4  # b began before a ended


def test_an_error_response_ends_nothing_but_itself(stream: Stream) -> None:
    stream.send("repeat_errors", [1, -2, 3])
    first, second, third = stream.take(3)
    assert _values([first, third]) == [(1, 0), (3, 2)]
    assert isinstance(second, InferenceServerException)
    assert second.message() == "negative value at 1"
    stream.send("repeat_errors", [4])  # the stream still serves
    assert _values(stream.take(1)) == [(4, 0)]


def test_a_stream_asked_to_end_on_error_ends_with_the_models_first_error(
    server: ShoalServer,
) -> None:
    """Triton's ``triton_grpc_error: true`` header: a model's error response ends the
    stream with its gRPC status (nothing after it arrives); a request refused before it
    ran is answered on the stream, which goes on."""
    s = Stream(server, {"triton_grpc_error": "true"})
    try:
        s.send("no_such_model", [1])
        (refused,) = s.take(1)
        assert isinstance(refused, InferenceServerException)
        assert "no_such_model" in refused.message()
        s.send("repeat_errors", [1, -2, 3])
        first, second = s.take(2)
        assert _values([first]) == [(1, 0)]
        assert isinstance(second, InferenceServerException)
        assert (second.status(), second.message()) == (
            "StatusCode.INTERNAL",
            "negative value at 1",
        )
        assert s.quiet()  # the stream ended: not the third response
    finally:
        s.close()
    s = Stream(server, {"triton_grpc_error": "true"})  # a model that is not decoupled
    try:
        x = grpcclient.InferInput("text_input", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"fail"], dtype=object))
        s.client.async_stream_infer("text", [x])
        (failed,) = s.take(1)
        assert (failed.status(), failed.message()) == ("StatusCode.INTERNAL", "gen failed")
    finally:
        s.close()


def test_an_output_of_the_wrong_type_is_the_models_error(stream: Stream) -> None:
    """Checked as a Python model's answer is: FP64 for an INT32 output is not truncated
    but refused, as that response's error; the request goes on to its end."""
    stream.send("repeat_bad_output", [1, 2], enable_empty_final_response=True)
    first, second, last = stream.take(3)
    message = (
        "output 'OUT' of model 'repeat_bad_output' has data type float64, which its "
        "config's INT32 cannot hold"
    )
    assert isinstance(first, InferenceServerException) and first.message() == message
    assert isinstance(second, InferenceServerException) and second.message() == message
    assert _final(last)


def test_a_model_that_is_not_decoupled_answers_a_stream_once_and_finally(
    stream: Stream,
) -> None:
    x = grpcclient.InferInput("text_input", [1], "BYTES")
    x.set_data_from_numpy(np.array([b"s"], dtype=object))
    stream.client.async_stream_infer("text", [x], enable_empty_final_response=True)
    (answer,) = stream.take(1)
    assert answer.as_numpy("text_output")[0] == b"echo:s"
    assert _final(answer)  # as Triton 2.51 marks it; no empty response follows
    assert stream.quiet()


def test_each_response_carries_the_parameters_the_model_gave_it(stream: Stream) -> None:
    """A decoupled model's response parameters reach the client with that response, the
    stream's final flag beside them (L0_backend_python parameters)."""
    stream.send("repeat_inline", [4, 7], parameters={"respond_with_parameters": True})
    answers = stream.take(2)
    assert _values(answers) == [(4, 0), (7, 1)]
    got = [_parameters(a.get_response()) for a in answers]
    assert got == [
        {"index": 0, "even": True, "of": "repeat", "triton_final_response": False},
        {"index": 1, "even": False, "of": "repeat", "triton_final_response": False},
    ]
    stream.send("repeat_inline", [4])  # and none where the model gives none
    (answer,) = stream.take(1)
    assert _parameters(answer.get_response()) == {"triton_final_response": False}


def _parameters(response: Any) -> dict[str, Any]:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.parameters.items()}


def _text_request(text: str) -> tuple[list[Any], list[Any]]:
    g = grpcclient.InferInput("text_input", [1], "BYTES")
    g.set_data_from_numpy(np.array([text.encode()], dtype=object))
    h = httpclient.InferInput("text_input", [1], "BYTES")
    h.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [g], [h]


def test_a_response_carries_the_parameters_the_model_gave_it(server: ShoalServer) -> None:
    """Over gRPC and HTTP, as Triton sends them; checked by pb_utils as Triton's Python
    backend checks them, whose refusal is the model's to answer."""
    given = {"bool": True, "str": "Hello World!", "int": 1024, "empty": ""}
    grpc_in, http_in = _text_request(json.dumps(given))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as g:
        result = g.infer("text", grpc_in)
        assert _parameters(result.get_response()) == given
        plain, _ = _text_request("plain")
        assert dict(g.infer("text", plain).get_response().parameters) == {}
        bad, _ = _text_request('{"int": 2, "float": 0.5}')
        with pytest.raises(InferenceServerException) as err:
            g.infer("text", bad)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message() == (
            "Expect parameters values to have type bool/int/str, found type <class 'float'>"
        )
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}") as h:
        answer = h.infer("text", http_in)
        assert answer.get_response()["parameters"] == given
        assert answer.as_numpy("text_output")[0] == b"echo:" + json.dumps(given).encode()


def test_a_sender_dropped_without_the_final_flag_ends_its_request(
    server: ShoalServer, stream: Stream
) -> None:
    stream.send("repeat_dropped", [1, 2], enable_empty_final_response=True)
    answers = stream.take(3)
    assert _values(answers[:2]) == [(1, 0), (2, 1)]
    assert _final(answers[2])
    assert "a response sender was dropped before its final flag" in server.log()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("raises", "RuntimeError: execute failed"),
        ("returns_list", "Python model 'repeat_returns_list_0_0' is using the decoupled mode "
         "and the execute function must return None."),
    ],
)  # fmt: skip
def test_a_failed_execute_ends_the_requests_it_left_open(
    stream: Stream, mode: str, message: str
) -> None:
    """The responses sent before the failure stand; the failure is the last answer."""
    stream.send(f"repeat_{mode}", [1, 2], enable_empty_final_response=True)
    answers = stream.take(3)
    assert _values(answers[:2]) == [(1, 0), (2, 1)]
    assert _final(answers[2])  # the model sent its final flag: the failure comes too late
    stream.send(f"repeat_{mode}", [], request_id="x")
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException)
    assert error.message() == (
        f"Failed to process the request(s) for model 'repeat_{mode}_0_0', message: {message}"
    )


def test_an_async_execute_runs_in_the_background_beside_the_next(stream: Stream) -> None:
    """Triton's stub runs a decoupled model's async execute in the background: one
    instance starts the next batch while the first awaits (L0_backend_python
    async_execute); an exception it raises later ends its requests left open."""
    stream.send("repeat_async", [1], delay_ms=3000, request_id="slow")
    time.sleep(0.2)
    stream.send("repeat_async", [2], delay_ms=0, request_id="fast")
    first, second = stream.take(2)
    assert (first.get_response().id, second.get_response().id) == ("fast", "slow")
    assert _values([first, second]) == [(2, 0), (1, 0)]
    stream.send("repeat_async", [], request_id="none")
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException)
    assert error.message() == (
        "Failed to process the request(s) for model 'repeat_async_0_0', message: "
        "ValueError: nothing to repeat"
    )


def test_a_unary_call_is_refused(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as err:
        client.infer("repeat_inline", _inputs([1]))
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    assert err.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )


@pytest.mark.parametrize("model", ["repeat_cancellable", "repeat_cancellable_inline"])
def test_a_cancelled_stream_reaches_the_model(server: ShoalServer, model: str) -> None:
    """The client closes its stream while the model still answers, from its thread or
    inside execute: the model sees its request cancelled and stops early; the instance
    serves the next stream."""
    before = server.log().count("cancelled after")
    s = Stream(server)
    s.send(model, list(range(200)), delay_ms=20)
    assert len(s.take(3)) == 3
    s.client.stop_stream(cancel_requests=True)
    s.client.close()
    deadline = time.monotonic() + 10
    while server.log().count("cancelled after") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count("cancelled after") == before + 1
    again = Stream(server)
    try:
        again.send(model, [7])
        assert _values(again.take(1)) == [(7, 0)]
    finally:
        again.close()


def test_a_worker_killed_mid_stream_fails_its_open_requests_alone(
    server: ShoalServer, stream: Stream
) -> None:
    """SIGKILL of the instance while its thread still answers: the open request ends
    with an error (UNAVAILABLE, naming the instance), another model's stream is
    untouched, and the restarted instance streams again."""
    other = Stream(server)
    try:
        stream.send("repeat_threaded", list(range(100)), delay_ms=20, request_id="doomed")
        other.send("repeat_cancellable", list(range(10)), delay_ms=20)
        assert len(stream.take(2)) == 2
        os.kill(server.worker_pid("repeat_threaded"), signal.SIGKILL)
        while not isinstance(last := stream.take(1)[0], InferenceServerException):
            pass
        assert "instance 'repeat_threaded_0_0'" in last.message()
        assert _values(other.take(10)) == [(v, v) for v in range(10)]
        server.wait_settled(("repeat_threaded",))
        deadline = time.monotonic() + 30
        while server.model_version("repeat_threaded")["state"] != "READY":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stream.send("repeat_threaded", [3])
        assert _values(stream.take(1)) == [(3, 0)]
    finally:
        other.close()


def test_statistics_count_requests_as_triton_counts_them(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    before = client.get_inference_statistics("repeat_last_final", as_json=True)["model_stats"][0]
    s = Stream(server)
    try:
        s.send("repeat_last_final", [1, 2, 3])
        s.send("repeat_last_final", [4])
        s.take(4)
    finally:
        s.close()
    after = client.get_inference_statistics("repeat_last_final", as_json=True)["model_stats"][0]
    grew = int(after["inference_stats"]["success"].get("count", 0)) - int(
        before["inference_stats"]["success"].get("count", 0)
    )
    assert grew == 2
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == 2


def test_plain_http_inference_is_refused(server: ShoalServer) -> None:
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]})
    status, answer = server.http("/v2/models/repeat_inline/infer", body.encode())
    assert (status, json.loads(answer)) == (
        501, {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    )  # fmt: skip


def _post(server: ShoalServer, path: str, doc: Any) -> tuple[int, str, bytes]:
    """Status, Content-Type and body of a POST of ``doc`` as JSON (raw bytes as they are)."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    req = urllib.request.Request(f"http://{server.url}{path}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return int(r.status), r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.headers["Content-Type"], e.read()


def test_generate_maps_keys_to_inputs_and_parameters(server: ShoalServer) -> None:
    doc = {"text_input": "hi", "id": "g1", "temperature": 0.5, "parameters": {"n": 2, "top_k": 3}}
    status, kind, body = _post(server, "/v2/models/text/generate", doc)
    assert (status, kind) == (200, "application/json")
    answer = json.loads(body)
    assert list(answer) == sorted(answer)
    params = json.loads(answer.pop("params"))
    assert params == {"id": "g1", "temperature": 0.5, "top_k": 3}
    assert answer == {
        "id": "g1", "model_name": "text", "model_version": "1", "score": [0.5, 1.25],
        "text_output": "echo:hiecho:hi",
    }  # fmt: skip
    status, _, body = _post(server, "/v2/models/text/versions/1/generate", {"text_input": "fail"})
    assert (status, json.loads(body)) == (400, {"error": "gen failed"})


@pytest.mark.parametrize(
    ("doc", "status", "message"),
    [
        ({}, 400, "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got "
         "0 inputs for model 'text'. Got input(s) [], but missing required input(s) "
         "['text_input']. Please provide all required input(s)."),
        ({"text_input": 5}, 500,
         "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
        ({"text_input": ["a", "b"]}, 400,
         "The schema can not convert input 'text_input' to tensor with proper shape"),
        ({"text_input": "a", "k": [1]}, 400,
         "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ({"text_input": "a", "parameters": {"text_input": "b"}}, 400,
         "Converting keyword: 'parameters': [request id: <id_unknown>] input 'text_input' "
         "already exists in request"),
        ({"text_input": "a", "parameters": [1]}, 500,
         "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object "
         "as object"),
        ({"text_input": "a", "n": "3"}, 500,
         "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ],
)  # fmt: skip
def test_generate_refuses_what_triton_refuses(
    server: ShoalServer, doc: Any, status: int, message: str
) -> None:
    for path in ("generate", "generate_stream"):  # plain JSON errors, before any event
        got, kind, body = _post(server, f"/v2/models/text/{path}", doc)
        assert (got, kind, json.loads(body)) == (status, "application/json", {"error": message})


def test_generate_of_a_decoupled_model_wants_exactly_one_response(server: ShoalServer) -> None:
    def generate(values: list[int]) -> tuple[int, Any]:
        status, _, body = _post(
            server, "/v2/models/repeat_errors/generate", {"IN": values, "DELAY_MS": 0}
        )
        return status, json.loads(body)

    assert generate([5]) == (200, {"IDX": 0, "OUT": 5, "model_name": "repeat_errors",
                                   "model_version": "1"})  # fmt: skip
    one = "generate expects model to produce exactly 1 response, use generate stream for model "
    one += "that generates various number of responses"
    assert generate([5, 6]) == (200, {"error": one})
    assert generate([]) == (200, {"error": one})
    assert generate([-1]) == (400, {"error": "negative value at 0"})


def _events(body: bytes) -> list[Any]:
    assert body.endswith(b"\n\n") or body == b""
    return [json.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]


def test_generate_stream_sends_each_response_as_an_event(server: ShoalServer) -> None:
    doc = {"IN": [1, -2, 3], "DELAY_MS": 10}
    status, kind, body = _post(server, "/v2/models/repeat_errors/generate_stream", doc)
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    base = {"model_name": "repeat_errors", "model_version": "1"}
    assert _events(body) == [
        {"IDX": 0, "OUT": 1, **base},
        {"error": "negative value at 1"},
        {"IDX": 2, "OUT": 3, **base},
    ]
    status, kind, body = _post(
        server, "/v2/models/repeat_errors/generate_stream", {"IN": [-1, 2], "DELAY_MS": 0}
    )
    assert status == 400 and _events(body) == [
        {"error": "negative value at 0"}, {"IDX": 1, "OUT": 2, **base}
    ]  # fmt: skip
    status, _, body = _post(
        server, "/v2/models/repeat_inline/generate_stream", {"IN": [], "DELAY_MS": 0}
    )
    assert (status, body) == (200, b"")  # the final flag alone: no event
    status, _, body = _post(server, "/v2/models/text/generate_stream", {"text_input": "x"})
    (event,) = _events(body)
    assert status == 200 and event["text_output"] == "echo:x"


def test_an_unload_lets_the_models_threads_finish_their_streams(tmp_path: Path) -> None:
    """Explicit model control: unloading a decoupled model whose thread still answers
    runs its finalize (which waits for its threads, as Triton's examples do): the open
    request gets all its responses, and the unload returns."""
    write_repository(tmp_path)
    with served(tmp_path, "--model-control-mode=explicit", "--load-model=repeat_threaded") as srv:
        s = Stream(srv)
        try:
            s.send("repeat_threaded", list(range(20)), delay_ms=25)
            assert len(s.take(2)) == 2
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
            client.unload_model("repeat_threaded")
            assert _values(s.take(18)) == [(v, v) for v in range(2, 20)]
            assert not client.is_model_ready("repeat_threaded")
        finally:
            s.close()


def test_a_closed_event_stream_reaches_the_model(server: ShoalServer) -> None:
    """The SSE client goes away after the first event: the model, still answering from
    its thread, sees its request cancelled."""
    before = server.log().count("cancelled after")
    conn = http.client.HTTPConnection(server.url, timeout=20)
    body = json.dumps({"IN": list(range(200)), "DELAY_MS": 20})
    conn.request("POST", "/v2/models/repeat_cancellable/generate_stream", body)
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")
    conn.close()
    deadline = time.monotonic() + 10
    while server.log().count("cancelled after") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count("cancelled after") == before + 1
