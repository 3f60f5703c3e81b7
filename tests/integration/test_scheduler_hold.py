"""Triton's scheduler-delay test hooks end to end: a server started with
``TRITONSERVER_DELAY_SCHEDULER=2`` holds each batching model's requests until two are
queued, then batches them together, and from then on batches as usual. The models are
Python models that answer, for each request, how many requests their ``execute`` got and
the READY control they were fed, so a Direct sequence batch shows its null requests."""

from __future__ import annotations

import json
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer, served

COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ready = pb_utils.get_input_tensor_by_name(r, "READY")
            ready = ready.as_numpy() if ready is not None else np.ones([1, 1], np.int32)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNT", np.full([1, 1], len(requests), np.int32)),
                pb_utils.Tensor("READY_OUT", ready.astype(np.int32).reshape([1, 1])),
            ]))
        return out
"""
IO = """
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_OUT" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SEQUENCE = """
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
"""


def _write(repo: Path, name: str, batching: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    config = f'name: "{name}"\nbackend: "python"\n{IO}{batching}'
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(COUNTING))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("hold-repo")
    _write(repo, "seq", SEQUENCE)
    _write(repo, "dyn", "dynamic_batching { }")
    with served(repo, env={"TRITONSERVER_DELAY_SCHEDULER": "2"}) as srv:
        yield srv


def _infer(url: str, model: str, **sequence: Any) -> tuple[int, int]:
    """(how many requests the model's execute got, the READY it was fed)."""
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.ones([1, 1], np.int32))
        result = client.infer(model, [inp], **sequence)
        return int(result.as_numpy("COUNT")[0][0]), int(result.as_numpy("READY_OUT")[0][0])
    finally:
        client.close()


def _stats(url: str, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return dict(stats)


class _Call(threading.Thread):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.args_, self.kw = args, kw
        self.answer: tuple[int, int] | None = None
        self.start()

    def run(self) -> None:
        self.answer = _infer(*self.args_, **self.kw)

    def result(self) -> tuple[int, int]:
        self.join(30)
        assert self.answer is not None
        return self.answer


def test_a_dynamic_batcher_holds_its_requests_until_the_count(server: ShoalServer) -> None:
    one = _Call(server.url, "dyn")
    time.sleep(1.0)
    assert one.is_alive()  # held: one queued of two
    two = _Call(server.url, "dyn")
    assert one.result() == (2, 1) and two.result() == (2, 1)
    assert _infer(server.url, "dyn") == (1, 1)  # let go for good: one request is a batch


def test_a_sequence_batcher_holds_then_gives_python_models_null_requests(
    server: ShoalServer,
) -> None:
    """Two sequences, held until both STARTs are queued, run as one batch (slots 0 and
    1). Then sequence 2's request alone spans rows 0-1: the model gets a null request
    (READY false) in row 0, as Triton gives it, and the batch counts 2 in batch_stats
    but 1 inference."""
    url = server.url
    one = _Call(url, "seq", sequence_id=1, sequence_start=True)
    time.sleep(1.0)
    assert one.is_alive()
    two = _Call(url, "seq", sequence_id=2, sequence_start=True)
    assert one.result() == (2, 1) and two.result() == (2, 1)
    assert _infer(url, "seq", sequence_id=1) == (1, 1)  # slot 0: one row
    before = _stats(url, "seq")
    assert _infer(url, "seq", sequence_id=2) == (2, 1)
    after = _stats(url, "seq")
    assert after["inference_count"] - before["inference_count"] == 1
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert sizes.get(2, 0) - old.get(2, 0) == 1
