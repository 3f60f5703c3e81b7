"""Request rescheduling, as Triton's Python backend offers it for iterative sequences:
a model's ``execute`` calls ``request.set_release_flags(
pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` and the request runs again in a later
``execute`` (the same request object, its flags 0), until the model releases it without
that flag. A model that is not decoupled returns None for it in its response list; a
decoupled one keeps its response sender open (responses sent meanwhile go out at once).

Only a model with ``sequence_batching { iterative_sequence: true }`` may: elsewhere the
request fails with Triton's words (``NOT_CONFIGURED``). The worker holds a rescheduled
request itself, and runs the ones it holds, together, as soon as its loop is free (after
a batch the broker sent, never inside one). The broker holds the request open meanwhile,
as it holds a decoupled model's streams (BatchDone's ``open``, then StreamsEnded), so a
worker that dies fails it. Each run again gets its sequence's controls and state for a
later run (shoal/workers/sequence_io.py) and is reported to the broker (RerunDone: its
statistics, as Triton counts each run). ``RescheduledRequests`` is the worker's list (no
sockets): one thread (the worker loop's) uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from shoal.ipc import messages as m

Key = tuple[bytes, int]  # (frontend, req_id)

#: Triton core's refusal of the flag where the model has no iterative sequences.
NOT_CONFIGURED: Final = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is "
    "not configured to handle such a flag."
)


class Rescheduled:
    """What ``execute_requests`` gives for a request the model rescheduled."""


RESCHEDULED: Final = Rescheduled()


def not_none(response: Any) -> str:
    """Triton's words (and its typo) for a response given to a rescheduled request."""
    return (
        "Expected a None object in the execute function return list for reschduled "
        f"request, found type '{type(response)}'."
    )


@dataclass
class Pending:
    item: m.WorkItem
    tensors: dict[str, np.ndarray]  # (what its sequence I/O fed it)
    request: Any  # its pb_utils.InferenceRequest: the model's, run again as it is


class RescheduledRequests:
    def __init__(self) -> None:
        self.pending: list[Pending] = []
        self.ended: list[Key] = []  # held open by the broker, since ended: StreamsEnded

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, item: m.WorkItem, tensors: dict[str, np.ndarray], request: Any) -> None:
        self.pending.append(Pending(item, tensors, request))

    def take(self) -> list[Pending]:
        """The requests to run again now (their flags reset, as Triton's)."""
        taken, self.pending = self.pending, []
        for p in taken:
            p.request._rerun()
        return taken

    def drop(self, frontend: bytes, req_id: int) -> bool:
        """The client of a held request gave up: it is not run again, and it ends."""
        for i, p in enumerate(self.pending):
            if (p.item.frontend, p.item.request.req_id) == (frontend, req_id):
                del self.pending[i]
                self.ended.append((frontend, req_id))
                return True
        return False

    def take_ended(self) -> list[Key]:
        keys, self.ended = self.ended, []
        return keys
