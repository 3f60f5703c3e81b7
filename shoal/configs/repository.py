"""The model repository on disk: one folder per model, numeric version folders inside.

`scan` reads a whole repository and `find` one model, returning a `ModelEntry` per model
with its completed and validated config and the versions its version policy selects.
A bad model never raises: its problem is recorded in `entry.error` (Triton's wording)
so the server can report it as UNAVAILABLE and keep serving the others. Only
filesystem reads happen here; nothing is loaded or executed.

Layout: <repo>/<model>/[config.pbtxt] [configs/<name>.pbtxt] <version>/<model file>.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.devices import cpu_only_backends
from shoal.configs.model_config import fill_defaults, parse_config_text, validate, validate_io
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import (
    DEFAULT_MODEL_FILENAME,
    ENSEMBLE_PLATFORM,
    KNOWN_BACKENDS,
    NON_VERSION_DIRS,
    PYTHON_BACKEND,
    ConfigError,
)
from shoal.configs.spec_reader import read_spec

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"

# Model files that identify a platform, in the order Triton's server-side autofill
# checks them, with the (platform, backend) each implies.
_MODEL_FILES: tuple[tuple[str, str, str], ...] = (
    ("model.savedmodel", "tensorflow_savedmodel", "tensorflow"),
    ("model.graphdef", "tensorflow_graphdef", "tensorflow"),
    ("model.plan", "tensorrt_plan", ""),
    ("model.onnx", "onnxruntime_onnx", ""),
    ("model.xml", "", "openvino"),
    ("model.pt", "pytorch_libtorch", ""),
    ("model.pt2", "torch_aoti", "pytorch"),
    ("model.py", "", PYTHON_BACKEND),
)


@dataclass
class ModelEntry:
    """One model directory as found on disk.

    `error` set means the model cannot be loaded; `config` is then whatever could be
    parsed (possibly None). `versions` are the version numbers the version policy
    selects, ascending; `available_versions` every valid version folder.
    `config_path` is the file the config came from, None when it was generated.
    """

    name: str
    path: Path
    config: pb.ModelConfig | None
    error: str | None = None
    versions: list[int] = field(default_factory=list)
    available_versions: list[int] = field(default_factory=list)
    config_path: Path | None = None

    # (config, its spec): read once per config object (the broker asks for it on every load)
    _read: tuple[pb.ModelConfig, ModelSpec] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def spec(self) -> ModelSpec | None:
        """The config as the roles read it (None without one). Read once for each config
        object ``config`` holds: complete that config before asking (``load_entry`` does)."""
        if self.config is None:
            return None
        if self._read is None or self._read[0] is not self.config:
            self._read = (self.config, read_spec(self.config))
        return self._read[1]

    def config_bytes(self) -> bytes:
        """The config, serialized (b"" without one), as the broker hands it on."""
        return self.config.SerializeToString() if self.config is not None else b""

    def model_file(self, version: int) -> Path:
        """<model>/<version>/<default_model_filename>, or the version folder if none."""
        filename = self.config.default_model_filename if self.config is not None else ""
        version_dir = self.path / str(version)
        return version_dir / filename if filename else version_dir


def check_model_name(name: str) -> None:
    """Raise ConfigError unless `name` can be a model directory and a URL path segment.
    As Triton's core: a "/" or the name ".." is path traversal; a backslash is a name's
    character on Linux (Triton's Python backend refuses it in its own check, as shoal's
    does: shoal/workers/python_backend.py). "." and NUL are refused too, as no directory."""
    if not name:
        raise ConfigError(name, "Model name cannot be empty. Please enter a valid name to deploy.")
    if "/" in name or "\x00" in name or name in (".", ".."):
        raise ConfigError(name, "model name must not contain path traversal characters")


def scan(
    repo: Path,
    *,
    model_config_name: str = "",
    autocomplete_enabled: bool = True,
    gpu_count: int = 0,
) -> list[ModelEntry]:
    """Every model of `repo`, sorted by name. Raises OSError only if `repo` is unreadable.

    Each sub-directory is a model (hidden ones are skipped); plain files are ignored.
    With `autocomplete_enabled` the input/output rules are not checked here: the
    caller runs the backend's auto-complete and then `validate_io`.
    """
    entries = []
    for child in sorted(repo.iterdir()):
        if not child.is_dir():
            continue
        if child.name.startswith("."):
            log.debug("ignore hidden directory '%s' in model repository %s", child.name, repo)
            continue
        entries.append(
            load_entry(
                child,
                model_config_name=model_config_name,
                autocomplete_enabled=autocomplete_enabled,
                gpu_count=gpu_count,
            )
        )
    return entries


def model_dirs(repo: Path) -> list[str]:
    """The names of ``repo``'s models (its sub-directories, hidden ones skipped), sorted.
    Raises OSError if ``repo`` cannot be read."""
    return sorted(c.name for c in repo.iterdir() if c.is_dir() and not c.name.startswith("."))


def find(
    repo: Path,
    name: str,
    *,
    model_config_name: str = "",
    autocomplete_enabled: bool = True,
    gpu_count: int = 0,
    config_override: pb.ModelConfig | None = None,
) -> ModelEntry | None:
    """The model `name` of `repo`, or None if it has no directory there.

    Raises ConfigError for a name that is not a valid model name (path traversal).
    `config_override` (e.g. from the load API) replaces the config file.
    """
    check_model_name(name)
    model_dir = repo / name
    if not model_dir.is_dir():
        return None
    return load_entry(
        model_dir,
        model_config_name=model_config_name,
        autocomplete_enabled=autocomplete_enabled,
        gpu_count=gpu_count,
        config_override=config_override,
    )


def load_entry(
    model_dir: Path,
    *,
    model_config_name: str = "",
    autocomplete_enabled: bool = True,
    gpu_count: int = 0,
    config_override: pb.ModelConfig | None = None,
) -> ModelEntry:
    """Read, complete and validate the model in `model_dir`. Never raises ConfigError."""
    name = model_dir.name
    entry = ModelEntry(name, model_dir, None)
    try:
        check_model_name(name)
        entry.available_versions = version_dirs(model_dir)
        if config_override is not None:
            config = pb.ModelConfig()
            config.CopyFrom(config_override)
        else:
            config, entry.config_path = _read_config(
                model_dir, model_config_name, autocomplete_enabled
            )
        entry.config = config
        if not config.platform and not config.backend and not config.default_model_filename:
            _detect_platform(config, model_dir, entry.available_versions)
            if autocomplete_enabled and not config.backend and not config.platform:
                _backend_from_name(config, name)
        fill_defaults(config, name, gpu_count=gpu_count, cpu_only_backends=cpu_only_backends())
        check_runtime(config, model_dir, entry.available_versions)
        validate(config, name, gpu_count=gpu_count, check_io=not autocomplete_enabled)
        _refuse_unsupported(config, name)
        entry.versions = select_versions(config, entry.available_versions, name)
    except ConfigError as err:
        entry.error = err.message
    except OSError as err:
        entry.error = f"failed to load '{name}': {err}"
    return entry


def check_runtime(config: pb.ModelConfig, model_dir: Path, versions: list[int]) -> None:
    """The config's ``runtime`` (a backend library's file name), as core's
    GetBackendLibraryProperties finds it: the library of a backend shoal serves
    (``libtriton_<backend>.so``) or a Python-based backend's ``model.py`` pass; any other
    is looked for in the (latest) version folder, then the model's folder: found there,
    it must not escape that folder (and shoal runs no C++ backend library); not found,
    it is refused as Triton refuses it."""
    runtime, name = config.runtime, config.name
    if not runtime or runtime == DEFAULT_MODEL_FILENAME[PYTHON_BACKEND]:
        return
    if runtime in {f"libtriton_{b}.so" for b in KNOWN_BACKENDS}:
        return
    folders = [model_dir / str(max(versions))] if versions else []
    folders.append(model_dir)
    for folder in folders:
        if not (folder / runtime).is_file():
            continue
        inside = os.path.normpath(folder / runtime).startswith(os.path.normpath(folder) + os.sep)
        if not inside:
            raise ConfigError(
                name,
                f"backend library name '{runtime}' escapes backend directory '{folder}', "
                f"for model '{name}', check model config runtime field",
            )
        raise ConfigError(
            name, f"backend library '{runtime}' of model '{name}': shoal runs no C++ backend"
        )
    searched = "".join(f"'{folder}' " for folder in folders)
    raise ConfigError(
        name, f"unable to find backend library '{runtime}' for model '{name}', searched: {searched}"
    )


def _refuse_unsupported(config: pb.ModelConfig, name: str) -> None:
    """Valid configs that shoal cannot serve yet fail their load saying so, rather than
    being served as something else."""
    if config.platform == ENSEMBLE_PLATFORM:
        validate_io(config)  # no worker completes an ensemble's config: it must be whole
    # (an ensemble's flag is its steps': the broker sets it once they have loaded)
    if config.model_transaction_policy.decoupled and config.platform != ENSEMBLE_PLATFORM:
        # A decoupled model answers a request with any number of responses, through the
        # response senders of Python models (shoal/workers/python_backend.py).
        what = ""
        if config.backend != PYTHON_BACKEND:
            what = f"backend '{config.backend or config.platform}'"
        elif config.dynamic_batching.preserve_ordering:
            what = "dynamic_batching.preserve_ordering"
        elif (
            config.HasField("sequence_batching")
            and not config.sequence_batching.HasField("oldest")
            and not config.sequence_batching.iterative_sequence  # (batched as Oldest)
        ):
            # (a Direct batch's null rows would need requests whose answers go nowhere)
            what = "sequence_batching with the Direct strategy"
        if what:
            raise ConfigError(
                name,
                f"failed to load '{name}': decoupled models are supported for Python models "
                "only, without preserve_ordering or Direct sequence batching (this one has "
                f"{what})",
            )
    if config.sequence_batching.iterative_sequence and config.backend != PYTHON_BACKEND:
        # (a request runs again while its model reschedules it: Python models only)
        raise ConfigError(
            name,
            f"failed to load '{name}': iterative sequence batching is supported for Python "
            "models only",
        )


def config_file(model_dir: Path, model_config_name: str = "") -> Path:
    """The file a model's config is read from (it may not exist: auto-complete)."""
    if model_config_name:
        custom = model_dir / "configs" / f"{model_config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILE


