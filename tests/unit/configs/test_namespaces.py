"""Model namespacing's names and config rewrites (shoal/configs/namespaces.py)."""

from __future__ import annotations

from shoal.configs import namespaces
from shoal.configs.model_config import parse_config_text

ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "shared" model_version: -1 input_map { key: "I" value: "IN" }
    output_map { key: "O" value: "MID" } },
  { model_name: "elsewhere" model_version: -1 input_map { key: "I" value: "MID" }
    output_map { key: "O" value: "OUT" } } ] }
"""


def test_a_name_in_several_repositories_is_served_once_per_repository() -> None:
    served = namespaces.served_names({0: {"shared", "ens"}, 1: {"shared", "elsewhere"}})
    assert served == {
        "shared@1": (0, "shared"),
        "shared@2": (1, "shared"),
        "ens": (0, "ens"),
        "elsewhere": (1, "elsewhere"),
    }
    assert namespaces.plain("shared@2") == "shared"
    assert namespaces.plain("a@b") == "a@b" and namespaces.plain("ens") == "ens"


def test_a_bare_name_of_copies_is_ambiguous_in_tritons_words() -> None:
    message = namespaces.ambiguity("shared", ["shared@1", "shared@2", "ens"])
    assert message == (
        "There are 2 identifiers of model 'shared' in global map, model namespace must be "
        "provided to resolve ambiguity."
    )
    assert namespaces.ambiguity("ens", ["shared@1", "shared@2", "ens"]) is None


def test_an_ensembles_steps_name_its_own_repositorys_copy() -> None:
    models = {0: {"shared", "ens"}, 1: {"shared", "elsewhere"}}
    text = namespaces.rewrite_config(ENSEMBLE, "ens", 0, models)
    assert text is not None
    steps = parse_config_text(text, "ens").ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["shared@1", "elsewhere"]
    # a model of one repository only, not an ensemble: nothing to rewrite
    assert namespaces.rewrite_config('name: "elsewhere"', "elsewhere", 1, models) is None
    # a copy: its name is its served name, with or without a config file
    copy = namespaces.rewrite_config('name: "shared"\nmax_batch_size: 4', "shared@2", 1, models)
    assert copy is not None and parse_config_text(copy, "shared@2").name == "shared@2"
    assert namespaces.rewrite_config(None, "shared@2", 1, models) == 'name: "shared@2"\n'
