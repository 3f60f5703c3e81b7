"""``shoal supervisord-conf``: the configuration it prints, read back by supervisor's own
parser, and the committed ``supervisord.conf`` that is its output for the shipped
repository."""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import signal
from pathlib import Path

import pytest
from supervisor.options import ServerOptions

from shoal.cli import main
from tests.repos import SIMPLE_ENSEMBLE, write_identity
from tools import modelgen

ROOT = Path(__file__).resolve().parents[2]
#: The committed supervisord.conf is this command's output (run where model_repository/
#: is the shipped one): `shoal supervisord-conf <COMMITTED> > supervisord.conf`.
COMMITTED = [
    "supervisord-conf",
    "--model-repository=model_repository",
    "--deployed-model-repository=/srv/models",
    "--python=/opt/shoal/.venv/bin/python",
    "--plan-cpus=0-7",
    "--plan-gpus=0",
]


def _generate(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _parsed(tmp_path: Path, text: str) -> dict[str, object]:
    """supervisor's own reading of ``text``: program name -> its ProcessGroupConfig."""
    path = tmp_path / "supervisord.conf"
    path.write_text(text)
    options = ServerOptions()
    options.realize(args=["-c", str(path)])
    return {group.name: group for group in options.process_group_configs}


def _layout(tmp_path: Path) -> list[str]:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return [
        f"--supervisor-dir={tmp_path}",
        f"--log-dir={tmp_path / 'logs'}",
        "--plan-cpus=0-3",
    ]


def test_the_committed_supervisord_conf_is_the_generators_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shipped repository as a clean clone has it once set up (mlp_large's weights are
    # generated, not committed): the model files do not change the configuration.
    repo = tmp_path / "model_repository"
    shutil.copytree(ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("*.onnx"))
    for name in modelgen.SHIPPED_MODELS:
        (repo / name / "1").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path)
    code, text, err = _generate(COMMITTED)
    assert code == 0, err
    committed = (ROOT / "supervisord.conf").read_text()
    assert committed == text, (
        "supervisord.conf is not the generator's output: run "
        f"`.venv/bin/shoal {shlex.join(COMMITTED)} > supervisord.conf`"
    )


def test_every_role_is_a_program_in_start_order_with_the_worker_counts(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_identity(repo, "three", "instance_group [ { count: 3 kind: KIND_CPU } ]")
    write_identity(repo, "gpu", "instance_group [ { count: 1 kind: KIND_GPU } ]")
    write_identity(repo, "one", "")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)
    code, text, err = _generate(
        [
            "supervisord-conf",
            f"--model-repository={repo}",
            *_layout(tmp_path),
            "--plan-gpus=2",
            "--exit-timeout-secs=12.5",
            "--frontend-processes=2",
        ]
    )
    assert code == 0, err
    groups = _parsed(tmp_path, text)
    assert sorted(groups, key=lambda n: groups[n].priority) == [  # type: ignore[attr-defined]
        "shoal-broker",
        "shoal-worker-gpu-v1",
        "shoal-worker-one-v1",
        "shoal-worker-simple-v1",
        "shoal-worker-three-v1",
        "shoal-frontend",
    ]
    assert "; ens: no worker program (an ensemble: its steps' workers run it)" in text
    counts = {name: len(g.process_configs) for name, g in groups.items()}  # type: ignore[attr-defined]
    assert counts == {
        "shoal-broker": 1,
        "shoal-worker-gpu-v1": 2,  # one on each of the 2 GPUs
        "shoal-worker-one-v1": 1,
        "shoal-worker-simple-v1": 1,
        "shoal-worker-three-v1": 3,
        "shoal-frontend": 2,
    }
    three = groups["shoal-worker-three-v1"].process_configs  # type: ignore[attr-defined]
    for n, process in enumerate(three):
        argv = shlex.split(process.command)
        assert process.name == f"shoal-worker-three-v1_{n}"
        assert argv[argv.index("--instance") + 1] == str(n)
        assert argv[argv.index("--model") + 1] == "three"
        assert "--cores" not in argv and "--gpu" not in argv  # it places itself
        assert "--parent-pid" not in argv  # siblings: nobody to die with
    # the plan the workers will find, written for the operator
    assert ";   shoal-worker-gpu-v1_1: gpu_0_0 on GPU 1" in text
    assert ";   shoal-worker-three-v1_0: three_0_0 on cores 2" in text
    frontends = groups["shoal-frontend"].process_configs  # type: ignore[attr-defined]
    for n, process in enumerate(frontends):
        argv = shlex.split(process.command)
        assert argv[argv.index("--index") + 1] == str(n)
        assert "--reuse-http-port=true" in argv and "--reuse-grpc-port=true" in argv
        assert process.stopsignal == signal.SIGTERM
        assert process.stopwaitsecs == 18  # the drain, and time to close after it
    for name, group in groups.items():
        for process in group.process_configs:  # type: ignore[attr-defined]
            assert process.stopasgroup and process.killasgroup, name
            assert 3 in process.exitcodes and 0 not in process.exitcodes, name
            assert Path(process.stdout_logfile).parent == tmp_path / "logs", name
            assert process.redirect_stderr, name


def test_names_a_shell_or_supervisord_would_read_otherwise_are_kept_whole(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_identity(repo, "a b%c:d", "")
    code, text, err = _generate(
        ["supervisord-conf", f"--model-repository={repo}", *_layout(tmp_path)]
    )
    assert code == 0, err
    groups = _parsed(tmp_path, text)
    (process,) = groups["shoal-worker-a_b_c_d-v1"].process_configs  # type: ignore[attr-defined]
    argv = shlex.split(process.command)
    assert argv[argv.index("--model") + 1] == "a b%c:d"


def test_model_control_through_the_api_is_refused_saying_why(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    code, text, err = _generate(
        ["supervisord-conf", f"--model-repository={repo}", "--model-control-mode=explicit"]
    )
    assert (code, text) == (2, "")
    assert "needs shoal serve" in err


def test_workers_get_the_rate_limiters_flags_to_plan_their_place(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_identity(repo, "one", "")
    code, text, err = _generate(
        [
            "supervisord-conf",
            f"--model-repository={repo}",
            *_layout(tmp_path),
            "--rate-limit=execution_count",
            "--rate-limit-resource=R:1",
        ]
    )
    assert code == 0, err
    (process,) = _parsed(tmp_path, text)["shoal-worker-one-v1"].process_configs  # type: ignore[attr-defined]
    argv = shlex.split(process.command)
    assert "--rate-limit=execution_count" in argv and "--rate-limit-resource=R:1" in argv
