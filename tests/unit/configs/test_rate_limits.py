"""Triton's rate-limiter configuration: the flags and each model's instance groups."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.configs.flags.broker import GivenResource, parse_rate_limit, parse_resource
from shoal.configs.model_spec import ModelSpec
from shoal.configs.rate_limits import GLOBAL, InstanceNeeds, check, describe, needs_of
from shoal.configs.spec_reader import read_spec


def _config(groups: str) -> ModelSpec:
    return read_spec(text_format.Parse(f"max_batch_size: 4 {groups}", mc.ModelConfig()))


def _group(resources: str, priority: int = 0, where: str = "kind: KIND_CPU") -> str:
    """An instance group whose instances need ``resources`` (Triton's list syntax)."""
    return f"{{ {where} rate_limiter {{ resources [{resources}] priority: {priority} }} }}"


def _short(resource: str, have: int, need: int) -> str:
    """Triton 2.51's reason for a model whose instances need more than was given."""
    return (
        f'Invalid argument: Resource count for "{resource}" is limited to {have} which will '
        "prevent scheduling of one or more model instances, the minimum required count is "
        f"{need}"
    )


R1_4 = '{ name: "resource1" count: 4 }'
R1_2_R2_GLOBAL_2 = '{ name: "resource1" count: 2 }, { name: "resource2" global: true count: 2 }'


# The models of Triton's L0_rate_limiter: A needs 4 of resource1 on its device; B needs 2
# of it and 2 of the global resource2, at priority 2.
A = _config(f"instance_group [{_group(R1_4)}]")
B = _config(f"instance_group [{_group(R1_2_R2_GLOBAL_2, priority=2)}]")


def test_the_mode_is_off_or_execution_count_in_any_case() -> None:
    assert parse_rate_limit("OFF") == "off"
    assert parse_rate_limit("Execution_Count") == "execution_count"
    with pytest.raises(ValueError, match=r"^invalid argument for --rate-limit$"):
        parse_rate_limit("on")


def test_a_given_resource_is_name_count_and_optionally_device() -> None:
    assert parse_resource("R1:10") == GivenResource("R1", 10, -1)
    assert parse_resource("R2:5:1") == GivenResource("R2", 5, 1)
    usage = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        "'<resource_name>:<count>'. Got "
    )
    for bad in ("R1", "R1:1:2:3", "R1:x", ":3", "R1:2:gpu"):
        with pytest.raises(ValueError) as e:
            parse_resource(bad)
        assert str(e.value) == usage + bad
    with pytest.raises(ValueError, match="the count must be 0 or more"):
        parse_resource("R1:-1")


def test_needs_are_per_device_unless_global_and_priority_zero_counts_as_one() -> None:
    on_gpus = _group(
        '{ name: "R" count: 3 }, { name: "G" global: true count: 1 }',
        where="count: 2 kind: KIND_GPU gpus: [0, 1]",
    )
    on_cpu = _group('{ name: "R" count: 1 }', priority=5)
    config = _config(f"instance_group [{on_gpus}, {on_cpu}]")
    needs = needs_of("m", config)
    assert [n.needs for n in needs] == [
        (((0, "R"), 3), ((GLOBAL, "G"), 1)),
        (((0, "R"), 3), ((GLOBAL, "G"), 1)),
        (((1, "R"), 3), ((GLOBAL, "G"), 1)),
        (((1, "R"), 3), ((GLOBAL, "G"), 1)),
        (((0, "R"), 1),),  # a CPU instance uses device 0's copies, as in Triton
    ]
    assert [n.priority for n in needs] == [1, 1, 1, 1, 5]
    assert needs_of("m", _config("")) == [InstanceNeeds()]  # the default group needs nothing


def test_without_given_resources_each_has_as_many_copies_as_the_most_any_instance_needs() -> None:
    limits = check([("a", [1], A), ("b", [1, 2], B)], [])
    assert limits.refused == {}
    assert limits.copies == {(0, "resource1"): 4, (GLOBAL, "resource2"): 2}
    assert set(limits.instances) == {("a", 1, 0), ("b", 1, 0), ("b", 2, 0)}
    assert limits.instances[("b", 2, 0)].priority == 2
    assert describe(limits.copies) == "GLOBAL: resource2=2; device 0: resource1=4"


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        # Triton's L0_rate_limiter cases, with its messages
        (
            ["resource1:1"],
            {
                "a": _short("resource1", 1, 4),
                # global resources are checked first, as Triton's map orders them
                "b": _short("resource2", 0, 2),
            },
        ),
        (
            ["resource1:3", "resource2:2"],
            {"a": _short("resource1", 3, 4)},
        ),
        (
            ["resource1:10:10", "resource2:2"],  # given for device 10 only
            {
                "a": _short("resource1", 0, 4),
                "b": _short("resource1", 0, 2),
            },
        ),
        (["resource1:4", "resource2:2"], {}),
        (["resource1:6:0", "resource2:2:7"], {}),  # a global one takes any device's count
    ],
)
def test_given_resources_must_cover_every_instance(given: list[str], refused: dict) -> None:
    limits = check([("a", [1], A), ("b", [1], B)], [parse_resource(g) for g in given])
    assert limits.refused == refused
    assert {name for name, _, _ in limits.instances} == {"a", "b"} - set(refused)


def test_a_refused_model_leaves_the_copies_of_the_others() -> None:
    given = [parse_resource("resource1:3"), parse_resource("resource2:2")]
    limits = check([("a", [1], A), ("b", [1], B)], given)
    assert limits.copies == {(0, "resource1"): 3, (GLOBAL, "resource2"): 2}


def test_a_resource_both_global_and_per_device_refuses_the_model_that_brings_it() -> None:
    group = _group('{ name: "resource2" count: 2 }')
    per_device = _config(f"instance_group [{group}]")
    limits = check([("c", [1], per_device), ("b", [1], B)], [])
    assert limits.refused == {
        "c": 'Invalid argument: Resource "resource2" is present as both global and '
        "device-specific resource in the model configuration."
    }
    assert limits.copies == {(0, "resource1"): 2, (GLOBAL, "resource2"): 2}
    groups = _group('{ name: "R" count: 1 }'), _group('{ name: "R" global: true count: 1 }')
    both = _config(f"instance_group [{', '.join(groups)}]")
    assert set(check([("d", [1], both)], []).refused) == {"d"}


def test_passive_instances_need_nothing_as_triton_leaves_them_out() -> None:
    passive = _group('{ name: "resource1" count: 8 }', where="kind: KIND_CPU passive: true")
    config = _config(f"instance_group [{_group(R1_4)}, {passive}]")
    assert [n.needs for n in needs_of("p", config)] == [(((0, "resource1"), 4),), ()]
    limits = check([("p", [1], config)], [parse_resource("resource1:4")])
    assert limits.refused == {} and limits.copies == {(0, "resource1"): 4}
