"""A Python model's own execution environment: the config's ``EXECUTION_ENV_PATH``
parameter, as Triton's Python backend reads it.

The value is a conda-pack or venv tarball (``.tar.gz``, ``.tgz``, ``.tar``) or an
unpacked environment's folder; ``$$TRITON_MODEL_DIRECTORY`` in it is the model's folder.
A tarball is unpacked once into a cache keyed by its SHA-256 (``$SHOAL_PYTHON_ENV_CACHE``,
else ``$XDG_CACHE_HOME/shoal/python-envs``, else ``~/.cache/shoal/python-envs``): into a
folder aside, renamed into place, so instances that start together unpack it at most
once each and never see half of it. Members that would land outside the folder are
refused (tarfile's ``tar`` filter).

The worker then becomes that environment's interpreter (``enter``: the same process,
exec'd, so its pid, which the broker watches, stays), before it connects to the broker.
The environment's packages come first on ``sys.path``; shoal and what it needs, where the
environment lacks them, come from the server's site-packages after them. Its Python must
be the server's version (shoal's compiled dependencies are loaded into it), as Triton asks
of its stub's. A missing or broken environment fails the load with the reason
(``EnvError``); a model is never run in the server's Python when it asked for another.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from shoal.configs.model_config import parse_config_json, parse_config_text
from shoal.configs.repository import config_file
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
#: Set in an environment's worker: the EXECUTION_ENV_PATH it runs in.
INSIDE = "SHOAL_EXECUTION_ENV"
_PATHS = "SHOAL_SERVER_SITE_PATHS"
_TARBALLS = (".tar.gz", ".tgz", ".tar")
# Run as ``python -c BOOT -m shoal.workers <argv>``: the command line reads as any
# worker's (what ps and process finders match), and BOOT drops the two words.
_BOOT = (
    "import json, os, runpy, site, sys\n"
    f"for p in json.loads(os.environ.pop({_PATHS!r})): site.addsitedir(p)\n"
    "del sys.argv[1:3]\n"
    "runpy.run_module('shoal.workers', run_name='__main__', alter_sys=True)\n"
)


class EnvError(Exception):
    """Why the environment cannot be used (the load's failure)."""


def requested(model_dir: Path, config_override: Path | None, model_config_name: str = "") -> str:
    """The model's EXECUTION_ENV_PATH, its ``$$TRITON_MODEL_DIRECTORY`` replaced; "" when
    it sets none (or its config cannot be read: its load says why)."""
    try:
        if config_override is not None:
            config = parse_config_json(config_override.read_text(), model_dir.name)
        else:
            text = config_file(model_dir, model_config_name).read_text()
            if PARAMETER not in text:  # (most models: no parsing)
                return ""
            config = parse_config_text(text, model_dir.name)
        spec = read_spec(config)
    except Exception:
        return ""
    if spec.backend not in ("", "python") or spec.platform or PARAMETER not in spec.parameters:
        return ""
    return spec.parameters[PARAMETER].replace(MODEL_DIRECTORY, str(model_dir))


def inside() -> str:
    """The EXECUTION_ENV_PATH this process runs in ("" for the server's Python)."""
    return os.environ.get(INSIDE, "")


def cache_root() -> Path:
    if root := os.environ.get("SHOAL_PYTHON_ENV_CACHE"):
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / "python-envs"


def prepare(value: str, cache: Path) -> Path:
    """The environment's folder: ``value`` itself if it is one, else its tarball unpacked
    in ``cache`` (once). Raises EnvError."""
    path = Path(value)
    if path.is_dir():
        return path
    if not path.is_file():
        raise EnvError(f"{PARAMETER} '{value}': no such file or directory")
    if not value.endswith(_TARBALLS):
        raise EnvError(f"{PARAMETER} '{value}': not a .tar.gz, .tgz or .tar archive")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    target = cache / digest.hexdigest()
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=cache))
    try:
        with tarfile.open(path) as archive:
            archive.extractall(aside, filter="tar")
        aside.rename(target)
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(aside, ignore_errors=True)
        if target.is_dir():  # another instance unpacked it first
            return target
        raise EnvError(f"{PARAMETER} '{value}' cannot be unpacked: {exc}") from exc
    return target


def interpreter(env: Path, value: str) -> Path:
    """The environment's Python, checked to run and to be the server's version."""
    python = next(
        (p for p in (env / "bin" / "python3", env / "bin" / "python") if p.exists()), None
    )
    if python is None:
        raise EnvError(f"{PARAMETER} '{value}' has no bin/python3: not a Python environment")
    try:
        ran = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvError(f"{PARAMETER} '{value}': its Python does not run: {exc}") from exc
    theirs, ours = ran.stdout.strip(), f"{sys.version_info[0]}.{sys.version_info[1]}"
    if theirs != ours:
        raise EnvError(
            f"{PARAMETER} '{value}': its Python is {theirs}, the server's is {ours}: they "
            "must be the same"
        )
    return python


def check(model: str, model_dir: Path, config_override: Path | None, name: str = "") -> None:
    """Raise ConfigError if the model asks for an environment this process is not."""
    value = requested(model_dir, config_override, name)
    if value and inside() != value:
        raise ConfigError(model, f"{PARAMETER} '{value}': the worker does not run in it")


def enter(value: str, env: Path, python: Path, argv: list[str]) -> None:
    """Become the worker ``argv`` names in ``env``'s interpreter (does not return)."""
    paths = site.getsitepackages()  # (a venv's own: its .pth files make shoal importable)
    variables = dict(os.environ)
    variables[INSIDE] = value
    variables[_PATHS] = json.dumps(paths)
    variables["PATH"] = f"{env / 'bin'}{os.pathsep}{variables.get('PATH', '')}"
    variables["VIRTUAL_ENV" if (env / "pyvenv.cfg").exists() else "CONDA_PREFIX"] = str(env)
    variables.pop("PYTHONHOME", None)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(python, [str(python), "-c", _BOOT, "-m", "shoal.workers", *argv], variables)
