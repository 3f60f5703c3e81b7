"""When an ensemble is ready: the policy the broker applies as its composing models load,
fail and unload (pure: the broker's model table in, verdicts on the ensembles' versions
out; no sockets).

An ensemble is judged once every model it uses has settled: READY when its steps fit those
models' configs, else UNAVAILABLE with Triton's reason. An ensemble of ensembles waits for
those it uses. One that lacks a model goes with it, as Triton's do, and comes back with it.
"""

from __future__ import annotations

import logging

from shoal.broker.models import ModelTable, ModelVersion
from shoal.configs import ensemble
from shoal.configs.schema import ConfigError

log = logging.getLogger("shoal.broker")


class EnsembleReadiness:
    """The ensembles' versions waiting for their composing models (``unsettled``), and
    the verdicts on them."""

    def __init__(self) -> None:
        self.unsettled: list[ModelVersion] = []

    def wait(self, versions: list[ModelVersion]) -> None:
        """These ensemble versions are judged once their models settle."""
        self.unsettled += versions

    def changed(self, table: ModelTable, changed: set[str]) -> set[str]:
        """The ensembles that use a model loaded or unloaded, directly or through other
        ensembles: one that lacks a model now goes with it, as Triton's do (UNAVAILABLE,
        "unloaded": not counted against readiness), and comes back with it; the others
        are judged again (LOADING until then, so that an ensemble of ensembles waits for
        those it uses). Returns the ensembles affected."""
        ensembles = {
            mv.name: mv for mv in table.all_versions() if mv.ensemble is not None
        }  # (one version each: an ensemble's versions share its steps)
        affected: set[str] = set()
        frontier = set(changed)
        while frontier:
            users = {
                name
                for name, mv in ensembles.items()
                if name not in affected and frontier & {d.model for d in mv.ensemble or []}
            }
            affected |= users
            frontier = users

        def lacks(name: str, seen: frozenset[str] = frozenset()) -> bool:
            mv = ensembles.get(name)
            if mv is None:
                return name not in table.models
            return name not in seen and any(
                lacks(d.model, seen | {name}) for d in mv.ensemble or []
            )

        for mv in table.all_versions():
            if mv.name not in affected:
                continue
            mv.ever_ready = False
            if lacks(mv.name):
                mv.state, mv.reason = "UNAVAILABLE", "unloaded"
            else:
                mv.state, mv.reason = "LOADING", ""
                if mv not in self.unsettled:
                    self.unsettled.append(mv)
        return affected

    def settle(self, table: ModelTable) -> None:
        """Ensembles whose composing models have settled become READY (their steps fit
        those models' configs) or UNAVAILABLE, with Triton's reason; an ensemble of
        ensembles waits for those."""
        while True:
            waiting = []
            for mv in self.unsettled:
                reason = self._verdict(table, mv)
                if reason is None:
                    waiting.append(mv)
                    continue
                mv.ever_ready = reason == "READY"
                mv.state = "READY" if mv.ever_ready else "UNAVAILABLE"
                mv.reason = "" if mv.ever_ready else reason
                log.log(
                    logging.INFO if mv.ever_ready else logging.ERROR,
                    "ensemble %s/%d: %s", mv.name, mv.version, reason,
                )  # fmt: skip
            settled = len(waiting) < len(self.unsettled)
            self.unsettled = waiting
            if not settled or not waiting:
                return

    def _verdict(self, table: ModelTable, mv: ModelVersion) -> str | None:
        """READY, why not, or None while a composing model is still loading."""
        assert mv.ensemble is not None
        name = mv.name
        missing = [d.model for d in mv.ensemble if d.model not in table.models]
        if missing:
            return (
                f"ensemble {name} contains models that are not available or ambiguous: "
                + ", ".join(dict.fromkeys(missing))
            )
        composing: dict[tuple[str, int], bytes] = {}
        for dep in mv.ensemble:
            entry = table.models[dep.model]
            versions = entry.versions.values()
            # an ensemble it depends on that failed is "not valid", as a broken config is
            failed_ensemble = next(
                (v.reason for v in versions if v.ensemble is not None and not v.ever_ready), ""
            )
            if entry.error or (failed_ensemble and not any(v.ever_ready for v in versions)):
                if any(v.state == "LOADING" for v in versions):
                    return None
                return (
                    f"ensemble '{name}' depends on '{dep.model}' which is not valid. Model "
                    f"'{dep.model}' failed with error: {entry.error or failed_ensemble}"
                )
            if any(v.state == "LOADING" and not v.ever_ready for v in versions):
                return None
            # a version that has been READY counts: one restarting now will be back
            if dep.version >= 0:
                v = entry.versions.get(dep.version)
                if v is None or not v.ever_ready:
                    return (
                        f"ensemble '{name}' depends on '{dep.model}' whose required version "
                        f"{dep.version} is not loaded."
                    )
            else:
                ready = [v for v in versions if v.ever_ready]
                if not ready:
                    why = next((v.reason for v in versions if v.reason), "")
                    failed = f" Model '{dep.model}' loading failed with error: {why}" if why else ""
                    return (
                        f"ensemble '{name}' depends on '{dep.model}' which has no loaded "
                        f"version.{failed}"
                    )
                v = max(ready, key=lambda v: v.version)
            composing[(dep.model, dep.version)] = v.config
        try:
            mv.config = ensemble.complete(mv.config, composing)
        except ConfigError as err:
            return err.message
        return "READY"
