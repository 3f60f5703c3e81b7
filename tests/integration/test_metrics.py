"""Triton's Prometheus metrics on --metrics-port, scraped from the real server while
tritonclient drives it: counts by Triton's rules, failure reasons, pending requests,
metric_tags labels, latency summaries, the host's CPU figures, and the flags."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.repos import infer_identity, write_identity
from tests.serverctl import ShoalServer, served

Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("metrics-repo")
    write_identity(
        repo,
        "pair",
        "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000 }\n"
        'metric_tags { key: "team" value: "vision" }',
    )
    write_identity(
        repo,
        "timeout",
        "dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 200000 } }",
    )
    write_identity(repo, "waits", "dynamic_batching { max_queue_delay_microseconds: 20000000 }")
    with served(
        repo,
        "--frontend-processes=2",
        "--metrics-config=summary_latencies=true",
        "--metrics-interval-ms=100",
    ) as srv:
        yield srv


def _page(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def _scrape(port: int) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(_page(port)[1]):
        for s in family.samples:
            # the parser names counter samples <family>_total; Triton's have no suffix
            name = family.name if family.type == "counter" else s.name
            out.setdefault(name, []).append((s.labels, s.value))
    return out


def _value(samples: Samples, name: str, **labels: str) -> float:
    (value,) = [v for got, v in samples[name] if all(got.get(k) == x for k, x in labels.items())]
    return value


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_two_requests_batched_together_count_as_triton_counts_them(server: ShoalServer) -> None:
    port = server.metrics_port
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(infer_identity, server.url, "pair", 1.0)
        # queued, waiting for a second request (preferred batch 2, a 20 s delay)
        _until(
            lambda: _value(_scrape(port), "nv_inference_pending_request_count", model="pair") == 1
        )
        second = infer_identity(server.url, "pair", 2.0)
        assert first.result()[0, 0] == 1.0 and second[0, 0] == 2.0
    samples = _scrape(port)
    tags = {"model": "pair", "version": "1", "_team": "vision"}  # metric_tags: a label
    assert _value(samples, "nv_inference_request_success", **tags) == 2
    assert _value(samples, "nv_inference_count", **tags) == 2
    assert _value(samples, "nv_inference_exec_count", **tags) == 1
    assert _value(samples, "nv_inference_pending_request_count", **tags) == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert _value(samples, "nv_inference_request_failure", model="pair", reason=reason) == 0
    # the first request waited for the second: its queue time is in the counter
    assert _value(samples, "nv_inference_queue_duration_us", model="pair") > 0
    assert _value(samples, "nv_inference_request_duration_us", model="pair") >= _value(
        samples, "nv_inference_compute_infer_duration_us", model="pair"
    )
    # the same figures /stats shows
    client = httpclient.InferenceServerClient(server.url)
    (stats,) = client.get_inference_statistics("pair")["model_stats"]
    assert stats["inference_stats"]["success"]["count"] == 2
    assert _value(samples, "nv_inference_request_duration_us", model="pair") == (
        int(stats["inference_stats"]["success"]["ns"]) // 1000
    )
    # summaries (summary_latencies=true): count, sum and quantiles of the last minute
    assert _value(samples, "nv_inference_request_summary_us_count", model="pair") == 2
    p50 = _value(samples, "nv_inference_request_summary_us", model="pair", quantile="0.5")
    p99 = _value(samples, "nv_inference_request_summary_us", model="pair", quantile="0.99")
    assert 0 < p50 <= p99


def test_an_expired_queue_timeout_is_a_rejected_failure(server: ShoalServer) -> None:
    with pytest.raises(InferenceServerException, match="Request timeout expired"):
        infer_identity(server.url, "timeout", 1.0)
    samples = _scrape(server.metrics_port)
    assert _value(samples, "nv_inference_request_failure", model="timeout", reason="REJECTED") == 1
    assert _value(samples, "nv_inference_request_failure", model="timeout", reason="OTHER") == 0
    assert _value(samples, "nv_inference_request_success", model="timeout") == 0


def test_a_request_its_client_gave_up_on_is_a_canceled_failure(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    port = server.metrics_port
    with ThreadPoolExecutor(1) as pool:
        # queued for 20 s: its client gives up after 3
        call = pool.submit(client.infer, "waits", [inp], client_timeout=3.0)
        _until(
            lambda: _value(_scrape(port), "nv_inference_pending_request_count", model="waits") == 1
        )
        with pytest.raises(InferenceServerException, match="Deadline"):
            call.result()
    failures = "nv_inference_request_failure"
    _until(lambda: _value(_scrape(port), failures, model="waits", reason="CANCELED") == 1)
    assert _value(_scrape(port), "nv_inference_pending_request_count", model="waits") == 0


def test_the_page_is_tritons_text_format_with_host_figures(server: ShoalServer) -> None:
    content_type, text = _page(server.metrics_port)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_count{_team="vision",model="pair",version="1"} ' in text
    assert not re.search(r"_total[{ ]", text)  # no OpenMetrics suffix on a counter
    samples = _scrape(server.metrics_port)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert _value(samples, "nv_cpu_memory_total_bytes") == total
    assert 0 < _value(samples, "nv_cpu_memory_used_bytes") < total
    # sampled every 100 ms here: one busy core of the host's shows within a few samples
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        busy = 0.5 / (os.cpu_count() or 1)
        _until(lambda: _value(_scrape(server.metrics_port), "nv_cpu_utilization") > busy)
    finally:
        stop.set()
        spinner.join()
    assert _value(_scrape(server.metrics_port), "nv_cpu_utilization") <= 1.0


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # LISTEN
                    inodes.add(f[9])
    return inodes


def test_every_frontend_serves_the_metrics_port(server: ShoalServer) -> None:
    inodes = _listening_inodes(server.metrics_port)
    holders = set()
    for pid in server.pids("frontend"):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                    holders.add(pid)
    assert len(server.pids("frontend")) == 2
    assert holders == set(server.pids("frontend"))


def test_other_paths_and_methods_are_refused(server: ShoalServer) -> None:
    base = f"http://127.0.0.1:{server.metrics_port}"
    for request, code in [
        (urllib.request.Request(f"{base}/v2/health/ready"), 404),
        (urllib.request.Request(f"{base}/metrics", data=b"", method="POST"), 405),
    ]:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=5)
        assert e.value.code == code


def test_flags_turn_families_and_the_port_off(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_identity(repo, "plain", "")
    srv = ShoalServer(repo, "--allow-cpu-metrics=false", "--metrics-config=counter_latencies=false")
    try:
        infer_identity(srv.url, "plain", 1.0)
        samples = _scrape(srv.metrics_port)
        assert _value(samples, "nv_inference_request_success", model="plain") == 1
        assert not [n for n in samples if n.startswith("nv_cpu") or n.endswith("_duration_us")]
        assert not [n for n in samples if "summary" in n]  # summaries are off by default
    finally:
        assert srv.stop() == 0
    off = ShoalServer(repo, "--allow-metrics=false")
    try:
        infer_identity(off.url, "plain", 1.0)  # serving as ever
        with pytest.raises(urllib.error.URLError):
            _page(off.metrics_port)
    finally:
        assert off.stop() == 0


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--metrics-config=summary_latency=true"], "unknown key 'summary_latency'"),
        (["--http-port=9123", "--metrics-port=9123"], "--metrics-port 9123 is also the HTTP port"),
        (["--grpc-port=9124", "--metrics-port=9124"], "--metrics-port 9124 is also the gRPC port"),
    ],
)
def test_bad_metrics_flags_are_refused_at_start(
    tmp_path: Path, flags: list[str], words: str
) -> None:
    argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={tmp_path}", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert words in done.stderr
