"""Model repositories in Google Cloud Storage (``gs://``) and Azure Blob Storage
(``az://``) against real emulators started by the test on free ports, as S3 is tested
against moto's server (tests/integration/test_object_storage.py): Google's
gcp-storage-emulator (pure Python, inside this process) and Azurite (Node.js; its
tests skip, saying so, where Node.js is not). The server's clients are gcsfs and adlfs,
as a user's would be, pointed at the emulators by the variables those read
(``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``); the test fills the
buckets with the same libraries. The server lists the bucket, fetches the models that
load to a local cache that is gone once it stops, and sees what changes in the bucket:
poll mode's rescans, explicit mode's loads and index."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.object_store import (
    caches_of,
    explicit_mode_serves_what_the_store_holds,
    infer_simple,
    until,
)
from tests.serverctl import free_port, log_dir, served
from tools import modelgen

BUCKET = "models"
ROOT = Path(__file__).resolve().parents[2]
#: Where scripts/setup.sh installs Azurite (npm), in the venv.
AZURITE = ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's one account and its key, the same in every Azurite (its documentation's).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Bucket:
    """One emulator's bucket (container) ``models``: the client that fills it, and the
    environment that points a server's client at the emulator."""

    scheme: str
    fs: Any  # gcsfs.GCSFileSystem or adlfs.AzureBlobFileSystem
    env: dict[str, str]

    def url(self, prefix: str = "") -> str:
        return f"{self.scheme}://{BUCKET}/{prefix}".rstrip("/")

    def upload(self, local: Path, prefix: str) -> None:
        """Every file under ``local`` to ``prefix/<its path>``."""
        for path in sorted(local.rglob("*")):
            if path.is_file():
                key = "/".join(p for p in (prefix, str(path.relative_to(local))) if p)
                self.fs.put_file(str(path), f"{BUCKET}/{key}")

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(f"{BUCKET}/{key}", data)

    def delete(self, prefix: str) -> None:
        for path in self.fs.find(f"{BUCKET}/{prefix}"):
            self.fs.rm_file(path)

    def empty(self) -> None:
        self.fs.invalidate_cache()
        for path in self.fs.find(BUCKET):
            self.fs.rm_file(path)


@pytest.fixture(scope="module")
def gcs() -> Iterator[Bucket]:
    """gcp-storage-emulator in this process (threads), on a free port."""
    from gcp_storage_emulator.server import create_server
    from gcsfs import GCSFileSystem

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        fs = GCSFileSystem(endpoint_url=endpoint, token="anon", skip_instance_cache=True)
        fs.mkdir(BUCKET)
        yield Bucket("gs", fs, {"STORAGE_EMULATOR_HOST": endpoint})
    finally:
        server.stop()


@pytest.fixture(scope="module")
def azure() -> Iterator[Bucket]:
    """Azurite's blob service as a process of its own, on a free port."""
    if shutil.which("node") is None:
        pytest.skip("Azurite, Azure's storage emulator, needs Node.js, which is not installed")
    if not AZURITE.exists():
        pytest.fail(f"Azurite is not installed ({AZURITE}): run scripts/setup.sh (it needs npm)")
    from adlfs import AzureBlobFileSystem

    port = free_port()
    workspace = Path(tempfile.mkdtemp(prefix="shoal-test-azurite-"))
    log = open(log_dir() / f"azurite-{port}.log", "wb")  # noqa: SIM115 (closed below)
    argv = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
            "--location", str(workspace), "--silent", "--disableTelemetry",
            "--skipApiVersionCheck", "--loose"]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        _listening(port, proc)
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )
        fs = AzureBlobFileSystem(connection_string=connection, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        yield Bucket("az", fs, {"AZURE_STORAGE_CONNECTION_STRING": connection})
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workspace, ignore_errors=True)


def _listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"Azurite exited with {proc.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        assert time.monotonic() < deadline, "Azurite did not listen in 60 s"
        time.sleep(0.1)


@pytest.fixture(params=["gs", "az"])
def bucket(request: pytest.FixtureRequest) -> Iterator[Bucket]:
    """Each emulator's bucket, empty for each test."""
    b: Bucket = request.getfixturevalue("gcs" if request.param == "gs" else "azure")
    b.empty()
    yield b
    b.empty()


def test_poll_mode_serves_from_the_bucket_and_sees_it_change(
    bucket: Bucket, tmp_path: Path
) -> None:
    local = tmp_path / "repo"
    modelgen.write_shipped_repository(local, ("simple",))
    bucket.upload(local, "repo")
    args = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
    with served(bucket.url("repo"), *args, env=bucket.env) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        np.testing.assert_array_equal(infer_simple(grpc, grpcclient), 2 * np.arange(16)[None])
        (cache,) = caches_of(srv.proc.pid)
        assert (cache / "simple" / "1" / "model.onnx").is_file()  # the workers' copy
        # a new model in the bucket loads
        modelgen.write_shipped_repository(local, ("mlp",))
        bucket.upload(local / "mlp", "repo/mlp")
        until(lambda: client.is_model_ready("mlp"))
        # a changed config reloads
        config = (local / "simple" / "config.pbtxt").read_text()
        changed = config.replace("max_batch_size: 8", "max_batch_size: 2")
        bucket.put("repo/simple/config.pbtxt", changed.encode())
        until(lambda: client.get_model_config("simple")["max_batch_size"] == 2)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        # a model removed from the bucket unloads
        bucket.delete("repo/mlp")
        until(lambda: not client.is_model_ready("mlp"))
        assert [e["name"] for e in client.get_model_repository_index()] == ["simple"]
        pid = srv.proc.pid
        # the storage client's own request log (Azure's logs each at INFO) stays out
        assert "Request URL" not in srv.log()
    assert caches_of(pid) == []  # the cache goes with the server


def test_explicit_mode_loads_what_the_bucket_holds_now(bucket: Bucket, tmp_path: Path) -> None:
    explicit_mode_serves_what_the_store_holds(
        tmp_path / "repo",
        lambda *flags: served(bucket.url(), *flags, env=bucket.env),
        bucket.upload,
        bucket.put,
    )


def test_a_missing_bucket_or_path_stops_the_start(bucket: Bucket, tmp_path: Path) -> None:
    gcs_bucket = "Could not get MetaData for bucket with name nosuchbucket"
    for url, why in (
        # (Azure answers a listing of a missing container as an empty one)
        (f"{bucket.scheme}://nosuchbucket/repo", gcs_bucket if bucket.scheme == "gs" else ""),
        (bucket.url("nothing/here"), ""),
    ):
        argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={url}",
                f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                f"--metrics-port={free_port()}", f"--runtime-dir={tmp_path / 'run'}"]  # fmt: skip
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=90, env={**os.environ, **bucket.env}
        )
        assert done.returncode != 0, done.stderr
        assert f"error: creating server: Internal - {why or f'failed to stat file {url}'}" in (
            done.stderr
        ), done.stderr
