"""The repository view (shoal/configs/repository_view.py) over local folders and a fake object
store: what it links, what it fetches whole or in part, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal import repository_cache
from shoal.configs import repository_view
from shoal.configs.object_store import RemoteLocation, StorageError
from shoal.configs.repository_view import RepositoryError, RepositoryView


class FakeStore:
    """Objects in memory: key -> bytes; its tag is the bytes themselves."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.downloads: list[str] = []
        self.down = False

    def list(self, prefix: str) -> dict[str, str]:
        if self.down:
            raise StorageError("Could not get MetaData for bucket with name b")
        start = f"{prefix}/" if prefix else ""
        return {k[len(start) :]: v.hex() for k, v in self.objects.items() if k.startswith(start)}

    def download(self, key: str, dest: Path) -> None:
        self.downloads.append(key)
        dest.write_bytes(self.objects[key])


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> FakeStore:
    fake = FakeStore()
    monkeypatch.setattr(repository_view, "open_store", lambda loc: fake)
    return fake


def _model(store: FakeStore, prefix: str, name: str, data: bytes = b"onnx") -> None:
    store.objects[f"{prefix}/{name}/config.pbtxt"] = f'name: "{name}"'.encode()
    store.objects[f"{prefix}/{name}/1/model.onnx"] = data


def test_locations_parse_as_tritonserver_takes_them() -> None:
    loc = RemoteLocation.parse("s3://bucket/path/to/repo/")
    assert (loc.bucket, loc.prefix, loc.endpoint) == ("bucket", "path/to/repo", "")
    loc = RemoteLocation.parse("s3://10.0.0.1:9000/bucket/repo")
    assert (loc.bucket, loc.prefix, loc.endpoint) == ("bucket", "repo", "http://10.0.0.1:9000")
    assert RemoteLocation.parse("gs://bucket").prefix == ""
    with pytest.raises(StorageError, match="names no bucket"):
        RemoteLocation.parse("s3://")


def test_several_folders_are_linked_and_a_name_in_two_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "m1" / "1").mkdir(parents=True)
    (b / "m2" / "1").mkdir(parents=True)
    view = RepositoryView([str(a), str(b)], tmp_path / "view")
    assert view.sync(strict=True) == {"m1", "m2"}
    assert (tmp_path / "view" / "m2").resolve() == (b / "m2").resolve()
    assert view.sync() == set()  # nothing changed
    (b / "m1" / "1").mkdir(parents=True)
    with pytest.raises(RepositoryError, match="'m1': not unique across all model repositories"):
        view.sync(strict=True)
    assert view.sync() == {"m1"}  # later: left out
    assert not (tmp_path / "view" / "m1").exists()


def test_models_are_fetched_whole_when_wanted_and_again_when_changed(
    store: FakeStore, tmp_path: Path
) -> None:
    _model(store, "repo", "m1")
    _model(store, "repo", "m2")
    root = tmp_path / "view"
    view = RepositoryView(["s3://b/repo"], root)
    view.sync({"m1"}, strict=True)
    assert (root / "m1" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert (root / "m2" / "config.pbtxt").is_file() and (root / "m2" / "1").is_dir()
    assert not (root / "m2" / "1" / "model.onnx").exists()  # its config only
    assert view.has("m1") and not view.has("m2")
    store.downloads.clear()
    assert view.sync(set()) == set()  # unchanged; and m1 stays whole
    assert store.downloads == []
    store.objects["repo/m1/1/model.onnx"] = b"new"
    view = RepositoryView(["s3://b/repo"], root)  # another process: it reads the manifest
    assert view.sync(set()) == {"m1"}
    assert (root / "m1" / "1" / "model.onnx").read_bytes() == b"new"
    # (the config is fetched again: namespacing may rewrite the copy's; a model file is not)
    assert sorted(store.downloads) == ["repo/m1/1/model.onnx", "repo/m1/config.pbtxt"]
    del store.objects["repo/m2/config.pbtxt"], store.objects["repo/m2/1/model.onnx"]
    assert view.sync() == {"m2"} and not (root / "m2").exists()


def test_an_unreadable_store_is_an_error_at_start_and_keeps_the_view_later(
    store: FakeStore, tmp_path: Path
) -> None:
    _model(store, "repo", "m1")
    view = RepositoryView(["s3://b/repo"], tmp_path / "view")
    view.sync(strict=True)
    store.down = True
    assert view.sync() == set()
    assert view.has("m1")
    with pytest.raises(RepositoryError, match="Could not get MetaData for bucket"):
        view.sync(strict=True)
    store.down = False
    with pytest.raises(RepositoryError, match="failed to stat file s3://b/elsewhere"):
        RepositoryView(["s3://b/elsewhere"], tmp_path / "other").sync(strict=True)


def test_stale_views_of_dead_servers_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repository_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = tmp_path / "shoal-models-999999999"
    live = repository_cache.cache_dir()
    dead.mkdir()
    live.mkdir()
    assert repository_cache.sweep_stale() == [dead]
    assert live.is_dir() and not dead.exists()
