"""A soak: a server held at saturation for ``--duration`` seconds (default 600), across
several models, over HTTP and gRPC, with connection churn, clients that go away before
their answer and slow clients; what it asks of the server at the end is that it be
where it was at the start. A record, not a test.

One ``shoal serve`` on the repository (``model_repository/`` by default: ``simple``,
``mlp`` and ``mlp_large`` are driven, ``simple_sequence`` idles), started here and
stopped at the end with everything it started. ``--client-processes`` processes run the
clients of ``soak_clients.py`` (its docstring lists the kinds; ``--clients`` sets how many
of each). The report (``bench/results/<stamp>-soak.md``, and ``.json``) gives:

* every server process (launcher, broker, frontends, workers): its resident memory
  (VmRSS) and open descriptors idle before the load, once warmed up (``--warmup``
  seconds in), at the load's end and idle after it; the verdicts: RSS grew less than 5%
  from warm to end, and descriptors came back to their idle count;
* every client outcome by kind, those the kind should not earn marked as errors (the
  slow clients earn their cut; a client that hangs up earns nothing);
* requests per second and p50 / p99 per ``--window`` seconds, per protocol;
* the WARNING and ERROR lines of the server's log during the soak, grouped.

    python bench/run_soak.py                      # 10 minutes
    python bench/run_soak.py --duration 60 --warmup 10 --window 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from servers import REPO_ROOT, ServerProcess, descendants, shoal_server
from soak_clients import EXPECTED, KINDS, ClientPlan, ClientReport, run_clients

_DEFAULT_CLIENTS = {
    "http": 8,
    "grpc": 8,
    "http-churn": 2,
    "grpc-churn": 2,
    "http-hangup": 1,
    "grpc-cancel": 1,
    "slow-header": 2,
    "slow-body": 2,
}
_RSS_GROWTH_LIMIT = 0.05


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds before 'warm' figures")
    p.add_argument("--window", type=float, default=30.0, help="seconds per p99 window")
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--models", default="simple,mlp,mlp_large", help="those present are driven")
    p.add_argument("--frontends", type=int, default=1)
    p.add_argument("--client-processes", type=int, default=2)
    p.add_argument(
        "--clients",
        default=",".join(f"{k}={v}" for k, v in _DEFAULT_CLIENTS.items()),
        help="kind=count,... (in all, shared out over the client processes)",
    )
    p.add_argument(
        "--prime",
        type=float,
        default=10.0,
        help="seconds of the same load before the idle figures: what the first requests "
        "set up for good (mapped slabs, gRPC's pollers) is part of the idle state",
    )
    p.add_argument("--settle", type=float, default=60.0, help="most seconds to wait for idle")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return p.parse_args(argv)


def _counts(text: str) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for part in filter(None, text.split(",")):
        kind, _, n = part.partition("=")
        if kind not in out:
            raise SystemExit(f"--clients: unknown kind '{kind}' (known: {', '.join(KINDS)})")
        out[kind] = int(n)
    return out


# -- the server's processes ----------------------------------------------------------


def _role(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode(errors="replace") for a in argv]
    if "serve" in words and any(w.endswith("shoal") for w in words):
        return "launcher"
    if "shoal.broker" in words:
        return "broker"
    if "shoal.frontend" in words:
        return f"frontend#{words[words.index('--index') + 1]}"
    if "shoal.workers" in words:
        return f"worker {words[words.index('--model') + 1]}#{words[words.index('--instance') + 1]}"
    return " ".join(words[:3])


def _snapshot(root: int) -> dict[str, dict[str, int]]:
    """role -> {pid, rss_kib, fds} of the server's processes now."""
    out: dict[str, dict[str, int]] = {}
    for pid in [root, *descendants(root)]:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            out[_role(pid)] = {"pid": pid, "rss_kib": rss, "fds": fds}
        except (OSError, AttributeError, ValueError, IndexError):
            continue
    return out


