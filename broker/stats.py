"""Per-version inference statistics with Triton's counting rules (pure).

* ``inference_count`` adds each successful request's batch size; ``execution_count``
  adds one per model execution. Two batch-1 requests run together: success 2,
  inference_count 2, execution_count 1.
* A request's ``compute_*`` durations are those of the batch it ran in; ``queue`` is
  from its arrival at the broker to its dispatch; ``success``/``fail`` from arrival to
  its answer.
* ``batch_stats`` counts executions per batch size.
"""

from __future__ import annotations

import time

from ipc import messages as m


class VersionStats:
    def __init__(self, name: str, version: int) -> None:
        self.s = m.ModelStats(name, str(version))
        self._batches: dict[int, m.BatchStats] = {}

    def queued(self, waited_ns: int) -> None:
        self.s.inference_stats.queue.add(waited_ns)

    def failed(self, elapsed_ns: int) -> None:
        self.s.inference_stats.fail.add(elapsed_ns)

    def executed(self, done: m.BatchDone, ok_elapsed_ns: list[int], ok_samples: int) -> None:
        """One execution; ``ok_elapsed_ns`` holds each successful request's time since
        arrival, ``ok_samples`` the sum of their batch sizes."""
        st = self.s.inference_stats
        n = len(ok_elapsed_ns)
        self.s.execution_count += 1
        self.s.inference_count += ok_samples
        self.s.last_inference = int(time.time() * 1000)
        for ns in ok_elapsed_ns:
            st.success.add(ns)
        st.compute_input.add(done.input_ns * n, n)
        st.compute_infer.add(done.infer_ns * n, n)
        st.compute_output.add(done.output_ns * n, n)
        b = self._batches.get(done.batch_size)
        if b is None:
            b = self._batches[done.batch_size] = m.BatchStats(done.batch_size)
        b.compute_input.add(done.input_ns)
        b.compute_infer.add(done.infer_ns)
        b.compute_output.add(done.output_ns)

    def snapshot(self) -> m.ModelStats:
        self.s.batch_stats = [self._batches[k] for k in sorted(self._batches)]
        return self.s
