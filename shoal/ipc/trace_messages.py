"""The messages of tracing (shoal/dataplane/tracing.py), part of shoal.ipc.messages:
a traced request's way and its answer's (in the place of ``hops``), a finished trace's
record, and the trace settings the broker keeps and sends to the frontends."""

from __future__ import annotations

import msgspec


class TracedWay(msgspec.Struct):
    """A traced request's way (its ``InferRequest.hops``; shoal/dataplane/tracing.py):
    its trace's id, which a Python model's BLS requests name as their parent, and the
    stamps the processes add as ``hops``' (``append``). A map on the wire where an
    untraced request's hops are an array: an untraced request encodes as before."""

    id: int
    stamps: list[int]
    # opentelemetry mode: the W3C traceparent of the request's model span, which a
    # Python model reads (request.trace().get_context()); "" otherwise
    context: str = ""

    def append(self, ns: int) -> None:
        self.stamps.append(ns)


class TraceRecord(msgspec.Struct, array_like=True):
    """One trace as the file and the exporter show it (shoal/dataplane/tracing.py):
    its id, its parent's (0: none), the request's model, version and id, its
    timestamps ``(name, monotonic ns)`` in order, what the batch and the processes it
    crossed were (``attributes``), and the traces it spawned (ensemble steps, BLS)."""

    id: int
    model: str
    version: int = -1
    parent_id: int = 0
    request_id: str = ""
    stamps: list[tuple[str, int]] = []
    attributes: dict[str, int | str | list[int]] = {}
    tensors: list[tuple[str, str, str, list[int], str]] = []  # activity, name, dtype, shape, data
    children: list[TraceRecord] = []


class TracedAnswer(msgspec.Struct):
    """A traced request's answer's ``hops`` (a map where others' are an array): the
    request's stamps with the worker's receipt and send, as an untraced measured one's,
    then the worker's part (shoal/workers/trace_note.py): its compute phases, what ran
    it and the batch it ran in, and the BLS traces its model spawned."""

    hops: list[int]
    stamps: list[tuple[str, int]]
    attributes: dict[str, int | str | list[int]] = {}
    children: list[TraceRecord] = []


class TraceSetting(msgspec.Struct, array_like=True, frozen=True):
    """One trace setting (the trace extension's): the levels traced (none: OFF), one
    request in ``rate`` sampled, ``count`` traces at most (-1: no limit), the file and
    how many traces each of its parts holds (0: one file, written at exit)."""

    levels: tuple[str, ...] = ()
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""


class TraceTable(msgspec.Struct, array_like=True):
    """Broker -> frontends (and BLS connections): the server's trace settings, one truth
    kept by the broker (shoal/configs/trace_settings.py), sent in each Welcome and again
    whenever they change. ``models``: the settings in effect for each model that has its
    own; the others follow ``default``. ``options``: the mode's --trace-config settings."""

    mode: str = "triton"
    default: TraceSetting = TraceSetting()
    models: dict[str, TraceSetting] = {}
    options: dict[str, str] = {}
