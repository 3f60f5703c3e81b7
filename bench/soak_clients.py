"""The clients of ``run_soak.py``: one asyncio loop per client process, each running a
share of every kind of client until a common end time.

Kinds (``KINDS``):

* ``http`` / ``grpc``: keep-alive clients, one request after another, round-robin over
  the models (HTTP: one aiohttp connection each; gRPC: one channel each);
* ``http-churn`` / ``grpc-churn``: a new connection for every HTTP request, a new channel
  for every few gRPC requests;
* ``http-hangup`` / ``grpc-cancel``: a request whose client goes away before the answer
  (HTTP: the socket closed once the request is sent; gRPC: a 1 ms deadline);
* ``slow-header`` / ``slow-body``: a byte a second of a request's headers, or of its body
  after the headers, until the server cuts it (what they earn: the connection closed at
  the header deadline, a 400 at the body's).

Every outcome is counted by kind; the latencies of the first four kinds are kept per
window of ``window_s`` (by the time each request ended), for the p99 over time. What
goes back to the parent is plain data (``ClientReport``), pickled by multiprocessing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import aiohttp
import numpy as np

KINDS = (
    "http",
    "grpc",
    "http-churn",
    "grpc-churn",
    "http-hangup",
    "grpc-cancel",
    "slow-header",
    "slow-body",
)
#: What a kind's requests earn when all is well (anything else is an error).
EXPECTED = {
    "http": {"ok"},
    "grpc": {"ok"},
    "http-churn": {"ok"},
    "grpc-churn": {"ok"},
    "http-hangup": {"hung up"},
    "grpc-cancel": {"deadline exceeded", "ok"},  # (an answer within 1 ms is no error)
    "slow-header": {"closed at the header deadline"},
    "slow-body": {"400 at the body deadline"},
}
_SHAPES = {"simple": (16, "INT32"), "mlp": (256, "FP32"), "mlp_large": (1024, "FP32")}


@dataclass
class ClientPlan:
    """What one client process runs: how many clients of each kind, against which
    server and models, until ``end`` (``time.time()``)."""

    http_url: str
    grpc_url: str
    models: list[str]
    counts: dict[str, int]
    end: float
    start: float
    window_s: float


@dataclass
class ClientReport:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, outcome)
    # (window, protocol) -> latencies (ms) of the keep-alive and churn clients
    latencies: dict[tuple[int, str], list[float]] = field(default_factory=lambda: defaultdict(list))


def _http_body(model: str) -> bytes:
    if model == "simple":
        inputs = [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ]
    else:
        width = _SHAPES[model][0]
        inputs = [
            {"name": "INPUT0", "shape": [1, width], "datatype": "FP32", "data": [0.5] * width}
        ]
    return json.dumps({"inputs": inputs}).encode()


def _grpc_inputs(model: str) -> list[object]:
    import tritonclient.grpc.aio as grpcclient

    width, dtype = _SHAPES[model]
    names = ("INPUT0", "INPUT1") if model == "simple" else ("INPUT0",)
    out = []
    for name in names:
        tensor = grpcclient.InferInput(name, [1, width], dtype)
        if dtype == "INT32":
            data = np.arange(width, dtype=np.int32)
        else:
            data = np.full(width, 0.5, np.float32)
        tensor.set_data_from_numpy(data.reshape(1, width))
        out.append(tensor)
    return out


class _Run:
    """One client process's loop."""

    def __init__(self, plan: ClientPlan) -> None:
        self.plan = plan
        self.report = ClientReport()
        self.bodies = {m: _http_body(m) for m in plan.models}

    def alive(self) -> bool:
        return time.time() < self.plan.end

    def note(self, kind: str, outcome: str, started: float | None = None) -> None:
        self.report.outcomes[(kind, outcome)] += 1
        if started is not None and outcome == "ok":
            now = time.time()
            window = int((now - self.plan.start) // self.plan.window_s)
            protocol = kind.split("-")[0]
            self.report.latencies[(window, protocol)].append((now - started) * 1000)

    async def http(self, kind: str, index: int) -> None:
        churn = kind == "http-churn"
        connector = aiohttp.TCPConnector(limit=1, force_close=churn)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            n = index
            while self.alive():
                model = self.plan.models[n % len(self.plan.models)]
                n += 1
                url = f"http://{self.plan.http_url}/v2/models/{model}/infer"
                started = time.time()
                try:
                    async with session.post(url, data=self.bodies[model]) as r:
                        await r.read()
                        self.note(kind, "ok" if r.status == 200 else f"HTTP {r.status}", started)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    self.note(kind, type(exc).__name__)

    async def grpc(self, kind: str, index: int) -> None:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        per_channel = 5 if kind == "grpc-churn" else 1 << 60
        deadline = 0.001 if kind == "grpc-cancel" else 60.0
        inputs = {m: _grpc_inputs(m) for m in self.plan.models}
        n = index
        while self.alive():
            client = grpcclient.InferenceServerClient(self.plan.grpc_url)
            try:
                for _ in range(per_channel):
                    if not self.alive():
                        break
                    model = self.plan.models[n % len(self.plan.models)]
                    n += 1
                    started = time.time()
                    try:
                        await client.infer(model, inputs[model], client_timeout=deadline)
                        self.note(kind, "ok", started)
                    except InferenceServerException as exc:
                        status = str(exc.status() or "")
                        if "DEADLINE_EXCEEDED" in status:
                            self.note(kind, "deadline exceeded")
                        else:
                            self.note(kind, f"{status}: {exc.message()}"[:120])
                    if kind == "grpc-cancel":
                        await asyncio.sleep(0.05)
            finally:
                await client.close()

    async def hangup(self, kind: str, index: int) -> None:
        host, port = self.plan.http_url.split(":")
        n = index
        while self.alive():
            model = self.plan.models[n % len(self.plan.models)]
            n += 1
            body = self.bodies[model]
            head = (
                f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            try:
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(head + body)
                await writer.drain()
                writer.close()
                await writer.wait_closed()
                self.note(kind, "hung up")
            except OSError as exc:
                self.note(kind, type(exc).__name__)
            await asyncio.sleep(0.05)

    async def slow(self, kind: str, index: int) -> None:
        host, port = self.plan.http_url.split(":")
        body = self.bodies[self.plan.models[index % len(self.plan.models)]]
        model = self.plan.models[index % len(self.plan.models)]
        head = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nX-Slow: {'a' * 120}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        while self.alive():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError as exc:
                self.note(kind, type(exc).__name__)
                await asyncio.sleep(1)
                continue
            try:
                outcome = await self._trickle(kind, reader, writer, head, body)
            finally:
                writer.close()
            if outcome is not None:
                self.note(kind, outcome)

    async def _trickle(
        self,
        kind: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: bytes,
        body: bytes,
    ) -> str | None:
        """Send a byte a second (headers, or the body after whole headers) until the
        server answers or closes; None if the soak ended first."""
        if kind == "slow-body":
            writer.write(head)
        data = head if kind == "slow-header" else body
        for byte in data:
            if not self.alive():
                return None
            try:
                writer.write(bytes([byte]))
                answer = await asyncio.wait_for(reader.read(4096), 1.0)
            except TimeoutError:
                continue
            except OSError:
                answer = b""
            if not answer:
                return "closed at the header deadline" if kind == "slow-header" else "closed"
            status = answer.split(b" ", 2)[1].decode(errors="replace")
            if kind == "slow-body" and status == "400" and b"request body" in answer:
                return "400 at the body deadline"
            return f"HTTP {status}"
        return "not cut: it sent everything"


async def _main(plan: ClientPlan) -> ClientReport:
    run = _Run(plan)
    tasks = []
    for kind, count in plan.counts.items():
        for i in range(count):
            if kind in ("http", "http-churn"):
                tasks.append(run.http(kind, i))
            elif kind in ("grpc", "grpc-churn", "grpc-cancel"):
                tasks.append(run.grpc(kind, i))
            elif kind == "http-hangup":
                tasks.append(run.hangup(kind, i))
            else:
                tasks.append(run.slow(kind, i))
    await asyncio.gather(*tasks)
    return run.report


def run_clients(plan: ClientPlan) -> ClientReport:
    """A client process's body (multiprocessing target's work)."""
    report = asyncio.run(_main(plan))
    report.latencies = dict(report.latencies)
    return report
