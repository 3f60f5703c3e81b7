"""When an ensemble is ready, judged from the broker's model table alone (no sockets)."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.broker.ensemble_readiness import EnsembleReadiness
from shoal.broker.models import ModelTable, ModelVersion
from shoal.configs.ensemble import dependencies
from shoal.configs.spec_reader import read_spec

STEP = """
name: "a"
platform: "onnxruntime_onnx"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

ENSEMBLE = """
name: "e"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "%s" model_version: -1
  input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" }
} ] }
"""


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _table(step: str = "a") -> tuple[ModelTable, EnsembleReadiness, ModelVersion]:
    table = ModelTable()
    table.add_model("a", {1: 1}, "onnxruntime_onnx")
    config = _config(ENSEMBLE % step)
    readiness = EnsembleReadiness()
    versions = table.add_ensemble(
        "e", [1], config.SerializeToString(), dependencies(read_spec(config))
    )
    readiness.wait(versions)
    return table, readiness, versions[0]


def _ready(table: ModelTable, name: str = "a") -> None:
    mv = table.models[name].versions[1]
    mv.state, mv.ever_ready, mv.config = "READY", True, _config(STEP).SerializeToString()


def test_an_ensemble_waits_for_its_step_then_is_ready() -> None:
    table, readiness, e = _table()
    readiness.settle(table)
    assert (e.state, readiness.unsettled) == ("LOADING", [e])
    _ready(table)
    readiness.settle(table)
    assert (e.state, e.reason, e.ever_ready, readiness.unsettled) == ("READY", "", True, [])


def test_a_step_that_failed_makes_the_ensemble_unavailable_with_tritons_reason() -> None:
    table, readiness, e = _table()
    table.add_error("a", "no model file")  # a load that failed leaves no version
    readiness.settle(table)
    assert e.state == "UNAVAILABLE"
    assert e.reason == (
        "ensemble 'e' depends on 'a' which is not valid. Model 'a' failed with error: no model file"
    )


def test_a_missing_step_is_named() -> None:
    table, readiness, e = _table(step="b")
    readiness.settle(table)
    assert e.state == "UNAVAILABLE"
    assert e.reason == "ensemble e contains models that are not available or ambiguous: b"


def test_a_step_whose_tensors_do_not_fit_is_refused() -> None:
    table, readiness, e = _table()
    mv = table.models["a"].versions[1]
    wrong = _config(STEP.replace("dims: [ 4 ] } ]\noutput", "dims: [ 5 ] } ]\noutput"))
    mv.state, mv.ever_ready, mv.config = "READY", True, wrong.SerializeToString()
    readiness.settle(table)
    assert e.state == "UNAVAILABLE"
    assert e.reason == (
        "in ensemble e, ensemble tensor X: inconsistent shape: [4] is inferred from model e "
        "while [5] is inferred from model a"
    )


def test_an_unloaded_step_takes_its_ensemble_along_and_a_reload_judges_it_again() -> None:
    table, readiness, e = _table()
    _ready(table)
    readiness.settle(table)
    table.remove("a")
    assert readiness.changed(table, {"a"}) == {"e"}
    assert (e.state, e.reason) == ("UNAVAILABLE", "unloaded")
    table.add_model("a", {1: 1}, "onnxruntime_onnx")
    assert readiness.changed(table, {"a"}) == {"e"}
    assert e.state == "LOADING" and readiness.unsettled == [e]
    _ready(table)
    readiness.settle(table)
    assert e.state == "READY"
