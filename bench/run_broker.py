"""The broker alone: its CPU per request under a fixed load, against a ZeroMQ round trip.

A real broker process (``python -m shoal.broker``) serves a repository of one model with
``dynamic_batching {}``. This process plays its frontend and its worker over the real
sockets: the frontend sends requests in groups (one message each, as a frontend's turn
sends them) and keeps ``--window`` of them in flight; the worker answers each batch at
once, straight to the frontend, then reports it done, as a worker does. Nothing computes,
so what the broker's process spends (user + system time from ``/proc/<pid>/stat``, its
ZeroMQ I/O thread included) is all routing: admission, batching, dispatch, statistics.

The baseline, in the same run: one lock-step round trip of a request-sized message
between two sockets of this process through the same ZeroMQ transport (``ipc://``), in
µs of CPU of this process per round trip. A record, not a test: nothing asserts a speed.

    python bench/run_broker.py [--groups 1,4,16] [--requests 20000] [--window 64]
                               [--tree OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from shoal.configs.model_config import parse_config_text  # noqa: E402
from shoal.ipc import messages as m  # noqa: E402
from shoal.ipc import sockets  # noqa: E402
from shoal.ipc.result_link import FrameReader, ResultSender, listen  # noqa: E402

CONFIG = """name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / _TICK


