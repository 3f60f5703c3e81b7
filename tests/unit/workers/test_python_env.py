"""EXECUTION_ENV_PATH (shoal/workers/python_env.py): the parameter read from a config, a
tarball unpacked once into its cache, what cannot be used refused with the reason."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from shoal.configs.schema import ConfigError
from shoal.workers import python_env as pe


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _model(tmp_path: Path, parameters: str, backend: str = "python") -> Path:
    model = tmp_path / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(f'name: "m"\nbackend: "{backend}"\n{parameters}\n')
    return model


def test_the_parameter_is_read_with_the_model_directory_replaced(tmp_path: Path) -> None:
    value = '{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }'
    model = _model(tmp_path, f'parameters {{ key: "EXECUTION_ENV_PATH" value: {value} }}')
    assert pe.requested(model, None) == f"{model}/env.tar.gz"
    assert pe.requested(_model(tmp_path / "x", ""), None) == ""
    other = (
        f'platform: "onnxruntime_onnx"\nparameters {{ key: "EXECUTION_ENV_PATH" value: {value} }}'
    )
    assert pe.requested(_model(tmp_path / "y", other, backend=""), None) == ""


def test_a_model_that_asks_for_an_environment_never_loads_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = '{ string_value: "/envs/py.tar.gz" }'
    model = _model(tmp_path, f'parameters {{ key: "EXECUTION_ENV_PATH" value: {value} }}')
    monkeypatch.delenv(pe.INSIDE, raising=False)
    with pytest.raises(ConfigError, match="the worker does not run in it"):
        pe.check("m", model, None)
    monkeypatch.setenv(pe.INSIDE, "/envs/py.tar.gz")
    pe.check("m", model, None)


def test_a_tarball_is_unpacked_once_per_content(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _tarball(tmp_path / "a.tar.gz", {"bin/python3": b"", "lib/x.py": b"X = 1\n"})
    env = pe.prepare(str(first), cache)
    assert (env / "lib" / "x.py").read_text() == "X = 1\n" and env.parent == cache
    (env / "lib" / "x.py").write_text("X = 2\n")  # (a second unpacking would undo this)
    copy = tmp_path / "b.tar.gz"
    copy.write_bytes(first.read_bytes())
    assert pe.prepare(str(copy), cache) == env
    assert (env / "lib" / "x.py").read_text() == "X = 2\n"
    assert [p.name for p in cache.iterdir()] == [env.name]  # nothing left aside
    assert pe.prepare(str(env), cache) == env  # a folder is used as it is


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("missing.tar.gz", None, "no such file or directory"),
        ("env.zip", b"PK", "not a .tar.gz, .tgz or .tar archive"),
        ("broken.tar.gz", b"not an archive", "cannot be unpacked"),
    ],
)
def test_what_cannot_be_unpacked_is_refused_with_why(
    tmp_path: Path, name: str, content: bytes | None, reason: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(pe.EnvError, match=reason):
        pe.prepare(str(path), tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*"))


def test_a_member_outside_the_folder_is_refused(tmp_path: Path) -> None:
    evil = _tarball(tmp_path / "evil.tar.gz", {"../../escaped.py": b"x"})
    with pytest.raises(pe.EnvError, match="cannot be unpacked"):
        pe.prepare(str(evil), tmp_path / "cache")
    assert not (tmp_path / "escaped.py").exists()


def test_an_environment_without_python_is_refused(tmp_path: Path) -> None:
    with pytest.raises(pe.EnvError, match="has no bin/python3"):
        pe.interpreter(tmp_path, "env.tar.gz")


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("echo 2.7", "its Python is 2.7, the server's is 3."),
        ("exit 1", "its Python does not run"),
    ],
)
def test_an_interpreter_of_another_version_or_that_fails_is_refused(
    tmp_path: Path, script: str, reason: str
) -> None:
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    with pytest.raises(pe.EnvError, match=reason):
        pe.interpreter(tmp_path, "env.tar.gz")


def test_the_servers_own_interpreter_is_taken(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    assert pe.interpreter(tmp_path, "env.tar.gz") == tmp_path / "bin" / "python3"
