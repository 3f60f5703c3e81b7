"""Chat templates: a conversation's messages made into the one prompt a model reads.

Templates are Jinja2, written as Hugging Face writes them (``tokenizer_config.json``'s
``chat_template``): they see ``messages`` (each a dict with ``role`` and ``content``),
``add_generation_prompt``, ``bos_token`` and ``eos_token``, may call
``raise_exception(message)``, and use the ``tojson`` filter. They run in Jinja2's
immutable sandbox, so a template from a model repository can read its variables and
nothing else. A model that declares none gets ``DEFAULT_TEMPLATE`` (ChatML). Jinja2 is
imported with the first template (a frontend that serves no generative model never
imports it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

#: ChatML: each message as ``<|im_start|>role\ncontent<|im_end|>\n``, then the
#: assistant's opening when a reply is wanted.
DEFAULT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(Exception):
    """A template that does not compile, or fails (``raise_exception``) on a conversation:
    the message says why."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env


class ChatTemplate:
    """One compiled template (compile once per model, render per request). Rendering is
    pure and safe to call from any coroutine."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2

        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages``; raises TemplateError when the template refuses
        them or fails."""
        import jinja2

        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise TemplateError(f"the chat template failed: {exc}") from None
