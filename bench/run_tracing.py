"""What tracing costs: one server, its trace setting switched through the trace API
(``POST /v2/trace/setting``) between many short runs of the same load, tracing off and
Triton-mode tracing at ``rate=1000`` (one request in a thousand traced, written to a trace
file) back to back, so that a drift of the host's load hits both alike and no difference
of two servers' placement on the cores enters the ratio.

shoal serves the shipped ``simple`` (the cheapest model: the overhead shows most). Each
round runs every setting once per protocol, in an order that alternates between rounds
(off, on, then on, off), as perf_analyzer runs of ``--max-trials`` windows of
``--measurement-interval`` ms. For each run: throughput and the CPU µs per request of
each process role (/proc/<pid>/stat around the run, divided by the requests the server
counted), which moves far less than throughput on a shared host. The report gives, per
round, the ratio on/off of each (the two runs of a round are seconds apart), as the
median and quartiles over the rounds. ``rate=1`` (every request traced) shows what one
traced request costs. The report also times, in this process, the work tracing adds to a
request (``micro``). A record, not a test: nothing asserts a speed.

    python bench/run_tracing.py [--rounds 12] [--concurrency 8] [--protocols http,grpc]
        [--settings off,rate=1000,rate=1]
"""

from __future__ import annotations

import argparse
import json
import os
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

SETTINGS = ("off", "rate=1000", "rate=1")
ROLES = ("frontend", "broker", "worker", "server")
Results = dict[tuple[str, str, int], list[Measurement]]


def _server(run_raw: Path, repo: Path, trace_dir: Path) -> ServerProcess:
    """One server for every setting: Triton-mode tracing to a file, rotated every 1000
    traces (``_switch`` sets the level and rate of each run)."""
    flags = (
        "--trace-config=rate=1000",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=triton,file={trace_dir / 'trace.json'}",
        "--trace-config=triton,log-frequency=1000",
    )
    return shoal_server(repo, run_raw / "shoal.log", extra=flags)


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


def _cpu(m: Measurement, role: str) -> float | None:
    return m.cpu_us.get(role) if m.cpu_us else None


def _quartiles(values: list[float]) -> str:
    """``median [p25, p75]`` of ``values`` (— for none)."""
    if not values:
        return "—"
    if len(values) < 4:
        return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return f"{q2:.3f} [{q1:.3f}, {q3:.3f}]"


def _medians(results: Results) -> list[str]:
    """Each setting's median throughput and CPU µs per request by role, over its runs."""
    head = " | ".join(f"{r} µs/req" for r in ROLES)
    out = [f"| protocol | c | tracing | runs | infer/s | {head} |",
           "|---|---:|---|---:|---:|" + "---:|" * len(ROLES)]  # fmt: skip
    for (protocol, name, c), ms in sorted(results.items()):
        tput = statistics.median(m.throughput for m in ms)
        cells = []
        for role in ROLES:
            values = [v for m in ms if (v := _cpu(m, role)) is not None]
            cells.append(fmt(statistics.median(values) if values else None, ",.1f"))
        out.append(f"| {protocol} | {c} | {name} | {len(ms)} | {tput:,.0f} | "
                   + " | ".join(cells) + " |")  # fmt: skip
    return out