def _read_config(
    model_dir: Path, model_config_name: str, autocomplete_enabled: bool
) -> tuple[pb.ModelConfig, Path | None]:
    name = model_dir.name
    path = config_file(model_dir, model_config_name)
    if not path.is_file():
        if not autocomplete_enabled:
            raise ConfigError(
                name,
                f"failed to load '{name}': model configuration file '{path}' not found "
                "and auto-complete is disabled",
            )
        return pb.ModelConfig(name=name), None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(name, f"failed to load '{name}': {path}: {err}") from None
    return parse_config_text(text, name), path


def _detect_platform(config: pb.ModelConfig, model_dir: Path, versions: list[int]) -> None:
    """Set platform/backend from the model file found in the lowest version folder."""
    for version in versions:
        version_dir = model_dir / str(version)
        for filename, platform, backend in _MODEL_FILES:
            candidate = version_dir / filename
            # An ONNX model may be a directory (external data), a SavedModel is one; the
            # others are files.
            if filename == "model.savedmodel":
                found = candidate.is_dir()
            else:
                found = candidate.is_file() or (filename == "model.onnx" and candidate.is_dir())
            if found:
                config.platform, config.backend = platform, backend
                return


def _backend_from_name(config: pb.ModelConfig, name: str) -> None:
    """Core's last resort (AutoCompleteBackendFields, a custom backend): a model named
    ``<x>.<backend>`` with nothing in its config or folder to say its backend has that
    one, and the file ``model.<backend>``; any other name is refused."""
    if "." not in name:
        raise ConfigError(
            name,
            f"Invalid model name: Could not determine backend for model '{name}' with no "
            "backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'.",
        )
    backend = name.split(".", 1)[1]
    config.backend = backend
    config.default_model_filename = f"model.{backend}"


