"""What tracing costs: one server under one steady load, its trace setting switched
through the trace API (``POST /v2/trace/setting``) every ``--segment`` seconds between
tracing off and Triton-mode tracing at ``rate=1000`` (one request in a thousand traced,
written to a trace file), then between off and ``rate=1`` (every request traced).

On a host shared with other work, throughput and CPU time swing by far more than the 2%
to be shown, and the swings last seconds: two runs a minute apart do not see the same
host. So one perf_analyzer run drives ``simple`` (the cheapest model: the overhead shows
most) per protocol, and the setting alternates under it in short segments, in the order
off, on, on, off, off, on, ... (each pair of segments is one off and one on, back to
back, and neither comes first more often). For each segment: the requests the server
answered (its statistics) and the on-CPU nanoseconds of each process role (every
thread's /proc/<pid>/task/<tid>/schedstat: ns, not 10 ms ticks), hence throughput and
CPU µs per request. The report gives, per pair, the ratio on/off of each, as the median
and quartiles over the pairs, and the pooled ratio (all on segments' CPU per request
over all off segments'). What ``rate=1000`` adds is a fraction of a percent, below what
the host's swings let a direct comparison resolve; ``rate=1`` multiplies it by a
thousand, so its pooled difference from off is what one traced request costs, and a
thousandth of it (with the sampling decision, ``micro``) is what ``rate=1000`` adds to
each request: the report gives that figure beside the direct one. It also times, in this
process, the work tracing adds to a request. A record, not a test: nothing asserts a
speed.

    python bench/run_tracing.py [--segments 60] [--segment 1.0] [--concurrency 8]
        [--protocols http,grpc] [--on rate=1000,rate=1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import cpu
from common import csv_list, fmt, link_model, start_run, start_server, write_report
from perf_analyzer import run_perf_analyzer
from servers import REPO_ROOT, ServerProcess, shoal_server

sys.path.insert(0, str(REPO_ROOT))

ROLES = ("frontend", "broker", "worker", "server")


@dataclass(frozen=True)
class Segment:
    """One slice of the load under one setting: its length, the requests answered and
    the CPU ns each role spent in it."""

    setting: str
    seconds: float
    requests: int
    cpu_ns: dict[str, int]

    def per_request_us(self, role: str) -> float | None:
        return self.cpu_ns.get(role, 0) / 1e3 / self.requests if self.requests else None


def _server(run_raw: Path, repo: Path, trace_dir: Path) -> ServerProcess:
    """Triton-mode tracing to a file, rotated every 1000 traces (``_switch`` sets the
    level and rate of each segment)."""
    flags = (
        "--trace-config=rate=1000",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=triton,file={trace_dir / 'trace.json'}",
        "--trace-config=triton,log-frequency=1000",
    )
    return shoal_server(repo, run_raw / "shoal.log", extra=flags)


def _switch(srv: ServerProcess, name: str) -> None:
    """The server's global trace setting to ``name``'s: ``off``, or ``rate=N``."""
    rate = name.partition("=")[2] or "1000"
    level = ["OFF"] if name == "off" else ["TIMESTAMPS"]
    body = json.dumps({"trace_level": level, "trace_rate": rate}).encode()
    req = urllib.request.Request(f"http://{srv.http_url}/v2/trace/setting", data=body)
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def _reading(srv: ServerProcess) -> tuple[float, int, dict[str, int]]:
    assert srv.proc is not None
    return time.monotonic(), cpu.served(srv.http_url, "simple"), cpu.cpu_ns_by_role(srv.proc.pid)


def setting_of(k: int, on: str) -> str:
    """Segment ``k``'s setting: off, on, on, off, off, on, ... (pairs 2j, 2j+1)."""
    return on if (k + 1) // 2 % 2 else "off"


