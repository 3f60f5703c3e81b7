"""A Python model whose name (or instance name) holds a character Triton's Python backend
refuses in a stub's name fails to load, in Triton's words; others load."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.workers.python_backend import PythonBackend

MODEL = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def _model(tmp_path: Path, name: str) -> tuple[Path, pb.ModelConfig]:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(MODEL)
    return tmp_path / "1" / "model.py", pb.ModelConfig(name=name, backend="python")


@pytest.mark.parametrize("name", ["model;test", "model$test", "model`x`", "model\\test", "a'b"])
def test_a_name_with_shell_characters_is_refused(tmp_path: Path, name: str) -> None:
    model_file, config = _model(tmp_path, name)
    backend = PythonBackend()
    with pytest.raises(ConfigError, match="Invalid stub name: contains invalid characters"):
        backend.auto_complete(model_file, config)
    backend.instance_name = f"{name}_0"
    with pytest.raises(ConfigError, match="Invalid stub name: contains invalid characters"):
        backend.load(model_file, read_spec(config), 1, False)


@pytest.mark.parametrize("name", ["TestModel123", "model-with-hyphens", "model_with_underscores"])
def test_other_names_load(tmp_path: Path, name: str) -> None:
    model_file, config = _model(tmp_path, name)
    backend = PythonBackend()
    backend.instance_name = f"{name}_0"
    backend.load(model_file, read_spec(config), 1, False)
