"""Python models' own metrics (``pb_utils.MetricFamily`` / ``Metric``): the contract between
the worker that keeps them and the frontends that show them on ``/metrics``.

Each Python model's worker writes all of them, as one msgspec snapshot, to
``<runtime dir>/metrics/<its pid>.msgpack`` when they changed (``SnapshotWriter``: in
place, behind a sequence number, so a reader never takes half of one), and removes the
file when it stops. A frontend reads every snapshot at each scrape, with no message
between processes. A file whose pid no longer runs (a killed worker) is skipped, and
removed by ``sweep``.

Triton keeps one registry for the whole server; shoal's instances are processes, so
``merge`` makes one of theirs: a family is the one created first (its kind and
description; another kind of the same name elsewhere is left out, with a warning), and
the metrics with the same labels add up (counters and histograms) or show the value set
last (gauges).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from pathlib import Path
from typing import Literal

import msgspec

from shoal.ipc.lifecycle import pid_alive

log = logging.getLogger("shoal.metrics")

Kind = Literal["counter", "gauge", "histogram"]
_FOLDER = "metrics"


class MetricSample(msgspec.Struct, array_like=True):
    """One metric of a family: its labels (sorted by name), and its value (counter, gauge)
    or its observations (histogram: ``counts`` per bucket of ``buckets``' upper bounds,
    then one for +Inf; not cumulative). ``updated_ns``: CLOCK_MONOTONIC at its last change."""

    labels: list[tuple[str, str]]
    value: float = 0.0
    updated_ns: int = 0
    buckets: list[float] = []
    counts: list[int] = []
    total: float = 0.0  # a histogram's sum of observations


class FamilySnapshot(msgspec.Struct, array_like=True):
    name: str
    description: str
    kind: Kind
    created_ns: int
    metrics: list[MetricSample] = []


class Snapshot(msgspec.Struct, array_like=True):
    pid: int
    families: list[FamilySnapshot] = []


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Snapshot)


def folder(runtime_dir: Path) -> Path:
    return runtime_dir / _FOLDER


def snapshot_path(runtime_dir: Path, pid: int) -> Path:
    return folder(runtime_dir) / f"{pid}.msgpack"


_HEADER = struct.Struct("<QQ")  # a sequence number (odd while a write is under way), length
_READ_TRIES = 8


class SnapshotWriter:
    """A worker's snapshot file, rewritten in place (no new file per write: cheap on any
    file system): the header's sequence number is odd while the body changes, so a
    reader that saw the same even number before and after reading the body has a whole
    one (a seqlock). One writer per file; the caller serializes its writes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._seq = 0

    def write(self, snapshot: Snapshot) -> None:
        body = _encoder.encode(snapshot)
        os.pwrite(self._fd, _HEADER.pack(self._seq + 1, len(body)), 0)
        os.pwrite(self._fd, body, _HEADER.size)
        self._seq += 2
        os.pwrite(self._fd, _HEADER.pack(self._seq, len(body)), 0)

    def close(self) -> None:
        os.close(self._fd)


def _read(path: Path) -> Snapshot | None:
    """A whole snapshot of ``path`` (None: none yet, or a writer too busy to catch)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for _ in range(_READ_TRIES):
            head = os.pread(fd, _HEADER.size, 0)
            if len(head) < _HEADER.size:
                return None
            seq, length = _HEADER.unpack(head)
            if seq % 2 == 0:
                body = os.pread(fd, length, _HEADER.size)
                if os.pread(fd, _HEADER.size, 0) == head and len(body) == length:
                    return _decoder.decode(body)
    except (OSError, msgspec.DecodeError):
        return None
    finally:
        os.close(fd)
    return None


def read_all(runtime_dir: Path) -> list[Snapshot]:
    """The snapshots of the workers that run now (one caught mid-write is skipped: the
    next scrape has it)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(folder(runtime_dir).glob("*.msgpack")):
            snap = _read(path)
            if snap is not None and pid_alive(snap.pid):
                found.append(snap)
    return found


def sweep(runtime_dir: Path) -> list[Path]:
    """Remove the snapshots of workers that no longer run; returns them."""
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for path in folder(runtime_dir).glob("*.msgpack"):
            if path.stem.isdigit() and not pid_alive(int(path.stem)):
                path.unlink(missing_ok=True)
                gone.append(path)
    return gone


def merge(snapshots: list[Snapshot]) -> list[FamilySnapshot]:
    """One registry of several workers' (see the module's docstring), families by name."""
    families: dict[str, FamilySnapshot] = {}
    samples: dict[str, dict[tuple[tuple[str, str], ...], MetricSample]] = {}
    ordered = sorted(
        (f for s in snapshots for f in s.families), key=lambda f: (f.created_ns, f.name)
    )
    for fam in ordered:
        first = families.setdefault(
            fam.name, FamilySnapshot(fam.name, fam.description, fam.kind, fam.created_ns)
        )
        if first.kind != fam.kind:
            log.warning(
                "metric family '%s' is a %s in one model and a %s in another: the %s is shown",
                fam.name, first.kind, fam.kind, first.kind,
            )  # fmt: skip
            continue
        mine = samples.setdefault(fam.name, {})
        for sample in fam.metrics:
            key = tuple(sample.labels)
            if key not in mine:
                mine[key] = msgspec.structs.replace(sample, counts=list(sample.counts))
            else:
                _add(mine[key], sample, fam.kind)
    for name, fam in families.items():
        fam.metrics = sorted(samples.get(name, {}).values(), key=lambda s: s.labels)
    return sorted(families.values(), key=lambda f: f.name)


def _add(into: MetricSample, other: MetricSample, kind: Kind) -> None:
    if kind == "gauge":
        if other.updated_ns > into.updated_ns:
            into.value, into.updated_ns = other.value, other.updated_ns
        return
    into.updated_ns = max(into.updated_ns, other.updated_ns)
    if kind == "counter":
        into.value += other.value
    elif into.buckets == other.buckets:  # (another model's own bounds: its first is kept)
        into.counts = [a + b for a, b in zip(into.counts, other.counts, strict=True)]
        into.total += other.total
