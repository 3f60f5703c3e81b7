"""The ``shoal`` command. ``shoal serve`` takes tritonserver's flag names, in both
``--flag value`` and ``--flag=value`` forms, so an operator keeps their command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from configs.model_control import check_flags
from ipc.lifecycle import raise_open_file_limit, run_until_stopped
from ipc.logs import setup_logging
from shoal.flags import (
    add_cache_flags,
    add_connection_flags,
    add_cpu_lending_flag,
    add_grpc_flags,
    add_instance_memory_flag,
    add_log_flags,
    add_metrics_flags,
    add_no_effect_flags,
    add_rate_limit_flags,
    add_restriction_flags,
    bool_flag,
    cache_bytes,
    connection_flag_values,
    frontend_flags,
    grpc_flag_values,
    log_settings,
    no_effect,
)

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
    # Repeatable in Triton (one server over several repositories); shoal serves one.
    p.add_argument("--model-repository", "--model-store", required=True, action="append", type=Path)
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
    add_metrics_flags(p)
    add_restriction_flags(p)
    add_grpc_flags(p)
    add_connection_flags(p)
    add_no_effect_flags(p)
    p.add_argument("--model-namespacing", type=bool_flag, default=False)
    p.add_argument("--id", default="triton", help="server name in /v2 metadata")
    add_log_flags(p)
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
    p.add_argument("--exit-timeout-secs", default=30.0, type=float)
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
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shoal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser(sub)
    args = parser.parse_args(argv)
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
    from shoal.launcher import Launcher, ServeSettings

    if len(args.model_repository) > 1:
        print(
            f"error: --model-repository given {len(args.model_repository)} times: shoal "
            "serves one model repository",
            file=sys.stderr,
        )
        return 2
    if args.model_namespacing:
        print("error: --model-namespacing=true is not supported", file=sys.stderr)
        return 2
    repo = args.model_repository[0]
    if not repo.is_dir():
        print(f"error: model repository '{repo}' is not a directory", file=sys.stderr)
        return 2
    refusal = check_flags(args.model_control_mode, args.load_model)
    if refusal is None and args.model_control_mode == "poll" and args.repository_poll_secs <= 0:
        refusal = "--repository-poll-secs must be more than 0 in poll mode"
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    try:
        frontend_flags(args)  # each frontend reads them again; refused here at once
        response_cache_bytes = cache_bytes(args.cache_config, args.response_cache_byte_size)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    autocomplete = not args.disable_auto_complete_config and not args.strict_model_config
    backend_cfg = _backend_config(args.backend_config)
    settings = ServeSettings(
        model_repository=repo.resolve(),
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
        exit_timeout_secs=args.exit_timeout_secs,
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
    return run_until_stopped(Launcher(settings))


if __name__ == "__main__":
    sys.exit(main())