def version_dirs(model_dir: Path) -> list[int]:
    """Valid version folder numbers of a model, ascending.

    A version folder name is all digits without a leading zero ("0" itself is valid);
    other folders are skipped with Triton's warning.
    """
    versions = []
    for child in model_dir.iterdir():
        if not child.is_dir() or child.name in NON_VERSION_DIRS:
            continue
        sub = child.name
        if len(sub) > 1 and sub.startswith("0"):
            log.warning(
                "ignore version directory '%s' which contains leading zeros in its directory name",
                sub,
            )
        elif not (sub.isascii() and sub.isdigit()):
            log.warning(
                "ignore version directory '%s' which fails to convert to integral number", sub
            )
        else:
            versions.append(int(sub))
    return sorted(versions)


def select_versions(config: pb.ModelConfig, available: list[int], name: str) -> list[int]:
    """The versions `config.version_policy` selects among `available`, ascending.

    latest{n}: the n highest; all: every one; specific: those listed that exist (a
    missing one is logged). Raises ConfigError when the selection is empty.
    """
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "specific":
        selected = set()
        for v in policy.specific.versions:
            if v in available:
                selected.add(v)
            else:
                log.error(
                    "version %d is specified for model '%s', but the version directory "
                    "is not present",
                    v,
                    name,
                )
        versions = sorted(selected)
    elif choice == "all":
        versions = sorted(available)
    else:
        count = policy.latest.num_versions if choice == "latest" else 1
        versions = sorted(sorted(available, reverse=True)[: max(count, 0)])
    if not versions:
        raise ConfigError(
            name,
            f"at least one version must be available under the version policy of model '{name}'",
        )
    return versions
