"""shoal/broker/control.py: explicit model control over a real ModelTable and repository
directory, without sockets: what a load stages and starts, when it settles, what an
unload retires, and what the index and readiness say."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shoal.broker.control import START_DEADLINE_S, ModelControl
from shoal.broker.models import Instance, ModelTable
from shoal.configs.model_config import parse_config_text
from shoal.ipc import messages as m
from shoal.ipc.errors import MODEL_CONTROL_DISABLED, Code
from tests.repos import SIMPLE_ENSEMBLE
from tools import modelgen

FE = b"f-0-1"


@pytest.fixture
def control(tmp_path: Path) -> ModelControl:
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)
    run = tmp_path / "run"
    run.mkdir()
    c = ModelControl(ModelTable(), repo, run, explicit=True)
    c.has_launcher = True
    return c


def _load(c: ModelControl, name: str, config: str = "", qid: int = 1) -> list[m.WorkerSpec]:
    out = c.request(FE, m.ModelControl(qid, "load", name, config))
    assert out.replies == []  # not settled before its instances report
    return out.start


def _modify(model_dir: Path, part: str, later_s: float = 10.0) -> None:
    """A change to ``part`` of a model's folder (a version, a shared file), newer than
    anything there before."""
    path = model_dir / part
    if path.is_dir():
        path = path / "changed"
    if not path.is_file():  # (a file already there keeps its content)
        path.write_text("changed")
    stamp = time.time() + later_s
    os.utime(path, (stamp, stamp))


def _ready(c: ModelControl, spec: m.WorkerSpec, ident: bytes) -> Instance:
    """What the broker does when that worker says hello and reports READY."""
    mv = c.table.find(spec.model, spec.version, spec.generation)
    assert mv is not None
    inst = Instance(ident, spec.model, spec.version, spec.instance, 100, generation=spec.generation)
    c.table.by_ident[ident] = inst
    mv.add_instance(inst)
    inst.state = "READY"
    mv.refresh_state()
    return inst


def test_a_load_answers_once_its_instances_are_ready_and_then_replaces_the_loaded(
    control: ModelControl,
) -> None:
    (spec,) = _load(control, "simple")
    assert (spec.model, spec.version, spec.generation, spec.config_file) == ("simple", 1, 1, "")
    assert control.tick().replies == []
    first = _ready(control, spec, b"w1")
    out = control.tick()
    assert out.replies == [(FE, m.ControlReply(1))] and out.changed == {"simple"}
    assert control.table.version("simple", 1).generation == 1  # type: ignore[union-attr]
    # a reload with a config: staged beside the first, which serves until it is READY
    (spec2,) = _load(control, "simple", '{"max_batch_size": 4}', qid=2)
    assert spec2.generation == 2 and Path(spec2.config_file).read_text() == (
        '{"max_batch_size": 4}'
    )
    loaded = control.table.version("simple", 1)
    assert loaded is not None and loaded.generation == 1
    loaded.stats.failed(1000, "OTHER")  # counted before the reload
    _ready(control, spec2, b"w2")
    out = control.tick()
    assert out.replies == [(FE, m.ControlReply(2))]
    assert out.stop == [first]  # the replaced instance had nothing to run: it stops
    assert first.retiring
    reloaded = control.table.version("simple", 1)
    assert reloaded is not None and reloaded.generation == 2
    # the statistics go on counting across the reload (one version to its clients)
    assert (
        reloaded.stats is loaded.stats and reloaded.stats.snapshot().inference_stats.fail.count == 1
    )


def test_a_failed_reload_keeps_the_loaded_version_and_its_instance_retires(
    control: ModelControl,
) -> None:
    (spec,) = _load(control, "simple")
    _ready(control, spec, b"w1")
    control.tick()
    _modify(control.repo / "simple", "1")
    (spec2,) = _load(control, "simple", qid=2)
    mv = control.table.find("simple", 1, spec2.generation)
    assert mv is not None
    inst = Instance(b"w2", "simple", 1, 0, 101, generation=spec2.generation)
    mv.add_instance(inst)
    mv.load_failed(inst, "failed to load 'simple' version 1: boom")
    (reply,) = control.tick().replies
    assert reply[1].error == m.ErrorInfo(
        int(Code.INVALID_ARG),
        "load failed for model 'simple': version 1 is at UNAVAILABLE state: "
        "failed to load 'simple' version 1: boom;\n",
    )
    assert control.table.version("simple", 1).generation == 1  # type: ignore[union-attr]
    assert not control.failures()  # the model still serves: the server stays ready


def test_a_failed_first_load_shows_in_the_index_and_fails_readiness_until_unloaded(
    control: ModelControl,
) -> None:
    (spec,) = _load(control, "mlp")
    mv = control.table.find("mlp", 1, spec.generation)
    inst = Instance(b"w1", "mlp", 1, 0, 100, generation=spec.generation)
    mv.add_instance(inst)  # type: ignore[union-attr]
    mv.load_failed(inst, "boom")  # type: ignore[union-attr]
    control.tick()
    mv.instances.clear()  # type: ignore[union-attr]  # its worker's exit (the broker's _lost)
    assert "mlp" not in control.table.models
    assert [s for s in control.index() if s.name == "mlp"] == [
        m.ModelState("mlp", 1, "UNAVAILABLE", "boom")
    ]
    assert control.failures()
    out = control.request(FE, m.ModelControl(2, "unload", "mlp"))
    assert out.replies == [(FE, m.ControlReply(2))]
    assert not control.failures()
    assert [s for s in control.index() if s.name == "mlp"] == [
        m.ModelState("mlp", 1, "UNAVAILABLE", "unloaded")
    ]


def test_unload_retires_once_drained_and_answers_when_the_workers_are_gone(
    control: ModelControl,
) -> None:
    (spec,) = _load(control, "simple")
    inst = _ready(control, spec, b"w1")
    control.tick()
    inst.in_flight = m.ExecuteBatch(1, [])
    out = control.request(FE, m.ModelControl(2, "unload", "simple"))
    assert out.stop == [] and out.replies == [] and out.changed == {"simple"}
    assert [s for s in control.index() if s.name == "simple"] == [
        m.ModelState("simple", 1, "UNLOADING")
    ]
    inst.in_flight = None  # its batch is done
    assert control.tick().stop == [inst]
    assert control.tick().stop == []  # told once
    inst.state = "DEAD"  # killed, say: its exit is not seen yet, the unload waits for it
    assert control.tick().replies == []
    (retiring,) = control.table.retiring
    retiring.instances.pop(inst.ident)  # its exit (the broker's _lost)
    assert control.tick().replies == [(FE, m.ControlReply(2))]
    assert control.table.retiring == []


def test_an_ensemble_brings_its_composing_model_and_unload_dependents_takes_it(
    control: ModelControl,
) -> None:
    (spec,) = _load(control, "ens")  # its composing model, not loaded yet
    assert spec.model == "simple"
    _ready(control, spec, b"w1")
    out = control.tick()
    (ens,) = out.ensembles  # staged: the broker judges it against simple's config
    assert ens.name == "ens" and out.replies == []
    ens.state = "READY"
    assert control.tick().replies == [(FE, m.ControlReply(1))]
    assert control.named == {"ens"}
    out = control.request(FE, m.ModelControl(2, "unload", "ens", unload_dependents=True))
    assert out.changed == {"ens", "simple"}
    assert "simple" not in control.table.models


@pytest.mark.parametrize(
    ("setup", "msg", "code", "words"),
    [
        ("none-mode", m.ModelControl(1, "load", "simple"), Code.UNAVAILABLE,
         MODEL_CONTROL_DISABLED),
        ("no-launcher", m.ModelControl(1, "unload", "simple"), Code.UNAVAILABLE,
         "needs shoal serve"),
        ("", m.ModelControl(1, "load", "../simple"), Code.INVALID_ARG,
         "model name must not contain path traversal characters"),
        ("", m.ModelControl(1, "load", "nope"), Code.INTERNAL,
         "failed to load 'nope', failed to poll from model repository"),
        ("", m.ModelControl(1, "load", "simple", "{"), Code.INTERNAL,
         "failed to load 'simple', failed to poll from model repository: "),
    ],
)  # fmt: skip
def test_refusals(
    control: ModelControl, setup: str, msg: m.ModelControl, code: Code, words: str
) -> None:
    control.explicit = setup != "none-mode"
    control.has_launcher = setup != "no-launcher"
    out = control.request(FE, msg)
    ((frontend, reply),) = out.replies
    assert frontend == FE and reply.error is not None
    assert reply.error.code == int(code) and words in reply.error.message
    assert out.start == [] and not control.ops


def test_unloading_a_model_that_is_not_loaded_succeeds_and_changes_nothing(
    control: ModelControl,
) -> None:
    out = control.request(FE, m.ModelControl(1, "unload", "never_heard_of"))
    assert out.replies == [(FE, m.ControlReply(1))] and not out.changed
    assert "never_heard_of" not in {s.name for s in control.index()}
    assert {s.name: s.state for s in control.index()} == {
        "ens": "", "mlp": "", "simple": ""  # listed by name alone: never loaded
    }  # fmt: skip


def test_an_ensemble_waits_for_a_load_of_its_composing_model_under_way(
    control: ModelControl,
) -> None:
    """Two operations never stage the same model: the ensemble's starts once the load of
    its composing model is over, and then finds it loaded."""
    (spec,) = _load(control, "simple")
    out = control.request(FE, m.ModelControl(2, "load", "ens"))
    assert out.start == [] and not control.ops["ens"][0].started  # it waits
    _ready(control, spec, b"w1")
    out = control.tick()
    assert out.replies == [(FE, m.ControlReply(1))]
    (ens,) = out.ensembles  # simple is loaded: the ensemble is staged at once
    assert out.start == []
    ens.state = "READY"
    assert control.tick().replies == [(FE, m.ControlReply(2))]


def test_a_worker_that_never_says_hello_fails_its_load_in_time(control: ModelControl) -> None:
    (spec,) = _load(control, "simple")
    t0 = control.ops["simple"][0].started_at
    assert control.tick(t0 + START_DEADLINE_S - 1).replies == []
    out = control.tick(t0 + START_DEADLINE_S + 1)
    ((_, reply),) = out.replies
    assert reply.error is not None and reply.error.message == (
        "load failed for model 'simple': version 1 is at UNAVAILABLE state: its worker "
        f"process did not start within {START_DEADLINE_S:g} s;\n"
    )
    assert out.gone == [spec.generation]  # the launcher stops and never restarts it
    assert "simple" not in control.table.models and not control.ops


def test_an_unload_cancels_a_load_of_the_model_under_way(control: ModelControl) -> None:
    (spec,) = _load(control, "mlp")
    out = control.request(FE, m.ModelControl(2, "unload", "mlp"))
    ((_, first), (_, second)) = out.replies
    assert first.error is not None and first.error.code == int(Code.UNAVAILABLE)
    assert "an unload of it came first" in first.error.message
    assert second == m.ControlReply(2)  # nothing was loaded: nothing to wait for
    assert out.gone == [spec.generation]


def test_a_replaced_copy_keeps_its_open_sequences_until_they_end(tmp_path: Path) -> None:
    """A sequence that began before a reload continues on the copy holding its state;
    that copy stops only once no sequence is open on it."""
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo, ("simple_sequence",))
    run = tmp_path / "run"
    run.mkdir()
    c = ModelControl(ModelTable(), repo, run, explicit=True)
    c.has_launcher = True
    (spec,) = _load(c, "simple_sequence")
    first = _ready(c, spec, b"w1")
    config = (repo / "simple_sequence" / "config.pbtxt").read_text()
    c.table.find("simple_sequence", 1, spec.generation).set_config(  # type: ignore[union-attr]
        parse_config_text(config, "simple_sequence").SerializeToString()
    )
    c.tick()
    old = c.table.version("simple_sequence", 1)
    assert old is not None and old.sequencer is not None
    old.sequencer.add_instance(first.ident)
    start = m.InferRequest(1, "simple_sequence", 1, [], [], sequence_id=7, sequence_start=True)
    old.sequencer.enqueue(m.WorkItem(FE, start), 0.0)
    old.sequencer.completed(first.ident, old.sequencer.take(first.ident, 0.0), 0.0)
    _modify(repo / "simple_sequence", "1")
    (spec2,) = _load(c, "simple_sequence", qid=2)
    _ready(c, spec2, b"w2")
    c.table.find("simple_sequence", 1, spec2.generation).set_config(  # type: ignore[union-attr]
        old.config
    )
    out = c.tick()
    assert out.replies == [(FE, m.ControlReply(2))] and out.stop == []  # sequence 7 is open
    new = c.table.version("simple_sequence", 1)
    assert new is not None and new is not old
    assert c.table.sequence_home(new, 7) is old
    assert c.table.sequence_home(new, 8) is new
    old.sequencer.expire(3600.0)  # its idle time ran out (or its END came)
    assert c.tick().stop == [first]


def test_poll_keeps_every_model_when_the_repository_cannot_be_read(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo, ("simple",))
    run = tmp_path / "run"
    run.mkdir()
    c = ModelControl(ModelTable(), repo, run, explicit=False, poll_secs=1.0)
    c.has_launcher = True
    c.start_polling(0.0)
    repo.rename(tmp_path / "elsewhere")  # (a network file system's hiccup, a swap)
    assert c.poll(2.0).start == [] and not c.ops
    (tmp_path / "elsewhere").rename(repo)
    assert c.poll(4.0).start == [] and not c.ops  # unchanged: nothing to do
    (repo / "simple" / "config.pbtxt").touch()
    assert [w.model for w in c.poll(6.0).start] == ["simple"]  # changed: reloaded


def test_a_first_load_shows_its_versions_loading(control: ModelControl) -> None:
    (spec,) = _load(control, "mlp")
    (state,) = [s for s in control.table.states() if s.name == "mlp"]
    assert (state.version, state.state) == (1, "LOADING")
    assert not control.table.all_ready()  # Triton: not ready while a model loads
    _ready(control, spec, b"w1")
    control.tick()
    (state,) = [s for s in control.table.states() if s.name == "mlp"]
    assert (state.version, state.state) == (1, "READY")


def test_a_load_that_fails_reading_its_ensemble_leaves_a_load_under_way_alone(
    control: ModelControl,
) -> None:
    """An ensemble whose second composing model is missing fails before it claims its
    first one, which another operation is loading: that load goes on and settles."""
    (control.repo / "ens2" / "1").mkdir(parents=True)
    config = SIMPLE_ENSEMBLE.replace(
        "output_map", 'input_map { key: "X" value: "IN0" } output_map'
    ).replace(
        "step [ {",
        'step [ { model_name: "missing" model_version: -1 '
        'input_map { key: "A" value: "IN0" } output_map { key: "B" value: "OUT" } }, {',
    )
    (control.repo / "ens2" / "config.pbtxt").write_text(config)
    (spec,) = _load(control, "simple")
    out = control.request(FE, m.ModelControl(2, "load", "ens2"))
    ((_, reply),) = out.replies
    assert reply.error is not None and reply.error.code == int(Code.INTERNAL)
    _ready(control, spec, b"w1")
    assert control.tick().replies == [(FE, m.ControlReply(1))]
    assert control.table.version("simple", 1) is not None


def test_a_bug_in_a_load_answers_its_client_and_spares_the_broker(
    control: ModelControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(control, "_read", broken)
    out = control.request(FE, m.ModelControl(1, "load", "simple"))
    ((_, reply),) = out.replies
    assert reply.error == m.ErrorInfo(int(Code.INTERNAL), "failed to load 'simple': boom")
    assert not control.ops and not control.busy


def test_a_load_waiting_for_a_claim_is_not_planned_again_on_every_turn(
    control: ModelControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    (spec,) = _load(control, "simple")
    reads: list[str] = []
    read = control._read

    def counted(name: str, *args: object) -> object:
        reads.append(name)
        return read(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(control, "_read", counted)
    control.request(FE, m.ModelControl(2, "load", "ens"))  # waits for simple's load
    for _ in range(5):
        control.tick()
    assert reads == ["ens", "simple"]  # planned once, then it waits for the claim to go
    _ready(control, spec, b"w1")
    control.tick()
    assert reads == ["ens", "simple", "ens"]  # simple is loaded now: the ensemble is staged


def _two_versions(control: ModelControl) -> Path:
    """``simple`` with versions 1 and 2, both served (Triton's version policy ``all``)."""
    model = control.repo / "simple"
    (model / "2").mkdir()
    (model / "2" / "model.onnx").write_bytes((model / "1" / "model.onnx").read_bytes())
    with (model / "config.pbtxt").open("a") as f:
        f.write("version_policy: { all { }}\n")
    return model


def _load_ready(control: ModelControl, qid: int, *idents: bytes) -> list[m.WorkerSpec]:
    specs = _load(control, "simple", qid=qid)
    for spec, ident in zip(specs, idents, strict=True):
        _ready(control, spec, ident)
    assert control.tick().replies == [(FE, m.ControlReply(qid))]
    return specs


def _generations(control: ModelControl) -> dict[int, int]:
    entry = control.table.models["simple"]
    return {v: mv.generation for v, mv in entry.versions.items()}


def test_a_reload_keeps_the_versions_it_does_not_change_as_tritons_does(
    control: ModelControl,
) -> None:
    """Triton's reload: a version whose folder (and what the versions share) did not
    change, with a config that differs in its version policy at most, serves on as it
    is; a changed one loads again, a new one loads, one the policy drops is unloaded
    (UNAVAILABLE, "unloaded", in the index)."""
    model = _two_versions(control)
    _load_ready(control, 1, b"w1", b"w2")
    assert _generations(control) == {1: 1, 2: 1}
    # nothing changed: answered at once, nothing started or stopped
    out = control.request(FE, m.ModelControl(2, "load", "simple"))
    assert out.replies == [(FE, m.ControlReply(2))] and out.start == [] and out.stop == []
    assert _generations(control) == {1: 1, 2: 1}
    # version 2 changed: it alone loads again
    _modify(model, "2")
    (spec,) = _load_ready(control, 3, b"w3")
    assert spec.version == 2 and _generations(control) == {1: 1, 2: 2}
    # version 1 goes, version 3 comes
    (model / "3").mkdir()
    (model / "3" / "model.onnx").write_bytes((model / "2" / "model.onnx").read_bytes())
    for f in (model / "1").iterdir():
        f.unlink()
    (model / "1").rmdir()
    _modify(model, "3", later_s=20)  # (newer than version 2's change, stamped ahead)
    (spec,) = _load_ready(control, 4, b"w4")
    assert spec.version == 3 and _generations(control) == {2: 2, 3: 3}
    assert control.gone_versions["simple"] == {1}
    assert m.ModelState("simple", 1, "UNAVAILABLE", "unloaded") in control.index()
    # the policy narrows to version 3: version 2 goes, 3 stays as it is
    config = (model / "config.pbtxt").read_text().replace("all { }", "specific { versions: [3] }")
    (model / "config.pbtxt").write_text(config)
    _modify(model, "config.pbtxt", later_s=30)
    out = control.request(FE, m.ModelControl(5, "load", "simple"))
    assert out.replies == [(FE, m.ControlReply(5))] and out.start == []
    assert _generations(control) == {3: 3} and control.gone_versions["simple"] == {1, 2}


@pytest.mark.parametrize("change", ["shared file", "config"])
def test_a_change_every_version_shares_loads_every_version_again(
    control: ModelControl, change: str
) -> None:
    model = _two_versions(control)
    _load_ready(control, 1, b"w1", b"w2")
    if change == "shared file":  # a labels file, a Python model's dependency
        _modify(model, "labels.txt")
    else:
        config = (model / "config.pbtxt").read_text().replace("max_batch_size: 8", "")
        (model / "config.pbtxt").write_text(config + "max_batch_size: 4\n")
    specs = _load_ready(control, 2, b"w3", b"w4")
    assert sorted(s.version for s in specs) == [1, 2] and _generations(control) == {1: 2, 2: 2}


def test_an_unload_after_a_reload_lists_every_version_it_had(control: ModelControl) -> None:
    model = _two_versions(control)
    _load_ready(control, 1, b"w1", b"w2")
    config = (model / "config.pbtxt").read_text().replace("all { }", "specific { versions: [2] }")
    (model / "config.pbtxt").write_text(config)
    control.request(FE, m.ModelControl(2, "load", "simple"))
    (gone,) = control.table.retiring
    gone.instances.clear()  # its worker's exit (the broker's _lost)
    control.tick()
    control.request(FE, m.ModelControl(3, "unload", "simple"))
    assert "simple" not in control.gone_versions
    assert [s for s in control.index() if s.name == "simple"] == [
        m.ModelState("simple", 1, "UNAVAILABLE", "unloaded"),
        m.ModelState("simple", 2, "UNLOADING"),
    ]


def test_a_load_without_a_config_keeps_the_one_an_earlier_load_gave_until_a_file_changes(
    control: ModelControl,
) -> None:
    """Triton's L0_lifecycle test_config_override: a load's config counts as the model's
    newest change; a later load that gives none, of a model none of whose files changed
    since, leaves the model as it is."""
    (spec,) = _load(control, "simple", '{"max_batch_size": 4}')
    _ready(control, spec, b"w1")
    control.tick()
    out = control.request(FE, m.ModelControl(2, "load", "simple"))
    assert out.replies == [(FE, m.ControlReply(2))] and out.start == [] and out.stop == []
    assert control.loaded["simple"].config.max_batch_size == 4  # type: ignore[union-attr]
    _modify(control.repo / "simple", "config.pbtxt")  # (its own config, changed since)
    (spec,) = _load(control, "simple", qid=3)
    assert spec.generation == 2 and spec.config_file == ""
