"""Model repositories in object storage: ``--model-repository=s3://host:port/bucket/path``
against a real S3-compatible server (moto's, on a free port, in this process), filled
with boto3 as a user would. The server lists the bucket, fetches the models that load to
a local cache that is gone once it stops, and sees what changes in the bucket: poll
mode's rescans and explicit mode's loads and index. Errors are Triton's words, and a
dead endpoint ends the start in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
from tests.serverctl import free_port, served
from tools import modelgen

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "models"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(endpoint: str) -> Iterator[Any]:
    """A client of the S3 server with an empty bucket ``models``."""
    client = boto3.client("s3", endpoint_url=f"http://{endpoint}", **_boto_args())
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _boto_args() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


def _upload(s3: Any, local: Path, prefix: str) -> None:
    """Every file under ``local`` to ``prefix/<its path>``, as ``aws s3 sync`` would."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local)}")


def _delete(s3: Any, prefix: str) -> None:
    for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=obj["Key"])


def test_poll_mode_serves_from_s3_and_sees_the_bucket_change(
    s3: Any, endpoint: str, tmp_path: Path
) -> None:
    local = tmp_path / "repo"
    modelgen.write_shipped_repository(local, ("simple",))
    _upload(s3, local, "repo")
    url = f"s3://{endpoint}/{BUCKET}/repo"
    args = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
    with served(url, *args, env=CREDENTIALS) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        np.testing.assert_array_equal(infer_simple(grpc, grpcclient), 2 * np.arange(16)[None])
        (cache,) = caches_of(srv.proc.pid)
        assert (cache / "simple" / "1" / "model.onnx").is_file()  # the workers' copy
        # a new model in the bucket loads
        modelgen.write_shipped_repository(local, ("mlp",))
        _upload(s3, local / "mlp", "repo/mlp")
        until(lambda: client.is_model_ready("mlp"))
        # a changed config reloads
        config = (local / "simple" / "config.pbtxt").read_text()
        s3.put_object(
            Bucket=BUCKET,
            Key="repo/simple/config.pbtxt",
            Body=config.replace("max_batch_size: 8", "max_batch_size: 2").encode(),
        )
        until(lambda: client.get_model_config("simple")["max_batch_size"] == 2)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        # a new version loads (the latest one serves)
        s3.upload_file(
            str(local / "simple" / "1" / "model.onnx"), BUCKET, "repo/simple/2/model.onnx"
        )
        until(lambda: client.is_model_ready("simple", "2"))
        # a model removed from the bucket unloads
        _delete(s3, "repo/mlp/")
        until(lambda: not client.is_model_ready("mlp"))
        index = client.get_model_repository_index()
        assert {e["name"] for e in index} == {"simple"}
        # the version the new one replaced is listed as Triton lists it
        assert {"name": "simple", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in (
            index
        )
        pid = srv.proc.pid
    assert caches_of(pid) == []  # the cache goes with the server


def test_explicit_mode_loads_what_the_bucket_holds_now(
    s3: Any, endpoint: str, tmp_path: Path
) -> None:
    url = f"s3://{endpoint}/{BUCKET}"

    def put(key: str, body: bytes) -> None:
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    explicit_mode_serves_what_the_store_holds(
        tmp_path / "repo",
        lambda *flags: served(url, *flags, env=CREDENTIALS),
        lambda folder, prefix: _upload(s3, folder, prefix),
        put,
    )


def _start_fails(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={url}",
            f"--http-port={free_port()}", f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}", f"--runtime-dir={tmp_path / 'run'}"]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=90, env={**os.environ, **CREDENTIALS}
    )


def test_an_unreachable_bucket_or_a_missing_path_stops_the_start_in_triton_words(
    s3: Any, endpoint: str, tmp_path: Path
) -> None:
    done = _start_fails(f"s3://{endpoint}/nosuchbucket/repo", tmp_path)
    assert done.returncode != 0
    assert "Could not get MetaData for bucket with name nosuchbucket" in done.stderr
    done = _start_fails(f"s3://{endpoint}/{BUCKET}/nothing/here", tmp_path)
    assert done.returncode != 0
    assert f"failed to stat file s3://{BUCKET}/nothing/here" in done.stderr
    # a dead endpoint: an error within the timeouts, not a hang
    started = time.monotonic()
    done = _start_fails(f"s3://127.0.0.1:{free_port()}/{BUCKET}/repo", tmp_path)
    assert done.returncode != 0 and "Could not get MetaData for bucket" in done.stderr
    assert time.monotonic() - started < 60


def test_a_stale_cache_of_a_dead_server_is_removed_at_start(
    s3: Any, endpoint: str, tmp_path: Path
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"shoal-models-{dead.pid}"
    (stale / "simple").mkdir(parents=True)
    local = tmp_path / "repo"
    modelgen.write_shipped_repository(local, ("simple",))
    _upload(s3, local, "repo")
    # the endpoint from AWS_ENDPOINT_URL, as the AWS tools take it
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{endpoint}"}
    with served(f"s3://{BUCKET}/repo", env=env) as srv:
        assert not stale.exists()
        assert srv.http_status("/v2/models/simple/ready") == 200


def test_a_folder_and_a_bucket_serve_together(s3: Any, endpoint: str, tmp_path: Path) -> None:
    local, folder = tmp_path / "bucket", tmp_path / "folder"
    modelgen.write_shipped_repository(local, ("simple",))
    modelgen.write_shipped_repository(folder, ("mlp",))
    _upload(s3, local, "repo")
    url = f"s3://{endpoint}/{BUCKET}/repo"
    with served(folder, f"--model-repository={url}", env=CREDENTIALS) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        assert client.is_model_ready("mlp")
        assert sorted(e["name"] for e in client.get_model_repository_index()) == ["mlp", "simple"]


def test_a_dead_endpoint_later_fails_loads_in_seconds_and_the_server_serves_on(
    tmp_path: Path,
) -> None:
    """The S3 server goes away while shoal runs (explicit mode): a load fails with the
    storage's error within the timeouts, the index answers, the loaded model serves."""
    port = free_port()
    own = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    own.start()
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **_boto_args())
        s3.create_bucket(Bucket=BUCKET)
        local = tmp_path / "repo"
        modelgen.write_shipped_repository(local, ("simple", "mlp"))
        _upload(s3, local, "repo")
        url = f"s3://127.0.0.1:{port}/{BUCKET}/repo"
        args = ("--model-control-mode=explicit", "--load-model=simple")
        with served(url, *args, env=CREDENTIALS) as srv:
            client = httpclient.InferenceServerClient(srv.url, network_timeout=60)
            own.stop()
            started = time.monotonic()
            with pytest.raises(Exception, match="Could not get MetaData for bucket") as e:
                client.load_model("mlp")
            assert "failed to load 'mlp', failed to poll from model repository" in str(e.value)
            assert time.monotonic() - started < 30
            assert {e["name"] for e in client.get_model_repository_index()} == {"simple", "mlp"}
            np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
            assert client.is_server_ready()
    finally:
        own.stop()
