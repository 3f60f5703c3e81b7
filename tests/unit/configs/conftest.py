"""Fixtures that build tiny model repositories under tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

MakeModel = Callable[..., Path]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def make_model(repo: Path) -> MakeModel:
    """make_model(name, config=None, versions=(1,), filename="model.onnx") -> model dir.

    Writes config.pbtxt when `config` is given and a dummy model file in each version
    folder (the bytes are never read by the config code).
    """

    def make(
        name: str,
        config: str | None = None,
        versions: Iterable[str | int] = (1,),
        filename: str = "model.onnx",
    ) -> Path:
        model_dir = repo / name
        model_dir.mkdir()
        if config is not None:
            (model_dir / "config.pbtxt").write_text(config)
        for version in versions:
            version_dir = model_dir / str(version)
            version_dir.mkdir()
            if filename:
                (version_dir / filename).write_bytes(b"not really a model")
        return model_dir

    return make
