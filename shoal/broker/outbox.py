"""The broker's messages out, over its two ROUTER sockets: to one frontend or worker, to every
one of them, and the answers it gives requests itself (errors: a refusal, a request that
fails while queued or with its instance).

A message to a peer that is gone is dropped (EHOSTUNREACH: the sockets are mandatory
routers); its death, seen through its pidfd, settles what it held. Part of the broker's
shell (shoal/broker/proc.py): one thread, the broker's loop.
"""

from __future__ import annotations

import logging

import msgspec
import zmq

from shoal.broker.client_shm_requests import ClientRegions
from shoal.broker.models import ModelTable
from shoal.broker.ordering import OrderedRelease
from shoal.broker.peers import PeerWatch
from shoal.ipc import messages as m
from shoal.ipc import sockets
from shoal.ipc.errors import RequestError, ServingError

log = logging.getLogger("shoal.broker")


class Outbox:
    def __init__(
        self,
        fsock: zmq.Socket[bytes],
        wsock: zmq.Socket[bytes],
        table: ModelTable,
        client_regions: ClientRegions,
        peers: PeerWatch,
    ) -> None:
        self.fsock, self.wsock = fsock, wsock
        self.table, self.client_regions, self.peers = table, client_regions, peers

    def send(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        """``frames`` (the peer's identity first) to one peer."""
        try:
            sockets.send_frames(sock, frames)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            log.debug("peer %r is gone; message dropped", frames[0])

    def to_frontend(self, frontend: bytes, msg: msgspec.Struct) -> None:
        self.send(self.fsock, [frontend, *m.encode(msg)])

    def to_worker(self, worker: bytes, msg: msgspec.Struct) -> None:
        self.send(self.wsock, [worker, *m.encode(msg)])

    def to_frontends(self, frames: list[bytes]) -> None:
        """One message to every frontend this broker knows (watched or not yet)."""
        for ident in self.peers.frontends():
            self.send(self.fsock, [ident, *frames])

    def to_workers(self, frames: list[bytes]) -> None:
        """One message to every worker of the table."""
        for worker in list(self.table.by_ident):
            self.send(self.wsock, [worker, *frames])

    def reply_error(self, frontend: bytes, req_id: int, err: ServingError) -> None:
        """Refuse a request that was never admitted (no place in any order)."""
        info = m.ErrorInfo(int(err.code), err.message, isinstance(err, RequestError))
        resp = m.InferResponse(req_id, [], info)
        self.send(self.fsock, [frontend, m.RESULT, m.encode_payload(resp)])

    def fail_item(
        self, item: m.WorkItem, err: ServingError, ordering: OrderedRelease | None = None
    ) -> None:
        """Answer an admitted request with an error; in its turn if it was ordered (only
        a request an instance was given has a turn: ``ordering`` is that version's)."""
        self.finished(item)
        resp = m.InferResponse(item.request.req_id, [], m.ErrorInfo(int(err.code), err.message))
        if isinstance(way := item.request.hops, m.TracedWay):  # its stamps so far go back
            resp.hops = m.TracedAnswer(list(way.stamps), [])
        payload = m.encode_payload(resp)
        if item.seq and ordering is not None:
            released = ordering.answer(item.seq, item.frontend, payload)
        else:
            released = [(item.frontend, payload)]
        for fe, data in released:
            if data is not None:
                self.send(self.fsock, [fe, m.RESULT, data])

    def finished(self, item: m.WorkItem) -> None:
        """A request ended: its hold on client regions goes (unmapped once unused)."""
        self.released(self.client_regions.finished(item))

    def released(self, reg_ids: list[int]) -> None:
        """Client registrations nothing uses any more: every worker unmaps them."""
        if reg_ids:
            self.to_workers(m.encode(m.RegionsReleased(reg_ids)))

    def tell_regions(self, frontend: bytes | None = None) -> None:
        """The table of client registrations, to ``frontend`` (None: to every one)."""
        frames = m.encode(m.ClientRegionsKnown(self.client_regions.known()))
        if frontend is not None:
            self.send(self.fsock, [frontend, *frames])
            return
        self.to_frontends(frames)
