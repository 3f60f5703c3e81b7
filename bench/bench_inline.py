"""Where to stop inlining tensor bytes in ZeroMQ messages and use a shared-memory slab instead.

For each size, one lock-step round trip over a pyzmq PAIR socket on ``ipc://`` to a peer (a
process by default, or a thread) that decodes the message, takes an ``np.frombuffer`` view of
the tensor and answers with a small ack:

- inline: a ``msgspec.Struct`` carrying ``data: bytes`` (encode copies the bytes into the
  message; decode copies them out of the frame);
- shm: the same Struct without data, carrying (offset, nbytes) into a pre-faulted, mmap'd
  ``/dev/shm`` file both sides mapped at start (the file is unlinked once both have it);
  the sender first memcpys the bytes into the slab, the peer views them in place;
- memcpy: the slab copy alone, the floor of the shm path's size-dependent cost.

Prints median µs per round trip for 256 B .. 1 MiB and the crossover size.

    python bench/bench_inline.py [--peer process|thread] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import zmq

SIZES = [256 << i for i in range(13)]  # 256 B .. 1 MiB
SLAB_BYTES = max(SIZES)


class InlineTensor(msgspec.Struct, tag=True, array_like=True):
    id: int
    dtype: str
    shape: list[int]
    data: bytes


class ShmTensor(msgspec.Struct, tag=True, array_like=True):
    id: int
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int


class Ack(msgspec.Struct, array_like=True):
    id: int
    first: int


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


def _map_slab(path: str, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, SLAB_BYTES)
        slab = mmap.mmap(fd, SLAB_BYTES)
    finally:
        os.close(fd)
    # Pre-fault: touch every page now so no request pays first-touch cost.
    np.frombuffer(slab, np.uint8)[::4096] = 0
    return slab


def peer_loop(endpoint: str, slab_path: str, ctx: zmq.Context | None = None) -> None:
    """The reader: decode, view the tensor, ack with its first byte; stops on ``Stop``."""
    own_ctx = ctx is None
    ctx = ctx or zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    slab = _map_slab(slab_path, create=False)
    decoder = msgspec.msgpack.Decoder(InlineTensor | ShmTensor | Stop)
    encoder = msgspec.msgpack.Encoder()
    sock.send(b"ready")
    try:
        while True:
            msg = decoder.decode(sock.recv(copy=False).buffer)
            if isinstance(msg, Stop):
                break
            if isinstance(msg, InlineTensor):
                view = np.frombuffer(msg.data, np.uint8)
            else:
                view = np.frombuffer(slab, np.uint8, msg.nbytes, msg.offset)
            sock.send(encoder.encode(Ack(msg.id, int(view[0]))))
            del view
    finally:
        sock.close(linger=0)
        slab.close()
        if own_ctx:
            ctx.term()


def _timed_interleaved(fns: list, seconds: float, min_iters: int = 300) -> list[float]:  # type: ignore[type-arg]
    """Median µs of each ``fn()``, calls alternated so machine noise hits every path alike."""
    for _ in range(50):
        for fn in fns:
            fn()
    samples: list[list[int]] = [[] for _ in fns]
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    while len(samples[0]) < min_iters or clock() < deadline:
        for fn, out in zip(fns, samples, strict=True):
            t0 = clock()
            fn()
            out.append(clock() - t0)
    return [float(np.median(s)) / 1e3 for s in samples]


def run(peer: str, seconds: float) -> list[tuple[int, float, float, float]]:
    tmp = tempfile.mkdtemp(prefix="shoal-bench-inline-")
    endpoint = f"ipc://{tmp}/pair.sock"
    slab_path = f"/dev/shm/shoal-bench-inline-{os.getpid()}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.bind(endpoint)
    slab = _map_slab(slab_path, create=True)
    worker: threading.Thread | mp.process.BaseProcess
    if peer == "thread":
        worker = threading.Thread(target=peer_loop, args=(endpoint, slab_path, ctx))
    else:
        worker = mp.get_context("spawn").Process(target=peer_loop, args=(endpoint, slab_path))
    worker.start()
    encoder = msgspec.msgpack.Encoder()
    ack_decoder = msgspec.msgpack.Decoder(Ack)
    rows = []
    try:
        assert sock.recv() == b"ready"
        os.unlink(slab_path)  # both sides hold the mapping; nothing left to clean up
        for size in SIZES:
            data = np.random.default_rng(size).integers(0, 255, size, np.uint8).tobytes()
            shape = [size // 4]

            def inline(data: bytes = data, shape: list[int] = shape) -> None:
                sock.send(encoder.encode(InlineTensor(1, "FP32", shape, data)))
                ack_decoder.decode(sock.recv(copy=False).buffer)

            def via_shm(data: bytes = data, shape: list[int] = shape) -> None:
                slab[0 : len(data)] = data
                sock.send(encoder.encode(ShmTensor(1, "FP32", shape, 0, len(data))))
                ack_decoder.decode(sock.recv(copy=False).buffer)

            def memcpy(data: bytes = data) -> None:
                slab[0 : len(data)] = data

            inline_us, shm_us, copy_us = _timed_interleaved([inline, via_shm, memcpy], seconds)
            rows.append((size, inline_us, shm_us, copy_us))
        sock.send(encoder.encode(Stop()))
    finally:
        worker.join(timeout=5)
        sock.close(linger=0)
        ctx.term()
        slab.close()
        Path(slab_path).unlink(missing_ok=True)
        Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
        os.rmdir(tmp)
    return rows


def crossover(rows: list[tuple[int, float, float, float]], overhead_us: float = 0.0) -> int | None:
    """Smallest size from which the shm path, plus ``overhead_us`` of slab bookkeeping this
    benchmark does not model (slot allocation, release), wins at every larger size too."""
    best: int | None = None
    for size, inline_us, shm_us, _ in reversed(rows):
        if shm_us + overhead_us >= inline_us:
            break
        best = size
    return best


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=["process", "thread"], default="process")
    ap.add_argument("--seconds", type=float, default=1.0, help="per size")
    args = ap.parse_args()
    rows = run(args.peer, args.seconds)
    print(f"peer={args.peer}, median µs per lock-step round trip (memcpy: slab copy alone)")
    print(
        f"{'size':>9} {'inline':>9} {'shm':>9} {'memcpy':>9} {'inline-shm':>11} {'shm/inline':>11}"
    )
    for size, inline_us, shm_us, copy_us in rows:
        print(
            f"{_human(size):>9} {inline_us:9.1f} {shm_us:9.1f} {copy_us:9.2f} "
            f"{inline_us - shm_us:11.1f} {shm_us / inline_us:11.2f}"
        )
    for overhead in (0.0, 2.0, 5.0, 10.0):
        x = crossover(rows, overhead)
        where = f"from {_human(x)} up" if x else "nowhere in range"
        print(f"crossover with {overhead:4.1f} µs shm bookkeeping: shm wins {where}")


if __name__ == "__main__":
    main()
