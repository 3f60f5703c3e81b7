"""Where a frontend's finished traces go: a thread of their own, so no request waits on a
file or an exporter. ``put`` only queues.

Triton mode writes Triton's trace file: a JSON array holding, per trace, an object with
its id, model name and version (its request id and parent id where it has them), then
one object per timestamp, ``{"id": .., "timestamps": [{"name": .., "ns": ..}]}``, and at
TENSORS level one per tensor. With ``log_frequency`` N, every N traces go to
``<file>.<i>`` (i = 0, 1, ...); with 0, all go to ``<file>`` when the frontend stops.
Frontend k > 0 of a server writes ``<file>.frontend<k>`` (and its indexed parts), so that
no two processes write one file. Opentelemetry mode hands each trace to the exporter
(shoal/frontend/otel_export.py).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from shoal.ipc import messages as m

log = logging.getLogger("shoal.frontend.trace")
_STOP = None


def triton_entries(r: m.TraceRecord) -> list[dict[str, Any]]:
    """``r`` and its children as the objects of Triton's trace file, in its order."""
    head: dict[str, Any] = {"id": r.id, "model_name": r.model, "model_version": r.version}
    if r.request_id:
        head["request_id"] = r.request_id
    if r.parent_id:
        head["parent_id"] = r.parent_id
    out = [head]
    for name, ns in r.stamps:
        out.append({"id": r.id, "timestamps": [{"name": name, "ns": ns}]})
    for activity, name, dtype, shape, data in r.tensors:
        tensor = {"name": name, "data": data, "shape": ",".join(map(str, shape)), "dtype": dtype}
        out.append({"id": r.id, "activity": activity, "tensor": tensor})
    for c in r.children:
        out.extend(triton_entries(c))
    return out


@dataclass
class _TraceFile:
    """One trace file: its next part's index, and the traces kept for the file itself
    (a retired setting's, when it has no log frequency), written when the frontend stops."""

    index: int = 0
    kept: list[dict[str, Any]] = field(default_factory=list)
    kept_traces: int = 0


@dataclass
class _Pending:
    """One setting's traces not written yet, as Triton keeps them per setting."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    traces: int = 0


def file_name(path: str, frontend: int) -> str:
    return path if frontend == 0 else f"{path}.frontend{frontend}"


_Item = tuple[m.TraceRecord, m.TraceSetting, bool, str] | m.TraceTable | None


class TraceSink:
    """Writes (or exports) finished traces on its own thread, started on the first.

    As Triton, each setting keeps its own traces: every ``log_frequency`` of them, or
    the last its ``count`` allows, go to the file's next part (``<file>.<i>``). A setting
    that an update replaced (``follow``) is retired: what it still holds goes to the next
    part if it has a log frequency, else it is kept for ``<file>`` itself, which is
    written, with every retired and still current setting's rest, when the frontend
    stops."""

    def __init__(self, frontend: int) -> None:
        self.frontend = frontend
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._files: dict[str, _TraceFile] = {}
        self._pending: dict[tuple[str, m.TraceSetting], _Pending] = {}
        self.options: dict[str, str] = {}
        self._exporter: Any = None

    def follow(self, table: m.TraceTable) -> None:
        """The broker's trace settings changed: the exporter's options with them (an
        exporter already made keeps its own), and the settings no longer in effect are
        retired, in order with the traces queued before. In opentelemetry mode the
        exporter is made now, as Triton's is at start: its batch span processor's
        schedule runs from then, not from the first trace."""
        self.options = table.options
        if table.mode == "opentelemetry" and self._exporter is None:
            self._start()
        if self._thread is not None:
            self._queue.put(table)

    def put(self, record: m.TraceRecord, setting: m.TraceSetting, last: bool, mode: str) -> None:
        self._start()
        self._queue.put((record, setting, last, mode))

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trace-sink", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is left (Triton writes at exit), stop the thread and the exporter."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)
        for path, setting in list(self._pending):
            self._retire(path, setting)
        for path, f in self._files.items():
            if f.kept_traces:
                _dump(path, f.kept)
        if self._exporter is not None:
            self._exporter.shutdown()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if isinstance(item, m.TraceTable):
                if item.mode == "opentelemetry" and self._exporter is None:
                    self._exporter = _exporter(self.options, self.frontend)
                live = {item.default, *item.models.values()}
                for path, setting in list(self._pending):
                    if setting not in live:
                        self._retire(path, setting)
                continue
            record, setting, last, mode = item
            try:
                if mode == "opentelemetry":
                    self._export(record)
                else:
                    self._keep(record, setting, last)
            except Exception:  # a trace must not stop the next ones
                log.exception("failed to write trace %d", record.id)

    def _export(self, record: m.TraceRecord) -> None:
        if self._exporter is None:
            self._exporter = _exporter(self.options, self.frontend)
        self._exporter.export(record)

    def _keep(self, record: m.TraceRecord, setting: m.TraceSetting, last: bool) -> None:
        path = file_name(setting.file, self.frontend)
        p = self._pending.setdefault((path, setting), _Pending())
        p.entries.extend(triton_entries(record))
        p.traces += 1
        if last or (setting.log_frequency and p.traces >= setting.log_frequency):
            self._part(path, p)

    def _part(self, path: str, p: _Pending) -> None:
        """``p``'s traces to ``path``'s next part, then forgotten."""
        f = self._files.setdefault(path, _TraceFile())
        _dump(f"{path}.{f.index}", p.entries)
        f.index += 1
        p.entries, p.traces = [], 0

    def _retire(self, path: str, setting: m.TraceSetting) -> None:
        p = self._pending.pop((path, setting))
        if not p.traces:
            return
        if setting.log_frequency:
            self._part(path, p)
            return
        f = self._files.setdefault(path, _TraceFile())
        f.kept.extend(p.entries)
        f.kept_traces += p.traces


def _exporter(options: dict[str, str], frontend: int) -> Any:
    """The OpenTelemetry exporter (imported here: only opentelemetry mode pays for it)."""
    from shoal.frontend.otel_export import OtelExporter

    return OtelExporter(options, frontend)


def _dump(target: str, entries: list[dict[str, Any]]) -> None:
    try:
        with open(target, "w") as out:
            json.dump(entries, out)
    except OSError as exc:
        log.error("failed creating trace file: %s", exc)
