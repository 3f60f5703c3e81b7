"""What a load leaves as it is, as Triton's model lifecycle does (pure: it reads the model
folders' stamps, nothing else; used by shoal/broker/control.py).

Each loaded model's folder is stamped when its load reads it (shoal/configs/model_stamps.py).
A later load of it

* changes nothing when it gives no config or files of its own and nothing of the model,
  its config included, is newer (``unchanged``): a config an earlier load gave stays;
* else keeps the READY versions whose folder and shared files are no newer and whose
  config differs in its version policy at most (``kept_versions``); the others load.

A load's own config counts as the model's newest change (Triton stamps it with the time
of the load); a model loaded from a request's files has no stamps: its next load loads
every version.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Set

from shoal.configs import repository
from shoal.configs.ensemble import is_ensemble
from shoal.configs.model_stamps import ModelStamps, reload_needed
from shoal.configs.repository import ModelEntry


class LoadedStamps:
    def __init__(self, model_config_name: str = "") -> None:
        self.model_config_name = model_config_name
        self.of: dict[str, ModelStamps] = {}  # model -> its folder's stamps at its load

    def read(self, entry: ModelEntry, *, config_given: bool = False) -> ModelStamps:
        """``entry``'s folder's stamps now (its config: the repository's file, even where a
        load gave the config; ``config_given``: one did, and is new now)."""
        config = repository.config_file(entry.path, self.model_config_name)
        stamps = ModelStamps.read(entry.path, config)
        if config_given:
            stamps = dataclasses.replace(stamps, config=time.time_ns())
        return stamps

    def unchanged(self, loaded: ModelEntry) -> bool:
        """Whether nothing of the loaded model is newer than at its load (a load that
        gives no config or files of its own then leaves it as it is)."""
        stamps = self.of.get(loaded.name)
        return stamps is not None and not stamps.modified(self.read(loaded))

    def kept_versions(self, loaded: ModelEntry, entry: ModelEntry, ready: Set[int]) -> set[int]:
        """The versions of ``entry`` (the model as this load reads it) that serve on as
        they are: ``ready`` now, their folder and what the versions share no newer than at
        their load, and a config that differs in its version policy at most. None for an
        ensemble."""
        stamps, spec = self.of.get(entry.name), entry.spec
        if (
            stamps is None or loaded.config is None or entry.config is None or spec is None
            or is_ensemble(spec) or reload_needed(loaded.config, entry.config)
        ):  # fmt: skip
            return set()
        now = self.read(entry)
        return {v for v in entry.versions if v in ready and not stamps.version_modified(now, v)}
