"""Triton's Prometheus metrics: ``GET /metrics`` on ``--metrics-port``, text format 0.0.4.

Names, HELP texts, labels and units are Triton 2.51's, so that its dashboards and alerts
work unchanged. The per-model figures come from the broker at each scrape (the same
statistics ``/v2/models/stats`` shows), so every frontend answers alike and several
frontends share the port (SO_REUSEPORT) as they share the HTTP port. The host's CPU
figures, and its GPUs' (shoal.frontend.gpu_metrics), are sampled every ``--metrics-interval-ms``,
as Triton does.

prometheus_client's exposition is not used to render: it names every counter with a
``_total`` suffix (the OpenMetrics rule), and Triton's counters have none.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from aiohttp import web

from shoal.configs.flags.frontend import MetricsConfig
from shoal.dataplane import hop_histogram
from shoal.dataplane.hop_histogram import HopHistogram
from shoal.dataplane.response_cache import ResponseCache
from shoal.frontend.gpu_metrics import FAMILIES as GPU_FAMILIES
from shoal.frontend.gpu_metrics import GpuSampler
from shoal.frontend.http_connections import (
    METRICS_CONNECTIONS,
    ConnectionCounts,
    ConnectionGate,
    ConnectionLimits,
    GatedSite,
)
from shoal.frontend.prometheus_text import Text, custom_families
from shoal.ipc import custom_metrics
from shoal.ipc import messages as m
from shoal.ipc.custom_metrics import FamilySnapshot
from shoal.ipc.errors import ServingError

log = logging.getLogger("shoal.frontend")

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


_Value = Callable[[m.ModelStats], int]
_Rows = list[tuple[m.VersionMetrics, list[tuple[str, str]]]]
_COUNTERS: Final[tuple[tuple[str, str, _Value], ...]] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda s: s.inference_stats.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
)
_CACHED = "(includes cached requests)"
_NOT_CACHED = "(does not include cached requests)"
# (phase, counter name, counter help, summary name, summary help, cumulative ns)
_PHASES: Final[tuple[tuple[str, str, str, str, str, _Value], ...]] = (
    (
        "request",
        "nv_inference_request_duration_us",
        f"Cumulative inference request duration in microseconds {_CACHED}",
        "nv_inference_request_summary_us",
        f"Summary of inference request duration in microseconds {_CACHED}",
        lambda s: s.inference_stats.success.ns,
    ),
    (
        "queue",
        "nv_inference_queue_duration_us",
        f"Cumulative inference queuing duration in microseconds {_CACHED}",
        "nv_inference_queue_summary_us",
        f"Summary of inference queuing duration in microseconds {_CACHED}",
        lambda s: s.inference_stats.queue.ns,
    ),
    (
        "compute_input",
        "nv_inference_compute_input_duration_us",
        f"Cumulative compute input duration in microseconds {_NOT_CACHED}",
        "nv_inference_compute_input_summary_us",
        f"Summary of compute input duration in microseconds {_NOT_CACHED}",
        lambda s: s.inference_stats.compute_input.ns,
    ),
    (
        "compute_infer",
        "nv_inference_compute_infer_duration_us",
        f"Cumulative compute inference duration in microseconds {_NOT_CACHED}",
        "nv_inference_compute_infer_summary_us",
        f"Summary of compute inference duration in microseconds {_NOT_CACHED}",
        lambda s: s.inference_stats.compute_infer.ns,
    ),
    (
        "compute_output",
        "nv_inference_compute_output_duration_us",
        f"Cumulative inference compute output duration in microseconds {_NOT_CACHED}",
        "nv_inference_compute_output_summary_us",
        f"Summary of inference compute output duration in microseconds {_NOT_CACHED}",
        lambda s: s.inference_stats.compute_output.ns,
    ),
)
# Shown with the latency counters when the server has a response cache, for the models
# whose config enables it (as Triton shows them).
_CACHE_COUNTERS: Final[tuple[tuple[str, str, _Value, int], ...]] = (
    (
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model",
        lambda s: s.inference_stats.cache_hit.count,
        1,
    ),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.inference_stats.cache_hit.ns,
        1000,
    ),
    (
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        lambda s: s.inference_stats.cache_miss.count,
        1,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.inference_stats.cache_miss.ns,
        1000,
    ),
)
# With the summaries, when the server has a response cache (Triton's names and texts).
_CACHE_SUMMARIES: Final[tuple[tuple[str, str, str, _Value, _Value], ...]] = (
    (
        "cache_hit",
        "nv_cache_hit_summary_per_model",
        "Summary of cache hit counts/durations per model, in microseconds.",
        lambda s: s.inference_stats.cache_hit.count,
        lambda s: s.inference_stats.cache_hit.ns,
    ),
    (
        "cache_miss",
        "nv_cache_miss_summary_per_model",
        "Summary of cache miss counts/durations per model, in microseconds.",
        lambda s: s.inference_stats.cache_miss.count,
        lambda s: s.inference_stats.cache_miss.ns,
    ),
)
_SUMMARY_COUNTS: Final[dict[str, _Value]] = {  # each phase's observations so far
    "request": lambda s: s.inference_stats.success.count,
    "queue": lambda s: s.inference_stats.queue.count,
    "compute_input": lambda s: s.inference_stats.compute_input.count,
    "compute_infer": lambda s: s.inference_stats.compute_infer.count,
    "compute_output": lambda s: s.inference_stats.compute_output.count,
}


@dataclass
class MetricsSettings:
    address: str = "0.0.0.0"
    port: int = 8002
    reuse_port: bool = False
    interval_ms: int = 2000
    cpu: bool = True
    gpu: bool = True
    config: MetricsConfig = field(default_factory=MetricsConfig)
    frontend: str = "0"  # this frontend process's index, the label of its own figures


class HostSampler:
    """Triton's CPU metrics from /proc: utilization over the last interval (busy time
    over all time, idle and iowait counting as idle), and RAM in use (total less
    available)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self.utilization = 0.0
        self.memory_total = 0
        self.memory_used = 0
        self._last: tuple[int, int] | None = None

    def sample(self) -> None:
        try:
            busy, total = self._cpu_times()
            mem = self._meminfo()
        except (OSError, ValueError, IndexError, KeyError) as exc:
            log.debug("cannot sample the host's CPU and memory: %s", exc)
            return
        if self._last is not None and total > self._last[1]:
            self.utilization = (busy - self._last[0]) / (total - self._last[1])
        self._last = (busy, total)
        self.memory_total = mem["MemTotal"] * 1024
        self.memory_used = (mem["MemTotal"] - mem["MemAvailable"]) * 1024

    def _cpu_times(self) -> tuple[int, int]:
        first = (self.proc / "stat").read_text().splitlines()[0].split()
        # user nice system idle iowait irq softirq steal (guest time is within user)
        ticks = [int(x) for x in first[1:9]]
        idle = ticks[3] + ticks[4]
        return sum(ticks) - idle, sum(ticks)

    def _meminfo(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0])
        return out


