"""shoal/configs/model_stamps.py: which parts of a model folder tell a reload that a
version changed, as Triton's ModelTimestamp."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_stamps import ModelStamps, reload_needed


def _touch(path: Path, later_s: float) -> None:
    """Write ``path``, stamped ``later_s`` from now (newer than the folders made now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    stamp = time.time() + later_s
    os.utime(path, (stamp, stamp))


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "m"
    for part in ("1/model.onnx", "2/model.onnx", "config.pbtxt", "labels.txt"):
        _touch(model / part, 100.0)
    return model


def test_a_version_is_modified_by_its_folder_or_what_the_versions_share(tmp_path: Path) -> None:
    model = _model(tmp_path)
    config = model / "config.pbtxt"
    before = ModelStamps.read(model, config)
    _touch(model / "2" / "model.onnx", 200.0)
    after = ModelStamps.read(model, config)
    assert not before.version_modified(after, 1) and before.version_modified(after, 2)
    _touch(model / "labels.txt", 300.0)
    later = ModelStamps.read(model, config)
    assert after.version_modified(later, 1) and after.version_modified(later, 2)
    assert before.version_modified(later, 7)  # a version it did not have


def test_the_config_is_no_part_of_the_stamps(tmp_path: Path) -> None:
    model = _model(tmp_path)
    custom = model / "configs" / "custom.pbtxt"
    _touch(custom, 100.0)
    before = ModelStamps.read(model, custom)
    _touch(custom, 200.0)  # the custom config's folder: the config's entry
    assert not before.version_modified(ModelStamps.read(model, custom), 1)
    _touch(model / "config.pbtxt", 200.0)  # not the config read: a shared file
    assert before.version_modified(ModelStamps.read(model, custom), 1)
    before = ModelStamps.read(model, model / "config.pbtxt")
    _touch(model / "config.pbtxt", 300.0)
    assert not before.version_modified(ModelStamps.read(model, model / "config.pbtxt"), 1)


def test_a_config_needs_a_reload_unless_only_its_version_policy_differs() -> None:
    old = pb.ModelConfig(name="m", max_batch_size=8)
    new = pb.ModelConfig()
    new.CopyFrom(old)
    new.version_policy.specific.versions.append(3)
    assert not reload_needed(old, new)
    new.max_batch_size = 4
    assert reload_needed(old, new)


def test_a_file_copied_in_with_an_older_modification_time_is_a_change(tmp_path: Path) -> None:
    """Triton reads the later of the modification and inode change times (``cp -p``)."""
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_text("x")
    before = ModelStamps.read(model, model / "config.pbtxt")
    time.sleep(0.05)  # (past the file system's clock tick)
    os.utime(model / "1" / "model.onnx", (1000.0, 1000.0))  # an older file in its place
    assert before.version_modified(ModelStamps.read(model, model / "config.pbtxt"), 1)
