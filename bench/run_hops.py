"""One request's way through shoal's processes, leg by leg, against bare hops.

shoal serves ``mlp`` with ``dynamic_batching {}`` (a temporary repository linking the
shipped model) under ``SHOAL_HOP_TIMING=1``: every request is stamped with
``time.monotonic_ns()`` (one clock for every process of a host) when the frontend sends
it, when the broker receives and dispatches it, and when the worker receives its batch and
sends its answer; the frontend adds its receipt and sums each leg
(``GET /v2/shoal/frontend``, ``hops_ns``). perf_analyzer drives it at each concurrency and
protocol; the report gives the mean of each leg beside the client's p50, and what is left
of the p50 (the client, the protocol, the frontend's own work, the model's run is inside
``in_worker``).

The baselines, in the same run: half of a lock-step round trip of a request-sized message
between two processes over ZeroMQ ``ipc://`` (DEALER/ROUTER, as the broker's sockets), and
over a unix stream socket (as a worker's answers reach a frontend, shoal.ipc.result_link):
what one hop costs with nothing else to do, in time and in CPU (both processes). A record,
not a test: nothing asserts a speed.

    python bench/run_hops.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Hop:
    us: float  # half a lock-step round trip
    cpu_us: float  # CPU of both processes (and their threads) per hop


def _cpu_s(pid: int) -> float:
    """User + system time of a process so far, its threads included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lockstep(send: Callable[[], None], recv: Callable[[], None], n: int, echo: Any) -> Hop:
    for _ in range(200):
        send()
        recv()
    pids = (os.getpid(), echo.pid)
    c0, t0 = sum(map(_cpu_s, pids)), time.perf_counter()
    for _ in range(n):
        send()
        recv()
    us = (time.perf_counter() - t0) / n / 2 * 1e6
    cpu = sum(map(_cpu_s, pids)) - c0  # the echo waits for its last message: alive
    send()
    echo.join(10)
    return Hop(us, cpu / n / 2 * 1e6)


def zmq_hop(n: int = 5000) -> Hop:
    """One hop over ZeroMQ ipc between this process and another."""
    with tempfile.TemporaryDirectory() as d:
        addr = f"ipc://{d}/hop.sock"
        ctx: zmq.Context = zmq.Context()
        a = ctx.socket(zmq.DEALER)
        a.bind(addr)
        echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(addr, n + 201))
        echo.start()
        msg = [b"I", b"\0" * 1100]
        hop = _lockstep(lambda: a.send_multipart(msg), a.recv_multipart, n, echo)
        a.close(0)
        ctx.term()
    return hop


def _unix_echo(path: str, n: int) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    for _ in range(n):
        s.sendall(s.recv(65536))
    s.close()


def unix_hop(n: int = 5000) -> Hop:
    """One hop over a unix stream socket between this process and another."""
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/hop.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        echo = multiprocessing.get_context("spawn").Process(target=_unix_echo, args=(path, n + 201))
        echo.start()
        conn, _ = listener.accept()
        msg = b"\0" * 1104
        hop = _lockstep(lambda: conn.sendall(msg), lambda: conn.recv(65536), n, echo)
        conn.close()
        listener.close()
    return hop


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
    zhop = zmq_hop()
    uhop = unix_hop()
    lines = [f"# One request's way, leg by leg ({time.strftime('%Y-%m-%d %H:%M')})", ""]
    lines += [
        f"Mean µs per leg over each perf_analyzer run (`mlp`, dynamic batching). Bare hops "
        f"between two processes in this run: ZeroMQ {zhop.us:.1f} µs ({zhop.cpu_us:.1f} µs of "
        f"CPU), unix socket {uhop.us:.1f} µs ({uhop.cpu_us:.1f} µs of CPU). The first two legs "
        "between processes go through ZeroMQ (the broker's sockets), the answer's through a "
        "unix socket. `rest` is the client's p50 less the legs: the client, the protocol and "
        "the frontend's own work.",
        "",
        "| c | protocol | client p50 | "
        + " | ".join(HOPS)
        + " | rest | ZeroMQ legs / bare | answer leg / bare |",
        "|---:|---|---:|" + "---:|" * (len(HOPS) + 3),
    ]
    for c, protocol, p50, legs in rows:
        zmq_legs = (legs["frontend_to_broker"] + legs["broker_to_worker"]) / 2
        rest = None if p50 is None else p50 - sum(legs.values())
        lines.append(
            f"| {c} | {protocol} | {fmt(p50, ',.0f')} | "
            + " | ".join(f"{legs[leg]:,.0f}" for leg in HOPS)
            + f" | {fmt(rest, ',.0f')} | {zmq_legs / zhop.us:.1f}"
            + f" | {legs['worker_to_frontend'] / uhop.us:.1f} |"
        )
    return write_report(a.out_dir, run.stamp, "hops", "\n".join(lines) + "\n", skipped)


if __name__ == "__main__":
    sys.exit(main())
