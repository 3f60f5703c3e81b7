"""The broker's start: its settings (``BrokerSettings``), its model control as they ask
(``model_control``), and what it expects of the model repository at start
(``load_repository``): which models load (by the model-control mode),
the rate limiter's resources, each version's instances or each ensemble's dependencies in
the model table, and the errors of those that cannot load. No sockets: the workers' hellos
then fill the table in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shoal.broker.control import ModelControl, not_in_repository
from shoal.broker.ensemble_readiness import EnsembleReadiness
from shoal.broker.models import ModelTable
from shoal.broker.rate_limiter import RateLimiter
from shoal.broker.repository_sync import RepositorySync
from shoal.broker.router import Router
from shoal.broker.scheduler_hold import HoldCounts
from shoal.configs import ensemble, rate_limits, repository
from shoal.configs.devices import gpu_count
from shoal.configs.ensemble import is_ensemble
from shoal.configs.model_control import ALL, startup_models
from shoal.configs.placement import instance_count, passive_instances
from shoal.configs.rate_limits import describe
from shoal.configs.repository_view import RepositoryView

log = logging.getLogger("shoal.broker")


@dataclass
class BrokerSettings:
    model_repository: Path
    runtime_dir: Path
    exit_on_error: bool = True
    autocomplete: bool = True
    model_config_name: str = ""
    strict_readiness: bool = True
    execution_timeout_s: float = 300.0  # a batch running longer means a hung instance
    instance_memory_limit_mb: int = 0  # for models whose config sets none; 0: no limit
    rate_limit: str = "off"  # --rate-limit (shoal/configs/rate_limits.py)
    rate_limit_resources: list[str] = field(default_factory=list)  # --rate-limit-resource
    model_control_mode: str = "none"  # shoal.configs.model_control
    load_models: list[str] = field(default_factory=list)  # --load-model (explicit mode)
    repository_poll_secs: float = 15.0  # poll mode: how often the repository is rescanned
    # what model_repository is a view of (shoal/configs/repository_view.py); [] it is no view
    repository_locations: list[str] = field(default_factory=list)
    model_namespacing: bool = False  # qualified names (shoal/configs/namespaces.py) are served
    # why the server failed to initialize: no repository is read, the server is neither
    # live nor ready and model control is refused (Triton's FAILED_TO_INITIALIZE)
    init_error: str = ""
    expect_launcher: bool = False  # started by shoal serve (explicit/poll: it starts workers)
    cpu_lending: bool = True  # idle CPU instances lend their cores to busy ones
    frontend_silence_s: float = 30.0  # a frontend silent this long is stuck (0: never)
    # Triton's test hooks TRITONSERVER_(BACKLOG_)DELAY_SCHEDULER, read from the environment
    scheduler_hold: HoldCounts = field(default_factory=HoldCounts)


def load_repository(
    s: BrokerSettings,
    table: ModelTable,
    router: Router,
    control: ModelControl,
    readiness: EnsembleReadiness,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read the repository and fill ``table`` with the models that load at start (their
    versions LOADING until their workers report), the others known to ``control`` by
    name; in poll mode, polling starts (``clock``: when)."""
    entries = repository.scan(
        s.model_repository,
        model_config_name=s.model_config_name,
        autocomplete_enabled=s.autocomplete,
        gpu_count=gpu_count(),
    )
    limits = rate_limits.for_repository(entries, s.rate_limit, s.rate_limit_resources)
    if limits is not None:
        router.limiter = RateLimiter(limits)
        control.refused = dict(limits.refused)
        log.info("rate limiter: execution_count; resources %s", describe(limits.copies))
    configs = {e.name: spec for e in entries if not e.error and (spec := e.spec) is not None}
    mode, names = s.model_control_mode, s.load_models
    chosen = startup_models(entries, mode, names)
    for e in entries:
        if e.name not in chosen:
            control.unloaded[e.name] = {}  # never loaded: in the index by name
    control.named = {e.name for e in entries} if ALL in names or mode != "explicit" else set(names)
    for name in sorted(set(names) - {e.name for e in entries} - {ALL}):
        if mode == "explicit":  # Triton's: the model is not in the repository
            log.error("%s", not_in_repository(name))
            table.add_error(name, f"failed to load '{name}', failed to poll from model repository")
    entries = [e for e in entries if e.name in chosen]
    control.started_with(entries)
    if control.poll_secs > 0:
        control.start_polling(clock())
    for e in entries:
        if limits is not None and e.name in limits.refused:
            e.error = limits.refused[e.name]
        loop = ensemble.cycle(configs, e.name) if e.name in configs and not e.error else None
        if loop is not None:  # Triton's words: the start, ..., the last, the start
            ends = f"{loop[0]} -> ... -> {loop[-2]} -> {loop[0]}"
            e.error = f"circular dependency between ensembles: {ends}"
        spec = e.spec
        if e.error or spec is None:
            log.error("%s", e.error)
            table.add_error(e.name, e.error or "failed to load")
            continue
        if is_ensemble(spec):
            deps = ensemble.dependencies(spec)
            readiness.wait(table.add_ensemble(e.name, e.versions, e.config_bytes(), deps))
            continue
        count = instance_count(spec)
        platform = spec.platform or spec.backend
        passive = passive_instances(spec)
        table.add_model(e.name, {v: count for v in e.versions}, platform, passive)
    log.info("repository %s: %d model(s) loading at start", s.model_repository, len(entries))


def model_control(s: BrokerSettings, table: ModelTable) -> ModelControl:
    """Model control as the settings' mode asks, over a view of the repository's
    locations where the model repository is one."""
    control = ModelControl(
        table,
        s.model_repository,
        s.runtime_dir,
        explicit=s.model_control_mode == "explicit",
        model_config_name=s.model_config_name,
        autocomplete=s.autocomplete,
        poll_secs=s.repository_poll_secs if s.model_control_mode == "poll" else 0,
    )
    if s.repository_locations and s.model_control_mode != "none":
        view = RepositoryView(
            s.repository_locations, s.model_repository, namespacing=s.model_namespacing
        )
        control.view_sync = RepositorySync(view, whole=s.model_control_mode != "explicit")
    return control
