"""Tensor parallelism: one generative instance over ``tensor_parallel_size`` processes.

The worker is rank 0, the leader: it runs the engine (scheduler, pool, sampling,
responses) and its shard of the model. Ranks 1.. are followers it starts itself
(``python -m shoal.workers.generative.tensor_parallel START``, dying with it through
PDEATHSIG): each builds the same model class with ``tensor_parallel_rank`` and
``tensor_parallel_size`` in its parameters, and a KV cache of the same blocks for its
own heads. Before each model call the leader broadcasts the step (``TpStep``: the batch,
or block copies) over the group's gloo link (CPU tensors); every rank then runs the
call, and the model's own collectives (all-reduce after its sharded layers) meet inside
it. Only the leader's logits are used. A group of 1 is the plain engine: no process, no
link.

On CPU instances the group is gloo alone. On GPU instances each rank has a GPU of its
own (a follower is started seeing only its GPU, as device 0, as the leader sees its
own: ``shoal.configs.devices.group_devices``) and the group is ``cpu:gloo,cuda:nccl``:
the steps still go over gloo, the model's collectives on CUDA tensors over NCCL. The
code is the same for both.

The model shards itself (tiny_llm splits its attention heads and its MLP); the engine
and the pool are the same code for any group size.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from shoal.ipc.lifecycle import die_with_parent
from shoal.ipc.tp_messages import TpStart, TpStep
from shoal.workers.generative.interface import KvCache, StepBatch

_TIMEOUT = datetime.timedelta(seconds=120)  # a follower gone: the leader's step fails
_HOST = "127.0.0.1"


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _broadcast(step: TpStep | None) -> TpStep:
    """The leader's step to every rank (``step`` None on a follower: it receives)."""
    import torch

    dist = _dist()
    data = msgspec.msgpack.encode(step) if step is not None else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=0)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if step is not None
        else torch.empty(int(size[0]), dtype=torch.uint8)
    )
    dist.broadcast(buf, src=0)
    return step if step is not None else msgspec.msgpack.decode(buf.numpy().tobytes(), type=TpStep)


def backend(device: str) -> str:
    """The group's torch.distributed backend for ``device`` ("cpu" or "cuda")."""
    return "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"


def rank_parameters(params: dict[str, str], rank: int, size: int) -> dict[str, str]:
    return {**params, "tensor_parallel_rank": str(rank), "tensor_parallel_size": str(size)}


def load_class(model_file: str, name: str) -> type:
    """``name`` of ``model_file``, imported as the Python backend imports model.py."""
    from shoal.workers import pb_utils

    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    path = Path(model_file)
    for folder in (path.parent.parent, path.parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}.{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)  # type: ignore[no-any-return]


class TensorParallelGroup:
    """The leader's side: its followers, the link, and the model and cache wrapped so
    that every call and copy goes to the followers first. ``visible``: each rank's
    CUDA_VISIBLE_DEVICES on a GPU instance (None on CPU: the followers inherit this
    process's environment)."""

    def __init__(
        self,
        size: int,
        model_class: type,
        params: dict[str, str],
        device: str,
        visible: list[str] | None = None,
    ) -> None:
        if visible is not None and len(visible) != size:
            raise ValueError(f"{len(visible)} GPUs for a tensor-parallel group of {size}")
        self.size = size
        self._class, self._params, self._device = model_class, params, device
        self._visible = visible
        self._followers: list[subprocess.Popen[bytes]] = []

    def _env(self, rank: int) -> dict[str, str] | None:
        if self._visible is None:
            return None
        return {**os.environ, "CUDA_VISIBLE_DEVICES": self._visible[rank]}

    def start(self, num_blocks: int, block_size: int) -> None:
        """Start the followers and join the group (rank 0); raises when it cannot. The
        rendezvous is the leader's TCPStore on a port the kernel picks: nothing on disk."""
        import inspect

        dist = _dist()
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.TCPStore(
            _HOST, 0, self.size, is_master=True, timeout=_TIMEOUT, wait_for_workers=False
        )
        model_file = inspect.getfile(self._class)
        for rank in range(1, self.size):
            start = TpStart(
                rank, self.size, store.port, model_file, self._class.__name__,
                rank_parameters(self._params, rank, self.size), self._device,
                num_blocks, block_size, os.getpid(),
            )  # fmt: skip
            argv = [sys.executable, "-m", __name__, msgspec.json.encode(start).decode()]
            self._followers.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=self._env(rank))
            )
        dist.init_process_group(
            backend(self._device), store=store, rank=0, world_size=self.size, timeout=_TIMEOUT
        )

    def model(self) -> Any:
        """The leader's shard of the model (rank 0)."""
        return self._class(rank_parameters(self._params, 0, self.size), self._device)

    def leader(self, model: Any) -> Any:
        return _Leader(model)

    def cache(self, kv: KvCache) -> KvCache:
        return _LeaderCache(kv.k, kv.v, kv.block_size)

    def stop(self) -> None:
        """Tell the followers to exit, wait for them, leave the group."""
        with contextlib.suppress(Exception):
            _broadcast(TpStep("stop"))
        for proc in self._followers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(Exception):
            _dist().destroy_process_group()


class _Leader:
    """The leader's model: each call broadcast to the followers, then run here."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.eos_token_id = model.eos_token_id
        self.max_positions = model.max_positions

    def kv_layout(self) -> Any:
        return self._model.kv_layout()

    def prefill(self, batch: StepBatch, kv: KvCache) -> Any:
        _broadcast(TpStep("prefill", batch.tokens, batch.starts, batch.block_tables))
        return self._model.prefill(batch, kv)

    def decode_step(self, batch: StepBatch, kv: KvCache) -> Any:
        _broadcast(TpStep("decode", batch.tokens, batch.starts, batch.block_tables))
        return self._model.decode_step(batch, kv)


class _LeaderCache(KvCache):
    def copy_block(self, src: int, dst: int) -> None:
        _broadcast(TpStep("copy", copies=[(src, dst)]))
        super().copy_block(src, dst)


def follow(start: TpStart) -> None:
    """A follower's life: join the group, then run each step the leader broadcasts."""
    import torch

    die_with_parent(start.parent, sig=9)
    dist = _dist()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore(_HOST, start.store_port, start.size, is_master=False, timeout=_TIMEOUT)
    dist.init_process_group(
        backend(start.device), store=store, rank=start.rank, world_size=start.size,
        timeout=_TIMEOUT,
    )  # fmt: skip
    model = load_class(start.model_file, start.model_class)(start.parameters, start.device)
    kv = KvCache.allocate(model.kv_layout(), start.num_blocks, start.block_size, start.device)
    while True:
        step = _broadcast(None)
        if step.kind == "stop":
            break
        if step.kind == "copy":
            for src, dst in step.copies:
                kv.copy_block(src, dst)
            continue
        batch = StepBatch(step.tokens, step.starts, step.tables)
        with torch.inference_mode():
            (model.prefill if step.kind == "prefill" else model.decode_step)(batch, kv)
    dist.destroy_process_group()


if __name__ == "__main__":
    follow(msgspec.json.decode(sys.argv[1].encode(), type=TpStart))
