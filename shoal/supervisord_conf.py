"""``shoal supervisord-conf``: a complete supervisord configuration that runs a model
repository as ``shoal serve`` would, each role its own program.

The programs are the processes ``shoal serve`` starts, with the same command lines
(shoal.role_argv): the broker, the frontends (one program, ``numprocs`` of them), and one
worker program per model version, ``numprocs`` its instance count. A worker is started
without ``--cores``/``--gpu`` and places itself at start as ``shoal serve`` places it
(shoal/workers/__main__.py): one program covers every instance of a version, so the place of
each comes from its ``%(process_num)d``. The plan written in the comments is the one for
the host described by ``HostShape``.

Order: the broker starts first and stops last (priorities); supervisord stops one
program at a time, highest priority first, and waits for it, so the frontends stop
accepting and drain (``--exit-timeout-secs``, inside ``stopwaitsecs``) while the broker
and the workers still answer. Pure: text from settings and plans.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.configs.placement import InstancePlan
from shoal.ipc.lifecycle import EXIT_FATAL, EXIT_RETIRED
from shoal.role_argv import RoleArgv

if TYPE_CHECKING:
    from shoal.launcher import ServeSettings

#: supervisord replaces it with each process's number (0 .. numprocs-1)
PROCESS_NUM = "%(process_num)d"
#: the broker and the workers get as long as ``shoal serve`` gives them to stop
ROLE_STOP_SECS = 10
#: beyond --exit-timeout-secs, for a frontend to close its sockets after draining
FRONTEND_STOP_MARGIN_SECS = 5
PRIORITY = {"broker": 10, "worker": 20, "frontend": 30}


@dataclass(frozen=True)
class HostShape:
    """The host the workers are planned for: its usable cores and its GPU count."""

    cpus: tuple[int, ...]
    gpus: int


@dataclass(frozen=True)
class Layout:
    """Where the configuration's files are on the host that runs it.

    ``supervisor_dir``: supervisord's control socket and pid file; ``log_dir``: each
    process's log and supervisord's own; ``user``: the programs' user (supervisord
    started as root), "" for supervisord's."""

    python: str
    supervisor_dir: Path
    log_dir: Path
    user: str = ""


def program_name(model: str, version: int, taken: set[str]) -> str:
    """A supervisord program name for a model version's workers: characters supervisord
    or a shell would read otherwise become ``_``, and a clash gets a number."""
    base = f"shoal-worker-{re.sub(r'[^A-Za-z0-9._-]', '_', model)}-v{version}"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def command(argv: Iterable[str]) -> str:
    """``argv`` as supervisord's ``command=``: shell-quoted (supervisord splits it as a
    shell would), ``%`` doubled (its own expansions) but in ``%(process_num)d``."""
    return " ".join(
        arg if arg == PROCESS_NUM else shlex.quote(arg).replace("%", "%%") for arg in argv
    )


def _value(text: str) -> str:
    return text.replace("%", "%%")


def _place(plan: InstancePlan) -> str:
    if plan.gpu is not None:
        return f"GPU {plan.gpu}"
    return f"cores {_ranges(plan.cores)}"


def _ranges(cores: Iterable[int]) -> str:
    """0,1,2,3,6 -> 0-3,6"""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cores):
        if run and c != run[-1] + 1:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        run.append(c)
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out) or "none"


def _program(
    name: str,
    argv: list[str],
    layout: Layout,
    role: str,
    stop_secs: int,
    exitcodes: tuple[int, ...],
    numprocs: int | None,
) -> list[str]:
    lines = [f"[program:{name}]", f"command={command(argv)}"]
    log_name = "%(program_name)s.log"
    if numprocs is not None:
        lines += ["process_name=%(program_name)s_%(process_num)d", f"numprocs={numprocs}"]
        log_name = "%(program_name)s_%(process_num)d.log"
    if layout.user:
        lines.append(f"user={_value(layout.user)}")
    lines += [
        f"priority={PRIORITY[role]}",
        "autostart=true",
        # an exit code in exitcodes is a role that cannot run with its settings (or a
        # retired worker): restarting it cannot help; any other end is restarted
        "autorestart=unexpected",
        f"exitcodes={','.join(map(str, exitcodes))}",
        # judged by its exit code alone, however soon it ends: a model that fails its
        # load fast is not tried again and again
        "startsecs=0",
        "stopsignal=TERM",
        f"stopwaitsecs={stop_secs}",
        "stopasgroup=true",
        "killasgroup=true",
        "redirect_stderr=true",
        f"stdout_logfile={_value(str(layout.log_dir))}/{log_name}",
        "stdout_logfile_maxbytes=50MB",
        "stdout_logfile_backups=5",
        "",
    ]
    return lines


