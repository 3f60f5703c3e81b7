"""A stand-in for the broker's frontend socket: a real ROUTER bound where the broker binds
it, driven by the test, which so decides what a frontend hears and when."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import zmq

from shoal.dataplane.broker_client import BrokerClient
from shoal.ipc import messages as m
from shoal.ipc import sockets
from shoal.ipc.result_link import ResultSender

_KEEPALIVE = (m.KINDS[m.FrontendHello], m.KINDS[m.ServerQuery])


class StandInBroker:
    def __init__(self, runtime_dir: Path) -> None:
        self.runtime_dir = runtime_dir
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = sockets.router(self.ctx, sockets.endpoint(runtime_dir, sockets.FRONTEND_SOCKET))

    def recv(self, timeout_ms: int = 2000, keepalive: bool = False) -> list[bytes] | None:
        """The next message (without the routing id), or None if none came in time.
        Called on the client's event loop, it blocks that loop: nothing the client defers
        can be sent meanwhile. The client's own greetings and pings (a slow host may see
        some) are passed over, unless ``keepalive``."""
        while self.sock.poll(timeout_ms):
            frames = self.sock.recv_multipart()[1:]
            if keepalive or frames[0] not in _KEEPALIVE:
                return frames
        return None

    def welcome(self, client: BrokerClient) -> None:
        frames = self.recv(keepalive=True)
        assert frames is not None and frames[0] == m.KINDS[m.FrontendHello]
        self.sock.send_multipart([client.identity, *m.encode(m.Welcome(os.getpid()))])

    def reply(self, client: BrokerClient, msg: msgspec.Struct) -> None:
        """A control-plane answer (a query's reply) on the client's DEALER."""
        self.sock.send_multipart([client.identity, *m.encode(msg)])

    def answer(self, client: BrokerClient, req_ids: list[int]) -> None:
        """Answers as a worker sends them: one message on the client's result socket."""
        link = ResultSender(sockets.result_path(self.runtime_dir, client.identity))
        payloads = [m.encode_payload(m.InferResponse(i, model_version=i)) for i in req_ids]
        assert link.send(payloads)
        link.close(linger_s=1.0)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
