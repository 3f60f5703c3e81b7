"""Whether the running broker still answers ``shoal serve`` (pure: the launcher passes
the time in and owns the socket and the process).

A broker that exits is seen through its pidfd; one that is stuck (a deadlock, a loop
that never returns, SIGSTOP) has not exited, and nothing else would ever restart it.
The launcher pings it (any query: it answers every peer within milliseconds, even
under load) and kills one that stays silent ``silent_s``; it is then restarted as any
dead broker. The frontends give a silent broker up sooner (10 s: their requests fail
with 503 from then on), so this bound only decides when service comes back. A broker
that has not answered yet since it started is reading the repository, which may take
long: it is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A broker silent this long, once it has answered, is stuck.
SILENT_S = 30.0
PING_S = 1.0


@dataclass
class BrokerWatch:
    silent_s: float = SILENT_S
    ping_s: float = PING_S
    last_heard: float | None = None  # None: not heard since it started
    last_ping: float = float("-inf")

    def started(self) -> None:
        """A broker (re)started, or the one watched was killed: none is judged yet."""
        self.last_heard = None

    def heard(self, now: float) -> None:
        self.last_heard = now

    def ping_due(self, now: float) -> bool:
        """Whether to ping now (counted as done)."""
        if now - self.last_ping < self.ping_s:
            return False
        self.last_ping = now
        return True

    def stuck(self, now: float) -> bool:
        return self.last_heard is not None and now - self.last_heard > self.silent_s
