"""A decoupled Python model with Oldest sequence batching (Triton QA's ``sequence_py``
shape): each request of a sequence answers through its response sender, the model sees
the request's correlation ID and flags, and a sequence's requests run in order. Direct
sequence batching stays refused for decoupled models (its null rows have no sender).

Python models with implicit state (``sequence_batching { state [...] }``), decoupled or
not: the state input is an input of each request, the output state a tensor of its
response (Triton's Python backend has no implicit state; shoal's does)."""

from __future__ import annotations

import json
import queue
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served

# Two responses per request: the sequence's running count of requests, then the final
# flag; START resets the count.
COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


class TritonPythonModel:
    def initialize(self, args):
        self.counts = {}

    def execute(self, requests):
        for request in requests:
            sid = request.correlation_id()
            if request.flags() & START:
                self.counts[sid] = 0
            self.counts[sid] += 1
            out = pb_utils.Tensor("OUT", np.array([[self.counts[sid]]], np.int32))
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=FINAL)
        return None
"""
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ {strategy} max_sequence_idle_microseconds: 10000000 }}
"""


# OUT: the state plus IN; the output state is that sum, left out of the response when IN
# is 0 (the state stays what it was).
ACCUMULATOR = """
import json
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            tensors = [pb_utils.Tensor("OUT", state + x)]
            if x.any():
                tensors.append(pb_utils.Tensor("STATE_OUT", state + x))
            response = pb_utils.InferenceResponse(tensors)
            if self.decoupled:
                request.get_response_sender().send(response, FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses
"""
STATE = """
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
"""


