"""``python -m shoal.frontend --runtime-dir D --http-port 8000``: one frontend process."""

from __future__ import annotations

import argparse
import sys

from shoal.configs.flags.common import add_log_flags, bool_flag, log_settings
from shoal.configs.flags.frontend import (
    add_connection_flags,
    add_grpc_flags,
    add_metrics_flags,
    add_restriction_flags,
    frontend_flags,
)
from shoal.ipc.lifecycle import (
    add_process_flags,
    die_with_parent,
    raise_open_file_limit,
    set_cpu_scheduling,
)
from shoal.ipc.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shoal.frontend")
    p.add_argument("--index", default=0, type=int)
    p.add_argument("--allow-http", type=bool_flag, default=True)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", default=8000, type=int)
    p.add_argument("--reuse-http-port", type=bool_flag, default=False)
    p.add_argument("--allow-grpc", type=bool_flag, default=True)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", default=8001, type=int)
    p.add_argument("--reuse-grpc-port", type=bool_flag, default=False)
    p.add_argument("--allow-client-shm", type=bool_flag, default=False)
    p.add_argument(
        "--response-cache-bytes",
        type=int,
        default=0,
        help="this frontend's response cache (its share of --cache-config's size); 0: none",
    )
    p.add_argument("--http-max-input-size", default=64 * 1024 * 1024, type=int)
    p.add_argument("--id", default="triton")
    p.add_argument("--shm-pool-byte-size", default=64 * 1024 * 1024, type=int)
    p.add_argument("--exit-timeout-secs", default=30.0, type=float)
    add_metrics_flags(p)
    add_restriction_flags(p)
    add_grpc_flags(p)
    add_connection_flags(p)
    p.add_argument("--reuse-metrics-port", type=bool_flag, default=False)
    add_process_flags(p)
    add_log_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        flags = frontend_flags(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    die_with_parent(args.parent_pid)
    setup_logging(f"frontend#{args.index}", log_settings(args))
    set_cpu_scheduling()
    open_files = raise_open_file_limit()
    import uvloop

    from shoal.frontend.http_body import BodyDeadline
    from shoal.frontend.metrics import MetricsSettings
    from shoal.frontend.proc import Connections, FrontendSettings, serve

    settings = FrontendSettings(
        runtime_dir=args.runtime_dir,
        index=args.index,
        http_address=args.http_address,
        http_port=args.http_port,
        allow_http=args.allow_http,
        server_id=args.id,
        http_max_input_size=args.http_max_input_size,
        shm_pool_bytes=args.shm_pool_byte_size,
        exit_timeout_secs=args.exit_timeout_secs,
        reuse_http_port=args.reuse_http_port,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        reuse_grpc_port=args.reuse_grpc_port,
        allow_client_shm=args.allow_client_shm,
        response_cache_bytes=args.response_cache_bytes,
        allow_metrics=args.allow_metrics,
        metrics=MetricsSettings(
            address=args.metrics_address or args.http_address,
            port=args.metrics_port,
            reuse_port=args.reuse_metrics_port,
            interval_ms=args.metrics_interval_ms,
            cpu=args.allow_cpu_metrics,
            gpu=args.allow_gpu_metrics,
            config=flags.metrics,
            frontend=str(args.index),
        ),
        http_restricted=flags.http_restricted,
        grpc_restricted=flags.grpc_restricted,
        grpc_options=flags.grpc_options,
        grpc_tls=flags.grpc_tls,
        connections=Connections(
            open_files=open_files,
            http_max=args.http_max_connections or None,
            grpc_max=args.grpc_max_connections or None,
            header_timeout_s=args.http_header_timeout_secs,
            keepalive_timeout_s=args.http_keepalive_timeout_secs,
            body=BodyDeadline(args.http_body_timeout_secs, args.http_body_min_rate),
            openai_port=args.openai_port or None,
        ),
    )
    return uvloop.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
