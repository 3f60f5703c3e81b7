"""Triton's model_warmup through a real server: each instance runs its samples before it
is ready, the statistics do not count them, and a sample that cannot run fails that
model's load alone, with Triton's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import identity_config
from tests.serverctl import ShoalServer, settled_server
from tools import modelgen

ZERO = "data_type: TYPE_INT32 dims: [ 16 ] zero_data: true"


def _simple(repo: Path, name: str, warmups: str, extra: str = "") -> None:
    config = modelgen.SIMPLE_CONFIG.replace('name: "simple"', f'name: "{name}"')
    modelgen.write_model(repo, name, modelgen.simple_model(), config + warmups + extra)


def _sample(name: str, batch_size: int, count: int, in0: str = ZERO) -> str:
    return (
        f'model_warmup {{ name: "{name}" batch_size: {batch_size} count: {count} '
        f'inputs {{ key: "INPUT0" value: {{ {in0} }} }} '
        f'inputs {{ key: "INPUT1" value: {{ {ZERO} }} }} }}\n'
    )


MODELS = ("warm", "warm_bytes", "too_big", "no_file")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("warmup-repo")
    from_file = "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'input0'"
    _simple(
        repo, "warm",
        _sample("zeros", 4, 2) + _sample("from_file", 1, 1, from_file),
        # two instances warm up; a passive one does not (Triton warms only the others)
        "instance_group [ { count: 2 kind: KIND_CPU }, "
        "{ count: 1 kind: KIND_CPU passive: true } ]\n",
    )  # fmt: skip
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "input0").write_bytes(np.arange(16, dtype="<i4").tobytes())
    modelgen.write_model(
        repo, "warm_bytes", modelgen.identity_model("BYTES", [-1], batch=True),
        identity_config("warm_bytes", "BYTES", "[ -1 ]", 8)
        + 'model_warmup { name: "empty" batch_size: 3 inputs { key: "INPUT0" '
        "value: { data_type: TYPE_STRING dims: [ 5 ] random_data: true } } }\n",
    )  # fmt: skip
    _simple(repo, "too_big", _sample("big", 16, 1))
    missing = "data_type: TYPE_INT32 dims: [ 16 ] input_data_file: 'nowhere'"
    _simple(repo, "no_file", _sample("lost", 1, 1, missing))
    with settled_server(repo, MODELS) as srv:
        yield srv


def test_every_active_instance_warms_up_before_it_is_ready(server: ShoalServer) -> None:
    log = server.log()
    for instance in (0, 1):
        assert f"instance {instance} warmed up with sample 'zeros' (batch 4, 2 time(s))" in log
        assert f"instance {instance} warmed up with sample 'from_file' (batch 1, 1 time(s))" in log
    assert "instance 2 warmed up" not in log  # the passive one
    assert "warmed up with sample 'empty' (batch 3, 1 time(s))" in log
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("warm") and client.is_model_ready("warm_bytes")


def test_warmup_is_not_in_the_statistics_and_requests_run_as_usual(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    (stats,) = client.get_inference_statistics("warm_bytes")["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (0, 0)
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.full((1, 16), 3, dtype=np.int32))
    np.testing.assert_array_equal(
        client.infer("warm", ins).as_numpy("OUTPUT0"), np.full((1, 16), 6)
    )
    text = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([[b"a", b"bc"]], dtype=object))
    assert client.infer("warm_bytes", [text]).as_numpy("OUTPUT0").tolist() == [[b"a", b"bc"]]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "too_big",
            "failed to load 'too_big' version 1: failed to run warmup sample 'big': "
            "batch size 16 for 'too_big', max allowed is 8; ",
        ),
        (
            "no_file",
            "failed to load 'no_file' version 1: failed to read warmup data for input "
            "'INPUT0' from warmup/nowhere: No such file or directory",
        ),
    ],
)
def test_a_warmup_that_cannot_run_fails_that_models_load_alone(
    server: ShoalServer, model: str, reason: str
) -> None:
    version = server.model_version(model)
    assert (version["state"], version["reason"]) == ("UNAVAILABLE", reason)
    client = httpclient.InferenceServerClient(server.url)
    assert not client.is_model_ready(model)
    assert client.is_model_ready("warm")
    status, body = server.http("/v2/repository/index", b"{}")
    states = {m["name"]: m["state"] for m in json.loads(body)}
    assert status == 200 and states[model] == "UNAVAILABLE" and states["warm"] == "READY"
