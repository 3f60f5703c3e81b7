"""The ``shoal`` command. ``shoal serve`` takes tritonserver's flag names, in both
``--flag value`` and ``--flag=value`` forms, so an operator keeps their command line."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.analyze import flags as analyze_flags
from shoal.configs.devices import gpu_count
from shoal.configs.flags.broker import (
    add_cpu_lending_flag,
    add_frontend_silence_flag,
    add_instance_memory_flag,
    add_rate_limit_flags,
)
from shoal.configs.flags.common import add_log_flags, bool_flag, log_settings
from shoal.configs.flags.frontend import (
    add_cache_flags,
    add_connection_flags,
    add_grpc_flags,
    add_metrics_flags,
    add_restriction_flags,
    cache_bytes,
    connection_flag_values,
    frontend_flags,
    grpc_flag_values,
)
from shoal.configs.flags.trace import add_trace_flags, trace_flags, trace_settings
from shoal.configs.model_control import check_flags
from shoal.configs.object_store import is_remote
from shoal.ipc.lifecycle import raise_open_file_limit, run_until_stopped
from shoal.ipc.logs import setup_logging
from shoal.no_effect_flags import add_no_effect_flags, check_values, no_effect
from shoal.repository_cache import cache_dir, needs_view

if TYPE_CHECKING:
    from shoal.launcher import ServeSettings

log = logging.getLogger("shoal.serve")


def _deprecated_flags(args: argparse.Namespace) -> None:
    """Triton's warnings (command_line_parser.cc) for --strict-model-config."""
    if args.strict_model_config is None:
        return
    log.warning(
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead."
    )
    if args.disable_auto_complete_config and not args.strict_model_config:
        log.warning(
            "Warning: Overriding deprecated '--strict-model-config' from False to True in "
            "favor of '--disable-auto-complete-config'!"
        )


def _backend_config(values: list[str]) -> dict[str, str]:
    """``--backend-config=[backend,]key=value``; only global keys are used today."""
    out: dict[str, str] = {}
    for v in values:
        setting = v.split(",", 1)[-1] if "," in v else v
        key, _, val = setting.partition("=")
        out[key.strip()] = val.strip()
    return out


def serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve a Triton model repository")
    add_serve_flags(p)
    return p


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """``shoal serve``'s flags (tritonserver's names), also taken by supervisord-conf."""
    _add_endpoint_flags(p)
    add_metrics_flags(p)
    add_restriction_flags(p)
    add_grpc_flags(p)
    add_connection_flags(p)
    add_no_effect_flags(p)
    add_trace_flags(p)
    p.add_argument("--model-namespacing", type=bool_flag, default=False)
    p.add_argument("--id", default="triton", help="server name in /v2 metadata")
    add_log_flags(p)
    _add_model_control_flags(p)
    _add_process_flags(p)


def _add_endpoint_flags(p: argparse.ArgumentParser) -> None:
    """The repositories served, and where and how clients reach the server."""
    # Repeatable (one server over several repositories); a folder or object storage
    # (s3://, gs://, az://): shoal/configs/repository_view.py
    p.add_argument("--model-repository", "--model-store", required=True, action="append")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", default=8000, type=int)
    p.add_argument("--allow-http", type=bool_flag, default=True)
    p.add_argument("--reuse-http-port", type=bool_flag, default=False)
    p.add_argument("--allow-grpc", type=bool_flag, default=True)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", default=8001, type=int)
    p.add_argument("--reuse-grpc-port", type=bool_flag, default=False)
    p.add_argument(
        "--allow-client-shm",
        type=bool_flag,
        default=False,
        help="allow clients to register system/CUDA shared memory (as Triton)",
    )


