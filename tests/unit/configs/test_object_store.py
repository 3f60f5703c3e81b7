"""Object storage clients (shoal/configs/object_store.py): the fsspec one (gs://, az://) over
fsspec's in-memory filesystem, standing in for gcsfs and adlfs. Against real servers: S3
in tests/integration/test_object_storage.py, GCS and Azure (with gcsfs and adlfs) in
tests/integration/test_object_storage_emulators.py."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.configs import object_store
from shoal.configs.object_store import FsspecStore, RemoteLocation, StorageError
from shoal.configs.repository_view import RepositoryView

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    monkeypatch.setattr(fsspec, "filesystem", lambda protocol, **options: fs)
    yield fs
    fs.store.clear()


def test_a_bucket_is_listed_relative_to_the_repository_and_read(
    memory: Any, tmp_path: Path
) -> None:
    memory.pipe("/b/repo/m/config.pbtxt", b'name: "m"')
    memory.pipe("/b/repo/m/1/model.onnx", b"onnx")
    memory.pipe("/b/other/x", b"")
    store = FsspecStore(RemoteLocation.parse("gs://b/repo"))
    listed = store.list("repo")
    assert sorted(listed) == ["m/1/model.onnx", "m/config.pbtxt"]
    store.download("repo/m/1/model.onnx", tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").read_bytes() == b"onnx"
    with pytest.raises(StorageError, match=r"Failed to get object at gs://b/repo/absent"):
        store.download("repo/absent", tmp_path / "absent")


def test_a_view_over_azure_storage_fetches_its_models(memory: Any, tmp_path: Path) -> None:
    memory.pipe("/container/models/m/config.pbtxt", b'name: "m"')
    memory.pipe("/container/models/m/1/model.onnx", b"onnx")
    view = RepositoryView(["az://container/models"], tmp_path / "view")
    assert view.sync(strict=True) == {"m"}
    assert (tmp_path / "view" / "m" / "1" / "model.onnx").read_bytes() == b"onnx"


def test_a_missing_client_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(protocol: str, **options: Any) -> None:
        raise ImportError("no gcsfs")

    monkeypatch.setattr(fsspec, "filesystem", missing)
    with pytest.raises(StorageError, match="needs fsspec and gcsfs"):
        object_store.open_store(RemoteLocation.parse("gs://b/repo"))


@pytest.mark.parametrize(
    ("url", "protocol"), [("gs://b/repo", "gcs"), ("az://c/repo", "az"), ("as://acct/c/r", "az")]
)
def test_gcs_and_azure_clients_get_connect_and_read_timeouts(
    monkeypatch: pytest.MonkeyPatch, url: str, protocol: str
) -> None:
    """As S3's: the timeouts reach gcsfs (every request) and adlfs (downloads) under the
    names their constructors take (an unknown one would vanish into their **kwargs)."""
    aiohttp = pytest.importorskip("aiohttp")
    opened: dict[str, dict[str, Any]] = {}
    memory = fsspec.filesystem("memory")

    def filesystem(name: str, **options: Any) -> Any:
        opened[name] = options
        return memory

    monkeypatch.setattr(fsspec, "filesystem", filesystem)
    FsspecStore(RemoteLocation.parse(url))
    (options,) = opened.values()
    assert list(opened) == [protocol]
    if protocol == "gcs":
        client = pytest.importorskip("gcsfs").GCSFileSystem
        timeout = options["requests_timeout"]
        assert isinstance(timeout, aiohttp.ClientTimeout)
        assert (timeout.sock_connect, timeout.sock_read, timeout.total) == (5.0, 30.0, None)
    else:
        client = pytest.importorskip("adlfs").AzureBlobFileSystem
        assert options == {"connection_timeout": 5.0, "read_timeout": 30.0}
    assert set(options) <= set(inspect.signature(client.__init__).parameters)
