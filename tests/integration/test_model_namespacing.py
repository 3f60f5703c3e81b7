"""``--model-namespacing=true`` (Triton's, checked as its L0_model_namespacing does): each
repository is a namespace; the same model name may be in two; an ensemble's steps use its
own repository's model; a request that names a duplicated model alone is refused for its
ambiguity, and shoal serves each copy under ``<name>@<n>`` (the n-th repository)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import free_port, served
from tools import modelgen

# Python's composing model of the second repository: OUTPUT0 = INPUT0 - INPUT1 (the
# first repository's, Triton's simple: OUTPUT0 = INPUT0 + INPUT1)
SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a - b)]))
        return out
"""
SUB_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def _ensemble(name: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "composing_model" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }} ] }}
"""


def _repos(tmp_path: Path) -> tuple[Path, Path]:
    """addsub/: simple_addsub -> composing_model (a + b); subadd/: simple_subadd ->
    composing_model (a - b)."""
    addsub, subadd = tmp_path / "addsub", tmp_path / "subadd"
    config = modelgen.SIMPLE_CONFIG.replace('name: "simple"', 'name: "composing_model"')
    modelgen.write_model(addsub, "composing_model", modelgen.simple_model(), config)
    (subadd / "composing_model" / "1").mkdir(parents=True)
    (subadd / "composing_model" / "1" / "model.py").write_text(SUB)
    (subadd / "composing_model" / "config.pbtxt").write_text(SUB_CONFIG)
    for repo, name in ((addsub, "simple_addsub"), (subadd, "simple_subadd")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_ensemble(name))
    return addsub, subadd


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    return client.infer(model, inputs).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def _until(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except InferenceServerException:
            pass
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_each_ensemble_uses_its_own_repositorys_model_and_a_bare_name_is_ambiguous(
    tmp_path: Path,
) -> None:
    addsub, subadd = _repos(tmp_path)
    args = (f"--model-repository={subadd}", "--model-namespacing=true",
            "--model-control-mode=poll", "--repository-poll-secs=0.3")  # fmt: skip
    with served(addsub, *args) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        assert client.is_server_ready()
        np.testing.assert_array_equal(_infer(client, "simple_addsub"), A + B)
        np.testing.assert_array_equal(_infer(client, "simple_subadd"), A - B)
        with pytest.raises(InferenceServerException, match="ambiguity") as e:
            _infer(client, "composing_model")
        assert e.value.message() == (
            "There are 2 identifiers of model 'composing_model' in global map, model "
            "namespace must be provided to resolve ambiguity."
        )
        # shoal's own: each copy by its repository
        np.testing.assert_array_equal(_infer(client, "composing_model@1"), A + B)
        np.testing.assert_array_equal(_infer(client, "composing_model@2"), A - B)
        names = {e["name"] for e in client.get_model_repository_index()}
        assert names == {"composing_model@1", "composing_model@2", "simple_addsub", "simple_subadd"}
        # Triton's dynamic resolution: the first repository's copy goes, and both
        # ensembles use the one left; back, each uses its own again
        shutil.move(addsub / "composing_model", tmp_path / "aside")
        _until(lambda: (_infer(client, "simple_addsub") == A - B).all())
        np.testing.assert_array_equal(_infer(client, "composing_model"), A - B)
        shutil.move(tmp_path / "aside", addsub / "composing_model")
        _until(lambda: (_infer(client, "simple_addsub") == A + B).all())
        _until(lambda: (_infer(client, "simple_subadd") == A - B).all())  # (reloaded too)
        with pytest.raises(InferenceServerException, match="ambiguity"):
            _infer(client, "composing_model")


def test_explicit_mode_loads_an_ensemble_with_its_own_repositorys_model(tmp_path: Path) -> None:
    addsub, subadd = _repos(tmp_path)
    args = (f"--model-repository={subadd}", "--model-namespacing=true",
            "--model-control-mode=explicit")  # fmt: skip
    with served(addsub, *args) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        for model in ("simple_addsub", "simple_subadd"):
            client.load_model(model)  # its composing model loads with it
        np.testing.assert_array_equal(_infer(client, "simple_addsub"), A + B)
        np.testing.assert_array_equal(_infer(client, "simple_subadd"), A - B)
        with pytest.raises(InferenceServerException, match="ambiguity"):
            _infer(client, "composing_model")


def test_without_namespacing_the_same_repositories_stop_the_start(tmp_path: Path) -> None:
    addsub, subadd = _repos(tmp_path)
    argv = [sys.executable, "-m", "shoal", "serve",
            f"--model-repository={addsub}", f"--model-repository={subadd}",
            f"--http-port={free_port()}", f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}", f"--runtime-dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "'composing_model': not unique across all model repositories" in done.stderr