def _add_model_control_flags(p: argparse.ArgumentParser) -> None:
    """What loads when, from which config, and what a failure to load does."""
    p.add_argument("--exit-on-error", type=bool_flag, default=True)
    p.add_argument("--strict-readiness", type=bool_flag, default=True)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument(
        "--strict-model-config",
        type=bool_flag,
        default=None,
        help="deprecated alias of --disable-auto-complete-config",
    )
    p.add_argument("--model-config-name", default="")
    p.add_argument(
        "--model-control-mode",
        default="none",
        help="none (every model loads at start; load/unload are refused), explicit (the "
        "models --load-model names load at start; the API loads, reloads and unloads) or "
        "poll (every model loads at start; the repository is rescanned for changes)",
    )
    p.add_argument(
        "--repository-poll-secs",
        default=15.0,
        type=float,
        help="poll mode: how often the repository is rescanned for changes",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        help="explicit mode: a model to load at start (repeatable; '*': all of them)",
    )
    p.add_argument("--backend-config", action="append", default=[])
    p.add_argument(
        "--model-load-retry-count",
        default=0,
        type=int,
        help="how many times an instance whose model fails to load tries again (Triton's)",
    )


def _add_process_flags(p: argparse.ArgumentParser) -> None:
    """The processes' timeouts, sizes and counts, and the cores and memory they get."""
    p.add_argument("--exit-timeout-secs", default=30.0, type=float)
    p.add_argument(
        "--broker-silence-timeout-secs",
        default=30.0,
        type=float,
        help="shoal serve kills (and so restarts) a broker that has answered none of its "
        "pings for this long: stuck (0: never)",
    )
    add_frontend_silence_flag(p)
    p.add_argument("--http-max-input-size", default=64 * 1024 * 1024, type=int)
    p.add_argument("--frontend-processes", default=1, type=int)
    p.add_argument(
        "--model-execution-timeout-secs",
        default=300.0,
        type=float,
        help="kill and restart an instance whose batch runs longer (0: never)",
    )
    add_instance_memory_flag(p)
    add_cpu_lending_flag(p)
    add_rate_limit_flags(p)
    add_cache_flags(p)
    p.add_argument(
        "--runtime-dir",
        default="",
        help="private directory for the ipc sockets (default: a fresh temp dir)",
    )


def supervisord_conf_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = sub.add_parser(
        "supervisord-conf",
        help="print a supervisord configuration that runs the repository as shoal serve would",
        description="Prints (to stdout) a complete supervisord configuration: a program per "
        "role, a worker program per model version with numprocs its instance count, placed as "
        "shoal serve places them. Takes shoal serve's flags; --runtime-dir defaults to "
        "<supervisor-dir>/ipc.",
    )
    add_serve_flags(p)
    p.add_argument(
        "--deployed-model-repository",
        default="",
        help="the repository's path on the host that runs the configuration "
        "(default: --model-repository's, made absolute)",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter shoal is installed for there (default: this one)",
    )
    p.add_argument(
        "--supervisor-dir",
        default="/run/shoal",
        type=Path,
        help="supervisord's control socket and pid file (default: /run/shoal)",
    )
    p.add_argument(
        "--log-dir",
        default="/var/log/shoal",
        type=Path,
        help="every program's log file, and supervisord's (default: /var/log/shoal)",
    )
    p.add_argument("--user", default="", help="the user the programs run as (supervisord as root)")
    p.add_argument(
        "--plan-cpus",
        default=None,
        type=cpu_list,
        help="the usable cores of the host the workers are planned for, as 0-7 or 0,2,4 "
        "(default: this process's)",
    )
    p.add_argument(
        "--plan-gpus",
        default=None,
        type=int,
        help="that host's GPU count (default: this host's)",
    )
    return p


