"""What a generative model implements for shoal's engine, in the spirit of vLLM's model
runner: the engine owns the loop, the KV-cache pool and the scheduling; the model only
computes steps over a batch of live sequences.

A model class (named in config.pbtxt by ``generative_model``) is built as
``cls(parameters, device)``: the config's parameters as strings, and ``"cpu"`` or
``"cuda"``. It then gives:

* ``kv_layout()``: how big one token's KV is (layers, KV heads, head size, dtype), so
  that the engine sizes the pool; the engine allocates the cache (``KvCache``) and hands
  the same tensors to every step.
* ``prefill(batch, kv)`` and ``decode_step(batch, kv)``: for each sequence of ``batch``,
  take its new tokens (``StepBatch.tokens``, at positions ``start ..``), write their K
  and V into the cache slots their block table names, attend over the sequence's whole
  context (its earlier tokens are in the cache already) and return the logits of each
  sequence's last new token, one row per sequence ([len(batch), vocab]). In
  ``decode_step`` every sequence has exactly one new token (batch it across sequences);
  in ``prefill`` any number (a chunk of a prompt, or a recomputed sequence).
* ``eos_token_id`` and ``max_positions`` (the longest sequence it can take).

A model never keeps per-sequence state of its own between steps: a preempted sequence
is recomputed from its tokens, and a shared prompt block is read by several sequences.
Steps run on one thread, the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class KvLayout:
    """One token's KV in one layer: ``num_kv_heads`` x ``head_dim`` for K and for V."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Any  # a torch.dtype

    def bytes_per_token(self) -> int:
        import torch

        size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * size


@dataclass
class KvCache:
    """The pool's memory: ``k`` and ``v`` each [layers, blocks, block_size, kv_heads,
    head_dim]. Block ``b``'s slot ``o`` holds the token a block table maps there."""

    k: Any
    v: Any
    block_size: int

    @classmethod
    def allocate(cls, layout: KvLayout, num_blocks: int, block_size: int, device: str) -> KvCache:
        import torch

        shape = (layout.num_layers, num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
        k = torch.zeros(shape, dtype=layout.dtype, device=device)
        return cls(k, torch.zeros_like(k), block_size)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: block ``dst`` becomes a copy of ``src`` in every layer."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])


@dataclass
class StepBatch:
    """The sequences of one model call: for each, its new token ids, the position of the
    first of them (the tokens before are in the cache) and its block table (block ids,
    in order: position ``p`` lies in ``block_tables[i][p // block_size]``)."""

    tokens: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tokens: list[int], start: int, block_table: list[int]) -> None:
        self.tokens.append(tokens)
        self.starts.append(start)
        self.block_tables.append(block_table)


class GenerativeModel(Protocol):
    eos_token_id: int
    max_positions: int

    def kv_layout(self) -> KvLayout: ...

    def prefill(self, batch: StepBatch, kv: KvCache) -> Any:
        """Logits [len(batch), vocab] of each sequence's last new token."""

    def decode_step(self, batch: StepBatch, kv: KvCache) -> Any:
        """As ``prefill``, with one new token per sequence."""
