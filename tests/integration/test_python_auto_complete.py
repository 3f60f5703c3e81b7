"""A Python model's ``auto_complete_config`` (Triton's static method on TritonPythonModel):
what it sets is the served config; what it is refused fails the model's load, in
Triton's words; ``--disable-auto-complete-config`` skips it."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer, served

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        {body}

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""
COMPLETES = """mc = auto_complete_model_config
        mc.set_max_batch_size(8)
        mc.set_dynamic_batching()
        mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        mc.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        return mc"""
MODELS = {
    "completed": ("", COMPLETES),
    "shrinks": ("max_batch_size: 16\n", COMPLETES),
    "forgets": ("", "pass"),
}


def _write(repo: Path, name: str, config: str, body: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODEL).format(body=body))
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("auto-complete")
    for name, (config, body) in MODELS.items():
        _write(repo, name, config, body)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ShoalServer]:
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        srv.wait_settled(tuple(MODELS))
        yield srv


def test_what_the_model_completes_is_its_config(server: ShoalServer) -> None:
    status, body = server.http("/v2/models/completed/config")
    assert status == 200
    config = json.loads(body)
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]  # Triton's normalizing
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("IN", "TYPE_FP32", [4])
    ]
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("IN", [2, 4], "FP32")
    x.set_data_from_numpy(np.ones((2, 4), np.float32))
    assert client.infer("completed", [x]).as_numpy("OUT").tolist() == [[1.0] * 4] * 2


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("shrinks", "configuration specified max_batch_size 16, but in auto-complete-config "
         "function for model 'shrinks' specified max_batch_size 8"),
        ("forgets", "auto_complete_config function in model 'forgets' must return a valid "
         "pb.ModelConfig object."),
    ],
)  # fmt: skip
def test_a_refused_completion_fails_the_load(server: ShoalServer, model: str, message: str) -> None:
    state = server.model_version(model)
    assert state["state"] == "UNAVAILABLE"
    assert message in state["reason"]


def test_disabled_auto_complete_leaves_the_config_as_written(repo: Path) -> None:
    with served(
        repo, "--exit-on-error=false", "--strict-readiness=false", "--disable-auto-complete-config"
    ) as srv:
        srv.wait_settled(("shrinks",))
        assert "auto-complete-config" not in srv.model_version("shrinks").get("reason", "")
