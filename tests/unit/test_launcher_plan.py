"""The launcher's plan of workers: which instances get a process, and their cores."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.launcher import Launcher, ServeSettings
from tests.repos import write_identity


def _needs(count: int) -> str:
    return (
        "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ "
        f'{{ name: "R" count: {count} }} ] }} }} ]'
    )


def test_a_model_the_rate_limiter_refuses_gets_no_worker_and_no_cores(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_identity(repo, "big", _needs(2))
    write_identity(repo, "small", _needs(1))
    limited = ServeSettings(
        model_repository=repo,
        runtime_dir=str(tmp_path / "run"),
        rate_limit="execution_count",
        rate_limit_resources=["R:1"],
    )
    plans = Launcher(limited).worker_argvs()
    assert [name for name, _ in plans] == ["small/1 small_0_0"]
    (_, argv) = plans[0]
    every_core = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert argv[argv.index("--cores") + 1] == every_core
    unlimited = ServeSettings(model_repository=repo, runtime_dir=str(tmp_path / "run2"))
    assert len(Launcher(unlimited).worker_argvs()) == 2


def test_a_worker_that_places_itself_leaves_out_the_refused_models_too(tmp_path: Path) -> None:
    """Under supervisord a worker plans its own place: with the rate limiter's flags it
    leaves out the models the broker refuses, as the launcher does."""
    from shoal.workers.__main__ import _place, parse_args

    repo = tmp_path / "repo"
    repo.mkdir()
    write_identity(repo, "big", _needs(2))
    write_identity(repo, "small", _needs(1))
    args = parse_args(
        [
            f"--model-repository={repo}",
            f"--runtime-dir={tmp_path / 'run'}",
            "--model=small",
            "--version=1",
            "--rate-limit=execution_count",
            "--rate-limit-resource=R:1",
        ]
    )
    _place(args)
    assert args.cores == ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert args.instance_name == "small_0_0"
