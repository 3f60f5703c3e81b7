"""One request's way through shoal's processes, leg by leg, against a bare ZeroMQ hop.

shoal serves ``mlp`` with ``dynamic_batching {}`` (a temporary repository linking the
shipped model) under ``SHOAL_HOP_TIMING=1``: every request is stamped with
``time.monotonic_ns()`` (one clock for every process of a host) when the frontend sends
it, when the broker receives and dispatches it, and when the worker receives its batch and
sends its answer; the frontend adds its receipt and sums each leg
(``GET /v2/shoal/frontend``, ``hops_ns``). perf_analyzer drives it at each concurrency and
protocol; the report gives the mean of each leg beside the client's p50, and what is left
of the p50 (the client, the protocol, the frontend's own work, the model's run is inside
``in_worker``).

The baseline, in the same run: half of a lock-step round trip of a request-sized message
between two processes over ZeroMQ ``ipc://`` (DEALER/ROUTER, as shoal's sockets): what one
hop costs with nothing else to do. A record, not a test: nothing asserts a speed.

    python bench/run_hops.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import zmq
from common import csv_ints, csv_list, fmt, link_model, start_run, start_server, write_report
from perf_analyzer import run_perf_analyzer
from servers import REPO_ROOT, shoal_server

sys.path.insert(0, str(REPO_ROOT))

from shoal.dataplane.broker_client import HOPS

CONFIG_TAIL = "dynamic_batching { }\n"


def _hops(http: str) -> dict[str, list[int]]:
    with urllib.request.urlopen(f"http://{http}/v2/shoal/frontend", timeout=10) as r:
        hops: dict[str, list[int]] = json.loads(r.read())["hops_ns"]
        return hops


def _echo(addr: str, n: int) -> None:
    ctx: zmq.Context = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.connect(addr)
    for _ in range(n):
        s.send_multipart(s.recv_multipart())
    s.close(0)
    ctx.term()


def zmq_hop_us(n: int = 5000) -> float:
    """Half the mean lock-step round trip between this process and another, µs."""
    with tempfile.TemporaryDirectory() as d:
        addr = f"ipc://{d}/hop.sock"
        ctx: zmq.Context = zmq.Context()
        a = ctx.socket(zmq.DEALER)
        a.bind(addr)
        echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(addr, n + 200))
        echo.start()
        msg = [b"I", b"\0" * 1100]
        for _ in range(200):
            a.send_multipart(msg)
            a.recv_multipart()
        t0 = time.perf_counter()
        for _ in range(n):
            a.send_multipart(msg)
            a.recv_multipart()
        us = (time.perf_counter() - t0) / n / 2 * 1e6
        echo.join(10)
        a.close(0)
        ctx.term()
    return us


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--concurrency", type=csv_ints, default=[1, 8])
    p.add_argument("--protocols", type=csv_list, default=["http", "grpc"])
    p.add_argument("--measurement-interval", type=int, default=3000)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    a = p.parse_args(argv)
    run = start_run(a.out_dir, "hops")
    rows = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-hops-") as tmp:
        repo = Path(tmp)
        config = (a.repo / "mlp" / "config.pbtxt").read_text()
        link_model(a.repo, repo, "mlp", config + CONFIG_TAIL)
        srv = shoal_server(repo, run.raw / "shoal.log")
        srv.env = {"SHOAL_HOP_TIMING": "1"}
        if start_server(srv, 120, skipped) is not None:
            with srv:
                for c in a.concurrency:
                    for protocol in a.protocols:
                        before = _hops(srv.http_url)
                        m = run_perf_analyzer(
                            run.pa, server="shoal", url=srv.url(protocol), protocol=protocol,
                            model="mlp", concurrency=c,
                            csv_path=run.raw / f"{protocol}-c{c}.csv",
                            interval_ms=a.measurement_interval, max_trials=5, stability_pct=20,
                            timeout_s=7 * a.measurement_interval / 1e3 + 30,
                        )  # fmt: skip
                        after = _hops(srv.http_url)
                        legs = {
                            leg: (after[leg][1] - before[leg][1])
                            / max(after[leg][0] - before[leg][0], 1)
                            / 1e3
                            for leg in HOPS
                        }
                        rows.append((c, protocol, m.p50_us, legs))
    hop = zmq_hop_us()
    lines = [f"# One request's way, leg by leg ({time.strftime('%Y-%m-%d %H:%M')})", ""]
    lines += [
        f"Mean µs per leg over each perf_analyzer run (`mlp`, dynamic batching); the bare "
        f"ZeroMQ hop between two processes in this run: {hop:.1f} µs. `rest` is the client's "
        "p50 less the legs: the client, the protocol and the frontend's own work.",
        "",
        "| c | protocol | client p50 | " + " | ".join(HOPS) + " | rest | hops / bare hop |",
        "|---:|---|---:|" + "---:|" * (len(HOPS) + 2),
    ]
    for c, protocol, p50, legs in rows:
        between = legs["frontend_to_broker"] + legs["broker_to_worker"] + legs["worker_to_frontend"]
        rest = None if p50 is None else p50 - sum(legs.values())
        lines.append(
            f"| {c} | {protocol} | {fmt(p50, ',.0f')} | "
            + " | ".join(f"{legs[leg]:,.0f}" for leg in HOPS)
            + f" | {fmt(rest, ',.0f')} | {between / 3 / hop:.1f} |"
        )
    return write_report(a.out_dir, run.stamp, "hops", "\n".join(lines) + "\n", skipped)


if __name__ == "__main__":
    sys.exit(main())
