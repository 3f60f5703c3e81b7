"""The engine of one generative model instance: requests in, one model step at a time,
each sequence's new tokens and text out (a core: the clock is passed in, no threads, no
sockets; the runner is its shell).

``add`` queues a request (refused at once, ``InvalidSampling``, when it can never fit:
a prompt longer than the model takes, or prompt and ``max_tokens`` beyond the whole
pool). ``step(now)`` retires the requests past their deadline, asks the scheduler for a
plan, copies the blocks it shares that a sequence writes into, runs the model (one
``decode_step`` over every decoding sequence, one ``prefill`` over the prompt chunks),
samples where a sequence's tokens are all computed, and retires what finished: end of
sequence, a stop string, ``max_tokens``, the model's longest sequence. ``cancel`` retires
a request at once. A retired request's blocks are free when the call returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from shoal.workers.generative.block_pool import BlockPool
from shoal.workers.generative.interface import GenerativeModel, KvCache, StepBatch
from shoal.workers.generative.sampler import InvalidSampling, Sampled, SamplingParams, sample
from shoal.workers.generative.scheduler import Plan, Scheduler, SchedulerConfig, Sequence
from shoal.workers.generative.text import OutputText

FinishReason = str  # "stop" | "length" | "cancelled" | "abort"


@dataclass
class Output:
    """What one step (or a cancel) produced for one request."""

    handle: Hashable
    new_tokens: list[int]
    text: str  # the new text (all of it once finished, for a caller that did not stream)
    finish: FinishReason | None
    cumulative_logprob: float
    logprobs: list[dict[str, Any]]  # per new token: {token id: {logprob, rank, decoded_token}}
    num_input_tokens: int
    num_output_tokens: int
    first: bool  # its first token: time to first token ends here


@dataclass
class _State:
    handle: Hashable
    params: SamplingParams
    max_tokens: int
    deadline: float  # 0: none
    arrival: float
    text: OutputText
    generator: torch.Generator | None
    cumulative: float = 0.0
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    want_logprobs: bool = False  # its responses carry them
    reported: int = 0  # output tokens handed out
    last_token_at: float = 0.0


@dataclass
class StepTimes:
    """Latencies the steps measured, for the metrics: each request's first token after
    its arrival, and each later token after the one before."""

    first_token: list[float] = field(default_factory=list)
    inter_token: list[float] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        model: GenerativeModel,
        kv: KvCache,
        num_blocks: int,
        config: SchedulerConfig,
        decode: Callable[[list[int]], str],
        default_max_tokens: int = 16,
        default_timeout_s: float = 0.0,
    ) -> None:
        self.model, self.kv, self.decode = model, kv, decode
        self.pool = BlockPool(num_blocks)
        self.scheduler = Scheduler(config, self.pool)
        self.block_size = config.block_size
        self.default_max_tokens, self.default_timeout_s = default_max_tokens, default_timeout_s
        self._seqs: dict[Hashable, Sequence] = {}
        self._next_id = 0
        self.generated_tokens = 0
        self.times = StepTimes()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def add(
        self,
        handle: Hashable,
        prompt: list[int],
        params: SamplingParams,
        now: float,
        want_logprobs: bool = False,
    ) -> None:
        """Queue a request (``want_logprobs``: its outputs list each token's logprob);
        raises InvalidSampling when it can never run."""
        limit = self.model.max_positions
        if not prompt:
            raise InvalidSampling("the prompt has no tokens")
        if len(prompt) >= limit:
            raise InvalidSampling(
                f"the prompt has {len(prompt)} tokens; this model takes at most {limit - 1}"
            )
        max_tokens = min(params.max_tokens or self.default_max_tokens, limit - len(prompt))
        capacity = self.pool.num_blocks * self.block_size
        if len(prompt) + max_tokens > capacity:
            raise InvalidSampling(
                f"the prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) need more "
                f"than this instance's KV cache ({capacity} tokens)"
            )
        timeout = params.timeout_s or self.default_timeout_s
        state = _State(
            handle, params, max_tokens, now + timeout if timeout else 0.0, now,
            OutputText(self.decode, params.stop), params.generator(), want_logprobs=want_logprobs,
        )  # fmt: skip
        seq = Sequence(self._next_id, list(prompt), len(prompt), data=state)
        self._next_id += 1
        self._seqs[handle] = seq
        self.scheduler.add(seq)

    def cancel(self, handle: Hashable, reason: FinishReason = "cancelled") -> Output | None:
        """Retire a request now (its blocks are free); its last output, or None when it
        is not here (finished already)."""
        seq = self._seqs.get(handle)
        if seq is None:
            return None
        return self._retire(seq, reason)

    def step(self, now: float) -> list[Output]:
        """One model step; the outputs of the requests that got a token or ended."""
        outputs = [self._retire(s, "abort") for s in self._expired(now)]
        plan = self.scheduler.schedule()
        if not plan.items:
            return outputs
        for src, dst in plan.copies:
            self.kv.copy_block(src, dst)
        logits = self._run(plan)
        self.scheduler.stepped(plan)
        ready = [i for i, (seq, _) in enumerate(plan.items) if seq.computed == len(seq.tokens)]
        if not ready:
            return outputs
        if len(ready) < len(plan.items):
            logits = logits[ready]
        seqs = [plan.items[i][0] for i in ready]
        states: list[_State] = [seq.data for seq in seqs]
        params = [s.params for s in states]
        said = None
        if any(p.penalized for p in params):
            said = [seq.tokens[seq.prompt_len :] for seq in seqs]
        picks = sample(logits, params, [s.generator for s in states], said)
        for seq, pick in zip(seqs, picks, strict=True):
            outputs.append(self._advance(seq, pick, now))
        return outputs

    def _expired(self, now: float) -> list[Sequence]:
        return [s for s in self._seqs.values() if 0.0 < s.data.deadline <= now]

    def _run(self, plan: Plan) -> torch.Tensor:
        """The model over the plan: its logits, a row per item in the plan's order (the
        decodes, one token each, in one call; the prompt chunks in another)."""
        decode, prefill = StepBatch(), StepBatch()
        rows: list[int] = []  # each item's row among the decodes' rows, then the chunks'
        for seq, n in plan.items:
            batch = decode if n == 1 else prefill
            rows.append(len(batch) if n == 1 else -1 - len(batch))
            batch.add(seq.tokens[seq.computed : seq.computed + n], seq.computed, seq.blocks)
        with torch.inference_mode():
            parts = [self.model.decode_step(decode, self.kv)] if len(decode) else []
            if len(prefill):
                parts.append(self.model.prefill(prefill, self.kv))
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        order = [r if r >= 0 else len(decode) - 1 - r for r in rows]
        if order != list(range(len(order))):
            logits = logits[order]
        return logits

    def _advance(self, seq: Sequence, pick: Sampled, now: float) -> Output:
        """Append the sampled token; the request's output, finished or not."""
        state: _State = seq.data
        seq.tokens.append(pick.token)
        self.generated_tokens += 1
        if state.last_token_at:
            self.times.inter_token.append(now - state.last_token_at)
        else:
            self.times.first_token.append(now - state.arrival)
        state.last_token_at = now
        state.cumulative += pick.logprob
        if state.want_logprobs:
            state.logprobs.append(self._logprob_entry(pick))
        eos = pick.token == self.model.eos_token_id and not state.params.ignore_eos
        outs = seq.tokens[seq.prompt_len :]
        finish: FinishReason | None = "stop" if state.text.update(outs) or eos else None
        if finish is None and (
            seq.output_len >= state.max_tokens or len(seq.tokens) >= self.model.max_positions
        ):
            finish = "length"
        if finish is not None:
            if finish != "stop" and state.text.update(outs, final=True):
                finish = "stop"
            return self._retire(seq, finish)
        return self._output(seq, None)

    def _logprob_entry(self, pick: Sampled) -> dict[str, Any]:
        entry = {str(pick.token): self._described(pick.token, pick.logprob, 0)}
        for rank, (token, lp) in enumerate(pick.top, start=1):
            entry.setdefault(str(token), self._described(token, lp, rank))
        return entry

    def _described(self, token: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.decode([token])}

    def _retire(self, seq: Sequence, finish: FinishReason) -> Output:
        self.scheduler.finish(seq)
        self._seqs.pop(seq.data.handle, None)
        return self._output(seq, finish)

    def _output(self, seq: Sequence, finish: FinishReason | None) -> Output:
        state: _State = seq.data
        new_tokens = seq.tokens[seq.prompt_len + state.reported :]
        first = state.reported == 0 and bool(new_tokens)
        state.reported = seq.output_len
        logprobs, state.logprobs = state.logprobs, []
        return Output(
            state.handle, new_tokens, state.text.take(finish is not None), finish,
            state.cumulative, logprobs, seq.prompt_len, seq.output_len, first,
        )  # fmt: skip

    def take_times(self) -> StepTimes:
        """The latencies measured since the last call (they gather until taken)."""
        times, self.times = self.times, StepTimes()
        return times

    def stats(self) -> dict[str, int]:
        s = self.scheduler
        return {
            "blocks_used": self.pool.num_used,
            "blocks_free": self.pool.num_free,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "preemptions": s.preemptions,
            "prompt_tokens": s.prompt_tokens,
            "prefix_hit_tokens": s.prefix_hit_tokens,
            "generated_tokens": self.generated_tokens,
        }


def logprobs_json(entries: list[dict[str, Any]]) -> str:
    """The ``logprobs`` output: one object per new token."""
    return json.dumps(entries)
