"""Triton's model control modes (pure): which models load at start, and the flags' checks.

``--model-control-mode=none`` (the default) loads every model of the repository and
refuses the load and unload API. ``explicit`` loads only the models ``--load-model``
names (``*``: all) at start, and the API loads, reloads and unloads models while the
server runs. An ensemble named at start brings its composing models with it, as Triton's
dependency graph does. ``poll`` loads every model at start, refuses the API, and rescans
the repository every ``--repository-poll-secs``: what changed loads, reloads or unloads.
"""

from __future__ import annotations

import posixpath
from typing import Any, Final

MODES: Final = ("none", "explicit", "poll")
ALL: Final = "*"


def check_flags(mode: str, load_models: list[str]) -> str | None:
    """Why the flags cannot start a server (Triton's refusals), or None."""
    if mode not in MODES:
        return f"unexpected value for --model-control-mode: '{mode}'"
    if load_models and mode != "explicit":
        return "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    if ALL in load_models and len(load_models) > 1:
        return "Wildcard model name '*' must be the ONLY startup model if specified at all."
    return None


def startup_models(entries: list[Any], mode: str, load_models: list[str]) -> set[str]:
    """The names of ``entries`` (``repository.scan``'s) that load at start: all of them
    outside explicit mode; else those named, with what their ensembles use. A name
    ``load_models`` gives that no entry has is not included (the caller reports it)."""
    names = {e.name for e in entries}
    if mode != "explicit" or ALL in load_models:
        return names
    # (here: importing this module stays light, for the roles' argument parsing)
    from shoal.configs.ensemble import dependencies, is_ensemble

    configs = {e.name: e.spec for e in entries if not e.error and e.config is not None}
    chosen: set[str] = set()
    todo = [n for n in load_models if n in names]
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        chosen.add(name)
        config = configs.get(name)
        if config is not None and is_ensemble(config):
            todo += [d.model for d in dependencies(config) if d.model in names]
    return chosen


def load_file_parts(path: str) -> tuple[str, ...] | None:
    """The folders and name under the model's folder of a load's ``file:<path>``, as
    Triton places it (core's JoinPath appends a path that starts with "/" as if relative;
    IsChildPathEscapingParentPath then judges the normalized path), or None when it
    leaves the model's folder or names no file."""
    norm = posixpath.normpath(path.lstrip("/")) if path.strip("/") else ""
    parts = tuple(norm.split("/")) if norm and norm != "." else ()
    if not parts or parts[0] == "..":
        return None
    return parts
