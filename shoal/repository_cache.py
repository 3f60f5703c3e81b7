"""The launcher's side of a repository view (shoal/configs/repository_view.py): whether the
--model-repository values need one, where it lives, its first sync before any other
role starts, and the removal of those that killed servers left.

A view's folder is ``shoal-models-<launcher pid>`` in the temp directory: the next start
removes those whose launcher is gone (`sweep_stale`); the launcher removes its own when
it stops.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from shoal.configs.object_store import is_remote
from shoal.configs.repository_view import RepositoryView
from shoal.ipc.lifecycle import pid_alive

CACHE_PREFIX = "shoal-models-"


def needs_view(locations: list[str]) -> bool:
    """Whether these --model-repository values need a view (else the one local folder
    is read as it is)."""
    return len(locations) > 1 or any(is_remote(loc) for loc in locations)


def cache_dir(pid: int | None = None) -> Path:
    """The view's folder for the launcher ``pid`` (this process by default)."""
    return Path(tempfile.gettempdir()) / f"{CACHE_PREFIX}{pid or os.getpid()}"


def sweep_stale() -> list[Path]:
    """Remove the views of servers that are gone (their launcher's pid is dead)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*"):
        pid = path.name.removeprefix(CACHE_PREFIX)
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def prepare(
    locations: list[str],
    root: Path,
    *,
    mode: str,
    load_models: list[str],
    model_config_name: str = "",
    namespacing: bool = False,
) -> RepositoryView:
    """The launcher's first sync of a view, before any role reads it: every model whole,
    or in explicit mode those that load at start (what --load-model names, with what its
    ensembles use) and the configs of the others. Raises RepositoryError (the server
    cannot start)."""
    from shoal.configs import repository
    from shoal.configs.model_control import ALL, startup_models

    view = RepositoryView(locations, root, namespacing=namespacing)
    wanted: set[str] | None = None
    if mode == "explicit" and ALL not in load_models:
        view.sync(set(), strict=True)  # the configs: which models the named ones use
        level = repository.log.level
        repository.log.setLevel(logging.CRITICAL)  # (half-fetched models: not errors)
        try:
            entries = repository.scan(root, model_config_name=model_config_name)
        finally:
            repository.log.setLevel(level)
        wanted = startup_models(entries, mode, load_models)
    view.sync(wanted, strict=True)
    return view