def _segments(
    pa: str, srv: ServerProcess, protocol: str, on: str, a: argparse.Namespace, raw: Path
) -> list[Segment]:
    """One perf_analyzer load for the whole run, the setting switched under it between
    off and ``on``."""
    warm_s = 3.0
    total_s = warm_s + a.segments * (a.segment + 0.1) + 5
    load = threading.Thread(target=run_perf_analyzer, args=(pa,), kwargs=dict(
        server="shoal", url=srv.url(protocol), protocol=protocol, model="simple",
        concurrency=a.concurrency, csv_path=raw / f"{protocol}-{on.replace('=', '')}.csv",
        interval_ms=int(total_s / 3 * 1000) + 1000, max_trials=3, stability_pct=999,
        timeout_s=total_s * 2 + 60,
    ), daemon=True)  # fmt: skip
    load.start()
    time.sleep(warm_s)  # (perf_analyzer's start and the server's first requests)
    out = []
    for k in range(a.segments):
        if not load.is_alive():
            break
        name = setting_of(k, on)
        _switch(srv, name)
        t0, n0, c0 = _reading(srv)
        time.sleep(a.segment)
        t1, n1, c1 = _reading(srv)
        used = {role: c1.get(role, 0) - c0.get(role, 0) for role in c1}
        used["server"] = sum(v for r, v in used.items() if r in ("frontend", "broker", "worker"))
        out.append(Segment(name, t1 - t0, n1 - n0, used))
    load.join()
    return out


def micro() -> dict[str, float]:
    """ns of the work tracing adds in a frontend, per request: ``check`` (the one check
    when off), ``sample`` (the HTTP frontend's decision at rate=1000, its one trace in
    1000 included: the model's name and the traceparent header read, then the
    tracer's count) and ``traced`` (one traced request's stamps, record and file
    entries, which rate=1000 pays once in 1000 requests)."""
    import timeit

    from aiohttp.test_utils import make_mocked_request

    from shoal.dataplane.tracing import Trace, Tracer
    from shoal.frontend import http_trace
    from shoal.frontend.trace_sink import triton_entries
    from shoal.ipc import messages as m

    request = make_mocked_request(
        "POST", "/v2/models/simple/infer", match_info={"model": "simple"},
        headers={"Host": "x", "Content-Type": "application/octet-stream",
                 "Inference-Header-Content-Length": "200", "User-Agent": "perf_analyzer"},
    )  # fmt: skip

    on = m.TraceSetting(levels=("TIMESTAMPS",), rate=1000, file="/dev/null")
    tracer = Tracer(0, lambda *_: None)
    tracer.apply(m.TraceTable(default=on))
    off = Tracer(0, lambda *_: None)
    off.apply(m.TraceTable())

    def traced() -> None:
        t = Trace(1, "simple", tracer.next_id)
        for name in ("HTTP_RECV_START", "HTTP_RECV_END"):
            t.stamp(name)
        req = m.InferRequest(1, "simple", -1, [], [])
        t.sent(req)
        way = m.TracedAnswer([1, 2, 3, 4, 5], [("COMPUTE_START", 4)] * 4, {"worker_pid": 1})
        t.answered(m.InferResponse(1, hops=way))
        for name in ("HTTP_SEND_START", "HTTP_SEND_END"):
            t.stamp(name)
        json.dumps(triton_entries(t.record()))

    def best(stmt: object, n: int) -> float:
        return min(timeit.repeat(stmt, number=n, repeat=7)) / n * 1e9  # type: ignore[arg-type]

    return {
        "check": best(lambda: off.active, 100_000),
        "sample": best(lambda: http_trace.sample(request, tracer), 100_000),
        "traced": best(traced, 2_000),
    }


def _quartiles(values: list[float]) -> str:
    """``median [p25, p75]`` of ``values`` (— for none)."""
    if len(values) < 4:
        return fmt(statistics.median(values) if values else None, ".3f")
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return f"{q2:.3f} [{q1:.3f}, {q3:.3f}]"


def _pooled(segments: list[Segment], name: str, role: str) -> float | None:
    """CPU µs per request of all ``name`` segments together."""
    mine = [s for s in segments if s.setting == name]
    n = sum(s.requests for s in mine)
    return sum(s.cpu_ns.get(role, 0) for s in mine) / 1e3 / n if n else None


def _protocol_lines(protocol: str, segments: list[Segment], on: str) -> list[str]:
    pairs = [(segments[i], segments[i + 1]) for i in range(0, len(segments) - 1, 2)]
    pairs = [(a, b) if a.setting == on else (b, a) for a, b in pairs]  # (on, off)
    tput = [(a.requests / a.seconds) / (b.requests / b.seconds) for a, b in pairs if b.requests]
    rows = [f"| {protocol} | infer/s | {_quartiles(tput)} | — | — | — |"]
    for role in ROLES:
        r = [x / y for a, b in pairs
             if (x := a.per_request_us(role)) and (y := b.per_request_us(role))]  # fmt: skip
        off, mine = _pooled(segments, "off", role), _pooled(segments, on, role)
        pooled = mine / off if mine is not None and off else None
        cells = f"{fmt(off, ',.1f')} | {fmt(mine, ',.1f')} | {fmt(pooled, '.4f')}"
        rows.append(f"| {protocol} | {role} CPU µs/req | {_quartiles(r)} | {cells} |")
    return rows


