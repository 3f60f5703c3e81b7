"""pb_utils.MetricFamily / Metric (shoal/workers/pb_metrics.py): Triton's semantics and
words, the snapshot a worker writes, and the page several workers' snapshots make
(shoal/ipc/custom_metrics.py, shoal/frontend/prometheus_text.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.frontend.prometheus_text import Text, custom_families
from shoal.ipc import custom_metrics as cm
from shoal.workers import pb_metrics
from shoal.workers import pb_utils as pb


@pytest.fixture(autouse=True)
def published(tmp_path: Path) -> Iterator[Path]:
    """A fresh registry, written to a file as a worker's."""
    pb_metrics.registry = pb_metrics.Registry()
    path = cm.snapshot_path(tmp_path, os.getpid())
    pb_metrics.publish_to(path, os.getpid())
    yield tmp_path
    pb_metrics.stop_publishing()


def _page(runtime_dir: Path) -> str:
    t = Text()
    custom_families(t, cm.merge(cm.read_all(runtime_dir)))
    return t.render()


def test_counter_gauge_and_their_refusals_in_tritons_words() -> None:
    counters = pb.MetricFamily("c", "a counter", pb.MetricFamily.COUNTER)
    counter = counters.Metric({"k": "v"})
    counter.increment(2023.0)
    assert counter.value() == 2023.0
    with pytest.raises(pb.TritonModelException, match="can only be incremented monotonically"):
        counter.increment(-1)
    with pytest.raises(pb.TritonModelException, match="COUNTER does not support Set"):
        counter.set(1)
    with pytest.raises(pb.TritonModelException, match="COUNTER does not support Observe"):
        counter.observe(1)
    gauges = pb.MetricFamily("g", "a gauge", pb.MetricFamily.GAUGE)
    gauge = gauges.Metric()
    gauge.increment(2023.0)
    gauge.increment(-23.5)
    assert gauge.value() == 1999.5
    gauge.set(999.9)
    assert gauge.value() == 999.9
    with pytest.raises(pb.TritonModelException, match="GAUGE does not support Observe"):
        gauge.observe(0.05)
    gauge.set(np.float32(2.5))  # (numpy numbers are numbers)
    assert gauge.value() == 2.5
    with pytest.raises(TypeError):
        gauge.set("1")


