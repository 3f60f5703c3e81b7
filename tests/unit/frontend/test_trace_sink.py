"""Triton's trace file as a frontend writes it (shoal/frontend/trace_sink.py): on its own
thread, in parts of log_frequency traces, the rest at exit; frontend k > 0 apart."""

from __future__ import annotations

import json
from pathlib import Path

from shoal.frontend.trace_sink import TraceSink
from shoal.ipc.messages import TraceRecord, TraceSetting


def _ids(path: Path) -> list[int]:
    return [e["id"] for e in json.loads(path.read_text()) if "model_name" in e]


def test_parts_of_log_frequency_traces_then_the_rest_at_exit(tmp_path: Path) -> None:
    setting = TraceSetting(("TIMESTAMPS",), 1, -1, 2, str(tmp_path / "t.json"))
    sink = TraceSink(0)
    for i in (1, 2, 3):
        sink.put(TraceRecord(i, "m", 1, stamps=[("REQUEST_START", i)]), setting, False, "triton")
    sink.close()
    assert (_ids(tmp_path / "t.json.0"), _ids(tmp_path / "t.json.1")) == ([1, 2], [3])
    assert not (tmp_path / "t.json").exists()


def test_one_file_at_exit_and_a_part_when_the_count_runs_out(tmp_path: Path) -> None:
    setting = TraceSetting(("TIMESTAMPS",), 1, 2, 0, str(tmp_path / "t.json"))
    sink = TraceSink(3)  # frontend 3 of several: its own file
    sink.put(TraceRecord(1, "m"), setting, False, "triton")
    sink.put(TraceRecord(2, "m"), setting, True, "triton")  # the count's last
    sink.put(TraceRecord(3, "m"), TraceSetting(("TIMESTAMPS",), file=str(tmp_path / "u")), False,
             "triton")  # fmt: skip
    sink.close()
    assert _ids(tmp_path / "t.json.frontend3.0") == [1, 2]
    assert _ids(tmp_path / "u.frontend3") == [3]


def test_a_replaced_settings_traces_go_to_the_file_and_its_successors_to_parts(
    tmp_path: Path,
) -> None:
    """As Triton's trace count check (L0_trace): traces under the old setting are kept for
    the file itself once an update replaced it; the new setting's, when its count runs
    out, go to a part of their own."""
    from shoal.ipc.messages import TraceTable

    path = str(tmp_path / "t.json")
    old = TraceSetting(("TIMESTAMPS",), 1, -1, 0, path)
    new = TraceSetting(("TIMESTAMPS",), 1, 2, 0, path)
    sink = TraceSink(0)
    sink.put(TraceRecord(1, "m"), old, False, "triton")
    sink.put(TraceRecord(2, "m"), old, False, "triton")
    sink.follow(TraceTable(default=new))  # the update: `old` is retired
    sink.put(TraceRecord(3, "m"), new, False, "triton")
    sink.put(TraceRecord(4, "m"), new, True, "triton")  # the count's last
    sink.close()
    assert (_ids(tmp_path / "t.json"), _ids(tmp_path / "t.json.0")) == ([1, 2], [3, 4])
    assert not (tmp_path / "t.json.1").exists()
