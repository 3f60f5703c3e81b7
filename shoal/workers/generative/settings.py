"""A generative model's engine settings, from its config.pbtxt parameters (strings).

=====================  ========  ======================================================
parameter              default   meaning
=====================  ========  ======================================================
generative_model       (none)    the class of model.py the engine drives (opts in)
tokenizer              tokenizer.json  a ``tokenizers`` file, in the version folder or
                                 else the model's folder
kv_block_size          16        tokens per KV-cache block
kv_cache_blocks        0         blocks in the instance's pool; 0: from kv_cache_bytes
kv_cache_bytes         268435456 the pool's size in bytes, when kv_cache_blocks is 0
max_running_sequences  32        sequences decoding together at most
max_step_tokens        512       tokens one model step computes at most (decodes and
                                 prompt chunks together)
prefill_chunk          256       prompt tokens of one sequence per step at most
default_max_tokens     16        a request's max_tokens when it gives none (vLLM's)
request_timeout_s      0         seconds a request may run (0: no limit); a request's
                                 ``timeout`` sampling parameter overrides it
tensor_parallel_size   1         processes one instance spans (on GPU instances: a GPU each)
=====================  ========  ======================================================
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from shoal.workers.generative.scheduler import SchedulerConfig


@dataclass(frozen=True)
class EngineSettings:
    tokenizer: str = "tokenizer.json"
    kv_block_size: int = 16
    kv_cache_blocks: int = 0
    kv_cache_bytes: int = 256 << 20
    max_running_sequences: int = 32
    max_step_tokens: int = 512
    prefill_chunk: int = 256
    default_max_tokens: int = 16
    request_timeout_s: float = 0.0
    tensor_parallel_size: int = 1

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> EngineSettings:
        """Raises ValueError naming the parameter that is not valid."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = params.get(f.name)
            if raw is None or raw == "":
                continue
            kind = type(getattr(cls(), f.name))
            try:
                values[f.name] = kind(raw)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"parameter {f.name}: '{raw}' is not {what}") from None
            if kind is not str and values[f.name] < (0 if f.name in _ZERO_OK else 1):
                raise ValueError(f"parameter {f.name}: '{raw}' is out of range")
        settings = cls(**values)
        if settings.max_step_tokens < settings.max_running_sequences:
            raise ValueError("parameter max_step_tokens must be at least max_running_sequences")
        return settings

    def num_blocks(self, bytes_per_token: int) -> int:
        if self.kv_cache_blocks:
            return self.kv_cache_blocks
        return max(1, self.kv_cache_bytes // (bytes_per_token * self.kv_block_size))

    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(
            self.kv_block_size, self.max_running_sequences, self.max_step_tokens, self.prefill_chunk
        )


_ZERO_OK = {"kv_cache_blocks", "request_timeout_s"}