def _labels(v: m.VersionMetrics, gpus: GpuSampler | None) -> list[tuple[str, str]]:
    """model and version, ``_<key>`` for each of the config's metric_tags, and the
    ``gpu_uuid`` of the GPU its instances run on, where the GPU metrics know it."""
    out = [("model", v.stats.name), ("version", v.stats.version)]
    out += [("_" + key, val) for key, val in sorted(v.tags.items())]  # keys checked at load
    if gpus is not None and 0 <= v.gpu < len(gpus.gpus):
        out.append(("gpu_uuid", gpus.gpus[v.gpu].uuid))
    return out


def render(
    versions: list[m.VersionMetrics],
    cfg: MetricsConfig,
    host: HostSampler | None,
    cache: ResponseCache | None = None,
    gpus: GpuSampler | None = None,
    connections: tuple[str, list[ConnectionCounts]] | None = None,
    custom: list[FamilySnapshot] | None = None,
    hops: HopHistogram | None = None,
) -> str:
    """The metrics page, families in Triton's order; ``cache``: this frontend's response
    cache, if the server has one; ``gpus``: the GPUs' last sample, if there are any;
    ``connections``: this frontend's index and its listeners' connection counts;
    ``custom``: the Python models' own families (after Triton's, as it registers them)."""
    t = Text()
    rows = [(v, _labels(v, gpus)) for v in versions]

    def counter(name: str, help_: str, value: _Value, per: int = 1, of: _Rows = rows) -> None:
        t.family(name, help_, "counter")
        for v, labels in of:
            t.sample(name, labels, value(v.stats) // per)

    (name, help_, count), *counts = _COUNTERS
    counter(name, help_, count)
    failures = "nv_inference_request_failure"
    t.family(failures, "Number of failed inference requests, all batch sizes", "counter")
    for v, labels in rows:
        for reason in m.FAILURE_REASONS:
            t.sample(failures, [*labels, ("reason", reason)], v.failures.get(reason, 0))
    for name, help_, count in counts:
        counter(name, help_, count)
    if cfg.counter_latencies:
        for _, name, help_, _, _, ns in _PHASES:
            counter(name, help_, ns, per=1000)  # µs
    cached = [(v, labels) for v, labels in rows if v.response_cache and cache is not None]

    def summary(phase: str, name: str, help_: str, count: _Value, ns: _Value, of: _Rows) -> None:
        t.family(name, help_, "summary")
        for v, labels in of:
            t.sample(f"{name}_count", labels, count(v.stats))
            t.sample(f"{name}_sum", labels, ns(v.stats) // 1000)
            values = v.summaries.get(phase, [])
            for i, (q, _) in enumerate(cfg.summary_quantiles):
                got = values[i] if i < len(values) else math.nan
                t.sample(name, [*labels, ("quantile", repr(q))], got)

    if cfg.summary_latencies:
        for phase, _, _, name, help_, ns in _PHASES:
            summary(phase, name, help_, _SUMMARY_COUNTS[phase], ns, rows)
        if cache is not None:
            for phase, name, help_, count, ns in _CACHE_SUMMARIES:
                summary(phase, name, help_, count, ns, cached)
    if cache is not None and cfg.counter_latencies:
        for family, family_help, stat, per in _CACHE_COUNTERS:
            counter(family, family_help, stat, per, cached)
    pending = "nv_inference_pending_request_count"
    t.family(
        pending, "Instantaneous number of pending requests awaiting execution per-model.", "gauge"
    )
    for v, labels in rows:
        t.sample(pending, labels, v.pending)
    _instance_families(t, rows)
    _device_families(t, gpus, host)
    if cache is not None:
        _cache_families(t, cache)
    if custom:
        custom_families(t, custom)
    if connections is not None:
        _connection_families(t, *connections)
        if hops is not None and hops.observed:  # (once a measured request came back)
            t.family(hop_histogram.FAMILY, hop_histogram.HELP, "histogram")
            for suffix, labels, value in hops.samples(connections[0]):
                t.sample(hop_histogram.FAMILY + suffix, labels, value)
    return t.render()


def _device_families(t: Text, gpus: GpuSampler | None, host: HostSampler | None) -> None:
    """Triton's GPU families (when there are GPUs) and its CPU and memory gauges."""
    if gpus is not None:
        for name, help_, kind, attr in GPU_FAMILIES:
            t.family(name, help_, kind)
            for gpu in gpus.gpus:
                if (value := getattr(gpu, attr)) is not None:
                    t.sample(name, [("gpu_uuid", gpu.uuid)], value)
    if host is not None:
        for name, help_, value in (
            ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", host.utilization),
            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", host.memory_total),
            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", host.memory_used),
        ):
            t.family(name, help_, "gauge")
            t.sample(name, [], value)


def _cache_families(t: Text, cache: ResponseCache) -> None:
    """Triton's response-cache gauges, of this frontend's cache."""
    for name, help_, value in (
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.used / cache.capacity),
        ("nv_cache_num_entries", "Number of responses stored in response cache", len(cache)),
        ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
        (
            "nv_cache_num_lookups",
            "Number of cache lookups in response cache",
            cache.hits + cache.misses,
        ),
        (
            "nv_cache_num_evictions",
            "Number of cache evictions in response cache",
            cache.evictions,
        ),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
            cache.lookup_ns // 1000,
        ),
        (
            "nv_cache_insertion_duration",
            "Total cache insertion duration, in microseconds",
            cache.insertion_ns // 1000,
        ),
    ):
        t.family(name, help_, "gauge")
        t.sample(name, [], value)


