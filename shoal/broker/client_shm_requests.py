"""The broker's answers about client shared memory: the shared-memory extension's requests
(register, unregister, status), and the references inference requests make into registered
regions, checked against the registry (shoal/broker/client_shm_registry.py). Pure: no sockets.

Each method that can end a registration's life returns the registration ids that are now
free everywhere; the caller tells the workers to unmap them.
"""

from __future__ import annotations

import os

from shoal.broker.client_shm_registry import Kind, Region, RegionTable
from shoal.configs.devices import gpu_count
from shoal.ipc import messages as m
from shoal.ipc.errors import ServingError


class ClientRegions:
    def __init__(self, max_system_regions: int = 2**20) -> None:
        self.table = RegionTable(max_system_regions)
        self._pid = os.getpid()

    def handle(self, q: m.ShmRequest) -> tuple[m.ShmReply, list[int]]:
        """Register, unregister or report regions; returns the reply and the freed ids."""
        kind: Kind = "cuda" if q.kind == "cuda" else "system"
        freed: list[int] = []
        try:
            if q.op == "register" and kind == "system":
                self.table.register_system(q.name, q.key, q.offset, q.byte_size)
            elif q.op == "register":
                self.table.register_cuda(
                    q.name, q.raw_handle, q.device_id, q.byte_size, gpu_count()
                )
            elif q.op == "unregister":
                freed = self.table.unregister(q.name, kind)
            elif q.op == "check":
                for name, offset, nbytes in q.refs:
                    self.table.resolve(name, offset, nbytes)
            else:
                regions = [
                    m.RegionStatus(r.name, r.key, r.offset, r.byte_size, r.device_id)
                    for r in self.table.status(q.name, kind)
                ]
                return m.ShmReply(q.query_id, None, regions), freed
        except ServingError as err:
            return m.ShmReply(q.query_id, m.ErrorInfo(int(err.code), err.message)), freed
        return m.ShmReply(q.query_id), freed

    def resolve(self, req: m.InferRequest) -> list[m.ClientRegion]:
        """Check every reference into a client region and point it at the registration
        (raises ServingError with Triton's message). Nothing is held yet: see acquire."""
        used: dict[int, m.ClientRegion] = {}
        refs: list[m.TensorRef | m.OutputSpec] = [*req.inputs, *req.outputs]
        for ref in refs:
            if not ref.region.startswith(m.CLIENT_SHM):
                continue
            r = self.table.resolve(ref.region[len(m.CLIENT_SHM) :], ref.offset, ref.nbytes)
            ref.region = f"{m.CLIENT_REGION}{r.reg_id}"
            used[r.reg_id] = m.ClientRegion(
                r.reg_id,
                r.kind,
                r.key,
                r.offset,
                r.byte_size,
                r.device_id,
                r.raw_handle,
                path=f"/proc/{self._pid}/fd/{r.fd}" if r.fd >= 0 else "",
                dev=r.dev,
                ino=r.ino,
            )
        return list(used.values())

    def acquire(self, clients: list[m.ClientRegion]) -> None:
        """The request was admitted: its registrations stay alive until it ends."""
        self.table.acquire([self.table.by_id[c.reg_id] for c in clients])

    def finished(self, item: m.WorkItem) -> list[int]:
        """A request ended; returns the registrations nothing uses any more."""
        if not item.regions:
            return []
        return self.table.release([c.reg_id for c in item.regions])

    def known(self) -> list[m.ShmRequest]:
        """Every registration not unregistered, as the register request that made it
        (what the frontends keep, to give a restarted broker)."""
        live = sorted(
            (r for r in self.table.by_name.values() if not r.unregistered),
            key=lambda r: r.reg_id,
        )
        return [_as_register(r) for r in live]

    def restore(self, regions: list[m.ShmRequest]) -> tuple[int, list[str]]:
        """Register again what a frontend kept from an earlier broker, skipping names
        registered here already; returns how many came back and why each other one did
        not (its object unlinked since, say: that registration is lost)."""
        restored, lost = 0, []
        for q in regions:
            if q.op != "register" or q.name in self.table.by_name:
                continue
            reply, _ = self.handle(q)
            if reply.error is None:
                restored += 1
            else:
                lost.append(f"'{q.name}': {reply.error.message}")
        return restored, lost


def _as_register(r: Region) -> m.ShmRequest:
    return m.ShmRequest(
        0, "register", r.kind, r.name, r.key, r.offset, r.byte_size, r.device_id, r.raw_handle
    )
