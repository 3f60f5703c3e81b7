"""A decoupled Python model with Oldest sequence batching (Triton QA's ``sequence_py``
shape): each request of a sequence answers through its response sender, the model sees
the request's correlation ID and flags, and a sequence's requests run in order. Direct
sequence batching stays refused for decoupled models (its null rows have no sender).

Python models with implicit state (``sequence_batching { state [...] }``), decoupled or
not: the state input is an input of each request, the output state a tensor of its
response (Triton's Python backend has no implicit state; shoal's does)."""

from __future__ import annotations

import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

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
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        srv.wait_settled(("counter", "direct", "accumulator", "streamed_accumulator"))
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