_Count = Callable[[ConnectionCounts], int]
_CONNECTION_FAMILIES: Final[tuple[tuple[str, str, str, _Count], ...]] = (
    (
        "shoal_http_connections",
        "HTTP connections the frontend process holds now",
        "gauge",
        lambda c: c.open,
    ),
    (
        "shoal_http_connections_limit",
        "The most HTTP connections the frontend process holds (--http-max-connections, or "
        "what its open-file limit leaves)",
        "gauge",
        lambda c: c.limit,
    ),
    (
        "shoal_http_connections_reserve_count",
        "New HTTP connections beyond the limit, none idle to close, answered by the reserve "
        "(health requests served, others 503)",
        "counter",
        lambda c: c.reserve_answered,
    ),
)
_DROPPED: Final = "shoal_http_connections_dropped_count"
_DROPPED_HELP: Final = (
    "HTTP connections closed by the frontend process: idle_at_limit (the longest idle, to "
    "make room at the limit), refused_at_limit (new, beyond the limit and the reserve: a "
    "bare 503), header_timeout (no complete request headers in time)"
)


def _connection_families(t: Text, frontend: str, listeners: list[ConnectionCounts]) -> None:
    """shoal's own: the connections of this frontend process's listeners (HTTP, metrics)
    and what their limits did, labelled by frontend (the process that answered the
    scrape: with several, each scrape shows one's)."""
    rows = [(c, [("frontend", frontend), ("listener", c.listener)]) for c in listeners]
    for name, help_, kind, value in _CONNECTION_FAMILIES:
        t.family(name, help_, kind)
        for c, labels in rows:
            t.sample(name, labels, value(c))
    t.family(_DROPPED, _DROPPED_HELP, "counter")
    for c, labels in rows:
        for reason, count in (
            ("idle_at_limit", c.idle_closed),
            ("refused_at_limit", c.refused),
            ("header_timeout", c.header_timeouts),
        ):
            t.sample(_DROPPED, [*labels, ("reason", reason)], count)


