"""Per-version inference statistics with Triton's counting rules (pure).

* ``inference_count`` adds each successful request's batch size; ``execution_count``
  adds one per model execution. Two batch-1 requests run together: success 2,
  inference_count 2, execution_count 1.
* A request's ``compute_*`` durations are those of the batch it ran in; ``queue`` is
  from its arrival at the broker to its dispatch; ``success``/``fail`` from arrival to
  its answer.
* ``batch_stats`` counts executions per batch size.
* Failures are also counted by reason (``m.FAILURE_REASONS``), for the metrics.
* A request answered from a frontend's response cache is a success and a ``cache_hit``
  (its queue time 0), not an inference nor an execution; one looked up in vain counts
  its lookup as a ``cache_miss`` once it succeeds, and in its request time.
* Once a frontend serves latency summaries, each success's phases (``m.PHASES``) are
  kept for a minute, for their quantiles (Triton's summaries have a 60 s window).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Final

from shoal.ipc import messages as m
from shoal.ipc.messages import FailureReason

SUMMARY_WINDOW_S: Final = 60.0
_WINDOW_CAP: Final = 4096  # the latest observations kept per phase: bounded memory, and a
# scrape sorts at most this many per phase (about 0.25 ms each, in the broker's loop)


class _Window:
    """The last minute's observations of one phase (µs), at most _WINDOW_CAP."""

    def __init__(self) -> None:
        # two deques in step (not one of pairs): a scrape sorts the values alone
        self.times: deque[float] = deque(maxlen=_WINDOW_CAP)
        self.values: deque[int] = deque(maxlen=_WINDOW_CAP)

    def add(self, now: float, us: int) -> None:
        self.times.append(now)
        self.values.append(us)

    def quantiles(self, qs: list[float], now: float) -> list[float]:
        while self.times and now - self.times[0] > SUMMARY_WINDOW_S:
            self.times.popleft()
            self.values.popleft()
        if not self.values:
            return [math.nan] * len(qs)
        values = sorted(self.values)
        n = len(values)
        # a quantile outside [0, 1] (a frontend's bug) gets NaN, not an exception
        return [values[max(math.ceil(q * n) - 1, 0)] if 0 <= q <= 1 else math.nan for q in qs]


class VersionStats:
    def __init__(self, name: str, version: int) -> None:
        self.s = m.ModelStats(name, str(version))
        self._batches: dict[int, m.BatchStats] = {}
        self.failures: dict[str, int] = dict.fromkeys(m.FAILURE_REASONS, 0)
        self.windows: dict[str, _Window] | None = None  # None: summaries not served

    def keep_windows(self) -> None:
        if self.windows is None:
            self.windows = {phase: _Window() for phase in (*m.PHASES, *m.CACHE_PHASES)}

    def summaries(self, qs: list[float], now: float) -> dict[str, list[float]]:
        if self.windows is None or not qs:
            return {}
        return {phase: w.quantiles(qs, now) for phase, w in self.windows.items()}

    def queued(self, waited_ns: int, now: float) -> None:
        self.s.inference_stats.queue.add(waited_ns)
        if self.windows is not None:
            self.windows["queue"].add(now, waited_ns // 1000)

    def cache_hit(self, request_ns: int, hit_ns: int, now: float) -> None:
        st = self.s.inference_stats
        st.success.add(request_ns)
        st.queue.add(0)
        st.cache_hit.add(hit_ns)
        if self.windows is not None:
            self.windows["request"].add(now, request_ns // 1000)
            self.windows["queue"].add(now, 0)
            self.windows["cache_hit"].add(now, hit_ns // 1000)

    def cache_missed(self, lookup_ns: int, now: float) -> None:
        st = self.s.inference_stats
        st.success.ns += lookup_ns  # the request's time includes its lookup, as Triton's
        st.cache_miss.add(lookup_ns)
        if self.windows is not None:
            self.windows["cache_miss"].add(now, lookup_ns // 1000)

    def ensemble_done(self, request_ns: int, ok: bool, batch_size: int, now: float) -> None:
        """An ensemble request ended: Triton counts it once, after its last step (a
        success: one execution of its batch; a failure: reason OTHER). Its compute times
        are its steps', counted in their models' statistics, not here."""
        if not ok:
            self.failed(request_ns, "OTHER")
            return
        self.queued(0, now)
        size = max(batch_size, 1)
        self.executed(m.BatchDone(0, size), [request_ns], size, now)

    def failed(self, elapsed_ns: int, reason: FailureReason) -> None:
        self.s.inference_stats.fail.add(elapsed_ns)
        self.failures[reason] += 1

    def executed(
        self, done: m.BatchDone, ok_elapsed_ns: list[int], ok_samples: int, now: float
    ) -> None:
        """One execution, reported at ``now`` (monotonic); ``ok_elapsed_ns`` holds each
        successful request's time since arrival, ``ok_samples`` the sum of their batch
        sizes."""
        st = self.s.inference_stats
        n = len(ok_elapsed_ns)
        self.s.execution_count += 1
        self.s.inference_count += ok_samples
        self.s.last_inference = int(time.time() * 1000)
        for ns in ok_elapsed_ns:
            st.success.add(ns)
        if self.windows is not None:
            w = self.windows
            for ns in ok_elapsed_ns:
                w["request"].add(now, ns // 1000)
                w["compute_input"].add(now, done.input_ns // 1000)
                w["compute_infer"].add(now, done.infer_ns // 1000)
                w["compute_output"].add(now, done.output_ns // 1000)
        st.compute_input.add(done.input_ns * n, n)
        st.compute_infer.add(done.infer_ns * n, n)
        st.compute_output.add(done.output_ns * n, n)
        b = self._batches.get(done.batch_size)
        if b is None:
            b = self._batches[done.batch_size] = m.BatchStats(done.batch_size)
        b.compute_input.add(done.input_ns)
        b.compute_infer.add(done.infer_ns)
        b.compute_output.add(done.output_ns)

    def reran(self, msg: m.RerunDone, now: float) -> None:
        """Requests the model rescheduled ran again (shoal/workers/rescheduling.py):
        each run counts as a request (its time: the run's, with no queue time) and the
        run as one execution, as Triton counts each run of an iterative sequence's
        request (it goes through the scheduler again)."""
        done = msg.done
        took = done.input_ns + done.infer_ns + done.output_ns
        for _ in range(msg.failed):
            self.failed(took, "BACKEND")
        for _ in range(msg.ok):
            self.queued(0, now)
        if msg.ok:
            self.executed(done, [took] * msg.ok, msg.ok_samples, now)

    def snapshot(self) -> m.ModelStats:
        self.s.batch_stats = [self._batches[k] for k in sorted(self._batches)]
        return self.s