def _per_traced(segments: list[Segment], on: str) -> float | None:
    """The server's CPU µs one traced request adds, from ``on`` (rate=N) against off:
    the pooled difference per request, times N (the sampling decision left in)."""
    off, mine = _pooled(segments, "off", "server"), _pooled(segments, on, "server")
    rate = int(on.partition("=")[2] or 1000)
    return None if off is None or mine is None else (mine - off) * rate


def _report(
    results: dict[tuple[str, str], list[Segment]], a: argparse.Namespace, load: tuple[float, float]
) -> str:
    ns = micro()
    pairs = ", ".join(f"{p} {on}: {len(s) // 2}" for (p, on), s in results.items())
    lines = [
        f"# What tracing costs ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`simple`, batch 1, c={a.concurrency}; one server, one perf_analyzer load per "
        f"protocol and setting, the setting switched between off and it every "
        f"{a.segment:g} s (pairs: {pairs}). Load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end (a shared 2-core host).",
        "",
        "| protocol | on | what | on/off per pair: median [p25, p75] | off (pooled) | "
        "on (pooled) | pooled on/off |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for (protocol, on), segments in results.items():
        lines += [row.replace(f"| {protocol} |", f"| {protocol} | {on} |", 1)
                  for row in _protocol_lines(protocol, segments, on)]  # fmt: skip
    offs = [x for s in results.values() for seg in s if seg.setting == "off"
            and (x := seg.per_request_us("server")) is not None]  # fmt: skip
    server_us = statistics.median(offs) if offs else 0.0
    if any(on == "rate=1" for _, on in results):
        lines += ["", "## rate=1000, from what one traced request costs (rate=1 against off)", ""]
    for (protocol, on), segments in results.items():
        traced = _per_traced(segments, on) if on == "rate=1" else None
        if traced is not None and server_us:
            added = traced / 1000 + ns["sample"] / 1e3
            lines.append(
                f"- {protocol}: a traced request costs the server {traced:,.1f} µs of CPU more; "
                f"at rate=1000 that and the sampling decision are {added:.3f} µs a request, "
                f"{added / server_us:.3%} of the server's CPU per request off"
            )
    added_ns = ns["sample"] + ns["traced"] / 1000
    share = f", {added_ns / server_us / 1e3:.3%} of the server's CPU per request off"
    lines += [
        "",
        "## The work tracing adds, timed alone (ns per request, best of 7 repeats)",
        "",
        f"- off: the check, {ns['check']:.0f} ns (an untraced request's messages carry "
        "no extra bytes; its other tracing branches are `is None` tests)",
        f"- rate=1000: the sampling decision {ns['sample']:.0f} ns, and one traced request's "
        f"handling in the frontend {ns['traced']:,.0f} ns once in 1000 requests: "
        f"{added_ns:.0f} ns a request{share if server_us else ''}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--protocols", type=csv_list, default=["http", "grpc"])
    p.add_argument("--on", type=csv_list, default=["rate=1000", "rate=1"],
                   help="the settings each compared with off: rate=N")  # fmt: skip
    p.add_argument("--segments", type=int, default=60, help="per protocol and setting")
    p.add_argument("--segment", type=float, default=1.0, help="seconds per segment")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    a = p.parse_args(argv)
    run = start_run(a.out_dir, "tracing")
    skipped: list[str] = []
    results: dict[tuple[str, str], list[Segment]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-tracing-") as tmp:
        repo, traces = Path(tmp) / "repo", Path(tmp) / "traces"
        traces.mkdir()
        link_model(a.repo, repo, "simple", (a.repo / "simple" / "config.pbtxt").read_text())
        srv = start_server(_server(run.raw, repo, traces), 120, skipped)
        try:
            for protocol in a.protocols if srv is not None else []:
                for on in a.on:
                    assert srv is not None
                    got = _segments(run.pa, srv, protocol, on, a, run.raw)
                    results[(protocol, on)] = got
                    print(f"[bench] {protocol}, off/{on}: {len(got)} segments", flush=True)
        finally:
            if srv is not None:
                srv.stop()
    report = _report(results, a, (run.load, os.getloadavg()[0]))
    return write_report(a.out_dir, run.stamp, "tracing", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
