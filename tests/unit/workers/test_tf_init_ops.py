"""TF_INIT_OPS_FILE: where its file is found, its errors, and a GraphDef (or a TensorFlow 1
SavedModel) whose init ops did or did not run, on TensorFlowBackend in this process (the
served case: tests/integration/test_tf_backend.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.configs.tf_params import init_ops
from shoal.ipc.errors import Code, ServingError

tf_backend = pytest.importorskip("shoal.workers.tf_backend")
tfgen = pytest.importorskip("tools.tfgen")


def _version(tmp_path: Path) -> Path:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    return version


def test_the_version_folder_wins_over_the_model_folder(tmp_path: Path) -> None:
    version = _version(tmp_path)
    (version.parent / "ops.json").write_text(json.dumps({"init_ops": ["in_model"]}))
    assert init_ops(version / "model.graphdef", "ops.json", "m") == ["in_model"]
    (version / "ops.json").write_text(json.dumps({"init_ops": ["a", "b"]}))
    assert init_ops(version / "model.graphdef", "ops.json", "m") == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "failed to open text file for read "),
        ("{", "TF_INIT_OPS_FILE "),
        ('{"ops": []}', "no 'init_ops' member"),
        ('{"init_ops": [1]}', "'init_ops' must be a list of op names"),
    ],
)
def test_a_bad_init_ops_file(tmp_path: Path, text: str | None, message: str) -> None:
    version = _version(tmp_path)
    if text is not None:
        (version / "ops.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        init_ops(version / "model.graphdef", "ops.json", "m")


def _load(tmp_path: Path, ops: list[str] | None) -> object:
    version = _version(tmp_path)
    (version / "model.graphdef").write_bytes(tfgen.scaled_graph(3.0))
    params = ""
    if ops is not None:
        (version / "ops.json").write_text(json.dumps({"init_ops": ops}))
        params = 'parameters { key: "TF_INIT_OPS_FILE" value { string_value: "ops.json" } }\n'
    config = parse_config_text(
        'name: "m"\nplatform: "tensorflow_graphdef"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + params,
        "m",
    )
    backend = tf_backend.TensorFlowBackend()
    backend.load(version / "model.graphdef", read_spec(config), 1, False)
    return backend


def test_init_ops_run_once_at_load(tmp_path: Path) -> None:
    backend = _load(tmp_path, ["init"])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):
        (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"])  # type: ignore[attr-defined]
        np.testing.assert_array_equal(out, x * 3)


def test_without_its_init_ops_a_graph_fails_each_request(tmp_path: Path) -> None:
    backend = _load(tmp_path, None)
    with pytest.raises(ServingError) as err:
        backend.execute({"INPUT0": np.ones((1, 4), np.float32)}, ["OUTPUT0"])  # type: ignore[attr-defined]
    assert err.value.code == Code.INTERNAL
    assert "uninitialized" in err.value.message.lower(), err.value.message


def test_an_init_op_the_graph_lacks_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unable to run init op 'nope': .*not in the graph"):
        _load(tmp_path, ["nope"])


def _load_saved(tmp_path: Path, folder: Path, ops: list[str]) -> object:
    version = folder.parent
    (version / "ops.json").write_text(json.dumps({"init_ops": ops}))
    config = parse_config_text(
        'name: "m"\nplatform: "tensorflow_savedmodel"\n'
        'parameters { key: "TF_INIT_OPS_FILE" value { string_value: "ops.json" } }\n',
        "m",
    )
    backend = tf_backend.TensorFlowBackend()
    backend.load(folder, read_spec(config), 1, False)
    return backend


def test_a_tf1_savedmodel_runs_its_init_ops(tmp_path: Path) -> None:
    folder = tfgen.save_v1_scaled(_version(tmp_path) / "model.savedmodel")
    backend = _load_saved(tmp_path, folder, ["set_five"])
    x = np.ones((2, 4), dtype=np.float32)
    (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(out, x * 5)  # saved at 1, set to 5 by the init op


def test_a_tf2_savedmodel_refuses_init_ops(tmp_path: Path) -> None:
    folder = tfgen.save_add_sub(_version(tmp_path) / "model.savedmodel")
    with pytest.raises(ConfigError, match="a TensorFlow 2 SavedModel has none to run"):
        _load_saved(tmp_path, folder, ["init"])
