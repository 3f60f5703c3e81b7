"""``python -m shoal.broker --model-repository R --runtime-dir D``: the batching and routing hub."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from shoal.configs.flags.broker import (
    add_cpu_lending_flag,
    add_frontend_silence_flag,
    add_instance_memory_flag,
    add_rate_limit_flags,
)
from shoal.configs.flags.common import add_log_flags, bool_flag, log_settings
from shoal.configs.flags.trace import add_trace_flags, trace_settings
from shoal.configs.model_control import MODES
from shoal.ipc.lifecycle import (
    add_process_flags,
    die_with_parent,
    run_until_stopped,
    set_cpu_scheduling,
)
from shoal.ipc.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shoal.broker")
    p.add_argument("--model-repository", "--model-store", required=True, type=Path)
    p.add_argument("--exit-on-error", type=bool_flag, default=True)
    p.add_argument("--strict-readiness", type=bool_flag, default=True)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--model-config-name", default="")
    p.add_argument(
        "--model-execution-timeout-secs",
        default=300.0,
        type=float,
        help="kill (and so restart) an instance whose batch runs longer; 0: never",
    )
    p.add_argument("--model-control-mode", default="none", choices=MODES)
    p.add_argument("--load-model", action="append", default=[])
    p.add_argument("--repository-poll-secs", default=15.0, type=float)
    # the repositories a view (--model-repository) is made of: the broker keeps it in step
    p.add_argument("--repository-location", action="append", default=[])
    p.add_argument("--model-namespacing", type=bool_flag, default=False)
    # shoal serve's: why the server failed to initialize (it then serves no models)
    p.add_argument("--init-error", default="")
    add_instance_memory_flag(p)
    add_frontend_silence_flag(p)
    add_cpu_lending_flag(p)
    add_rate_limit_flags(p)
    add_process_flags(p)
    add_log_flags(p)
    add_trace_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGKILL, as workers: the launcher is gone (its own stop signals the broker itself),
    # so there is nothing to drain; and only SIGKILL reaches a broker that is stopped
    # (SIGSTOP, a debugger), which would otherwise outlive the server holding its clients'
    # region descriptors. What it leaves, the next start sweeps.
    die_with_parent(args.parent_pid, signal.SIGKILL)
    setup_logging("broker", log_settings(args))
    set_cpu_scheduling()
    from shoal.broker.proc import BrokerProc
    from shoal.broker.scheduler_hold import HoldCounts
    from shoal.broker.startup import BrokerSettings
    from shoal.ipc.sockets import ensure_runtime_dir

    proc = BrokerProc(
        BrokerSettings(
            model_repository=args.model_repository,
            runtime_dir=ensure_runtime_dir(str(args.runtime_dir)),
            exit_on_error=args.exit_on_error,
            autocomplete=not args.disable_auto_complete_config,
            model_config_name=args.model_config_name,
            strict_readiness=args.strict_readiness,
            execution_timeout_s=args.model_execution_timeout_secs,
            instance_memory_limit_mb=args.instance_memory_limit_mb,
            rate_limit=args.rate_limit,
            rate_limit_resources=args.rate_limit_resource,
            model_control_mode=args.model_control_mode,
            load_models=args.load_model,
            repository_poll_secs=args.repository_poll_secs,
            repository_locations=args.repository_location,
            model_namespacing=args.model_namespacing,
            init_error=args.init_error,
            expect_launcher=args.parent_pid is not None,
            cpu_lending=args.cpu_lending,
            frontend_silence_s=args.frontend_silence_timeout_secs,
            scheduler_hold=HoldCounts.from_env(os.environ),
            trace=trace_settings(args),
        )
    )
    return run_until_stopped(proc)


if __name__ == "__main__":
    sys.exit(main())
