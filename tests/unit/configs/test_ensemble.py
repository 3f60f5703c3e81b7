"""An ensemble's checks (shoal/configs/ensemble.py), in Triton's words: the graph of its steps
at load, and how its steps fit the composing models' configs once they have loaded."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.ensemble import (
    Dependency,
    check_composition,
    check_graph,
    cycle,
    decoupled,
    dependencies,
)
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec


def _step(model: str, ins: dict[str, str], outs: dict[str, str], version: int = -1) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items()]
    return f'{{ model_name: "{model}" model_version: {version} {" ".join(maps)} }}'


def _ensemble(steps: list[str], ins: str = "IN", outs: str = "OUT", mbs: int = 4) -> pb.ModelConfig:
    text = (
        f'name: "e" platform: "ensemble" max_batch_size: {mbs} '
        + " ".join(f'input {{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in ins.split())
        + " ".join(
            f' output {{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in outs.split()
        )
        + f" ensemble_scheduling {{ step [ {', '.join(steps)} ] }}"
    )
    return text_format.Parse(text, pb.ModelConfig())


def _model(name: str, mbs: int = 8, dims: str = "4", dtype: str = "TYPE_FP32") -> pb.ModelConfig:
    text = (
        f'name: "{name}" max_batch_size: {mbs} '
        f'input {{ name: "X" data_type: {dtype} dims: [ {dims} ] }} '
        f'input {{ name: "OPT" data_type: TYPE_FP32 dims: [ 4 ] optional: true }} '
        f'output {{ name: "Y" data_type: TYPE_FP32 dims: [ {dims} ] }}'
    )
    return text_format.Parse(text, pb.ModelConfig())


CHAIN = [_step("a", {"X": "IN"}, {"Y": "MID"}), _step("b", {"X": "MID"}, {"Y": "OUT"})]


ONE = _ensemble([_step("a", {"X": "IN"}, {"Y": "OUT"})])


def test_a_chain_is_a_graph_and_its_dependencies_are_its_models() -> None:
    config = _ensemble(CHAIN)
    check_graph(config)
    assert dependencies(read_spec(config)) == [Dependency("a", -1), Dependency("b", -1)]
    check_composition(config, {("a", -1): _model("a"), ("b", -1): _model("b")})


@pytest.mark.parametrize(
    ("steps", "ins", "outs", "message"),
    [
        ([_step("a", {"X": "IN"}, {"Y": "OUT"}), _step("b", {"X": "IN"}, {"Y": "OUT"})],
         "IN", "OUT", "ensemble tensor 'OUT' can appear in an output map only once for "
         "ensemble 'e' step 1"),
        (CHAIN, "IN IN2", "OUT", "ensemble input 'IN2' for ensemble e' is not used"),
        (CHAIN, "IN", "OUT OUT2", "ensemble output 'OUT2' for ensemble e' is not used"),
        ([*CHAIN, _step("c", {"X": "IN"}, {"Y": "LOST"})], "IN", "OUT",
         "ensemble tensor 'LOST' is unused in ensemble 'e'"),
        ([CHAIN[0], _step("b", {"X": "MID", "Z": "NOWHERE"}, {"Y": "OUT"})],
         "IN", "OUT", "output 'OUT' for ensemble 'e' is not written: at least one of its "
         "depending tensors, 'NOWHERE', is not connected"),
        ([*CHAIN, _step("c", {"X": "L1"}, {"Y": "L2"}), _step("d", {"X": "L2"}, {"Y": "L1"})],
         "IN", "OUT", "ensemble tensor 'L1' is unused in ensemble 'e'"),  # a loop of its own
        ([_step("a", {"X": "IN", "Z": "OUT"}, {"Y": "OUT"})], "IN", "OUT",
         "output 'OUT' for ensemble 'e' is not written: at least one of its depending "
         "tensors, 'OUT', is not connected"),
    ],
)  # fmt: skip
def test_graphs_that_cannot_run_are_refused(
    steps: list[str], ins: str, outs: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check_graph(_ensemble(steps, ins, outs))
    assert err.value.message == message


def test_cycles_through_ensembles_are_found() -> None:
    a = _ensemble([_step("b", {"X": "IN"}, {"Y": "OUT"})])
    b = _ensemble([_step("a", {"X": "IN"}, {"Y": "OUT"})])
    plain = _ensemble([_step("m", {"X": "IN"}, {"Y": "OUT"})])
    configs = {n: read_spec(c) for n, c in {"a": a, "b": b, "c": plain, "m": _model("m")}.items()}
    assert cycle(configs, "a") == ["a", "b", "a"]
    assert cycle(configs, "c") is None and cycle(configs, "m") is None


@pytest.mark.parametrize(
    ("models", "mbs", "message"),
    [
        ({("a", -1): _model("a", mbs=2)}, 4, "ensemble e allows maximum batch size 4, but it "
         "contains model a which only allows maximum batch size to be 2"),
        ({("a", -1): _model("a", dtype="TYPE_INT32")}, 4, "in ensemble e, ensemble tensor IN: "
         "inconsistent data type: TYPE_FP32 is inferred from model e while TYPE_INT32 is "
         "inferred from model a"),
        ({("a", -1): _model("a", dims="5")}, 4, "in ensemble e, ensemble tensor IN: inconsistent "
         "shape: [-1,4] is inferred from model e while [-1,5] is inferred from model a"),
    ],
)  # fmt: skip
def test_steps_must_fit_their_models(models: dict, mbs: int, message: str) -> None:
    config = _ensemble(CHAIN, mbs=mbs)
    with pytest.raises(ConfigError) as err:
        check_composition(config, {**models, ("b", -1): _model("b")})
    assert err.value.message == message


def test_maps_must_name_real_tensors_and_feed_every_required_input() -> None:
    wrong_in = _ensemble([_step("a", {"Q": "IN"}, {"Y": "OUT"})])
    with pytest.raises(ConfigError, match="ensemble tensor IN is mapping to non-existing input Q"):
        check_composition(wrong_in, {("a", -1): _model("a")})
    wrong_out = _ensemble([_step("a", {"X": "IN"}, {"Q": "OUT"})])
    with pytest.raises(
        ConfigError, match="ensemble tensor OUT is mapped from non-existing output Q"
    ):
        check_composition(wrong_out, {("a", -1): _model("a")})
    two_in = _model("a")
    two_in.input.add(name="W", data_type=pb.TYPE_FP32, dims=[4])
    with pytest.raises(
        ConfigError, match="input W in model a is not mapped to any ensemble tensors"
    ):
        check_composition(ONE, {("a", -1): two_in})
    # a model that does not batch takes any ensemble batch size; -1 matches any size
    check_composition(ONE, {("a", -1): _model("a", mbs=0, dims="-1")})


def test_each_pinned_version_is_checked_against_its_own_config() -> None:
    pinned = _ensemble(
        [_step("a", {"X": "IN"}, {"Y": "MID"}, 1), _step("a", {"X": "MID"}, {"Y": "OUT"}, 2)]
    )
    check_composition(pinned, {("a", 1): _model("a"), ("a", 2): _model("a")})
    with pytest.raises(ConfigError, match="inconsistent shape"):
        check_composition(pinned, {("a", 1): _model("a"), ("a", 2): _model("a", dims="5")})


def _models(decoupled_ones: str) -> dict[tuple[str, int], pb.ModelConfig]:
    """Models a to f, by (name, -1); those named in ``decoupled_ones`` decoupled."""
    out = {}
    for name in "abcdef":
        config = _model(name)
        config.model_transaction_policy.decoupled = name in decoupled_ones
        out[(name, -1)] = config
    return out


# IN -> a -> MID -> b -> OUT
_MIXED = (
    "in ensemble e, step of model 'e' receives inputs originated from different decoupled models"
)


def test_an_ensemble_is_decoupled_when_a_step_is_whatever_its_config_says() -> None:
    chain = _ensemble(CHAIN)
    assert decoupled(chain, _models("a")) and decoupled(chain, _models("b"))
    chain.model_transaction_policy.decoupled = True
    assert not decoupled(chain, _models(""))
    # a chain of decoupled steps: each response of a runs b, whose responses run c
    three = _ensemble([*CHAIN[:1], _step("b", {"X": "MID"}, {"Y": "M2"}),
                       _step("c", {"X": "M2"}, {"Y": "OUT"})])  # fmt: skip
    assert decoupled(three, _models("ab"))


def test_a_step_reads_tensors_of_one_origin() -> None:
    # a's responses fan out to b and c, d joins them: one origin, a's
    diamond = _ensemble([
        _step("a", {"X": "IN"}, {"Y": "MID"}),
        _step("b", {"X": "MID"}, {"Y": "L"}),
        _step("c", {"X": "MID"}, {"Y": "R"}),
        _step("d", {"X": "L", "OPT": "R"}, {"Y": "OUT"}),
    ])  # fmt: skip
    assert decoupled(diamond, _models("a"))
    for which in ("b", "c", "bc"):  # two decoupled origins, or one and a's
        with pytest.raises(ConfigError) as err:
            decoupled(diamond, _models(which))
        assert err.value.message == _MIXED
    # a response of a beside the request's own tensor
    beside = _ensemble([
        _step("a", {"X": "IN"}, {"Y": "MID"}),
        _step("b", {"X": "MID", "OPT": "IN2"}, {"Y": "OUT"}),
    ], ins="IN IN2")  # fmt: skip
    assert not decoupled(beside, _models(""))
    with pytest.raises(ConfigError) as err:
        decoupled(beside, _models("a"))
    assert err.value.message == _MIXED
    assert decoupled(beside, _models("b"))  # b reads the request's tensors only


def test_the_outputs_must_come_from_one_origin() -> None:
    split = _ensemble([
        _step("a", {"X": "IN"}, {"Y": "OUT"}),
        _step("b", {"X": "IN"}, {"Y": "OUT2"}),
    ], outs="OUT OUT2")  # fmt: skip
    assert not decoupled(split, _models(""))
    with pytest.raises(ConfigError) as err:
        decoupled(split, _models("ab"))
    assert err.value.message == (
        "in ensemble e, the outputs originate from different sources (decoupled model 'a' "
        "(step 0) and decoupled model 'b' (step 1)): no response could carry them all"
    )
    with pytest.raises(ConfigError, match=r"\(the request and decoupled model 'b' \(step 1\)\)"):
        decoupled(split, _models("b"))
