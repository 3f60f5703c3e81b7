"""Which models the OpenAI API serves, and what it keeps of each: its tokenizer and chat
template, loaded once per model version by each frontend process.

A generative model is a decoupled model with the inputs and outputs of Triton's vLLM
backend (docs/openai-api.md): ``text_input`` BYTES in, ``text_output`` BYTES out, and
any of the optional ones. Its config's parameters may name a tokenizer (a ``tokenizers``
JSON file) and a chat template (a Jinja2 file, or the template itself), and give
``bos_token`` / ``eos_token`` for the template; the files are read through the broker
(``RepositoryExtension.model_file``), relative to the version's directory, else the
model's. ``tokenizers`` is imported with the first model that names a tokenizer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.plane import DataPlane
from shoal.frontend.openai.chat_template import DEFAULT_TEMPLATE, ChatTemplate, TemplateError
from shoal.ipc.errors import Code, ServingError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TEXT_INPUT: Final = "text_input"
TEXT_OUTPUT: Final = "text_output"
#: The config parameters the API reads.
TOKENIZER_PARAM: Final = "tokenizer"
TEMPLATE_PARAM: Final = "chat_template"


def follows_contract(handle: ModelHandle) -> bool:
    """Whether ``handle`` is a generative model: decoupled, ``text_input`` and
    ``text_output`` both BYTES."""
    text_in = handle.inputs.get(TEXT_INPUT)
    text_out = handle.outputs.get(TEXT_OUTPUT)
    return (
        handle.decoupled
        and text_in is not None
        and text_in.datatype == "BYTES"
        and text_out is not None
        and text_out.datatype == "BYTES"
    )


@dataclass(frozen=True)
class GenerativeModel:
    """A generative model version as the API uses it. ``created``: when this frontend
    first saw the version loaded (Unix seconds). ``tokenizer`` is None when the config
    names none (token counts then come from the model's ``num_*_tokens`` outputs)."""

    handle: ModelHandle
    created: int
    tokenizer: Tokenizer | None
    template: ChatTemplate

    @property
    def name(self) -> str:
        return self.handle.name

    def has_input(self, name: str) -> bool:
        return name in self.handle.inputs

    def has_output(self, name: str) -> bool:
        return name in self.handle.outputs


class GenerativeModels:
    """The generative models of one frontend, by (name, version). What the data plane
    forgets of a model (a load, an unload, a lost broker) is forgotten here too: the
    next request reads its files again."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self._kept: dict[tuple[str, int], GenerativeModel] = {}
        self._first_seen: dict[tuple[str, int], int] = {}
        dataplane.broker.on_models_changed.append(self._forget)
        dataplane.broker.on_broker_lost.append(self._kept.clear)

    def _forget(self, names: list[str]) -> None:
        gone = set(names)
        for key in [k for k in self._kept if k[0] in gone]:
            del self._kept[key]
            self._first_seen.pop(key, None)

    async def get(self, name: str) -> GenerativeModel | None:
        """The latest ready version of ``name`` if it is a generative model, else None.
        Raises ServingError where the model exists but cannot serve (not ready: 503) or
        its tokenizer or template cannot be read (500)."""
        try:
            handle = await self.dataplane.model(name, "")
        except ServingError as err:
            if err.code == Code.NOT_FOUND:
                return None
            raise
        if not follows_contract(handle):
            return None
        key = (name, handle.version)
        kept = self._kept.get(key)
        if kept is not None and kept.handle is handle:
            return kept
        model = await self._load(handle, self._first_seen.setdefault(key, int(time.time())))
        self._kept[key] = model
        return model

    async def listed(self) -> list[GenerativeModel]:
        """Every loaded generative model (its latest ready version), by name; one whose
        files cannot be read is left out."""
        index = await self.dataplane.repository.index(ready_only=True)
        out = []
        for name in sorted({e["name"] for e in index}):
            try:
                model = await self.get(name)
            except ServingError:
                continue  # unloaded since the index, or broken files: not served now
            if model is not None:
                out.append(model)
        return out

    async def _load(self, handle: ModelHandle, created: int) -> GenerativeModel:
        params = handle.spec.parameters
        tokenizer = None
        if path := params.get(TOKENIZER_PARAM, ""):
            from tokenizers import Tokenizer  # (with the first model that has one)

            data = await self._file(handle, path)
            try:
                tokenizer = await asyncio.to_thread(Tokenizer.from_str, data.decode())
            except Exception as exc:
                raise ServingError(
                    Code.INTERNAL, f"model '{handle.name}': cannot read tokenizer '{path}': {exc}"
                ) from None
        source = DEFAULT_TEMPLATE
        if spec := params.get(TEMPLATE_PARAM, ""):
            # A name of a file, else the template itself (it has a Jinja2 tag).
            source = (
                spec if "{%" in spec or "{{" in spec else (await self._file(handle, spec)).decode()
            )
        try:
            template = ChatTemplate(
                source, params.get("bos_token", ""), params.get("eos_token", "")
            )
        except TemplateError as exc:
            raise ServingError(Code.INTERNAL, f"model '{handle.name}': {exc}") from None
        return GenerativeModel(handle, created, tokenizer, template)

    async def _file(self, handle: ModelHandle, path: str) -> bytes:
        try:
            return await self.dataplane.repository.model_file(handle.name, handle.version, path)
        except ServingError as err:
            raise ServingError(
                Code.INTERNAL, f"model '{handle.name}': cannot read '{path}': {err.message}"
            ) from None
