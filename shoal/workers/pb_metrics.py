"""``pb_utils.MetricFamily`` and ``Metric``: a Python model's own Prometheus metrics
(counters, gauges, histograms), with Triton's semantics and words.

The worker's registry holds them and, after each change, writes them all to the worker's
snapshot file (about 10 µs), which the frontends read at each scrape
(shoal/ipc/custom_metrics.py): the next scrape shows a change. As in Triton:

* ``MetricFamily(name, description, kind)`` of a name the registry has returns that
  family (its first description kept); of another kind, it is refused.
* ``family.Metric(labels=None, buckets=None)``: two metrics of the same labels are one;
  a histogram needs ``buckets`` (strictly increasing upper bounds), the others refuse them.
* A metric is shown while a ``Metric`` object of it lives, a family while a
  ``MetricFamily`` object of it lives. A family let go of first ends its metrics: an
  operation on one raises "Invalid metric operation as the corresponding 'MetricFamily'
  has been deleted. ...".
* ``increment`` (counters: never below zero), ``set`` (gauges), ``observe``
  (histograms), ``value`` (counters and gauges); each refuses the others in Triton's words.

Any thread of the model may use them (one lock). ``value()`` is this instance's own: the
page sums the instances' counters (shoal/ipc/custom_metrics.py).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import re
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.ipc import custom_metrics as cm
from shoal.workers.pb_errors import TritonModelException


class MetricKind(enum.Enum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_NAMES: dict[MetricKind, cm.Kind] = {
    MetricKind.COUNTER: "counter",
    MetricKind.GAUGE: "gauge",
    MetricKind.HISTOGRAM: "histogram",
}
_TRITON_KIND = {
    MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
    MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
    MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM",
}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted."
)
_Labels = tuple[tuple[str, str], ...]


class _Sample:
    def __init__(self, labels: _Labels, buckets: list[float] | None) -> None:
        self.labels = labels
        self.value = 0.0
        self.updated_ns = time.monotonic_ns()
        self.buckets = list(buckets or [])
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.holders = 0  # Metric objects of it

    def snapshot(self) -> cm.MetricSample:
        return cm.MetricSample(
            list(self.labels), self.value, self.updated_ns, list(self.buckets),
            list(self.counts), self.total,
        )  # fmt: skip


class _Family:
    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.created_ns = time.monotonic_ns()
        self.samples: dict[_Labels, _Sample] = {}
        self.holders = 0  # MetricFamily objects of it


class Registry:
    """The worker's families; after each change (under ``lock``), a snapshot of them all
    goes to ``writer`` (the worker's file, set at load), as Triton's registry changes at
    once: the next scrape shows it, even one the model makes itself."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.families: dict[str, _Family] = {}
        self.writer: cm.SnapshotWriter | None = None
        self.pid = 0
        self._held = 0  # ``batched`` blocks under way: their changes wait for the last
        self._dirty = False

    def changed(self) -> None:
        """(Under ``lock``.) Write the registry."""
        if self._held:
            self._dirty = True
            return
        if self.writer is not None:
            with contextlib.suppress(OSError):  # (a full disk: the next change tries again)
                self.writer.write(self.snapshot())

    def snapshot(self) -> cm.Snapshot:
        with self.lock:
            families = [
                cm.FamilySnapshot(
                    f.name,
                    f.description,
                    _KIND_NAMES[f.kind],
                    f.created_ns,
                    [s.snapshot() for s in f.samples.values()],
                )
                for f in self.families.values()
            ]
        return cm.Snapshot(self.pid, families)


registry = Registry()


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Several changes, one snapshot write at the end (shoal's, for its own models'
    metrics: a generative model's engine updates a dozen of them per step)."""
    with registry.lock:
        registry._held += 1
        try:
            yield
        finally:
            registry._held -= 1
            if not registry._held and registry._dirty:
                registry._dirty = False
                registry.changed()


def publish_to(path: Path, pid: int) -> None:
    """Write the registry to ``path`` now and after each change (the worker's, at load)."""
    with registry.lock:
        registry.pid = pid
        registry.writer = cm.SnapshotWriter(path)
        registry.changed()  # (an empty snapshot says this worker has none)


def stop_publishing() -> None:
    """No more writes (the worker is stopping: it removes its file)."""
    with registry.lock:
        if registry.writer is not None:
            registry.writer.close()
            registry.writer = None


def _error() -> type[Exception]:
    return TritonModelException


class Metric:
    """One metric of a family (made by ``MetricFamily.Metric``)."""

    def __init__(self, family: _Family, sample: _Sample) -> None:
        self._family = family
        self._sample = sample
        self._cleared = False

    def _check(self, what: str, allowed: tuple[MetricKind, ...], op: str) -> _Sample:
        if self._cleared:
            raise _error()(f"Failed to {what} metric value: {_CLEARED}")
        kind = self._family.kind
        if kind not in allowed:
            raise _error()(
                f"Failed to {what} metric value: {_TRITON_KIND[kind]} does not support {op}"
            )
        return self._sample

    def increment(self, value: float) -> None:
        value = _number(value)
        with registry.lock:
            sample = self._check("increment", (MetricKind.COUNTER, MetricKind.GAUGE), "Increment")
            if self._family.kind is MetricKind.COUNTER and value < 0:
                raise _error()(
                    "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can "
                    "only be incremented monotonically by non-negative values."
                )
            sample.value += value
            self._changed(sample)

    def set(self, value: float) -> None:
        value = _number(value)
        with registry.lock:
            sample = self._check("set", (MetricKind.GAUGE,), "Set")
            sample.value = value
            self._changed(sample)

    def observe(self, value: float) -> None:
        value = _number(value)
        with registry.lock:
            sample = self._check("observe", (MetricKind.HISTOGRAM,), "Observe")
            at = next((i for i, b in enumerate(sample.buckets) if value <= b), len(sample.buckets))
            sample.counts[at] += 1
            sample.total += value
            self._changed(sample)

    def value(self) -> float:
        with registry.lock:
            return self._check("get", (MetricKind.COUNTER, MetricKind.GAUGE), "Value").value

    def _changed(self, sample: _Sample) -> None:
        sample.updated_ns = time.monotonic_ns()
        registry.changed()

    def _clear(self) -> None:
        """Let go of the sample (under the lock): the last holder takes it off the page."""
        if self._cleared:
            return
        self._cleared = True
        self._sample.holders -= 1
        if self._sample.holders == 0:
            self._family.samples.pop(self._sample.labels, None)
            registry.changed()

    def __del__(self) -> None:
        with registry.lock:
            self._clear()


class MetricFamily:
    """A Prometheus family of the model's; see the module's docstring."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    _family: _Family | None = None  # (a refused one has none)

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): 'name' and 'description' must be str")
        if not isinstance(kind, MetricKind):
            raise TypeError(f"MetricFamily(): 'kind' cannot be {type(kind).__name__}")
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        with registry.lock:
            family = registry.families.get(name)
            if family is not None and family.kind is not kind:
                raise _error()(
                    "Error when creating MetricFamily: Family name already exists with "
                    "different type"
                )
            if family is None:
                if not _NAME.match(name):
                    raise _error()("Error when creating MetricFamily: Invalid metric name")
                family = registry.families[name] = _Family(name, description, kind)
                registry.changed()
            family.holders += 1
            self._family = family

    def Metric(self, labels: dict[str, str] | None = None, buckets: Any = None) -> Metric:
        assert self._family is not None
        family = self._family
        key = _labels(labels)
        if buckets is not None:
            if not isinstance(buckets, list):
                raise _error()("Failed to create metric. Buckets must be a list.")
            if family.kind is not MetricKind.HISTOGRAM:
                raise _error()("Failed to create metric. Unexpected buckets found.")
            bounds = [float(b) for b in buckets]
            if any(a >= b for a, b in itertools.pairwise(bounds)):
                raise _error()(
                    "Error when creating Metric: Bucket Boundaries must be strictly sorted"
                )
        elif family.kind is MetricKind.HISTOGRAM:
            raise _error()("Failed to create metric. Missing required buckets.")
        with registry.lock:
            sample = family.samples.get(key)
            if sample is None:
                sample = family.samples[key] = _Sample(key, bounds if buckets is not None else None)
                registry.changed()
            sample.holders += 1
            metric = Metric(family, sample)
            self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        family = self._family
        if family is None:
            return
        with registry.lock:
            for metric in list(self._metrics):
                metric._clear()
            family.holders -= 1
            if family.holders == 0 and registry.families.get(family.name) is family:
                del registry.families[family.name]
                registry.changed()


def _number(value: Any) -> float:
    """A metric operation's value, as Triton's bindings take it (a number; TypeError else)."""
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        raise TypeError(f"a metric's value cannot be {type(value).__name__}")
    return float(value)


def _labels(labels: Any) -> _Labels:
    if labels is None:
        return ()
    if not isinstance(labels, dict):
        raise _error()("Failed to create metric. Labels must be a dictionary.")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.match(key) or key.startswith("__"):
            raise _error()("Error when creating Metric: Invalid label name")
        if not isinstance(value, str):
            raise _error()(f"Error when creating Metric: label '{key}' must be a string")
    return tuple(sorted(labels.items()))
