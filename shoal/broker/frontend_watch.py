"""Which frontends have stopped talking to the broker (pure: the broker passes the time
in and owns the sockets, the pidfds and the kill).

A frontend that exits is seen through its pidfd; one that is stuck (its event loop
blocked, SIGSTOP) has not exited, keeps its ports, and its clients would wait on it for
ever. Every frontend sends the broker something at least every second from its event
loop (requests, or a ping when it has nothing else to say: shoal/dataplane/broker_client.py),
so one silent ``silent_s`` is stuck: the broker kills it, and whoever runs it (``shoal
serve``, supervisord) starts another, as for any frontend that dies.

Silence counts only while the broker itself listens: a turn of its loop that came long
after the one before (the broker was stopped, or busy) does not count against anyone,
as the messages sent meanwhile may still be unread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A frontend silent this long is stuck (``--frontend-silence-timeout-secs``).
SILENT_S = 30.0
#: Frontends ping at least this often (the broker's own loop turns every 0.25 s idle):
#: a gap between two looks longer than this is time the broker was away.
AWAY_S = 2.0


@dataclass
class FrontendWatch:
    silent_s: float = SILENT_S  # 0: never judged
    last_heard: dict[bytes, float] = field(default_factory=dict)
    last_look: float | None = None

    def expect(self, frontend: bytes, now: float) -> None:
        """``frontend`` (greeted, or found running at the broker's start) is judged from now."""
        if self.silent_s > 0:
            self.last_heard[frontend] = now

    def heard(self, frontend: bytes, now: float) -> None:
        if frontend in self.last_heard:
            self.last_heard[frontend] = now

    def forget(self, frontend: bytes) -> None:
        """It exited, or it was killed: judged no more."""
        self.last_heard.pop(frontend, None)

    def stuck(self, now: float) -> list[bytes]:
        """The frontends silent ``silent_s``, forgotten here (the caller kills them)."""
        away = 0.0 if self.last_look is None else now - self.last_look
        self.last_look = now
        if away > AWAY_S:  # not counted: the broker did not listen meanwhile
            for frontend in self.last_heard:
                self.last_heard[frontend] += away
        found = [f for f, heard in self.last_heard.items() if now - heard > self.silent_s]
        for frontend in found:
            del self.last_heard[frontend]
        return found
