"""Scanning model repositories: configs, auto-detected platforms, versions, errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_config import ConfigError, parse_config_json
from shoal.configs.repository import ModelEntry, check_model_name, find, scan, select_versions

from .conftest import MakeModel

ONNX_CONFIG = 'platform: "onnxruntime_onnx" max_batch_size: 8'


def test_scan_reads_configs_and_defaults(repo: Path, make_model: MakeModel) -> None:
    make_model("simple", ONNX_CONFIG, versions=(1, 2, 3))
    (repo / "README.md").write_text("not a model")
    (entry,) = scan(repo)
    assert entry.error is None
    assert entry.name == "simple"
    assert entry.config is not None and entry.config.name == "simple"
    assert entry.config.backend == "onnxruntime"
    assert entry.versions == [3]  # latest { num_versions: 1 }
    assert entry.available_versions == [1, 2, 3]
    assert entry.config_path == repo / "simple" / "config.pbtxt"
    assert entry.model_file(3) == repo / "simple" / "3" / "model.onnx"
    # the roles' view of it, read from the completed config; and the bytes handed on
    spec = entry.spec
    assert spec is not None and spec.name == "simple" and spec.backend == "onnxruntime"
    assert spec.version_policy.num_versions == 1 and spec.instance_groups[0].kind == "KIND_CPU"
    assert pb.ModelConfig.FromString(entry.config_bytes()) == entry.config
    assert entry.spec is spec  # read once for this config
    entry.config = pb.ModelConfig(name="other")
    assert entry.spec is not None and entry.spec.name == "other"  # a new config, read anew


def test_an_entry_without_a_config_has_no_spec(repo: Path) -> None:
    entry = ModelEntry("bare", repo / "bare", None, error="no config")
    assert entry.spec is None and entry.config_bytes() == b""


@pytest.mark.parametrize(
    ("filename", "platform", "backend"),
    [
        ("model.onnx", "onnxruntime_onnx", "onnxruntime"),
        ("model.plan", "tensorrt_plan", "tensorrt"),
        ("model.pt", "pytorch_libtorch", "pytorch"),
        ("model.py", "", "python"),
    ],
)
def test_missing_config_is_autodetected(
    repo: Path, make_model: MakeModel, filename: str, platform: str, backend: str
) -> None:
    make_model("auto", versions=(1,), filename=filename)
    (entry,) = scan(repo)
    assert entry.error is None
    assert entry.config is not None
    assert (entry.config.platform, entry.config.backend) == (platform, backend)
    assert entry.config.default_model_filename == filename
    assert entry.config_path is None
    assert entry.model_file(1).name == filename


def test_onnx_model_directory_is_detected(repo: Path, make_model: MakeModel) -> None:
    model_dir = make_model("big", versions=(1,), filename="")
    (model_dir / "1" / "model.onnx").mkdir()
    (entry,) = scan(repo)
    assert entry.config is not None and entry.config.platform == "onnxruntime_onnx"


def test_missing_config_without_autocomplete_is_an_error(repo: Path, make_model: MakeModel) -> None:
    make_model("auto")
    (entry,) = scan(repo, autocomplete_enabled=False)
    assert entry.error is not None
    assert "failed to load 'auto'" in entry.error and "config.pbtxt" in entry.error


def test_unknown_model_file_gives_clear_error(repo: Path, make_model: MakeModel) -> None:
    make_model("odd", filename="model.savedmodel")
    (entry,) = scan(repo)
    assert entry.error == (
        "Invalid model name: Could not determine backend for model 'odd' with no backend in "
        "model configuration. Expected model name of the form 'model.<backend_name>'."
    )


def test_a_model_named_for_its_backend_gets_that_backend(repo: Path, make_model: MakeModel) -> None:
    """Core's custom-backend rule: "model.identity" is the identity backend's (built in:
    shoal/workers/identity_backend.py); "model.nosuch" names a backend shoal has not."""
    make_model("model.identity", filename="")
    make_model("model.nosuch", filename="")
    identity, nosuch = scan(repo)
    assert identity.config is not None and identity.config.backend == "identity"
    assert identity.config.default_model_filename == "model.identity"
    assert identity.error is None
    assert nosuch.config is not None and nosuch.config.backend == "nosuch"
    assert nosuch.error is not None and "backend 'nosuch'" in nosuch.error


def test_bad_models_do_not_stop_the_scan(repo: Path, make_model: MakeModel) -> None:
    make_model("a_good", ONNX_CONFIG)
    make_model("b_parse", "max_batch_size: ")
    make_model("c_name", 'name: "other" ' + ONNX_CONFIG)
    make_model("d_noversion", ONNX_CONFIG, versions=())
    make_model("e_gpu", ONNX_CONFIG + " instance_group [ { kind: KIND_GPU gpus: [ 3 ] } ]")
    entries = {e.name: e for e in scan(repo, gpu_count=1)}
    assert entries["a_good"].error is None
    assert (entries["b_parse"].error or "").startswith("failed to load 'b_parse': ")
    assert entries["c_name"].error == (
        "unexpected directory name 'c_name' for model 'other', directory name must equal model name"
    )
    assert entries["d_noversion"].error == (
        "at least one version must be available under the version policy of model 'd_noversion'"
    )
    assert "specifies invalid or unsupported gpu id 3" in (entries["e_gpu"].error or "")


def test_io_rules_deferred_only_with_autocomplete(repo: Path, make_model: MakeModel) -> None:
    make_model("partial", ONNX_CONFIG + ' input [ { name: "INPUT0" } ]')
    (entry,) = scan(repo)
    assert entry.error is None
    (strict,) = scan(repo, autocomplete_enabled=False)
    assert strict.error == "model input 'INPUT0' must specify 'data_type' for partial"


def test_model_config_name_selects_alternate_config(repo: Path, make_model: MakeModel) -> None:
    model_dir = make_model("simple", ONNX_CONFIG)
    (model_dir / "configs").mkdir()
    (model_dir / "configs" / "h100.pbtxt").write_text(
        'platform: "onnxruntime_onnx" max_batch_size: 64'
    )
    (entry,) = scan(repo, model_config_name="h100")
    assert entry.config is not None and entry.config.max_batch_size == 64
    (fallback,) = scan(repo, model_config_name="a100")
    assert fallback.config is not None and fallback.config.max_batch_size == 8


def test_version_dirs_filtering(
    repo: Path, make_model: MakeModel, caplog: pytest.LogCaptureFixture
) -> None:
    make_model(
        "v",
        ONNX_CONFIG + " version_policy { all { } }",
        versions=(0, 2, 10, "003", "abc", ".ipynb_checkpoints", "warmup"),
    )
    with caplog.at_level(logging.WARNING):
        (entry,) = scan(repo)
    assert entry.versions == [0, 2, 10]
    assert "ignore version directory '003' which contains leading zeros" in caplog.text
    assert "ignore version directory 'abc' which fails to convert" in caplog.text
    assert "warmup" not in caplog.text


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [5]),
        ("latest { num_versions: 2 }", [3, 5]),
        ("latest { num_versions: 10 }", [1, 3, 5]),
        ("all { }", [1, 3, 5]),
        ("specific { versions: [ 1, 3, 4 ] }", [1, 3]),
    ],
)
def test_version_policies(
    repo: Path, make_model: MakeModel, policy: str, expected: list[int]
) -> None:
    text = ONNX_CONFIG + (f" version_policy {{ {policy} }}" if policy else "")
    make_model("m", text, versions=(1, 3, 5))
    (entry,) = scan(repo)
    assert entry.error is None
    assert entry.versions == expected


def test_specific_policy_with_no_present_version_is_an_error(
    repo: Path, make_model: MakeModel
) -> None:
    make_model("m", ONNX_CONFIG + " version_policy { specific { versions: [ 7 ] } }")
    (entry,) = scan(repo)
    assert entry.error == (
        "at least one version must be available under the version policy of model 'm'"
    )


def test_select_versions_latest_zero() -> None:
    config = pb.ModelConfig()
    config.version_policy.latest.num_versions = 0
    with pytest.raises(ConfigError):
        select_versions(config, [1, 2], "m")


def test_find_one_model(repo: Path, make_model: MakeModel) -> None:
    make_model("simple", ONNX_CONFIG)
    entry = find(repo, "simple")
    assert entry is not None and entry.error is None
    assert find(repo, "missing") is None


def test_find_with_config_override(repo: Path, make_model: MakeModel) -> None:
    make_model("simple", ONNX_CONFIG)
    override = parse_config_json('{"max_batch_size": "16"}', "simple")
    entry = find(repo, "simple", config_override=override)
    assert entry is not None and entry.error is None
    assert entry.config is not None
    assert entry.config.max_batch_size == 16
    assert entry.config.platform == "onnxruntime_onnx"  # detected from 1/model.onnx
    assert override.platform == ""  # the override itself is not modified


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("..", "model name must not contain path traversal characters"),
        ("a/../b", "model name must not contain path traversal characters"),
    ],
)
def test_invalid_model_names(repo: Path, name: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        find(repo, name)
    assert info.value.message == message


def test_valid_model_names() -> None:
    for name in ("simple", "model.identity", "a-b_c", "..hidden..", "a\\b"):
        check_model_name(name)


def test_hidden_directories_are_skipped(repo: Path, make_model: MakeModel) -> None:
    make_model(".ipynb_checkpoints", ONNX_CONFIG)
    make_model("simple", ONNX_CONFIG)
    assert [e.name for e in scan(repo)] == ["simple"]


def test_missing_repository_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        scan(tmp_path / "nope")


IDENTITY = 'backend: "repeat"\nmax_batch_size: 2\n'


@pytest.mark.parametrize(
    ("runtime", "library", "message"),
    [
        ("__invalid_runtime__", None, "unable to find backend library '__invalid_runtime__' "
         "for model 'rt', searched: "),
        ("../dummy_runtime/libtriton_repeat.so", "dummy_runtime/libtriton_repeat.so",
         "backend library name '../dummy_runtime/libtriton_repeat.so' escapes backend "
         "directory"),
        ("libtriton_repeat.so", "1/libtriton_repeat.so", "shoal runs no C++ backend"),
    ],
)  # fmt: skip
def test_a_runtime_library_is_looked_for_as_triton_looks(
    repo: Path, make_model: MakeModel, runtime: str, library: str | None, message: str
) -> None:
    model_dir = make_model("rt", IDENTITY + f'runtime: "{runtime}"\n')
    if library is not None:
        (model_dir / library).parent.mkdir(exist_ok=True)
        (model_dir / library).touch()
    entry = find(repo, "rt")
    assert entry is not None and entry.error is not None
    assert message in entry.error


def test_the_library_of_a_backend_shoal_serves_is_no_error(
    repo: Path, make_model: MakeModel
) -> None:
    make_model("rt", 'backend: "onnxruntime"\nruntime: "libtriton_onnxruntime.so"\n')
    entry = find(repo, "rt")
    assert entry is not None and entry.error is None