def _paired(results: Results) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Each round's ratio on/off (its two runs were back to back), as median [p25, p75]
    over the rounds: throughput, and CPU per request by role. Also the medians of the
    throughput and server-CPU ratios, by (protocol, setting)."""
    head = " | ".join(f"{r} CPU/req on/off" for r in ROLES)
    out = [f"| protocol | c | tracing | rounds | infer/s on/off | {head} |",
           "|---|---:|---|---:|---|" + "---|" * len(ROLES)]  # fmt: skip
    verdict: dict[tuple[str, str], float] = {}
    for (protocol, name, c), ms in sorted(results.items()):
        off = results.get((protocol, "off", c), [])
        if name == "off" or not off:
            continue
        pairs = list(zip(ms, off, strict=False))
        tput = [a.throughput / b.throughput for a, b in pairs if b.throughput]
        cells = []
        for role in ROLES:
            r = [x / y for a, b in pairs if (x := _cpu(a, role)) and (y := _cpu(b, role))]
            cells.append(_quartiles(r))
            if role == "server" and r:
                verdict[(protocol, name + " cpu")] = statistics.median(r)
        if tput:
            verdict[(protocol, name)] = statistics.median(tput)
        out.append(f"| {protocol} | {c} | {name} | {len(pairs)} | {_quartiles(tput)} | "
                   + " | ".join(cells) + " |")  # fmt: skip
    return out, verdict


def _report(results: Results, load: tuple[float, float], ns: dict[str, float]) -> str:
    lines = [f"# What tracing costs ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"`simple`, batch 1, one server switched between the settings through "
             f"/v2/trace/setting. Load average {load[0]:.1f} at the start, {load[1]:.1f} "
             f"at the end (a shared host).", "", "## Each setting (medians over its runs)",
             "", *_medians(results), "",
             "## Round by round (on/off within each round: median [p25, p75])", ""]  # fmt: skip
    paired, verdict = _paired(results)
    lines += paired
    offs = [v for k, ms in results.items() if k[1] == "off" for m in ms
            if (v := _cpu(m, "server")) is not None]  # fmt: skip
    server_ns = (statistics.median(offs) if offs else 0.0) * 1e3
    added = ns["sample"] + ns["traced"] / 1000
    share = f", {added / server_ns:.3%} of the server's CPU per request off" if server_ns else ""
    lines += ["", "## rate=1000 against off (medians of the rounds' ratios)", ""]
    for (protocol, what), r in sorted(verdict.items()):
        if what.startswith("rate=1000"):
            kind = "server CPU per request" if what.endswith("cpu") else "throughput"
            lines.append(f"- {protocol}: {kind} {r - 1:+.2%}")
    lines += [
        "",
        "## The work tracing adds, timed alone (ns per request, best of 7 repeats)",
        "",
        f"- off: the check, {ns['check']:.0f} ns (an untraced request's messages carry "
        "no extra bytes; its other tracing branches are `is None` tests)",
        f"- rate=1000: the sampling decision {ns['sample']:.0f} ns, and one traced request's "
        f"handling in the frontend {ns['traced']:,.0f} ns once in 1000 requests: "
        f"{added:.0f} ns a request{share}",
    ]
    return "\n".join(lines) + "\n"


def _order(settings: list[str], r: int) -> list[str]:
    """Round ``r``'s order: rotated each round, reversed every other (off, on / on, off
    for two settings), so that neither runs first more often nor after the other."""
    k = (r // 2) % len(settings)
    names = settings[k:] + settings[:k]
    return names[::-1] if r % 2 else names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--concurrency", type=csv_ints, default=[8])
    p.add_argument("--protocols", type=csv_list, default=["http", "grpc"])
    p.add_argument("--settings", type=csv_list, default=["off", "rate=1000"])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--measurement-interval", type=int, default=1000)
    p.add_argument("--max-trials", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    a = p.parse_args(argv)
    assert set(a.settings) <= set(SETTINGS), f"settings: {', '.join(SETTINGS)}"
    run = start_run(a.out_dir, "tracing")
    skipped: list[str] = []
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-tracing-") as tmp:
        repo, traces = Path(tmp) / "repo", Path(tmp) / "traces"
        traces.mkdir()
        link_model(a.repo, repo, "simple", (a.repo / "simple" / "config.pbtxt").read_text())
        srv = start_server(_server(run.raw, repo, traces), 120, skipped)
        try:
            for r in range(a.rounds if srv is not None else 0):
                assert srv is not None
                for protocol in a.protocols:
                    for c in a.concurrency:
                        for name in _order(a.settings, r):
                            _switch(srv, name)
                            csv = run.raw / f"{name.replace('=', '')}-{protocol}-c{c}-r{r}.csv"
                            m = _point(run.pa, srv, protocol, c, a, csv)
                            results.setdefault((protocol, name, c), []).append(m)
                print(f"[bench] round {r + 1}/{a.rounds} done", flush=True)
        finally:
            if srv is not None:
                srv.stop()
    report = _report(results, (run.load, os.getloadavg()[0]), micro())
    return write_report(a.out_dir, run.stamp, "tracing", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
