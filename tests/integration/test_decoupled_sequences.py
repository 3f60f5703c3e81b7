"""A decoupled Python model with Oldest sequence batching (Triton QA's ``sequence_py``
shape): each request of a sequence answers through its response sender, the model sees
the request's correlation ID and flags, and a sequence's requests run in order. Direct
sequence batching stays refused for decoupled models (its null rows have no sender)."""

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


def _write(repo: Path, name: str, strategy: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(COUNTER))
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, strategy=strategy))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("decoupled-sequences")
    _write(repo, "counter", "oldest { max_candidate_sequences: 4 }")
    _write(repo, "direct", "")
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        srv.wait_settled(("counter", "direct"))
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
