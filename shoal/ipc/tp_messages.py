"""What the leader of a tensor-parallel generative instance tells its followers before
each model call (shoal/workers/generative/tensor_parallel.py): msgpack bytes broadcast
over the group's torch.distributed (gloo) link, never pickle."""

from __future__ import annotations

from typing import Literal

import msgspec

TpKind = Literal["prefill", "decode", "copy", "stop"]


class TpStep(msgspec.Struct, array_like=True):
    """``prefill`` / ``decode``: the step's batch (tokens, starts, block tables);
    ``copy``: copy-on-write block copies ``(source, destination)``; ``stop``: exit."""

    kind: TpKind
    tokens: list[list[int]] = []
    starts: list[int] = []
    tables: list[list[int]] = []
    copies: list[tuple[int, int]] = []


class TpStart(msgspec.Struct):
    """A follower's command line (JSON): its rank, the group, the model and its cache."""

    rank: int
    size: int
    store_port: int  # the leader's torch.distributed TCPStore, on the loopback
    model_file: str
    model_class: str
    parameters: dict[str, str]
    device: str
    num_blocks: int
    block_size: int
    parent: int