def _supervisord_sections(layout: Layout) -> list[str]:
    sock = _value(str(layout.supervisor_dir / "supervisor.sock"))
    return [
        "[supervisord]",
        "nodaemon=true",
        f"logfile={_value(str(layout.log_dir / 'supervisord.log'))}",
        f"pidfile={_value(str(layout.supervisor_dir / 'supervisord.pid'))}",
        "",
        "[unix_http_server]",
        f"file={sock}",
        "chmod=0700",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{sock}",
        "",
    ]


def render(
    s: ServeSettings,
    plans: list[InstancePlan],
    layout: Layout,
    host: HostShape,
    generated_by: str,
    without_workers: Iterable[tuple[str, str]] = (),
) -> str:
    """The configuration, for settings ``s`` (its ``model_repository`` and
    ``runtime_dir`` as the programs see them) and the repository's worker ``plans``;
    ``without_workers``: (model, why) of the repository's models that get none."""
    roles = RoleArgv(s, Path(s.runtime_dir), None, layout.python)
    gpus = f"{host.gpus} GPU(s)" if host.gpus else "no GPU"
    lines = [
        "; shoal under supervisord: each role its own program, the processes `shoal serve`",
        "; would start. Generated (do not edit: generate it again) by",
        f";   {generated_by}",
        f"; Workers planned for a host with {len(host.cpus)} usable core(s)"
        f" ({_ranges(host.cpus)}) and {gpus}.",
        "; Start: supervisord -c <this file>. Stop: supervisorctl -c <this file> shutdown.",
        "",
        *_supervisord_sections(layout),
        "; The broker starts first and stops last.",
        *_program(
            "shoal-broker", roles.broker(), layout, "broker", ROLE_STOP_SECS, (EXIT_FATAL,), None
        ),
    ]
    taken: set[str] = {"shoal-broker", "shoal-frontend"}
    versions: dict[tuple[str, int], list[InstancePlan]] = {}
    for p in plans:
        versions.setdefault((p.model, p.version), []).append(p)
    for (model, version), instances in versions.items():
        name = program_name(model, version, taken)
        lines.append(f"; {model} version {version}: {len(instances)} instance(s); each worker")
        lines.append("; places itself at start as `shoal serve` would:")
        for p in sorted(instances, key=lambda p: p.index):
            lines.append(f";   {name}_{p.index}: {p.name} on {_place(p)}")
        argv = roles.worker_base(model, version, PROCESS_NUM)
        if s.cpu_lending:
            argv.append("--borrow-cores=true")  # (a GPU instance ignores it)
        lines += _program(
            name,
            argv,
            layout,
            "worker",
            ROLE_STOP_SECS,
            (EXIT_FATAL, EXIT_RETIRED),
            len(instances),
        )
    for model, why in without_workers:
        lines.append(f"; {model}: no worker program ({why.splitlines()[0] if why else '?'})")
    if without_workers:
        lines.append("")
    stop = math.ceil(s.exit_timeout_secs) + FRONTEND_STOP_MARGIN_SECS
    lines.append(
        f"; Frontends stop first: they drain in-flight requests for up to {s.exit_timeout_secs:g} s"
    )
    lines.append("; (--exit-timeout-secs) while the broker and the workers still run.")
    lines += _program(
        "shoal-frontend",
        roles.frontend(PROCESS_NUM),
        layout,
        "frontend",
        stop,
        (EXIT_FATAL,),
        max(s.frontend_processes, 1),
    )
    return "\n".join(lines).rstrip("\n") + "\n"
