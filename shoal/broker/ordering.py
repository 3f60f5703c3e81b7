"""preserve_ordering: answers leave in the order their requests arrived (pure).

Each admitted request of such a version gets a sequence number; its answer (from a
worker, or an error from the broker) is held until every earlier request has one. A
request that will never be answered (its frontend exited) is released as a skip, so the
sequence never stalls.
"""

from __future__ import annotations

Answer = tuple[bytes, bytes | None]  # (frontend, encoded InferResponse; None = skip)


class OrderedRelease:
    def __init__(self) -> None:
        self._assigned = 0
        self._next = 1
        self._held: dict[int, Answer] = {}

    def assign(self) -> int:
        self._assigned += 1
        return self._assigned

    def answer(self, seq: int, frontend: bytes, payload: bytes | None) -> list[Answer]:
        """Record the answer of ``seq``; returns the answers that may leave now, in order."""
        if seq < self._next:
            return []
        # The first answer stands (a worker may answer, then die before reporting done).
        self._held.setdefault(seq, (frontend, payload))
        out: list[Answer] = []
        while self._next in self._held:
            out.append(self._held.pop(self._next))
            self._next += 1
        return out

    def __len__(self) -> int:
        return len(self._held)
