"""An OpenAI request as the model requests it makes (pure: the random source is passed
in). One choice per prompt and ``n``: choice ``p * n + k`` is prompt ``p``'s ``k``-th.
With ``n`` > 1 each choice has its own seed, ``seed + k`` (a random base when the
request gives none), so that sampled choices differ and a seeded request repeats.

Fields the contract cannot honour are refused with OpenAI's 400 naming them rather than
ignored: ``suffix``, ``logit_bias``, ``best_of`` other than ``n``, logprobs from a model
without a ``logprobs`` output, token-id prompts to a model without a tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

from shoal.frontend.openai.chat_template import TemplateError
from shoal.frontend.openai.generation import EXTRA_OUTPUTS
from shoal.frontend.openai.generative import GenerativeModel
from shoal.frontend.openai.protocol import (
    MAX_CHOICES,
    ChatCompletionRequest,
    CompletionRequest,
    invalid,
)

#: OpenAI's default ``max_tokens`` of a completion (chat has none: the model's).
COMPLETION_MAX_TOKENS: Final = 16


@dataclass(frozen=True)
class Plan:
    """``sampling[i]``: choice ``i``'s ``sampling_parameters``. ``top_logprobs`` None:
    no logprobs; else how many alternatives to show per token."""

    prompts: list[str]
    n: int
    sampling: list[dict[str, Any]]
    max_tokens: int | None
    stops: list[str]
    stream: bool
    include_usage: bool
    want: tuple[str, ...]
    echo: bool = False
    top_logprobs: int | None = None

    def prompt_of(self, choice: int) -> str:
        return self.prompts[choice // self.n]


def completion_plan(req: CompletionRequest, model: GenerativeModel, rng: random.Random) -> Plan:
    if req.suffix:
        raise invalid("suffix", "suffix is not supported")
    if req.best_of is not None and req.best_of != req.n:
        raise invalid("best_of", "best_of is not supported (other than equal to n)")
    prompts = _prompts(req.prompt, model)
    top = req.logprobs
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETION_MAX_TOKENS
    return _plan(req, model, prompts, max_tokens, top, rng, echo=req.echo)


def chat_plan(req: ChatCompletionRequest, model: GenerativeModel, rng: random.Random) -> Plan:
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "top_logprobs requires logprobs to be true")
    messages = [_message(i, msg) for i, msg in enumerate(req.messages)]
    try:
        prompt = model.template.render(messages, add_generation_prompt=True)
    except TemplateError as exc:
        raise invalid("messages", str(exc)) from None
    max_tokens = req.max_completion_tokens or req.max_tokens
    top = (req.top_logprobs or 0) if req.logprobs else None
    return _plan(req, model, [prompt], max_tokens, top, rng)


def _plan(
    req: CompletionRequest | ChatCompletionRequest,
    model: GenerativeModel,
    prompts: list[str],
    max_tokens: int | None,
    top: int | None,
    rng: random.Random,
    echo: bool = False,
) -> Plan:
    if req.logit_bias:
        raise invalid("logit_bias", "logit_bias is not supported")
    if len(prompts) * req.n > MAX_CHOICES:
        raise invalid("n", f"at most {MAX_CHOICES} choices (prompts times n) per request")
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options", "stream_options is only allowed when stream is true")
    if top is not None and not model.has_output("logprobs"):
        raise invalid("logprobs", f"the model '{model.name}' does not provide logprobs")
    stops = [s for s in ([req.stop] if isinstance(req.stop, str) else req.stop or []) if s]
    base: dict[str, Any] = {}
    if max_tokens is not None:
        base["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty"):
        if (value := getattr(req, key)) is not None:
            base[key] = value
    if stops:
        base["stop"] = stops
    if req.ignore_eos:
        base["ignore_eos"] = True
    if top:
        base["logprobs"] = top  # alternatives per token (vLLM's SamplingParams.logprobs)
    seed = req.seed
    if seed is None and req.n > 1:
        seed = rng.getrandbits(31)
    sampling = []
    for _ in prompts:
        for k in range(req.n):
            sampling.append(base if seed is None else {**base, "seed": seed + k})
    want = tuple(name for name in EXTRA_OUTPUTS if name != "logprobs" or top is not None)
    return Plan(
        prompts=prompts,
        n=req.n,
        sampling=sampling,
        max_tokens=max_tokens,
        stops=stops,
        stream=req.stream,
        include_usage=req.stream_options is not None and req.stream_options.include_usage,
        want=want,
        echo=echo,
        top_logprobs=top,
    )


def _prompts(prompt: str | list[str | int | list[int]], model: GenerativeModel) -> list[str]:
    """The prompts as text: token ids decoded by the model's tokenizer."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid("prompt", "prompt must not be empty")
    if all(isinstance(p, str) for p in prompt):
        return [p for p in prompt if isinstance(p, str)]
    if all(isinstance(p, int) for p in prompt):
        return [_decode(model, [p for p in prompt if isinstance(p, int)])]
    if all(isinstance(p, list) for p in prompt):
        return [_decode(model, p) for p in prompt if isinstance(p, list)]
    raise invalid("prompt", "prompt must be a string, a list of strings, or token ids")


def _decode(model: GenerativeModel, ids: list[int]) -> str:
    if model.tokenizer is None:
        raise invalid("prompt", f"the model '{model.name}' has no tokenizer: send text")
    if any(i < 0 or i >= model.tokenizer.get_vocab_size() for i in ids):
        raise invalid("prompt", "a token id is outside the model's vocabulary")
    return str(model.tokenizer.decode(ids, skip_special_tokens=False))


def _message(index: int, msg: Any) -> dict[str, Any]:
    """A message as templates read it; content parts other than text are refused."""
    content = msg.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise invalid(
                    f"messages[{index}].content", f"content of type '{part.type}' is not supported"
                )
            texts.append(part.text)
        content = "".join(texts)
    out: dict[str, Any] = {"role": msg.role, "content": content or ""}
    if msg.name is not None:
        out["name"] = msg.name
    return out
