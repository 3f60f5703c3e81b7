"""What tracing costs: the same load on shoal with tracing off, and with Triton-mode
tracing on at ``rate=1000`` (one request in a thousand traced, written to a trace file),
side by side in one run.

shoal serves the shipped ``simple`` (the cheapest model: the overhead shows most); for each
protocol perf_analyzer drives it at each concurrency, alternating the two servers
``--rounds`` times so that a drift of the host's load hits both alike. The report gives
each setting's throughput, the ratio on/off, and the server's CPU µs per request by role
(/proc/<pid>/stat over each run). Another server answering ``rate=1`` (every request
traced) shows what one traced request costs. On a loaded host the throughputs swing far
more than 2%, so the report also times, in this process, the work tracing adds to a
request (``micro``): the check when off, the sampling decision at rate=1000, and a traced
request's own handling, each the best of several repeats. A record, not a test: nothing
asserts a speed, and on a host shared with other work the ratios are indicative only.

    python bench/run_tracing.py [--concurrency 8] [--protocols http,grpc] [--rounds 2]
        [--one-server]  # one server switched through the trace API: no placement bias
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

import cpu
from common import csv_ints, csv_list, fmt, link_model, start_run, start_server, write_report
from perf_analyzer import Measurement, run_perf_analyzer
from servers import REPO_ROOT, ServerProcess, shoal_server

sys.path.insert(0, str(REPO_ROOT))

SETTINGS = {
    "off": (),
    "rate=1000": ("--trace-config=rate=1000",),
    "rate=1": ("--trace-config=rate=1",),
}


def _server(run_raw: Path, repo: Path, name: str, trace_dir: Path) -> ServerProcess:
    flags = SETTINGS[name]
    if flags:
        tag = name.replace("=", "")
        flags = (
            *flags,
            "--trace-config=level=TIMESTAMPS",
            f"--trace-config=triton,file={trace_dir / f'{tag}.json'}",
            "--trace-config=triton,log-frequency=1000",
        )
    return shoal_server(repo, run_raw / f"shoal-{name.replace('=', '')}.log", extra=flags)


def _point(
    pa: str, srv: ServerProcess, protocol: str, c: int, a: argparse.Namespace, csv: Path
) -> Measurement:
    pid = srv.proc.pid if srv.proc is not None else None
    return cpu.measured(pid, srv.http_url, "simple", True, partial(
        run_perf_analyzer, pa, server="shoal", url=srv.url(protocol), protocol=protocol,
        model="simple", concurrency=c, csv_path=csv, interval_ms=a.measurement_interval,
        max_trials=a.max_trials, stability_pct=20,
        timeout_s=(a.max_trials + 2) * a.measurement_interval / 1e3 + 30,
    ))  # fmt: skip


def _switch(srv: ServerProcess, name: str) -> None:
    """The server's global trace setting to ``name``'s (SETTINGS): level and rate."""
    rate = name.partition("=")[2] or "1000"
    level = ["OFF"] if name == "off" else ["TIMESTAMPS"]
    body = json.dumps({"trace_level": level, "trace_rate": rate}).encode()
    req = urllib.request.Request(f"http://{srv.http_url}/v2/trace/setting", data=body)
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def micro() -> dict[str, float]:
    """ns of the work tracing adds in a frontend, per request: ``check`` (the one check
    when off), ``sample`` (the decision at rate=1000, its one trace in 1000 included) and
    ``traced`` (one traced request's stamps, record and file entries, which rate=1000
    pays once in 1000 requests; the worker's and broker's part is a few list appends)."""
    import timeit

    from shoal.dataplane.tracing import Trace, Tracer
    from shoal.frontend.trace_sink import triton_entries
    from shoal.ipc import messages as m

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
        "sample": best(lambda: tracer.sample("simple"), 100_000),
        "traced": best(traced, 2_000),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _server_us(m: Measurement) -> float | None:
    return m.cpu_us.get("server") if m.cpu_us else None


def _paired(results: dict[tuple[str, str, int], list[Measurement]]) -> list[str]:
    """Each round's on/off ratio (the two runs of a round are back to back, so a drift of
    the host's load hits both alike), as the median and the range over the rounds: on a
    shared host steadier than the ratio of the means."""
    out = ["", "## Round by round (on/off within each round: median [min, max])", "",
           "| protocol | c | tracing | rounds | infer/s on/off | server CPU µs/req on/off |",
           "|---|---:|---|---:|---|---|"]  # fmt: skip
    for (protocol, name, c), ms in sorted(results.items()):
        off = results.get((protocol, "off", c), [])
        if name == "off" or not off:
            continue
        pairs = list(zip(ms, off, strict=False))
        tput = sorted(a.throughput / b.throughput for a, b in pairs if b.throughput)
        cpu = sorted(x / y for a, b in pairs if (x := _server_us(a)) and (y := _server_us(b)))

        def cell(v: list[float]) -> str:
            return f"{statistics.median(v):.3f} [{v[0]:.3f}, {v[-1]:.3f}]" if v else "—"

        out.append(f"| {protocol} | {c} | {name} | {len(pairs)} | {cell(tput)} | {cell(cpu)} |")
    return out


def _report(
    results: dict[tuple[str, str, int], list[Measurement]], load: float, ns: dict[str, float]
) -> str:
    lines = [f"# What tracing costs ({time.strftime('%Y-%m-%d %H:%M')})", ""]
    lines += [
        f"`simple`, batch 1; each row the mean of its runs. Load average at the start: "
        f"{load:.1f} (a shared host: the ratios are indicative).",
        "",
        "| protocol | c | tracing | infer/s | on/off | p50 µs | frontend µs | broker µs | "
        "worker µs | server µs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (protocol, name, c), ms in sorted(results.items()):
        off = results.get((protocol, "off", c), [])
        tput = _mean([m.throughput for m in ms])
        base = _mean([m.throughput for m in off])
        ratio = None if tput is None or not base else tput / base
        p50 = _mean([m.p50_us for m in ms if m.p50_us is not None])
        roles = [
            _mean([m.cpu_us[r] for m in ms if m.cpu_us and r in m.cpu_us])
            for r in ("frontend", "broker", "worker", "server")
        ]
        lines.append(
            f"| {protocol} | {c} | {name} | {fmt(tput, ',.0f')} | {fmt(ratio, '.3f')} | "
            f"{fmt(p50, ',.0f')} | " + " | ".join(fmt(r, ",.1f") for r in roles) + " |"
        )
    lines += _paired(results)
    offs = [m.cpu_us["server"] for k, ms in results.items() if k[1] == "off" for m in ms
            if m.cpu_us and "server" in m.cpu_us]  # fmt: skip
    server_ns = (_mean(offs) or 0.0) * 1e3
    added = ns["sample"] + ns["traced"] / 1000
    share = f", {added / server_ns:.3%} of the server's CPU per request off" if server_ns else ""
    lines += [
        "",
        "## The work tracing adds, timed alone (ns per request, best of 7 repeats)",
        "",
        f"- off: the one check, {ns['check']:.0f} ns",
        f"- rate=1000: the sampling decision {ns['sample']:.0f} ns, and one traced request's "
        f"handling in the frontend {ns['traced']:,.0f} ns once in 1000 requests: "
        f"{added:.0f} ns a request{share}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--concurrency", type=csv_ints, default=[8])
    p.add_argument("--protocols", type=csv_list, default=["http", "grpc"])
    p.add_argument("--settings", type=csv_list, default=list(SETTINGS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--measurement-interval", type=int, default=3000)
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument("--one-server", action="store_true",
                   help="one server for every setting, switched through /v2/trace/setting "
                   "between runs (no difference of placement between two servers)")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    a = p.parse_args(argv)
    run = start_run(a.out_dir, "tracing")
    skipped: list[str] = []
    results: dict[tuple[str, str, int], list[Measurement]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-tracing-") as tmp:
        repo, traces = Path(tmp) / "repo", Path(tmp) / "traces"
        traces.mkdir()
        link_model(a.repo, repo, "simple", (a.repo / "simple" / "config.pbtxt").read_text())
        servers = {}
        if a.one_server:  # one server, its setting changed through the trace API
            srv = start_server(_server(run.raw, repo, "rate=1000", traces), 120, skipped)
            servers = dict.fromkeys(a.settings, srv) if srv is not None else {}
        for name in [] if a.one_server else a.settings:
            srv = start_server(_server(run.raw, repo, name, traces), 120, skipped)
            if srv is not None:
                servers[name] = srv
        try:
            for r in range(a.rounds):
                for protocol in a.protocols:
                    for c in a.concurrency:
                        # (each round in another order: a drifting load hits all alike)
                        names = list(servers)
                        names = names[r % len(names) :] + names[: r % len(names)]
                        for name, srv in ((n, servers[n]) for n in names):
                            if a.one_server:
                                _switch(srv, name)
                            csv = run.raw / f"{name.replace('=', '')}-{protocol}-c{c}-r{r}.csv"
                            m = _point(run.pa, srv, protocol, c, a, csv)
                            results.setdefault((protocol, name, c), []).append(m)
        finally:
            for srv in set(servers.values()):
                srv.stop()
    report = _report(results, run.load, micro())
    return write_report(a.out_dir, run.stamp, "tracing", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
