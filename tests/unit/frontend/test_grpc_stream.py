"""A gRPC stream's requests reach the broker in the order the stream brought them, also
while the frontend is still looking their model up (Triton reads a stream into its
scheduler one request after the other; preserve_ordering answers in that order), and a
model that is not decoupled is answered in that order too, whichever answer is ready
first (Triton's stream handler queues them so).

The frontend's own parts are real: its gRPC server, data plane, shared-memory pool and
broker connection, on one event loop; tritonclient sends. The broker is a StandInBroker
driven from another thread, so the test decides when each model lookup is answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as pb

from shoal.dataplane.broker_client import BrokerClient
from shoal.dataplane.plane import DataPlane
from shoal.frontend.grpc_server import build_server
from shoal.frontend.grpc_stream import ends_on_error
from shoal.ipc import messages as m
from shoal.ipc.shm import SlabPool
from tests.serverctl import free_ports
from tests.unit.dataplane.stand_in import StandInBroker

_CONFIG = pb.ModelConfig(
    name="ordered",
    platform="onnxruntime_onnx",
    max_batch_size=8,
    input=[pb.ModelInput(name="INPUT0", data_type=pb.TYPE_FP32, dims=[1])],
    output=[pb.ModelOutput(name="OUTPUT0", data_type=pb.TYPE_FP32, dims=[1])],
).SerializeToString()


class _Broker:
    """What reaches the broker while the test holds the lookups back."""

    def __init__(self, stand_in: StandInBroker, client: BrokerClient) -> None:
        self.stand_in = stand_in
        self.client = client
        self.lookups: list[m.ModelQuery] = []
        self.requests: list[m.InferRequest] = []

    def take(self, seconds: float) -> None:
        """Whatever arrives for ``seconds``: model lookups and inference requests."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            frames = self.stand_in.recv(timeout_ms=max(int(left * 1000), 1))
            if frames is None:
                continue
            kind, *payloads = frames
            if kind == m.KINDS[m.ModelQuery]:
                self.lookups.append(m.decode(kind, payloads[0]))  # type: ignore[arg-type]
            elif kind == m.KINDS[m.InferRequest]:
                self.requests += [m.decode(kind, p) for p in payloads]  # type: ignore[misc]

    def answer_lookups(self, count: int | None = None) -> None:
        """The lookups still unanswered (the first ``count`` of them): the model is ready."""
        for q in self.lookups[:count]:
            info = m.ModelInfo(q.query_id, None, "ordered", 1, [1], True, "", _CONFIG)
            self.stand_in.reply(self.client, info)
        self.lookups = self.lookups[len(self.lookups[:count]) :]

    def answer_requests(self) -> None:
        """Every request answered (with what does not matter here), so the stream ends."""
        self.stand_in.answer(self.client, [r.req_id for r in self.requests])


def _value(req: m.InferRequest) -> int:
    (tensor,) = req.inputs
    assert tensor.data is not None
    return int(np.frombuffer(tensor.data, dtype="<f4")[0])


def _drive(url: str, broker: _Broker) -> tuple[int, list[int]]:
    """Requests 0, 1 and 2 sent while their model is not looked up yet; the first lookup
    answered; request 3 sent; then the other lookups answered. How many lookups were
    waiting at once, and the order the requests reached the broker in, by the value each
    carries."""
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: None)

    def send(i: int) -> None:
        inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), i, dtype=np.float32))
        client.async_stream_infer("ordered", [inp], request_id=str(i))

    try:
        for i in range(3):
            send(i)
        broker.take(0.5)
        waiting = len(broker.lookups)
        broker.answer_lookups(1)
        broker.take(0.3)  # request 0 leaves; the others wait or follow it
        send(3)
        broker.take(0.5)  # request 3 finds the model cached
        broker.answer_lookups()
        broker.take(0.5)
        broker.answer_requests()
    finally:
        client.stop_stream()
        client.close()
    return waiting, [_value(r) for r in broker.requests]


def test_stream_lookups_run_at_once_and_no_request_overtakes_one_waiting_for_its_model(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)

    async def main() -> tuple[int, list[int]]:
        stand_in = StandInBroker(run)
        client = BrokerClient(run, 0)
        client.start()
        pool = SlabPool("test", 1 << 20)
        server = None
        try:
            await asyncio.sleep(0.05)  # the greeter's first hello leaves
            stand_in.welcome(client)
            assert await client.wait_connected(2.0)
            (port,) = free_ports(1)
            server = build_server(DataPlane(client, pool), f"127.0.0.1:{port}", False)
            await server.start()
            return await asyncio.to_thread(_drive, f"127.0.0.1:{port}", _Broker(stand_in, client))
        finally:
            if server is not None:
                await server.stop(0)
            await client.close()
            pool.close()
            stand_in.close()

    waiting, order = asyncio.run(main())
    # The lookups run at once (a silent broker fails a stream's requests together, not
    # one lookup timeout after another); the hand-overs keep the stream's order.
    assert waiting == 3
    assert order == [0, 1, 2, 3]


def _answered_in_order(url: str, broker: _Broker) -> list[str]:
    """Requests 0, 1 and 2 sent; the broker answers 2, then 1, then 0: the ids of the
    answers in the order the client got them."""
    got: list[str] = []
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.append(result.get_response().id))
    try:
        for i in range(3):
            inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            inp.set_data_from_numpy(np.full((1, 1), i, dtype=np.float32))
            client.async_stream_infer("ordered", [inp], request_id=str(i))
        broker.take(0.5)
        broker.answer_lookups()
        broker.take(0.5)
        for req in reversed(broker.requests):
            broker.stand_in.answer(broker.client, [req.req_id])
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.stop_stream()
        client.close()
    return got


def test_a_stream_answers_a_model_that_is_not_decoupled_in_request_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)

    async def main() -> list[str]:
        stand_in = StandInBroker(run)
        client = BrokerClient(run, 0)
        client.start()
        pool = SlabPool("test", 1 << 20)
        server = None
        try:
            await asyncio.sleep(0.05)
            stand_in.welcome(client)
            assert await client.wait_connected(2.0)
            (port,) = free_ports(1)
            server = build_server(DataPlane(client, pool), f"127.0.0.1:{port}", False)
            await server.start()
            broker = _Broker(stand_in, client)
            return await asyncio.to_thread(_answered_in_order, f"127.0.0.1:{port}", broker)
        finally:
            if server is not None:
                await server.stop(0)
            await client.close()
            pool.close()
            stand_in.close()

    assert asyncio.run(main()) == ["0", "1", "2"]


def test_only_triton_grpc_error_true_asks_a_stream_to_end_on_an_error() -> None:
    """Triton compares the header's value with "true" exactly."""
    assert ends_on_error((("triton_grpc_error", "true"), ("user-agent", "grpc-python")))
    for metadata in (None, (), (("triton_grpc_error", "True"),), (("triton_grpc_error", "1"),),
                     (("triton-grpc-error", "true"),)):  # fmt: skip
        assert not ends_on_error(metadata)
