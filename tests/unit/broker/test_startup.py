"""The broker's start (shoal/broker/startup.py) over a repository written for the test, without
sockets: which models load, what the table expects of them, and the errors of the others."""

from __future__ import annotations

from pathlib import Path

from shoal.broker.ensemble_readiness import EnsembleReadiness
from shoal.broker.models import ModelTable
from shoal.broker.router import Router
from shoal.broker.startup import BrokerSettings, load_repository, model_control
from tests.repos import SIMPLE_ENSEMBLE, write_identity
from tools import modelgen


def _repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo)  # simple among them
    write_identity(repo, "ident", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text("this is not a config")
    return repo


def _start(s: BrokerSettings) -> tuple[ModelTable, EnsembleReadiness]:
    table, readiness = ModelTable(), EnsembleReadiness()
    load_repository(s, table, Router(table), model_control(s, table), readiness)
    return table, readiness


def test_every_model_loads_at_start_and_the_broken_one_says_why(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    table, readiness = _start(BrokerSettings(repo, tmp_path))
    ident = table.version("ident", 1)
    assert ident is not None and ident.expected_instances == 2 and ident.state == "LOADING"
    assert [v.name for v in readiness.unsettled] == ["ens"]
    assert table.models["broken"].error
    assert {"simple", "ident", "ens", "broken"} <= set(table.models)


def test_explicit_mode_loads_what_is_named_with_what_its_ensembles_use(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    s = BrokerSettings(repo, tmp_path, model_control_mode="explicit", load_models=["ens", "nope"])
    table, _ = _start(s)
    assert set(table.models) == {"ens", "simple", "nope"}
    assert table.models["nope"].error == (
        "failed to load 'nope', failed to poll from model repository"
    )


def test_poll_mode_starts_polling_at_the_clock_s_time(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    s = BrokerSettings(repo, tmp_path, model_control_mode="poll", repository_poll_secs=2.0)
    table = ModelTable()
    control = model_control(s, table)
    assert control.poll_secs == 2.0 and not control.explicit
    load_repository(s, table, Router(table), control, EnsembleReadiness(), clock=lambda: 5.0)
    assert control._next_poll == 7.0
