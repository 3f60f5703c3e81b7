"""When ``shoal serve`` restarts a child that exited, and when it gives up (pure: no
processes, no clock; the launcher passes in how long the child ran).

A child that ran at least ``stable_after_s`` starts its backoff from the beginning
again; one that exits sooner counts as one more *quick exit in a row* and waits longer.
A role the server cannot serve without (the broker, a frontend) has a bound: past
``give_up_after`` quick exits in a row it is a crash loop, and the server stops rather
than spin. A worker has none: one model's crash loop must not stop the others, and its
requests get 503 meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: tuple[float, ...]
    stable_after_s: float = 30.0
    give_up_after: int | None = None  # quick exits in a row; None: never

    def after_exit(self, quick_exits: int, ran_s: float) -> tuple[int, float | None]:
        """A child that had exited ``quick_exits`` times in a row before ran ``ran_s``
        seconds and exited: its quick exits in a row now (this one counted), and the
        delay before its restart (None: give up)."""
        exits = 1 if ran_s >= self.stable_after_s else quick_exits + 1
        if self.give_up_after is not None and exits > self.give_up_after:
            return exits, None
        return exits, self.backoff_s[min(exits - 1, len(self.backoff_s) - 1)]


#: A worker: restarted for ever, at most every 5 s.
WORKER: Final = RestartPolicy((0.5, 1.0, 2.0, 5.0))
#: A frontend: as a worker, but five quick exits in a row stop the server.
FRONTEND: Final = RestartPolicy((0.5, 1.0, 2.0, 5.0), give_up_after=5)
#: The broker: every request waits for it, so its first restart is at once (service
#: is back within seconds); five quick exits in a row stop the server.
BROKER: Final = RestartPolicy((0.1, 0.5, 1.0, 2.0, 5.0), give_up_after=5)


def for_role(role: str) -> RestartPolicy:
    if role == "broker":
        return BROKER
    return FRONTEND if role.startswith("frontend") else WORKER