def _instance_families(t: Text, rows: list[tuple[m.VersionMetrics, list[tuple[str, str]]]]) -> None:
    """shoal's own: how often each model's instances ended unasked (each is restarted),
    and the memory each holds of its own next to its limit, to alert on."""
    exits = "shoal_instance_exit_count"
    t.family(
        exits,
        "Number of times an instance of the model exited unasked (then restarted): crash, "
        "or ended by the server for execution_timeout or memory_limit",
        "counter",
    )
    for v, labels in rows:
        for reason in m.EXIT_REASONS:
            t.sample(exits, [*labels, ("reason", reason)], v.exits.get(reason, 0))
    used = "shoal_instance_memory_bytes"
    t.family(used, "Memory an instance holds of its own (anonymous resident), in bytes", "gauge")
    for v, labels in rows:
        for index, value in sorted(v.memory.items()):
            t.sample(used, [*labels, ("instance", str(index))], value)
    limit = "shoal_instance_memory_limit_bytes"
    t.family(limit, "The limit on each instance's own memory, in bytes (0: none)", "gauge")
    for v, labels in rows:
        t.sample(limit, labels, v.memory_limit)


class MetricsServer:
    """The metrics port of one frontend process."""

    def __init__(
        self,
        s: MetricsSettings,
        fetch: Callable[[list[float]], Awaitable[list[m.VersionMetrics]]],
        cache: ResponseCache | None = None,
        limits: ConnectionLimits | None = None,
        connections: Callable[[], list[ConnectionCounts]] | None = None,
        runtime_dir: Path | None = None,
        hops: HopHistogram | None = None,
    ) -> None:
        self.s = s
        self._fetch = fetch  # the broker's figures, with these quantiles of each latency
        self.cache = cache  # this frontend's response cache
        self.limits = limits or ConnectionLimits(METRICS_CONNECTIONS)  # of this listener
        self._connections = connections  # the other listeners' connection counts
        self.runtime_dir = runtime_dir  # where Python models' metrics are (ipc/custom_metrics)
        self.hops = hops  # this frontend's measured hops
        self.gate: ConnectionGate | None = None
        self.host = HostSampler() if s.cpu else None
        self.gpus: GpuSampler | None = None
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        keepalive = self.limits.keepalive_timeout_s
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive)
        await self._runner.setup()
        assert self._runner.server is not None
        self.gate = ConnectionGate("metrics", self._runner.server, self.limits)
        site = GatedSite(
            self._runner, self.gate, self.s.address, self.s.port, reuse_port=self.s.reuse_port
        )
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        if self.s.gpu:
            self.gpus = await asyncio.to_thread(GpuSampler.open)
        if self.host is not None:
            self.host.sample()
        if self.host is not None or self.gpus is not None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
        log.info("metrics on %s:%d", self.s.address, self.s.port)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.gpus is not None:
            self.gpus.close()
            self.gpus = None

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(max(self.s.interval_ms, 1) / 1000)
            if self.host is not None:
                self.host.sample()
            if self.gpus is not None:
                await asyncio.to_thread(self.gpus.sample)

    async def _metrics(self, request: web.Request) -> web.Response:
        quantiles = [q for q, _ in self.s.config.summary_quantiles]
        try:
            versions = await self._fetch(quantiles if self.s.config.summary_latencies else [])
        except ServingError as err:
            return web.Response(status=503, text=f"metrics unavailable: {err.message}\n")
        listeners = [*(self._connections() if self._connections else [])]
        if self.gate is not None:
            listeners.append(self.gate.counts())
        connections = (self.s.frontend, listeners)
        custom = None
        if self.runtime_dir is not None:
            snapshots = await asyncio.to_thread(custom_metrics.read_all, self.runtime_dir)
            custom = custom_metrics.merge(snapshots)
        body = render(
            versions,
            self.s.config,
            self.host,
            self.cache,
            self.gpus,
            connections,
            custom,
            self.hops,
        )
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE})
