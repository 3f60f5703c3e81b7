"""Triton's response cache (``response_cache { enable: true }`` and ``--cache-config
local,size=N``), in each frontend process (pure: no sockets, no clock).

A request is looked up by a hash of what decides its answer: the model and the version
that answers it, each input (name, datatype, shape and bytes, by name), and the outputs
asked for (names, and the top K of a classification). Triton hashes the inputs alone, so
two requests that ask for different outputs of the same inputs share an entry there;
here they do not. The hash is BLAKE2b of 128 bits (Triton's is 64). Only successful
answers are kept; the least recently used go first when the cache is full.

A request with any tensor in client shared memory is neither looked up nor kept:
hashing its inputs would mean the frontend reads bytes it promises never to touch, and a
hit would mean the frontend writes into the client's region, which only workers do.
Triton hashes system shared memory too (it is CPU memory).

With several frontend processes each keeps its own cache, of an equal share of the size.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from shoal.dataplane.types import ClientRequest, OutputTensor

#: What an entry costs beyond its bytes: its key and objects, and each tensor's.
_ENTRY_OVERHEAD = 256
_TENSOR_OVERHEAD = 128
_U64 = 2**64 - 1


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0  # hashing and looking up, hits and misses (the caller's clock)
        self.insertion_ns = 0
        self._entries: OrderedDict[bytes, tuple[_Tensor, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(req: ClientRequest, model: str, version: int) -> bytes | None:
        """The request's key, or None when it cannot be cached (client shared memory)."""
        if any(t.data is None for t in req.inputs) or any(
            "shared_memory_region" in o.parameters for o in req.outputs
        ):
            return None
        h = hashlib.blake2b(digest_size=16)
        _field(h, model.encode())
        h.update(struct.pack("<q", version))
        for t in sorted(req.inputs, key=lambda t: t.name):
            assert t.data is not None
            _field(h, t.name.encode())
            _field(h, t.datatype.encode())
            dims = [d & _U64 for d in t.shape]  # HTTP allows dims up to 2**64 - 1
            h.update(struct.pack(f"<{len(dims) + 1}Q", len(dims), *dims))
            _field(h, t.data)
        h.update(b"\x00outputs")  # none asked for means all: a key of its own
        for o in req.outputs:
            _field(h, o.name.encode())
            k = o.parameters.get("classification", 0)
            h.update(struct.pack("<Q", k & _U64 if type(k) is int else _U64))
        return h.digest()

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0

    def get(self, key: bytes) -> list[OutputTensor] | None:
        """The outputs kept for ``key`` (views of the cache's own bytes), or None."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return [OutputTensor(t.name, t.datatype, list(t.shape), memoryview(t.data)) for t in entry]

    def put(self, key: bytes, outputs: list[OutputTensor]) -> bool:
        """Keep a copy of ``outputs`` for ``key``, making room by dropping the least
        recently used; False when they do not fit in the whole cache."""
        kept = [(o, o.data) for o in outputs if o.data is not None]
        cost = _ENTRY_OVERHEAD + sum(_TENSOR_OVERHEAD + data.nbytes for _, data in kept)
        if cost > self.capacity:
            return False
        entry = tuple(_Tensor(o.name, o.datatype, tuple(o.shape), bytes(data)) for o, data in kept)
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= _cost(old)
        while self.used + cost > self.capacity:
            _, dropped = self._entries.popitem(last=False)
            self.used -= _cost(dropped)
            self.evictions += 1
        self._entries[key] = entry
        self.used += cost
        return True


def _field(h: Any, data: bytes | memoryview) -> None:
    """Length-prefixed, so that no two different sequences of fields hash alike."""
    h.update(struct.pack("<Q", data.nbytes if isinstance(data, memoryview) else len(data)))
    h.update(data)


def _cost(entry: tuple[_Tensor, ...]) -> int:
    return _ENTRY_OVERHEAD + sum(_TENSOR_OVERHEAD + len(t.data) for t in entry)