def _steady(root: int, most_s: float) -> dict[str, dict[str, int]]:
    """The processes' figures once their descriptor counts held for 3 s (or ``most_s``)."""
    deadline = time.monotonic() + most_s
    last = _snapshot(root)
    while time.monotonic() < deadline:
        time.sleep(3)
        now = _snapshot(root)
        if {r: v["fds"] for r, v in now.items()} == {r: v["fds"] for r, v in last.items()}:
            return now
        last = now
    return last


def _settle(root: int, idle: dict[str, dict[str, int]], most_s: float) -> dict[str, dict[str, int]]:
    """The processes' figures once every one holds its idle count of descriptors again,
    or after ``most_s``."""
    deadline = time.monotonic() + most_s
    while True:
        now = _snapshot(root)
        back = all(now.get(r, {}).get("fds") == v["fds"] for r, v in idle.items())
        if back or time.monotonic() > deadline:
            return now
        time.sleep(1)


# -- the report ----------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _process_table(snaps: dict[str, dict[str, dict[str, int]]]) -> tuple[list[str], list[str]]:
    idle, warm, end, after = (snaps[k] for k in ("idle", "warm", "end", "after"))
    lines = [
        "| process | pid | RSS idle | RSS warm | RSS end | growth warm→end | RSS after "
        "| fds idle | fds warm | fds end | fds after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failures = []
    for role in sorted(idle):
        i, w, e, a = (s.get(role, {}) for s in (idle, warm, end, after))
        growth = (e.get("rss_kib", 0) - w.get("rss_kib", 0)) / max(w.get("rss_kib", 1), 1)
        mib = [f"{s.get('rss_kib', 0) / 1024:.1f} MiB" for s in (i, w, e, a)]
        lines.append(
            f"| {role} | {i.get('pid')} | {mib[0]} | {mib[1]} | {mib[2]} | {growth:+.1%} | "
            f"{mib[3]} | {i.get('fds')} | {w.get('fds')} | {e.get('fds')} | {a.get('fds')} |"
        )
        if a.get("pid") != i.get("pid"):
            failures.append(f"{role}: pid {i.get('pid')} became {a.get('pid')} (restarted)")
        if growth >= _RSS_GROWTH_LIMIT:
            failures.append(f"{role}: RSS grew {growth:.1%} from warm to end")
        if a.get("fds") != i.get("fds"):
            failures.append(f"{role}: {a.get('fds')} descriptors after, {i.get('fds')} idle before")
    return lines, failures


def _outcome_table(outcomes: Counter[tuple[str, str]]) -> tuple[list[str], int]:
    lines = ["| client kind | outcome | count | |", "|---|---|---|---|"]
    errors = 0
    for (kind, outcome), n in sorted(outcomes.items()):
        expected = outcome in EXPECTED[kind]
        errors += 0 if expected else n
        lines.append(f"| {kind} | {outcome} | {n} | {'' if expected else '**error**'} |")
    return lines, errors


def _window_table(
    latencies: dict[tuple[int, str], list[float]], window_s: float, duration_s: float
) -> list[str]:
    lines = ["| window (s) | protocol | requests/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for (window, protocol), values in sorted(latencies.items()):
        if (window + 1) * window_s > duration_s + 1e-9:
            continue  # a part-window: the requests that ended after the load's end
        lines.append(
            f"| {window * window_s:.0f}-{(window + 1) * window_s:.0f} | {protocol} | "
            f"{len(values) / window_s:,.0f} | {_percentile(values, 0.5):.2f} | "
            f"{_percentile(values, 0.99):.2f} |"
        )
    return lines


def _log_lines(text: str) -> list[str]:
    """The WARNING and ERROR lines, grouped by their text with numbers blanked."""
    groups: Counter[str] = Counter()
    for line in text.splitlines():
        if re.match(r"\S+ \S+\[\d+\] [WE] ", line):
            groups[re.sub(r"\d+", "N", line.split(" ", 2)[2])[:200]] += 1
    return [f"- {n} x `{text}`" for text, n in groups.most_common()] or ["- none"]


# -- the run -------------------------------------------------------------------------


def _plans(
    a: argparse.Namespace, server: ServerProcess, start: float, duration: float
) -> list[ClientPlan]:
    assert server.grpc_url is not None
    http, grpc = server.http_url, server.grpc_url
    counts = _counts(a.clients)
    repo_models = {d.name for d in a.repo.iterdir() if (d / "config.pbtxt").exists()}
    models = [m for m in a.models.split(",") if m in repo_models]
    n = max(a.client_processes, 1)
    plans = []
    for i in range(n):
        share = {k: v // n + (1 if i < v % n else 0) for k, v in counts.items()}
        plans.append(ClientPlan(http, grpc, models, share, start + duration, start, a.window))
    return plans


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server is stopped below
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = a.out_dir / f"{stamp}-soak-raw" / "shoal.log"
    server = shoal_server(a.repo, log_path, frontends=a.frontends)
    load = os.getloadavg()[0]
    with server.start(ready_timeout_s=300):
        assert server.proc is not None and server.grpc_url is not None
        root = server.proc.pid
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(max(a.client_processes, 1)) as pool:
            if a.prime > 0:
                print(f"[soak] {a.prime:.0f} s of priming load", flush=True)
                pool.map(run_clients, _plans(a, server, time.time(), a.prime))
        snaps = {"idle": _steady(root, a.settle)}
        log_mark = len(log_path.read_text(errors="replace"))
        start = time.time()
        plans = _plans(a, server, start, a.duration)
        print(f"[soak] {a.duration:.0f} s of load, {len(plans)} client processes", flush=True)
        with ctx.Pool(len(plans)) as pool:
            pending = pool.map_async(run_clients, plans)
            time.sleep(max(min(a.warmup, a.duration - 2), 0))
            snaps["warm"] = _snapshot(root)
            time.sleep(max(start + a.duration - 1 - time.time(), 0))
            snaps["end"] = _snapshot(root)
            reports: list[ClientReport] = pending.get(timeout=a.duration + 600)
        snaps["after"] = _settle(root, snaps["idle"], a.settle)
        server_log = log_path.read_text(errors="replace")[log_mark:]
    return _report(a, stamp, load, snaps, reports, server_log)


def _report(
    a: argparse.Namespace,
    stamp: str,
    load: float,
    snaps: dict[str, dict[str, dict[str, int]]],
    reports: list[ClientReport],
    server_log: str,
) -> int:
    outcomes: Counter[tuple[str, str]] = Counter()
    latencies: dict[tuple[int, str], list[float]] = {}
    for r in reports:
        outcomes.update(r.outcomes)
        for key, values in r.latencies.items():
            latencies.setdefault(key, []).extend(values)
    processes, failures = _process_table(snaps)
    clients, errors = _outcome_table(outcomes)
    verdict = "PASS" if not failures and not errors else "FAIL"
    lines = [
        f"# soak ({time.strftime('%Y-%m-%d %H:%M')}): {verdict}",
        "",
        f"{a.duration:.0f} s of load ({a.prime:.0f} s of it first to prime; 'warm' "
        f"{a.warmup:.0f} s in); "
        f"{a.client_processes} client processes; clients {a.clients}; load average at start "
        f"{load:.2f}; {len(os.sched_getaffinity(0))} cores",
        "",
        "## Server processes",
        "",
        *processes,
        "",
        *(f"- {f}" for f in failures or ["RSS and descriptors: as at the start"]),
        "",
        "## Client outcomes",
        "",
        *clients,
        "",
        f"{errors} error(s): outcomes a kind should not earn",
        "",
        "## Throughput and latency over time (keep-alive and churn clients)",
        "",
        *_window_table(latencies, a.window, a.duration),
        "",
        "## WARNING and ERROR lines of the server's log during the soak",
        "",
        *_log_lines(server_log),
    ]
    out = a.out_dir / f"{stamp}-soak.md"
    out.write_text("\n".join(lines) + "\n")
    (a.out_dir / f"{stamp}-soak.json").write_text(
        json.dumps(
            {
                "snapshots": snaps,
                "outcomes": [[k, o, n] for (k, o), n in outcomes.items()],
                "windows": {f"{w}:{p}": len(v) for (w, p), v in latencies.items()},
                "failures": failures,
                "errors": errors,
            },
            indent=1,
        )
    )
    print(out.read_text())
    print(f"[bench] wrote {out}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
