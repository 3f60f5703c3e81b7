"""The command line of each role process of one server (``python -m shoal.broker|frontend|
workers``), built from ``shoal serve``'s settings.

``shoal serve`` (shoal.launcher) starts its children with these command lines, and
``shoal supervisord-conf`` (shoal.supervisord_conf) writes them as supervisord programs,
so both deployments run the same processes with the same flags. Pure: it reads the model
repository to plan the workers, and nothing else.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.configs import rate_limits, repository
from shoal.configs.devices import gpu_count
from shoal.configs.flags.broker import rate_limit_flags
from shoal.configs.flags.common import log_flags
from shoal.configs.model_control import startup_models
from shoal.configs.placement import InstancePlan, plan_repository
from shoal.ipc.messages import WorkerSpec

if TYPE_CHECKING:
    from shoal.launcher import ServeSettings


def _flag(value: bool) -> str:
    return str(value).lower()


@dataclass(frozen=True)
class RoleArgv:
    """Builds the role command lines of one server.

    ``parent_pid``: the launcher's pid, which its children die with; None for programs
    that run as siblings (supervisord). ``python``: the interpreter the roles run on."""

    s: ServeSettings
    runtime_dir: Path
    parent_pid: int | None
    python: str = sys.executable

    def common(self) -> list[str]:
        args = ["--runtime-dir", str(self.runtime_dir), *log_flags(self.s.log)]
        if self.parent_pid is not None:
            args += ["--parent-pid", str(self.parent_pid)]
        return args

    def model_args(self) -> list[str]:
        args = ["--model-repository", str(self.s.model_repository)]
        if not self.s.autocomplete:
            args.append("--disable-auto-complete-config")
        if self.s.model_config_name:
            args += ["--model-config-name", self.s.model_config_name]
        return args

    def broker(self) -> list[str]:
        s = self.s
        return [
            self.python,
            "-m",
            "shoal.broker",
            *self.common(),
            *self.model_args(),
            f"--exit-on-error={_flag(s.exit_on_error)}",
            f"--strict-readiness={_flag(s.strict_readiness)}",
            "--model-execution-timeout-secs",
            str(s.execution_timeout_secs),
            f"--instance-memory-limit-mb={s.instance_memory_limit_mb}",
            f"--cpu-lending={_flag(s.cpu_lending)}",
            f"--frontend-silence-timeout-secs={s.frontend_silence_secs}",
            *rate_limit_flags(s.rate_limit, s.rate_limit_resources),
            f"--model-control-mode={s.model_control_mode}",
            f"--repository-poll-secs={s.repository_poll_secs}",
            *(f"--load-model={name}" for name in s.load_models),
            *(f"--repository-location={loc}" for loc in s.repository_locations),
            *(["--model-namespacing=true"] if s.model_namespacing else []),
            *([f"--init-error={s.init_error}"] if s.init_error else []),
            *s.trace_flags,
        ]

    def frontend(self, index: int | str) -> list[str]:
        """``index``: the frontend's number (supervisord: its ``%(process_num)d``)."""
        s = self.s
        shared = s.frontend_processes > 1
        return [
            self.python,
            "-m",
            "shoal.frontend",
            *self.common(),
            "--index",
            str(index),
            "--http-address",
            s.http_address,
            "--http-port",
            str(s.http_port),
            f"--allow-http={_flag(s.allow_http)}",
            "--id",
            s.server_id,
            "--http-max-input-size",
            str(s.http_max_input_size),
            "--exit-timeout-secs",
            str(s.exit_timeout_secs),
            f"--reuse-http-port={_flag(s.reuse_http_port or shared)}",
            f"--allow-grpc={_flag(s.allow_grpc)}",
            "--grpc-address",
            s.grpc_address,
            "--grpc-port",
            str(s.grpc_port),
            f"--reuse-grpc-port={_flag(s.reuse_grpc_port or shared)}",
            f"--allow-client-shm={_flag(s.allow_client_shm)}",
            f"--response-cache-bytes={-(-s.response_cache_bytes // max(s.frontend_processes, 1))}",
            f"--allow-metrics={_flag(s.allow_metrics)}",
            "--metrics-address",
            s.metrics_address,
            "--metrics-port",
            str(s.metrics_port),
            f"--reuse-metrics-port={_flag(s.reuse_http_port or shared)}",
            "--metrics-interval-ms",
            str(s.metrics_interval_ms),
            f"--allow-cpu-metrics={_flag(s.allow_cpu_metrics)}",
            f"--allow-gpu-metrics={_flag(s.allow_gpu_metrics)}",
            *(f"--metrics-config={v}" for v in s.metrics_config),
            *(f"--http-restricted-api={v}" for v in s.http_restricted_api),
            *(f"--grpc-restricted-protocol={v}" for v in s.grpc_restricted_protocol),
            *s.grpc_flags,
            *s.connection_flags,
            *s.extra_frontend_args,
        ]

    def worker_plans(
        self,
        repo: Path | None = None,
        cpus: list[int] | None = None,
        gpus: int | None = None,
    ) -> list[InstancePlan]:
        """The instances the repository asks for at start, each placed on its own cores or
        GPU (shoal.configs.placement), on a host with ``cpus`` and ``gpus`` (default: this
        one's). ``repo``: where to read the repository, if not at the settings' path."""
        gpus = gpu_count() if gpus is None else gpus
        entries = repository.scan(
            repo or self.s.model_repository,
            model_config_name=self.s.model_config_name,
            autocomplete_enabled=self.s.autocomplete,
            gpu_count=gpus,
        )
        # The broker refuses the models the rate limiter cannot schedule: no workers.
        entries = rate_limits.without_refused(
            entries, self.s.rate_limit, self.s.rate_limit_resources
        )
        chosen = startup_models(entries, self.s.model_control_mode, self.s.load_models)
        entries = [e for e in entries if e.name in chosen]
        return plan_repository(entries, sorted(os.sched_getaffinity(0)) if cpus is None else cpus)

    def workers(self) -> list[tuple[str, list[str]]]:
        """(instance name, argv) of every worker the repository asks for at start."""
        if self.s.init_error:  # (a server that failed to initialize reads no repository)
            return []
        return [
            self.worker(
                WorkerSpec(p.model, p.version, p.index, p.name, 0, list(p.cores), _gpu(p.gpu))
            )
            for p in self.worker_plans()
        ]

    def worker_base(self, model: str, version: int, instance: int | str) -> list[str]:
        """A worker's command line without its place: a worker started so finds its place
        itself, as ``shoal serve`` would give it (supervisord, whose one program runs every
        instance of a version, ``instance`` being its ``%(process_num)d``)."""
        argv = [
            self.python, "-m", "shoal.workers", *self.common(), *self.model_args(),
            "--model", model, "--version", str(version), "--instance", str(instance),
            "--default-max-batch-size", str(self.s.default_max_batch_size),
        ]  # fmt: skip
        if self.s.load_retries:
            argv += ["--model-load-retry-count", str(self.s.load_retries)]
        if self.s.rate_limit != "off":  # to plan its place without the refused models
            argv += rate_limit_flags(self.s.rate_limit, self.s.rate_limit_resources)
        return argv

    def worker(self, w: WorkerSpec) -> tuple[str, list[str]]:
        """(instance name, argv) of one worker: placed, and of its load (generation)."""
        argv = self.worker_base(w.model, w.version, w.instance)
        if w.model_repository:  # a load's own files (file:<version>/<path>)
            argv[argv.index("--model-repository") + 1] = w.model_repository
        argv += ["--instance-name", w.name]
        if w.generation:
            argv += ["--generation", str(w.generation)]
        if w.config_file:
            argv += ["--config-override", w.config_file]
        if w.gpu >= 0:
            argv += ["--gpu", str(w.gpu)]
        else:
            argv += ["--cores", ",".join(map(str, w.cores))]
            if self.s.cpu_lending:
                argv.append("--borrow-cores=true")
        return (f"{w.model}/{w.version} {w.name}", argv)


def _gpu(gpu: int | None) -> int:
    return -1 if gpu is None else gpu