# Request rescheduling (iterative sequences): each request runs IN times, rescheduled
# after each run but the last; OUT: [its runs, its flags on the first run, on the last].
# IN -1: a response for a request it rescheduled (Triton refuses it). Runs are counted by
# the correlation ID the server gives each request (an id() of the request object could
# be a later request's once a refused one is gone).
ITERATIVE = """
import numpy as np
import triton_python_backend_utils as pb_utils

AGAIN = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            want = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            runs, first = self.runs.get(request.correlation_id(), (0, request.flags()))
            runs += 1
            out = np.array([runs, first, request.flags()], np.int32)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)])
            if runs < abs(want):
                self.runs[request.correlation_id()] = (runs, first)
                request.set_release_flags(AGAIN)
                responses.append(response if want < 0 else None)
            else:
                self.runs.pop(request.correlation_id(), None)
                responses.append(response)
        return responses
"""
# Triton's decoupled example: IN responses, counting down, rescheduled after each but
# the last, which is final.
ITERATIVE_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            left = self.left.get(request.correlation_id(), n) - 1
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left <= 0:
                self.left.pop(request.correlation_id(), None)
                sender.send(out, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.left[request.correlation_id()] = left
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
"""
# A decoupled iterative sequence with implicit state and a START control: each run adds
# one to the state and sends [state, START]; rescheduled until the state reaches IN.
ITERATIVE_STATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy() + 1
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            out = pb_utils.Tensor("OUT", np.concatenate([state, start]).astype(np.int32))
            response = pb_utils.InferenceResponse([out, pb_utils.Tensor("STATE_OUT", state)])
            sender = request.get_response_sender()
            if state[0] < n:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
ITERATIVE_STATE_SEQUENCE = """
model_transaction_policy { decoupled: true }
sequence_batching {
  iterative_sequence: true
  control_input [ { name: "START"
    control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
}
"""
ITERATIVE_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""
ITERATIVE_SEQUENCE = "sequence_batching { iterative_sequence: true }"


def _write_iterative(repo: Path, name: str, source: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.pbtxt").write_text(ITERATIVE_CONFIG.format(name=name, extra=extra))


def _write(repo: Path, name: str, strategy: str, source: str = COUNTER) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    config = CONFIG.format(name=name, strategy=strategy)
    if source is ACCUMULATOR and "oldest" not in strategy:  # (Direct: not decoupled)
        config = config.replace("model_transaction_policy { decoupled: true }\n", "")
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("decoupled-sequences")
    _write(repo, "counter", "oldest { max_candidate_sequences: 4 }")
    _write(repo, "direct", "")
    _write(repo, "accumulator", STATE.format(), ACCUMULATOR)
    _write(repo, "streamed_accumulator", "oldest { } " + STATE.format(), ACCUMULATOR)
    _write_iterative(repo, "iterative", ITERATIVE, ITERATIVE_SEQUENCE)
    _write_iterative(repo, "rescheduler", ITERATIVE, "")  # (no iterative sequences)
    decoupled = "model_transaction_policy { decoupled: true }\n" + ITERATIVE_SEQUENCE
    _write_iterative(repo, "iterative_decoupled", ITERATIVE_DECOUPLED, decoupled)
    _write_iterative(repo, "iterative_state", ITERATIVE_STATE, ITERATIVE_STATE_SEQUENCE)
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        srv.wait_settled(("counter", "direct", "accumulator", "streamed_accumulator"))
        srv.wait_settled(("iterative", "rescheduler", "iterative_decoupled", "iterative_state"))
        yield srv


def test_each_sequence_counts_its_own_requests_in_order(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        x = grpcclient.InferInput("IN", [1, 1], "INT32")
        x.set_data_from_numpy(np.zeros([1, 1], np.int32))
        sent = [(7, True, False), (8, True, False), (7, False, False), (8, False, False),
                (7, False, True), (8, False, True)]  # fmt: skip
        for i, (sid, start, end) in enumerate(sent):
            client.async_stream_infer(
                "counter", [x], request_id=str(i), sequence_id=sid,
                sequence_start=start, sequence_end=end,
            )  # fmt: skip
        got: dict[int, list[int]] = {7: [], 8: []}
        for _ in sent:
            result = answers.get(timeout=20)
            assert not isinstance(result, Exception), result
            sid = sent[int(result.get_response().id)][0]
            got[sid].append(int(result.as_numpy("OUT")[0][0]))
        assert got == {7: [1, 2, 3], 8: [1, 2, 3]}
    finally:
        client.stop_stream()
        client.close()


def test_direct_sequence_batching_is_refused_for_a_decoupled_model(server: ShoalServer) -> None:
    state = server.model_version("direct")
    assert state["state"] == "UNAVAILABLE"
    assert "without preserve_ordering or Direct sequence batching" in state["reason"]


def _sums(client: Any, model: str, sent: list[tuple[int, int]], stream: queue.Queue | None) -> dict:
    """Each sequence's OUT values for ``sent`` (sequence ID, IN), in order, the first of
    each sequence its START."""
    started: set[int] = set()
    got: dict[int, list[int]] = {}
    for i, (sid, value) in enumerate(sent):
        x = grpcclient.InferInput("IN", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[value]], np.int32))
        start = sid not in started
        started.add(sid)
        if stream is None:
            result = client.infer(model, [x], sequence_id=sid, sequence_start=start)
        else:
            client.async_stream_infer(model, [x], request_id=str(i), sequence_id=sid,
                                      sequence_start=start)  # fmt: skip
            result = stream.get(timeout=20)
            assert not isinstance(result, Exception), result
        got.setdefault(sid, []).append(int(result.as_numpy("OUT")[0][0]))
    return got


# two interleaved sequences; IN 0 leaves the output state out of the response
SENT = [(21, 1), (22, 10), (21, 2), (22, 0), (21, 0), (22, 5), (21, 4)]
SUMS = {21: [1, 3, 3, 7], 22: [10, 10, 15]}


def test_a_python_models_output_state_is_its_sequences_next_state_input(
    server: ShoalServer,
) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        assert _sums(client, "accumulator", SENT, None) == SUMS
        # a new START begins again from the initial state (zeros)
        assert _sums(client, "accumulator", [(21, 6)], None) == {21: [6]}


def test_a_decoupled_python_models_responses_carry_its_state(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        assert _sums(client, "streamed_accumulator", SENT, answers) == SUMS
    finally:
        client.stop_stream()
        client.close()


def _in(value: int, mod: Any = grpcclient) -> Any:
    x = mod.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([value], np.int32))
    return x


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_rescheduled_request_runs_again_until_the_model_releases_it(
    server: ShoalServer, protocol: str
) -> None:
    """``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` and None in the
    responses: the request runs again, with no flags (START on its first run, as the
    iterative sequence batcher gives it), until its answer comes; requests rescheduled
    together run again together, each answered once."""
    url, mod = server.client(protocol)
    answers: dict[int, Any] = {}

    def call(n: int) -> None:  # (a client each: tritonclient.http's are not thread-safe)
        client = mod.InferenceServerClient(url)
        answers[n] = client.infer("iterative", [_in(n, mod)]).as_numpy("OUT").tolist()

    threads = [threading.Thread(target=call, args=(n,)) for n in (1, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    start = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert answers == {1: [1, start, start], 3: [3, start, 0], 5: [5, start, 0]}


def test_rescheduling_is_refused_in_tritons_words_where_it_is_not_allowed(
    server: ShoalServer,
) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as refused:
        client.infer("rescheduler", [_in(2)])  # no iterative_sequence in its config
    assert (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model "
        "is not configured to handle such a flag."
    ) in refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("iterative", [_in(-2)])  # a response for the rescheduled request
    assert (
        "Expected a None object in the execute function return list for reschduled request, "
        "found type '<class 'shoal.workers.pb_utils.InferenceResponse'>'."
    ) in refused.value.message()
    assert client.infer("iterative", [_in(2)]).as_numpy("OUT").tolist() == [2, 1, 0]


def test_a_decoupled_model_streams_from_each_run_of_a_rescheduled_request(
    server: ShoalServer,
) -> None:
    """Triton's iterative_sequence example: one response per run, the last final."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        client.async_stream_infer("iterative_decoupled", [_in(3)], enable_empty_final_response=True)
        got = []
        while True:
            result = answers.get(timeout=20)
            assert not isinstance(result, Exception), result
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                got.append(int(result.as_numpy("OUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
        assert got == [2, 1, 0]
    finally:
        client.stop_stream()
        client.close()


def test_each_run_of_a_rescheduled_request_carries_its_state_and_controls(
    server: ShoalServer,
) -> None:
    """As Triton's sequence batcher gives a rescheduled request: START on its first run
    only, and as state what its earlier runs' responses gave; two such requests at once
    (one instance, one slot: the second takes the slot the first's first run left) keep
    their states apart."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for n in (3, 2):
            client.async_stream_infer("iterative_state", [_in(n)], request_id=str(n))
        got: dict[str, list[list[int]]] = {"3": [], "2": []}
        for _ in range(5):
            result = answers.get(timeout=20)
            assert not isinstance(result, Exception), result
            got[result.get_response().id].append(result.as_numpy("OUT").tolist())
        assert got == {"3": [[1, 1], [2, 0], [3, 0]], "2": [[1, 1], [2, 0]]}
    finally:
        client.stop_stream()
        client.close()


def _counts(server: ShoalServer, model: str) -> tuple[int, int, int, int]:
    status, body = server.http(f"/v2/models/{model}/stats")
    assert status == 200
    (stats,) = json.loads(body)["model_stats"]
    inference = stats["inference_stats"]
    return (
        inference["success"]["count"],
        inference["fail"]["count"],
        stats["execution_count"],
        stats["inference_count"],
    )


def test_each_run_of_a_rescheduled_request_counts_in_the_statistics(server: ShoalServer) -> None:
    """As Triton counts an iterative sequence's request (each run goes through its
    scheduler again): a success, an inference and an execution per run."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    before = _counts(server, "iterative")
    assert client.infer("iterative", [_in(3)]).as_numpy("OUT").tolist() == [3, 1, 0]
    after = _counts(server, "iterative")
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 0, 3, 3]