def test_histogram_buckets_and_refusals(published: Path) -> None:
    family = pb.MetricFamily("h", "a histogram", pb.MetricFamily.HISTOGRAM)
    with pytest.raises(pb.TritonModelException, match="Missing required buckets"):
        family.Metric(labels={})
    with pytest.raises(pb.TritonModelException, match="strictly sorted"):
        family.Metric(labels={}, buckets=[2.5, 0.1])
    with pytest.raises(pb.TritonModelException, match="strictly sorted"):
        family.Metric(labels={}, buckets=[1, 1, 2])
    with pytest.raises(pb.TritonModelException, match="Unexpected buckets"):
        pb.MetricFamily("c", "", pb.MetricFamily.COUNTER).Metric(buckets=[1.0])
    metric = family.Metric(labels={"a": "1"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for kind in ("Value", "Increment", "Set"):
        with pytest.raises(pb.TritonModelException, match=f"HISTOGRAM does not support {kind}"):
            {"Value": metric.value, "Increment": lambda: metric.increment(1),
             "Set": lambda: metric.set(1)}[kind]()  # fmt: skip
    for datum in (0.05, 1.5, 6.0):
        metric.observe(datum)
    page = _page(published)
    assert 'h_count{a="1"} 3' in page
    assert 'h_sum{a="1"} 7.55' in page
    for le, n in (("0.1", 1), ("1", 1), ("2.5", 2), ("5", 2), ("10", 3), ("+Inf", 3)):
        assert f'h_bucket{{a="1",le="{le}"}} {n}' in page
    (parsed,) = text_string_to_metric_families(page)
    assert parsed.type == "histogram"


def test_a_family_of_a_known_name_is_that_family_and_another_kind_is_refused(
    published: Path,
) -> None:
    first = pb.MetricFamily("dup", "first description", pb.MetricFamily.COUNTER)
    second = pb.MetricFamily("dup", "second description", pb.MetricFamily.COUNTER)
    with pytest.raises(pb.TritonModelException, match="already exists with different type"):
        pb.MetricFamily("dup", "x", pb.MetricFamily.GAUGE)
    one, two = first.Metric({"k": "1"}), second.Metric({"k": "1"})
    one.increment(5)
    assert two.value() == 5  # the same labels: the same metric
    del first
    page = _page(published)
    assert "# HELP dup first description" in page and "second description" not in page
    assert 'dup{k="1"} 5' in page


def test_a_family_let_go_of_first_ends_its_metrics_and_leaves_the_page(published: Path) -> None:
    family = pb.MetricFamily("gone", "d", pb.MetricFamily.GAUGE)
    metric = family.Metric(labels={"x": "y"})
    assert "gone" in _page(published)
    del family
    with pytest.raises(pb.TritonModelException, match="'MetricFamily' has been deleted"):
        metric.set(10)
    with pytest.raises(pb.TritonModelException, match="'MetricFamily' has been deleted"):
        metric.value()
    assert "gone" not in _page(published)


def test_bad_names_and_labels_are_refused() -> None:
    with pytest.raises(pb.TritonModelException, match="Invalid metric name"):
        pb.MetricFamily("1bad", "", pb.MetricFamily.COUNTER)
    family = pb.MetricFamily("ok", "", pb.MetricFamily.COUNTER)
    with pytest.raises(pb.TritonModelException, match="Labels must be a dictionary"):
        family.Metric(labels=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(pb.TritonModelException, match="Invalid label name"):
        family.Metric(labels={"a-b": "c"})
    with pytest.raises(TypeError):
        pb.MetricFamily("k", "", "COUNTER")  # type: ignore[arg-type]


def _snap(pid: int, kind: cm.Kind, value: float, at: int, created: int = 0) -> cm.Snapshot:
    sample = cm.MetricSample([("k", "v")], value, at)
    return cm.Snapshot(pid, [cm.FamilySnapshot("f", f"from {pid}", kind, created, [sample])])


def test_merge_sums_counters_keeps_the_last_gauge_and_the_first_family() -> None:
    (counter,) = cm.merge([_snap(1, "counter", 2, 10, created=5), _snap(2, "counter", 3, 5)])
    assert counter.description == "from 2" and counter.metrics[0].value == 5
    (gauge,) = cm.merge([_snap(1, "gauge", 2, 10), _snap(2, "gauge", 3, 5)])
    assert gauge.metrics[0].value == 2
    (kept,) = cm.merge([_snap(1, "gauge", 2, 10, created=1), _snap(2, "counter", 3, 5, created=2)])
    assert kept.kind == "gauge" and kept.metrics[0].value == 2


def test_a_snapshot_caught_mid_write_is_skipped_and_a_whole_one_read(tmp_path: Path) -> None:
    path = cm.snapshot_path(tmp_path / "server", os.getpid())
    writer = cm.SnapshotWriter(path)
    writer.write(_snap(os.getpid(), "gauge", 1, 1))
    writer.write(_snap(os.getpid(), "gauge", 2, 2))  # (a shorter or longer body: the same)
    (read,) = cm.read_all(tmp_path / "server")
    assert read.families[0].metrics[0].value == 2
    with path.open("r+b") as f:  # a writer stopped halfway: its sequence number odd
        f.write(cm._HEADER.pack(5, 0))
    assert cm.read_all(tmp_path / "server") == []
    writer.close()


def test_a_dead_workers_snapshot_is_not_shown_and_is_swept(tmp_path: Path) -> None:
    runtime = tmp_path / "another-server"
    dead = 2**22 + 12345  # above pid_max's default: no process has it
    path = cm.snapshot_path(runtime, dead)
    writer = cm.SnapshotWriter(path)
    writer.write(_snap(dead, "counter", 1, 1))
    writer.close()
    assert cm.read_all(runtime) == []
    assert cm.sweep(runtime) == [path] and not path.exists()


def test_batched_changes_are_written_once_at_the_end(
    published: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gauges = pb.MetricFamily("g", "a gauge", pb.MetricFamily.GAUGE)
    counters = pb.MetricFamily("c", "a counter", pb.MetricFamily.COUNTER)
    gauge, counter = gauges.Metric(), counters.Metric()
    writes: list[cm.Snapshot] = []
    writer = pb_metrics.registry.writer
    assert writer is not None
    real = writer.write
    monkeypatch.setattr(writer, "write", lambda snap: (writes.append(snap), real(snap)))
    with pb_metrics.batched():
        gauge.set(3)
        counter.increment(2)
        with pb_metrics.batched():  # (nested: still one write, at the outer end)
            gauge.set(4)
        assert writes == []
    assert len(writes) == 1
    values = {f.name: f.metrics[0].value for f in writes[0].families}
    assert values == {"g": 4.0, "c": 2.0}
