"""Triton's scheduler-delay test hooks, as a pure class: ``TRITONSERVER_DELAY_SCHEDULER=N``
holds a model's batches until N of its requests are queued, and
``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=B`` (sequence models) until B more wait in the
sequence backlog too. Triton's QA suites (L0_sequence_batcher, L0_batcher, ...) set them
so that requests sent together are batched together, whatever the timing.

As Triton (core's dynamic_batch_scheduler.cc and sequence_batch_scheduler.cc) reads them:

* the variables are read once, when the server starts; unset, empty, 0 or not a number
  (``atoi``) mean no hold;
* the dynamic batcher counts the requests in its queue; a Direct sequence batcher counts
  the requests queued in the slots of all its instances and, separately, the requests
  of the sequences waiting in its backlog; an Oldest one (a dynamic batcher per
  instance in Triton) counts, per instance, the requests of that instance's sequences;
* a hold is let go once, for good: a model whose count is reached batches as it
  normally would from then on (the counts do not apply again when the queue empties).

A held model's queue delays and the share of its slots that must be used are not
counted while it is held; its queue timeouts and idle sequences still are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DELAY_VAR = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_VAR = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


def _atoi(text: str | None) -> int:
    """C's ``atoi`` as Triton applies it: leading blanks, a sign, digits; else 0. A
    negative count holds nothing (Triton casts it to a huge size_t; no test sets one)."""
    match = re.match(r"[ \t\n\r\f\v]*([+-]?[0-9]+)", text or "")
    return max(0, int(match.group(1))) if match else 0


@dataclass(frozen=True)
class HoldCounts:
    """How many queued requests release a model's batches (0: no hold)."""

    queued: int = 0
    backlog: int = 0  # sequence models only: requests waiting in the backlog

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HoldCounts:
        return cls(_atoi(env.get(DELAY_VAR)), _atoi(env.get(BACKLOG_VAR)))


class SchedulerHold:
    """One hold, let go for good once its counts are reached."""

    def __init__(self, counts: HoldCounts) -> None:
        self.counts = counts
        # Triton applies the backlog count only inside its DELAY_SCHEDULER check: with
        # no queued count there is no hold at all.
        self.released = counts.queued <= 0

    def holds(self, queued: int, backlog: int = 0) -> bool:
        """Whether batches are still held with ``queued`` requests queued (and
        ``backlog`` in the backlog); releases the hold for good once both are reached."""
        if self.released:
            return False
        if queued >= self.counts.queued and backlog >= self.counts.backlog:
            self.released = True
            return False
        return True


NO_HOLD = HoldCounts()