def _expect(sock: zmq.Socket, kind: type, timeout_s: float = 30.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            frames = sock.recv_multipart()
            msg = m.decode(frames[0], frames[1])
            if isinstance(msg, kind):
                return msg
    raise TimeoutError(f"no {kind.__name__} from the broker")


class Peers:
    """This process as the broker's one frontend and one worker."""

    def __init__(self, run: Path) -> None:
        self.ctx: zmq.Context = zmq.Context()
        self.fe_ident = sockets.frontend_identity(0)
        self.listener = listen(sockets.result_path(run, self.fe_ident))
        self.fe = sockets.dealer(
            self.ctx, sockets.endpoint(run, sockets.FRONTEND_SOCKET), self.fe_ident
        )
        worker = f"w-m-1-0-{os.getpid()}".encode()
        self.wk = sockets.dealer(self.ctx, sockets.endpoint(run, sockets.WORKER_SOCKET), worker)
        # the worker's link to the frontend, both ends in this process
        self.to_fe = ResultSender(sockets.result_path(run, self.fe_ident))
        self.results, _ = self.listener.accept()
        self.reader = FrameReader()

    def join(self) -> None:
        config = parse_config_text(CONFIG, "m").SerializeToString()
        hello = m.WorkerHello("m", 1, 0, os.getpid(), name="m_0")
        deadline = time.monotonic() + 60
        while True:  # until the broker is up and knows the model
            self.wk.send_multipart(m.encode(hello))
            try:
                _expect(self.wk, m.Welcome, 1.0)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        self.wk.send_multipart(m.encode(m.WorkerReady(config, [0])))
        self.fe.send_multipart(m.encode(m.FrontendHello(os.getpid(), 0)))
        _expect(self.fe, m.Welcome)

    def drive(self, requests: int, group: int, window: int) -> tuple[int, int]:
        """Send ``requests`` in groups of ``group``, at most ``window`` unanswered; the
        worker's part answers every batch. Returns (answered, batches)."""
        payload = b"\0" * 1024  # one FP32 [1, 256] input, inline as small tensors travel
        ref = [m.TensorRef("INPUT0", "FP32", [1, 256], len(payload), data=payload)]
        out = [m.OutputSpec("OUTPUT0")]
        answer = m.encode_payload(m.InferResponse(0, [], None, 1))
        sent = answered = batches = 0
        poller = zmq.Poller()
        poller.register(self.wk, zmq.POLLIN)
        poller.register(self.results.fileno(), zmq.POLLIN)
        while answered < requests:
            while sent < requests and sent - answered + group <= window:
                reqs = [
                    m.encode_payload(m.InferRequest(sent + i + 1, "m", -1, ref, out))
                    for i in range(min(group, requests - sent))
                ]
                sockets.send_frames(self.fe, [m.KINDS[m.InferRequest], *reqs])
                sent += len(reqs)
            for sock, _ in poller.poll(5000):
                if sock == self.results.fileno():
                    answered += len(self.reader.feed(self.results.recv(1 << 20)))
                    continue
                while sockets.readable(self.wk):
                    frames = sockets.recv_frames(self.wk)
                    msg = m.decode(frames[0], frames[1])
                    if not isinstance(msg, m.ExecuteBatch):
                        continue
                    batches += 1
                    self.to_fe.send([answer] * len(msg.items))
                    done = m.BatchDone(msg.batch_id, len(msg.items))
                    sockets.send_frames(self.wk, m.encode(done))
        return answered, batches

    def close(self) -> None:
        for s in (self.fe, self.wk):
            s.close(0)
        self.to_fe.close()
        self.results.close()
        self.listener.close()
        self.ctx.term()


def round_trip_us(n: int = 20000) -> float:
    """CPU µs of this process per lock-step round trip of a request-sized message over
    ZeroMQ ipc between two of its sockets (each end's work, both I/O threads' too)."""
    ctx: zmq.Context = zmq.Context()
    with tempfile.TemporaryDirectory() as d:
        a = sockets.dealer(ctx, f"ipc://{d}/rt.sock", b"a")
        b = ctx.socket(zmq.ROUTER)
        b.bind(f"ipc://{d}/rt.sock")
        msg = [b"I", b"\0" * 1100]
        for _ in range(200):  # connected and warm
            sockets.send_frames(a, msg)
            frames = sockets.recv_frames(b)
            sockets.send_frames(b, frames)
            sockets.recv_frames(a)
        t0 = _self_cpu()
        for _ in range(n):
            sockets.send_frames(a, msg)
            frames = sockets.recv_frames(b)
            sockets.send_frames(b, frames)
            sockets.recv_frames(a)
        us = (_self_cpu() - t0) / n * 1e6
        a.close(0)
        b.close(0)
    ctx.term()
    return us


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", default="1,4,16", help="requests per frontend message")
    p.add_argument("--requests", type=int, default=20000, help="per group size")
    p.add_argument("--window", type=int, default=64, help="requests in flight at most")
    p.add_argument("--profile", type=Path, help="run the broker under cProfile, stats here")
    p.add_argument(
        "--tree", type=Path, default=REPO_ROOT, help="run the broker of this checkout (A/B)"
    )
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-broker-") as tmp:
        repo, run = Path(tmp) / "repo", Path(tmp) / "run"
        (repo / "m" / "1").mkdir(parents=True)
        (repo / "m" / "config.pbtxt").write_text(CONFIG)
        (repo / "m" / "1" / "model.onnx").write_bytes(b"")  # never loaded: no worker runs it
        run.mkdir(mode=0o700)
        broker = subprocess.Popen(
            [sys.executable,
             *(("-m", "cProfile", "-o", str(a.profile.resolve())) if a.profile else ()),
             "-m", "shoal.broker", "--runtime-dir", str(run),
             "--model-repository", str(repo), "--log-warning=false"],
            cwd=a.tree, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        peers = Peers(run)
        try:
            peers.join()
            peers.drive(2000, 4, a.window)  # warm
            for group in (int(g) for g in a.groups.split(",")):
                t0, w0 = _cpu_s(broker.pid), time.monotonic()
                answered, batches = peers.drive(a.requests, group, a.window)
                cpu, wall = _cpu_s(broker.pid) - t0, time.monotonic() - w0
                rows.append((group, answered, batches, cpu / answered * 1e6, answered / wall))
        finally:
            peers.close()
            broker.terminate()  # (its stop: the profile, if any, is written)
            try:
                broker.wait(30)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()
    rt = round_trip_us()
    print(f"# broker alone ({time.strftime('%Y-%m-%d %H:%M')}, window {a.window}, "
          f"load average {os.getloadavg()[0]:.2f})\n")  # fmt: skip
    print("| requests a message | requests | avg batch | broker CPU µs a request "
          "| / ZeroMQ round trip | requests/s |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for group, n, batches, us, rate in rows:
        print(f"| {group} | {n:,} | {n / batches:.1f} | {us:.1f} | {us / rt:.2f} | {rate:,.0f} |")
    print(f"\nZeroMQ ipc round trip of a request-sized message, both ends in one process: "
          f"{rt:.1f} µs of CPU")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
