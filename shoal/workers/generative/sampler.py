"""Sampling parameters (the ``sampling_parameters`` JSON of Triton's vLLM backend) and
the sampling of each sequence's next token.

Greedy when ``temperature`` is 0; otherwise softmax at that temperature over the
``top_k`` most likely tokens, then the smallest set of them whose probability reaches
``top_p``, drawn with the sequence's own ``torch.Generator`` (seeded from ``seed``, or
from the OS when none is given). One draw per token, from that generator alone, so a
sequence's tokens do not depend on the sequences it is batched with, nor on a
preemption.

``presence_penalty`` and ``frequency_penalty`` are OpenAI's: before anything else, each
token's logit is lowered by ``frequency_penalty`` times the number of times the sequence
has generated it so far, and by ``presence_penalty`` once if it has (the prompt does not
count); negative values raise them. Greedy takes the most likely token after them.
Logprobs are those of the distribution the token is picked from, after the penalties,
before temperature (with no penalty: the model's own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class InvalidSampling(ValueError):
    """The request's sampling parameters are not valid (its client's fault)."""


@dataclass
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int = 0  # alternatives reported beside the sampled token
    timeout_s: float = 0.0  # shoal's: the request ends ("abort") after this long
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalized(self) -> bool:
        """Whether its next token depends on the tokens it generated (a penalty)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @classmethod
    def parse(cls, text: str) -> SamplingParams:
        """From the request's JSON; raises InvalidSampling with what is wrong."""
        try:
            raw = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidSampling(f"sampling_parameters is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidSampling("sampling_parameters must be a JSON object")
        p = cls()
        if (_opt_int(raw, "n", minimum=1) or 1) > 1:
            raise InvalidSampling("n > 1 is not supported: send n requests")
        p.max_tokens = _opt_int(raw, "max_tokens", minimum=1)
        p.temperature = _num(raw, "temperature", 1.0, minimum=0.0)
        p.top_p = _num(raw, "top_p", 1.0, minimum=0.0)
        if not 0.0 < p.top_p <= 1.0:
            raise InvalidSampling("top_p must be in (0, 1]")
        p.top_k = _opt_int(raw, "top_k", minimum=-1) or 0
        p.seed = _opt_int(raw, "seed")
        p.ignore_eos = bool(raw.get("ignore_eos", False))
        p.logprobs = _opt_int(raw, "logprobs", minimum=0) or 0
        p.timeout_s = _num(raw, "timeout", 0.0, minimum=0.0)
        for key in ("presence_penalty", "frequency_penalty"):
            value = _num(raw, key, 0.0, minimum=-2.0)
            if value > 2.0:
                raise InvalidSampling(f"{key} must be at most 2.0")
            setattr(p, key, value)
        stop = raw.get("stop", [])
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidSampling("stop must be a string or a list of strings")
        p.stop = [s for s in stop if s]
        return p

    def generator(self) -> torch.Generator | None:
        """The sequence's own generator (None for greedy: it draws nothing)."""
        if self.temperature == 0.0:
            return None
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def _opt_int(raw: dict[str, Any], key: str, minimum: int | None = None) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidSampling(f"{key} must be an integer")
    if minimum is not None and value < minimum:
        raise InvalidSampling(f"{key} must be at least {minimum}")
    return int(value)


def _num(raw: dict[str, Any], key: str, default: float, minimum: float) -> float:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSampling(f"{key} must be a number")
    if value < minimum:
        raise InvalidSampling(f"{key} must be at least {minimum}")
    return float(value)


@dataclass
class Sampled:
    """A sequence's next token, its logprob, and the top alternatives asked for."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    gens: list[torch.Generator | None],
    outputs: list[list[int]] | None = None,
) -> list[Sampled]:
    """The next token of each row of ``logits`` [n, vocab] (on any device: the rows that
    are drawn from come to the CPU, where their generators are). ``outputs[i]``: the
    tokens row ``i``'s sequence generated so far, read where its params have a penalty
    (None: no row has one)."""
    logits = logits.to(torch.float64)
    if outputs is not None and any(p.penalized for p in params):
        logits = _penalized(logits, params, outputs)
    logprobs = torch.log_softmax(logits, dim=-1)
    best, picked = logprobs.max(dim=-1)  # (the first of equals, as argmax)
    tokens, chosen = picked.tolist(), best.tolist()
    host: np.ndarray | None = None  # the rows on the CPU, once, if any is drawn
    for i, (p, g) in enumerate(zip(params, gens, strict=True)):
        if g is not None:
            if host is None:
                host = logprobs.cpu().numpy()
            tokens[i] = _draw(host[i], p, g)
            chosen[i] = float(host[i, tokens[i]])
    out: list[Sampled] = []
    for i, p in enumerate(params):
        top: list[tuple[int, float]] = []
        if p.logprobs:
            values, ids = logprobs[i].topk(min(p.logprobs, logprobs.shape[-1]))
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        out.append(Sampled(tokens[i], chosen[i], top))
    return out


def _penalized(
    logits: torch.Tensor, params: list[SamplingParams], outputs: list[list[int]]
) -> torch.Tensor:
    """``logits`` (float64, not written) with each penalized row's penalties applied."""
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i, (p, generated) in enumerate(zip(params, outputs, strict=True)):
        if not p.penalized or not generated:
            continue
        ids = torch.tensor(generated, device=logits.device)
        counts = torch.bincount(ids, minlength=vocab).to(logits.dtype)
        logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return logits


def _draw(logprobs: np.ndarray, p: SamplingParams, g: torch.Generator) -> int:
    """One token from the filtered distribution, by inverting its CDF at one uniform draw
    of ``g``: over the tokens most likely first where top-k or top-p cut the
    distribution, in vocabulary order where nothing is cut (no sort needed). Which of the
    two depends on the request's own parameters alone. (numpy: a few microseconds where
    torch's dispatch per operation costs more than a vocabulary-sized row's arithmetic.)"""
    scaled = logprobs / p.temperature
    u = float(torch.rand((), generator=g, dtype=torch.float64))
    if not 0 < p.top_k < scaled.size and p.top_p >= 1.0:
        cdf = np.cumsum(np.exp(scaled - scaled.max()))
        return min(int(np.searchsorted(cdf, u * cdf[-1])), scaled.size - 1)
    order = np.argsort(-scaled, kind="stable")
    if 0 < p.top_k < order.size:
        order = order[: p.top_k]
    ranked = scaled[order]
    probs = np.exp(ranked - ranked[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        before = np.cumsum(probs) - probs
        keep = max(int((before < p.top_p).sum()), 1)
        probs, order = probs[:keep] / probs[:keep].sum(), order[:keep]
    pick = int(np.searchsorted(np.cumsum(probs), u))
    return int(order[min(pick, order.size - 1)])
