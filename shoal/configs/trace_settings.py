"""The server's trace settings, global and per model, as Triton's trace manager keeps
them (its ``UpdateTraceSetting``): pure, kept by the broker, the one truth every
frontend follows (each gets the table in its Welcome and again after each change).

A setting has up to five fields (TraceSetting). The global setting's fields fall back to
the flags' (``defaults``) until an update specifies them, and again once an update clears
them (a null value); a model's fields fall back to the global setting's. A model whose
fields are all cleared follows the global setting again, changes to it included.
"""

from __future__ import annotations

from typing import Final

import msgspec

from shoal.ipc.errors import Code, ServingError
from shoal.ipc.messages import TraceSetting, TraceTable

FIELDS: Final = ("levels", "rate", "count", "log_frequency", "file")
Changes = dict[str, list[str] | int | None]
RATE_ZERO: Final = "sample rate must be non-zero"


def invalid_reason(s: TraceSetting, mode: str) -> str:
    """Why ``s`` traces nothing ("": it traces), Triton's words."""
    if not s.levels:
        return "tracing is disabled"
    if s.rate == 0:
        return RATE_ZERO
    if mode == "triton" and not s.file:
        return "trace file name is not given"
    return ""


class TraceSettings:
    """The global and per-model settings, with the fields each update specified."""

    def __init__(self, defaults: TraceSetting, mode: str, options: dict[str, str]) -> None:
        self.defaults = defaults
        self.mode = mode
        self.options = options
        self._global: dict[str, object] = {}  # the fields updates specified
        self._models: dict[str, dict[str, object]] = {}

    def get(self, model: str = "") -> TraceSetting:
        """The setting in effect for ``model`` ("": the global one)."""
        fields = {**self._global, **self._models.get(model, {})} if model else self._global
        return msgspec.structs.replace(self.defaults, **fields)  # type: ignore[arg-type]

    def update(self, model: str, changes: Changes) -> TraceSetting:
        """Apply ``changes`` (field -> value, None: clear) to ``model``'s setting ("":
        the global one); ServingError (nothing changed) when the result would trace
        nothing for a reason other than being OFF, as Triton refuses it."""
        current = self._models.get(model, {}) if model else self._global
        fields = dict(current)
        for name, value in changes.items():
            if name not in FIELDS:
                continue
            if value is None:
                fields.pop(name, None)
            else:
                fields[name] = tuple(value) if isinstance(value, list) else value
        base = {**self._global, **fields} if model else fields
        setting = msgspec.structs.replace(self.defaults, **base)  # type: ignore[arg-type]
        reason = invalid_reason(setting, self.mode)
        if reason and setting.levels:
            raise ServingError(
                Code.INVALID_ARG, f"Attempting to set invalid trace setting :{reason}"
            )
        if not model:
            self._global = fields
        elif fields:
            self._models[model] = fields
        else:
            self._models.pop(model, None)
        return setting

    def table(self) -> TraceTable:
        """What the frontends follow: the global setting and each model's own."""
        return TraceTable(
            mode=self.mode,
            default=self.get(),
            models={name: self.get(name) for name in self._models},
            options=self.options,
        )
