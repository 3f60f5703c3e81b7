"""The metrics page (Triton's names, labels and units), the host sampler and the
``--metrics-config`` flag, without a server. The page is read back with
prometheus_client's parser, as a scraper would."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.configs.flags.frontend import MetricsConfig, metrics_config, metrics_port_clash
from shoal.dataplane.response_cache import ResponseCache
from shoal.dataplane.types import OutputTensor
from shoal.frontend.http_connections import ConnectionCounts
from shoal.frontend.metrics import HostSampler, render
from shoal.ipc import messages as m


def _version(name: str = "mlp", **tags: str) -> m.VersionMetrics:
    s = m.ModelStats(name, "1", inference_count=3, execution_count=2)
    st = s.inference_stats
    st.success.add(9_000_999, 2)  # two requests: 9001 µs in all (rounded down)
    st.queue.add(2_000, 2)
    st.compute_input.add(4_000, 2)
    st.compute_infer.add(5_000_000, 2)
    st.compute_output.add(6_000, 2)
    failures = {"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    return m.VersionMetrics(s, failures, 4, tags, {"request": [4000.0, math.nan]})


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_the_page_has_tritons_families_types_and_values() -> None:
    text = render([_version()], MetricsConfig(), None)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert [name for name in fams] == [
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "shoal_instance_exit_count",
        "shoal_instance_memory_bytes",
        "shoal_instance_memory_limit_bytes",
    ]
    gauges = {n for n, f in fams.items() if f.type == "gauge"}
    assert gauges == {
        "nv_inference_pending_request_count",
        "shoal_instance_memory_bytes",
        "shoal_instance_memory_limit_bytes",
    }
    assert all(f.type == "counter" for n, f in fams.items() if n not in gauges)
    values = {n: [s.value for s in f.samples] for n, f in fams.items()}
    assert values["nv_inference_request_success"] == [2]
    assert values["nv_inference_count"] == [3]
    assert values["nv_inference_exec_count"] == [2]
    assert values["nv_inference_request_duration_us"] == [9000]
    assert values["nv_inference_compute_infer_duration_us"] == [5000]
    assert values["nv_inference_pending_request_count"] == [4]
    by_reason = {s.labels["reason"]: s.value for s in fams["nv_inference_request_failure"].samples}
    assert by_reason == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    # Triton's own spelling: no "_total", integers without ".0"
    assert 'nv_inference_request_success{model="mlp",version="1"} 2\n' in text
    assert not re.search(r"_total[{ ]", text)  # no OpenMetrics suffix on a counter


def test_instance_exits_by_reason_and_each_instances_memory() -> None:
    v = _version()
    v.exits, v.memory, v.memory_limit = {"memory_limit": 2}, {1: 5 << 20, 0: 7 << 20}, 8 << 20
    fams = _families(render([v], MetricsConfig(), None))
    mlp = {"model": "mlp", "version": "1"}
    assert [(labels, value) for _, labels, value in fams["shoal_instance_exit_count"]] == [
        ({**mlp, "reason": "crash"}, 0),
        ({**mlp, "reason": "execution_timeout"}, 0),
        ({**mlp, "reason": "memory_limit"}, 2),
    ]
    assert [(labels, value) for _, labels, value in fams["shoal_instance_memory_bytes"]] == [
        ({**mlp, "instance": "0"}, 7 << 20),
        ({**mlp, "instance": "1"}, 5 << 20),
    ]
    assert [(labels, value) for _, labels, value in fams["shoal_instance_memory_limit_bytes"]] == [
        (mlp, 8 << 20)
    ]
    text = render([v], MetricsConfig(), None)
    assert 'shoal_instance_exit_count{model="mlp",reason="memory_limit",version="1"} 2\n' in text


def test_each_listeners_connections_and_what_its_limit_did() -> None:
    http = ConnectionCounts("HTTP", 741, 12, idle_closed=23, reserve_answered=2, refused=1)
    metrics = ConnectionCounts("metrics", 16, 1, header_timeouts=4)
    fams = _families(render([], MetricsConfig(), None, connections=("1", [http, metrics])))
    http_l, metrics_l = (
        {"frontend": "1", "listener": "HTTP"},
        {"frontend": "1", "listener": "metrics"},
    )
    assert [(lb, v) for _, lb, v in fams["shoal_http_connections"]] == [
        (http_l, 12),
        (metrics_l, 1),
    ]
    assert [(lb, v) for _, lb, v in fams["shoal_http_connections_limit"]] == [
        (http_l, 741),
        (metrics_l, 16),
    ]
    assert (http_l, 2) in [(lb, v) for _, lb, v in fams["shoal_http_connections_reserve_count"]]
    dropped = [(lb, v) for _, lb, v in fams["shoal_http_connections_dropped_count"]]
    assert dropped[:3] == [
        ({**http_l, "reason": "idle_at_limit"}, 23),
        ({**http_l, "reason": "refused_at_limit"}, 1),
        ({**http_l, "reason": "header_timeout"}, 0),
    ]
    assert ({**metrics_l, "reason": "header_timeout"}, 4) in dropped


def test_metric_tags_become_underscored_labels_and_values_are_escaped() -> None:
    text = render([_version('a"b\\c', team="vision", cost="x\ny")], MetricsConfig(), None)
    (sample,) = _families(text)["nv_inference_count"]
    assert sample[1] == {"model": 'a"b\\c', "version": "1", "_cost": "x\ny", "_team": "vision"}


def test_counter_latencies_off_drops_the_duration_counters() -> None:
    fams = _families(render([_version()], MetricsConfig(counter_latencies=False), None))
    assert not [n for n in fams if n.endswith("_duration_us")]
    assert "nv_inference_request_success" in fams


def test_the_cache_families_are_of_the_models_that_enable_it_with_the_counters() -> None:
    cached, plain = _version("cached"), _version("plain")
    cached.response_cache = True
    cached.stats.inference_stats.cache_hit.add(7_500, 3)
    cached.stats.inference_stats.cache_miss.add(2_000, 1)
    cache = ResponseCache(1000)
    fams = _families(render([cached, plain], MetricsConfig(), None, cache))
    got = {
        name: [(labels["model"], value) for _, labels, value in fams[name]]
        for name in fams
        if name.startswith("nv_cache_") and name.endswith("_per_model")
    }
    assert got == {
        "nv_cache_num_hits_per_model": [("cached", 3)],
        "nv_cache_hit_duration_per_model": [("cached", 7)],  # µs
        "nv_cache_num_misses_per_model": [("cached", 1)],
        "nv_cache_miss_duration_per_model": [("cached", 2)],
    }
    quiet = render([cached], MetricsConfig(counter_latencies=False), None, cache)
    assert "_per_model" not in quiet
    assert "nv_cache_" not in render([cached], MetricsConfig(), None)  # no server cache


def test_cache_summaries_come_with_the_summaries() -> None:
    cached = _version("cached")
    cached.response_cache = True
    cached.stats.inference_stats.cache_hit.add(9_000, 3)
    cached.summaries = {"cache_hit": [2.0], "cache_miss": [math.nan]}
    cfg = metrics_config(["summary_latencies=true", "summary_quantiles=0.5:0.05"])
    fams = _families(render([cached, _version("plain")], cfg, None, ResponseCache(1000)))
    hits = {
        (name, labels.get("quantile")): v
        for name, labels, v in fams["nv_cache_hit_summary_per_model"]
    }
    assert hits == {
        ("nv_cache_hit_summary_per_model_count", None): 3,
        ("nv_cache_hit_summary_per_model_sum", None): 9,
        ("nv_cache_hit_summary_per_model", "0.5"): 2.0,
    }
    assert [labels["model"] for _, labels, _ in fams["nv_cache_miss_summary_per_model"]] == [
        "cached"
    ] * 3
    assert "nv_cache_hit_summary_per_model" not in _families(render([cached], cfg, None))


def test_the_cache_as_a_whole_is_this_frontends() -> None:
    cache = ResponseCache(3 * (256 + 128 + 100))
    out = [OutputTensor("OUTPUT0", "UINT8", [100], memoryview(bytes(100)))]
    for key in (b"a", b"b", b"c", b"d"):  # d evicts a
        assert cache.get(key) is None
        cache.put(key, out)
    assert cache.get(b"d") is not None
    cache.lookup_ns, cache.insertion_ns = 12_345, 6_789
    fams = _families(render([], MetricsConfig(), None, cache))
    gauges = {n: v for n, v in fams.items() if n.startswith("nv_cache_") and v}
    assert {n: v[0][2] for n, v in gauges.items()} == {
        "nv_cache_util": 1.0,
        "nv_cache_num_entries": 3,
        "nv_cache_num_hits": 1,
        "nv_cache_num_misses": 4,
        "nv_cache_num_lookups": 5,
        "nv_cache_num_evictions": 1,
        "nv_cache_lookup_duration": 12,
        "nv_cache_insertion_duration": 6,
    }
    assert "nv_cache_util" not in render([], MetricsConfig(), None)


def test_summaries_have_count_sum_and_each_quantile() -> None:
    cfg = MetricsConfig(summary_latencies=True, summary_quantiles=((0.5, 0.05), (0.9, 0.01)))
    fams = _families(render([_version()], cfg, None))
    request = fams["nv_inference_request_summary_us"]
    assert request[:2] == [
        ("nv_inference_request_summary_us_count", {"model": "mlp", "version": "1"}, 2),
        ("nv_inference_request_summary_us_sum", {"model": "mlp", "version": "1"}, 9000),
    ]
    assert [(s[1]["quantile"], s[2]) for s in request[2:3]] == [("0.5", 4000)]
    assert math.isnan(request[3][2])  # no observation for that quantile
    queue = fams["nv_inference_queue_summary_us"]
    assert len(queue) == 4 and all(math.isnan(s[2]) for s in queue[2:])  # none observed


def test_cpu_figures_come_from_proc(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n"
    )
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 100 700 100 0 0 0 50 0\ncpu0 1 2 3\n")
    host = HostSampler(tmp_path)
    host.sample()
    assert host.utilization == 0.0  # one reading: no interval yet
    stat.write_text("cpu  250 0 150 850 100 0 0 0 50 0\ncpu0 1 2 3\n")
    host.sample()
    assert host.utilization == pytest.approx(200 / 350)  # busy 200 of 350 ticks
    assert (host.memory_total, host.memory_used) == (1000 * 1024, 600 * 1024)
    fams = _families(render([], MetricsConfig(), host))
    assert fams["nv_cpu_utilization"][0][2] == pytest.approx(200 / 350)
    assert fams["nv_cpu_memory_used_bytes"][0][2] == 600 * 1024


def test_an_unreadable_proc_keeps_the_last_figures(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 400 kB\n")
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0\n")
    host = HostSampler(tmp_path)
    host.sample()
    (tmp_path / "stat").write_text("cpu  200 0 100 800 100 0 0 0\n")
    host.sample()
    before = (host.utilization, host.memory_total, host.memory_used)
    assert before == (0.5, 1000 * 1024, 600 * 1024)
    (tmp_path / "stat").write_text("cpu garbled\n")
    host.sample()
    (tmp_path / "meminfo").unlink()
    host.sample()
    assert (host.utilization, host.memory_total, host.memory_used) == before


def test_metrics_config_keys_and_refusals() -> None:
    cfg = metrics_config(
        ["summary_latencies=true", "counter_latencies=0", "summary_quantiles=0.5:0.05,0.99:0.001"]
    )
    assert cfg.summary_latencies and not cfg.counter_latencies
    assert cfg.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    assert metrics_config([]) == MetricsConfig()
    for bad, words in [
        ("latencies=true", "unknown key 'latencies'"),
        ("summary_latencies", "expected key=value"),
        ("summary_latencies=maybe", "expected a boolean"),
        ("summary_quantiles=0.5", "quantile:error"),
        ("summary_quantiles=1.5:0.1", "quantile:error"),
        ("summary_quantiles=0.5:0.1,0.5:0.01", "quantile 0.5 given twice"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            metrics_config([bad])


def test_the_metrics_port_may_not_be_a_listener_port_on_an_overlapping_address() -> None:
    def clash(**over: object) -> str | None:
        flags = dict(
            allow_metrics=True, metrics_address="", metrics_port=8002,
            allow_http=True, http_address="0.0.0.0", http_port=8000,
            allow_grpc=True, grpc_address="0.0.0.0", grpc_port=8001,
        )  # fmt: skip
        return metrics_port_clash(argparse.Namespace(**{**flags, **over}))

    assert clash() is None
    assert clash(metrics_port=8000) == "--metrics-port 8000 is also the HTTP port"
    assert clash(metrics_port=8001) == "--metrics-port 8001 is also the gRPC port"
    assert clash(metrics_port=8000, allow_http=False) is None
    assert clash(metrics_port=8000, allow_metrics=False) is None
    assert clash(metrics_port=8001, metrics_address="127.0.0.1") is not None  # gRPC on all
    assert (
        clash(
            metrics_port=8000,
            http_address="10.0.0.5",
            grpc_address="10.0.0.5",
            metrics_address="127.0.0.1",
        )
        is None
    )  # two addresses: two sockets