def cpu_list(value: str) -> tuple[int, ...]:
    """``0-3,6`` -> (0, 1, 2, 3, 6)"""
    cores: set[int] = set()
    try:
        for part in value.split(","):
            low, dash, high = part.strip().partition("-")
            cores.update(range(int(low), int(high if dash else low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected cores as 0-7 or 0,2,4, got '{value}'") from None
    if not cores or min(cores) < 0:
        raise argparse.ArgumentTypeError(f"expected cores as 0-7 or 0,2,4, got '{value}'")
    return tuple(sorted(cores))


def _dash_values(parsers: list[argparse.ArgumentParser], argv: list[str]) -> list[str]:
    """getopt's reading of ``--flag -value``: tritonserver takes the word after a flag
    that needs a value as its value, whatever it starts with (``--model-load-gpu-limit
    -1:0.6``), where argparse would read it as a flag: such pairs are joined with '='."""
    takes_value = {
        flag
        for p in parsers
        for action in p._actions
        if action.option_strings and action.nargs is None
        for flag in action.option_strings
    }
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word in takes_value:
            value = next(words, None)
            if value is not None and value.startswith("-") and value not in takes_value:
                out.append(f"{word}={value}")
                continue
            out.append(word)
            if value is not None:
                out.append(value)
            continue
        out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shoal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = [serve_parser(sub), supervisord_conf_parser(sub), analyze_flags.add_parser(sub)]
    argv = _dash_values(parsers, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "analyze":
        from shoal.analyze.main import run

        return run(args)
    if args.command == "supervisord-conf":
        return supervisord_conf(args, argv)
    if args.log_file:
        args.log_file = str(Path(args.log_file).resolve())  # the same file for every role
        try:
            open(args.log_file, "a").close()
        except OSError as exc:
            print(f"error: cannot write the log file: {exc}", file=sys.stderr)
            return 2
    setup_logging("shoal", log_settings(args))
    _deprecated_flags(args)
    raise_open_file_limit()  # its children inherit the raised limit
    from shoal.launcher import Launcher

    try:
        settings = serve_settings(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_until_stopped(Launcher(settings))


def supervisord_conf(args: argparse.Namespace, argv: list[str]) -> int:
    """Print the configuration (shoal.supervisord_conf) for ``args``."""
    import msgspec

    from shoal.role_argv import RoleArgv
    from shoal.supervisord_conf import HostShape, Layout, render

    setup_logging("shoal", msgspec.structs.replace(log_settings(args), file=""))
    if args.model_control_mode != "none":
        print(
            f"error: --model-control-mode={args.model_control_mode} needs shoal serve, whose "
            "launcher starts and stops the workers of the models loaded through the API: run "
            "shoal serve as one program (deploy/systemd) instead",
            file=sys.stderr,
        )
        return 2
    try:
        settings = serve_settings(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if settings.init_error:
        print(f"error: {settings.init_error}", file=sys.stderr)
        return 2
    if settings.repository_locations:
        print(
            "error: several model repositories and object storage need shoal serve, whose "
            "launcher fetches them into one view before the other roles start",
            file=sys.stderr,
        )
        return 2
    read_from = settings.model_repository
    settings.model_repository = Path(args.deployed_model_repository or read_from)
    settings.runtime_dir = args.runtime_dir or str(args.supervisor_dir / "ipc")
    if args.log_file:  # as shoal serve's: one file every role appends to
        settings.log.file = str(Path(args.log_file).absolute())
    host = HostShape(
        args.plan_cpus or tuple(sorted(os.sched_getaffinity(0))),
        gpu_count() if args.plan_gpus is None else args.plan_gpus,
    )
    roles = RoleArgv(settings, Path(settings.runtime_dir), None, args.python)
    plans = roles.worker_plans(read_from, list(host.cpus), host.gpus)
    layout = Layout(args.python, args.supervisor_dir, args.log_dir, args.user)
    generated_by = shlex.join(["shoal", *argv])
    without = _without_workers(settings, read_from, host.gpus, {p.model for p in plans})
    sys.stdout.write(render(settings, plans, layout, host, generated_by, without))
    return 0


def _without_workers(
    s: ServeSettings, repo: Path, gpus: int, planned: set[str]
) -> list[tuple[str, str]]:
    """(model, why) of the repository's models that get no worker."""
    from shoal.configs import repository

    out = []
    entries = repository.scan(
        repo,
        model_config_name=s.model_config_name,
        autocomplete_enabled=s.autocomplete,
        gpu_count=gpus,
    )
    for e in entries:
        if e.name in planned:
            continue
        if e.error:
            why = f"it cannot load: {e.error}"
        elif (spec := e.spec) is not None and spec.is_ensemble:
            why = "an ensemble: its steps' workers run it"
        elif not e.versions:
            why = "no version to serve"
        else:
            why = "the rate limiter refuses it"
        out.append((e.name, why))
    return out


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """``shoal serve``'s settings from its flags, or ValueError saying what is refused.
    Flags that have no effect are named in warnings."""
    from shoal.launcher import ServeSettings

    locations, init_error = _repository_locations(args)
    view = needs_view(locations) and not init_error
    repo = cache_dir() if view else Path(locations[0])
    response_cache_bytes = _checked(args)
    autocomplete = not args.disable_auto_complete_config and not args.strict_model_config
    backend_cfg = _backend_config(args.backend_config)
    return ServeSettings(
        model_repository=repo,
        init_error=init_error,
        repository_locations=locations if view else [],
        model_namespacing=args.model_namespacing,
        http_address=args.http_address,
        http_port=args.http_port,
        allow_http=args.allow_http,
        grpc_port=args.grpc_port,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        reuse_grpc_port=args.reuse_grpc_port,
        allow_client_shm=args.allow_client_shm,
        response_cache_bytes=response_cache_bytes,
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        metrics_interval_ms=args.metrics_interval_ms,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_config=args.metrics_config,
        trace_flags=trace_flags(args),
        http_restricted_api=args.http_restricted_api,
        grpc_restricted_protocol=args.grpc_restricted_protocol,
        grpc_flags=grpc_flag_values(args),
        connection_flags=connection_flag_values(args),
        server_id=args.id,
        log=log_settings(args),
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        autocomplete=autocomplete,
        model_config_name=args.model_config_name,
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        repository_poll_secs=args.repository_poll_secs,
        default_max_batch_size=int(backend_cfg.get("default-max-batch-size", 4)),
        load_retries=max(args.model_load_retry_count, 0),
        exit_timeout_secs=args.exit_timeout_secs,
        broker_silence_secs=args.broker_silence_timeout_secs,
        frontend_silence_secs=args.frontend_silence_timeout_secs,
        http_max_input_size=args.http_max_input_size,
        frontend_processes=max(args.frontend_processes, 1),
        execution_timeout_secs=args.model_execution_timeout_secs,
        instance_memory_limit_mb=args.instance_memory_limit_mb,
        cpu_lending=args.cpu_lending,
        rate_limit=args.rate_limit,
        rate_limit_resources=args.rate_limit_resource,
        reuse_http_port=args.reuse_http_port,
        runtime_dir=args.runtime_dir,
    )


def _repository_locations(args: argparse.Namespace) -> tuple[list[str], str]:
    """The repositories to serve, each once (local ones resolved), and the reason the
    server fails to initialize, if one is not a directory and --exit-on-error is off
    (ValueError when it is on)."""
    locations: list[str] = []
    init_error = ""
    for location in args.model_repository:
        if is_remote(location):
            locations.append(location)
        elif not Path(location).is_dir():
            message = f"model repository '{location}' is not a directory"
            if args.exit_on_error:
                raise ValueError(message)
            # Triton's failed-to-initialize server: it runs, neither live nor ready
            log.error("failed to initialize: %s (--exit-on-error=false: no models)", message)
            init_error = init_error or message
            locations.append(location)
        else:
            locations.append(str(Path(location).resolve()))
    locations = list(dict.fromkeys(locations))  # one repository named twice is one (Triton's set)
    return locations, init_error


def _checked(args: argparse.Namespace) -> int:
    """Refuses (ValueError) flags Triton refuses, warns of those that have no effect or
    are deprecated; returns the response cache's size in bytes."""
    refusal = check_flags(args.model_control_mode, args.load_model) or check_values(args)
    if refusal is None and args.model_control_mode == "poll" and args.repository_poll_secs <= 0:
        refusal = "--repository-poll-secs must be more than 0 in poll mode"
    if refusal is not None:
        raise ValueError(refusal)
    trace_settings(args)  # the broker reads them again; refused here at once
    frontend_flags(args)  # each frontend reads them again; refused here at once
    response_cache_bytes = cache_bytes(args.cache_config, args.response_cache_byte_size)
    if args.response_cache_byte_size is not None:
        log.warning(
            "--response-cache-byte-size is deprecated (as in Triton): it means "
            "--cache-config=local,size=%s",
            args.response_cache_byte_size,
        )
    for line in no_effect(args):
        log.warning("%s", line)
    if args.rate_limit_resource and args.rate_limit == "off":
        log.warning("--rate-limit-resource has no effect: --rate-limit is off")
    return response_cache_bytes


if __name__ == "__main__":
    sys.exit(main())
