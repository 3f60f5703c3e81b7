"""Which running requests of a Python model (not decoupled) their clients cancelled
(shoal/workers/cancels.py): what the model's ``request.is_cancelled()`` reads."""

from __future__ import annotations

import threading

from shoal.ipc import messages as m
from shoal.workers import pb_utils
from shoal.workers.cancels import RunningCancels


def _item(frontend: bytes, req_id: int) -> m.WorkItem:
    return m.WorkItem(frontend, m.InferRequest(req_id, "model", 1, [], []))


def test_a_model_sees_the_cancels_of_its_batch_alone_and_reads_them_while_it_runs() -> None:
    pending: list[tuple[bytes, int]] = []  # what the broker sent, not read yet
    reads: list[int] = []

    def read() -> None:
        reads.append(len(pending))
        while pending:
            cancels.cancel(*pending.pop())

    cancels = RunningCancels(read)
    first, second = cancels.begin([_item(b"f1", 1), _item(b"f2", 1)])
    requests = [pb_utils.InferenceRequest([], [], cancelled=w) for w in (first, second)]
    assert [r.is_cancelled() for r in requests] == [False, False]
    pending.append((b"f1", 1))  # sent while execute runs: read when the model asks
    assert requests[0].is_cancelled() and not requests[1].is_cancelled()
    cancels.cancel(b"f9", 1)  # no request of this batch
    cancels.frontend_gone(b"f2")
    assert requests[1].is_cancelled()
    seen: list[bool] = []
    third = cancels.begin([_item(b"f3", 2)])[0]
    pending.append((b"f3", 2))
    thread = threading.Thread(target=lambda: seen.append(third()))  # not the loop's thread
    thread.start()
    thread.join()
    assert seen == [False] and pending  # another thread never reads the loop's socket
    assert third()
    cancels.end()
    assert not requests[0].is_cancelled() and not third()  # the batch is over
    assert pb_utils.InferenceRequest([], []).is_cancelled() is False
