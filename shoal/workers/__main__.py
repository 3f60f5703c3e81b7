"""``python -m shoal.workers --model-repository R --model M --version V --instance I
--runtime-dir D``

Runs one model instance. Started by ``shoal serve`` or by supervisord (one program per
instance); it finds the broker through the runtime directory. Without ``--cores`` and
``--gpu`` (supervisord) it takes the place ``shoal serve`` would give it: it plans the
repository as the launcher does (shoal.configs.placement) and finds its own instance there, so
a KIND_GPU instance runs on its GPU and a CPU instance on its own cores.

``SHOAL_TEST_FAULT=<action>:<model>`` injects a fault into the instances of one model
(``<model>#<n>``: into its instance n alone), for the fault tests (as Triton's QA uses
``TRITONSERVER_DELAY_SCHEDULER``). The actions: ``die-after-report``: report the first
batch done without sending its answers, then die by SIGKILL; ``leak``: each batch holds
on to 256 MiB more; ``leak-in-batch``: the same, then the batch takes 20 s.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from shoal.configs.flags.broker import add_rate_limit_flags
from shoal.configs.flags.common import add_log_flags, bool_flag, log_settings
from shoal.ipc.lifecycle import (
    add_process_flags,
    die_with_parent,
    run_until_stopped,
    set_cpu_scheduling,
)
from shoal.ipc.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shoal.workers")
    p.add_argument("--model-repository", required=True, type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--version", required=True, type=int)
    p.add_argument("--instance", default=0, type=int)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--model-config-name", default="")
    p.add_argument("--default-max-batch-size", default=4, type=int)
    p.add_argument(
        "--model-load-retry-count", default=0, type=int, help="more tries of a failed load"
    )
    p.add_argument("--cores", default=None, help="comma-separated CPU cores to pin to")
    p.add_argument("--gpu", default=None, type=int, help="the one GPU this instance sees")
    p.add_argument(
        "--borrow-cores",
        default=False,
        type=bool_flag,
        help="size the intra-op pool for the cores idle instances may lend (the broker's "
        "--cpu-lending) as well as its own",
    )
    p.add_argument("--instance-name", default="")
    p.add_argument("--generation", default=0, type=int, help="the load it belongs to")
    p.add_argument(
        "--config-override", default="", help="a JSON ModelConfig file replacing config.pbtxt"
    )
    # only to plan its place as the launcher does: without the models the rate limiter
    # refuses (supervisord)
    add_rate_limit_flags(p)
    add_process_flags(p)
    add_log_flags(p)
    return p.parse_args(argv)


def _fault(model: str, instance: int) -> str:
    action, _, target = os.environ.get("SHOAL_TEST_FAULT", "").partition(":")
    return action if target in (model, f"{model}#{instance}") else ""


def _place(args: argparse.Namespace) -> None:
    """Set ``args.cores``, ``args.gpu`` and the instance name as ``shoal serve`` places
    this instance; unchanged (not pinned, on the CPU) for an instance the repository
    does not plan, whose load then fails with the reason."""
    from shoal.configs import rate_limits, repository
    from shoal.configs.devices import gpu_count
    from shoal.configs.placement import find_plan, plan_repository

    level = repository.log.level
    repository.log.setLevel(logging.CRITICAL)  # other models' warnings: the broker's to log
    try:
        entries = repository.scan(
            args.model_repository,
            model_config_name=args.model_config_name,
            autocomplete_enabled=not args.disable_auto_complete_config,
            gpu_count=gpu_count(),
        )
    except OSError:
        return
    finally:
        repository.log.setLevel(level)
    # the models the broker refuses get no cores (as the launcher plans)
    entries = rate_limits.without_refused(entries, args.rate_limit, args.rate_limit_resource)
    plans = plan_repository(entries, sorted(os.sched_getaffinity(0)))
    plan = find_plan(plans, args.model, args.version, args.instance)
    if plan is None:
        return
    args.gpu = plan.gpu
    args.cores = ",".join(map(str, plan.cores))
    args.instance_name = args.instance_name or plan.name


def _mentions_env(args: argparse.Namespace) -> bool:
    """Whether the model's config files (or its override) name EXECUTION_ENV_PATH at all,
    read as bytes: for every other model, nothing is imported before the pinning below
    (numpy's import starts OpenBLAS's threads, which would keep the default scheduling
    and every core)."""
    folder = Path(args.model_repository) / args.model
    files = [*folder.glob("*.pbtxt"), *folder.glob("configs/*.pbtxt")]
    if args.config_override:
        files.append(Path(args.config_override))
    for f in files:
        with contextlib.suppress(OSError):
            if b"EXECUTION_ENV_PATH" in f.read_bytes():
                return True
    return False


def _execution_env(args: argparse.Namespace, argv: list[str]) -> str:
    """A Python model's EXECUTION_ENV_PATH (shoal/workers/python_env.py): this worker is
    exec'd in that environment's interpreter, or the reason it cannot be, for its load
    to fail with ("" when the model asks for none, or this is the environment's)."""
    if not _mentions_env(args):
        return ""
    from shoal.workers import python_env as pe

    override = Path(args.config_override) if args.config_override else None
    value = pe.requested(args.model_repository / args.model, override, args.model_config_name)
    if not value or pe.inside() == value:
        return ""
    try:
        env = pe.prepare(value, pe.cache_root())
        python = pe.interpreter(env, value)
    except pe.EnvError as exc:
        return str(exc)
    logging.getLogger("shoal.worker").info("model '%s' runs in %s (%s)", args.model, env, value)
    pe.enter(value, env, python, argv)
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGKILL, not SIGTERM: a worker stuck in a model's native code never runs a Python
    # handler, and would outlive its parent (and the broker whose execution timeout would
    # have killed it). The one shared-memory pool it may own (a Python model's scripted
    # requests, shoal/workers/bls.py) is removed by the broker, or by the next start's sweep.
    die_with_parent(args.parent_pid, signal.SIGKILL)
    setup_logging(f"worker:{args.model}/{args.version}#{args.instance}", log_settings(args))
    env_error = _execution_env(args, sys.argv[1:] if argv is None else argv)
    set_cpu_scheduling()
    if args.cores is None and args.gpu is None:
        _place(args)
    # (before pinning) A GPU instance borrows no cores: supervisord's one program for
    # every instance of a version passes --borrow-cores to its GPU instances too.
    borrows = args.borrow_cores and args.gpu is None
    may_use = len(os.sched_getaffinity(0)) if borrows else 0
    cores = [int(c) for c in (args.cores or "").split(",") if c.strip()]
    if cores:
        os.sched_setaffinity(0, cores)
    # torch's CPU threads are OpenMP's: idle ones must sleep, not spin, on cores the
    # frontend, the broker and other instances share (ONNX Runtime is told so itself).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    gpus = None
    if args.gpu is not None:
        from shoal.configs.devices import gpu_count, narrow_to

        # Before any CUDA import: the instance sees its GPU alone, as device 0. The config
        # is still checked against the server's GPUs (counted before the narrowing).
        gpus = gpu_count()
        narrow_to(args.gpu)
    from shoal.workers.loading import WorkerSettings
    from shoal.workers.proc import WorkerProc

    proc = WorkerProc(
        WorkerSettings(
            model_repository=args.model_repository,
            model=args.model,
            version=args.version,
            instance=args.instance,
            runtime_dir=args.runtime_dir,
            autocomplete=not args.disable_auto_complete_config,
            model_config_name=args.model_config_name,
            default_max_batch_size=args.default_max_batch_size,
            load_retries=args.model_load_retry_count,
            cores=cores,
            gpu=args.gpu,
            gpu_count=gpus,
            instance_name=args.instance_name or f"{args.model}_{args.instance}",
            generation=args.generation,
            config_override=Path(args.config_override) if args.config_override else None,
            fault=_fault(args.model, args.instance),
            may_use=may_use,
            env_error=env_error,
        )
    )
    return run_until_stopped(proc)


if __name__ == "__main__":
    sys.exit(main())
