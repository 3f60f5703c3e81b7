"""Model repositories in object storage: where one is (`RemoteLocation`) and how its
objects are listed and read (`ObjectStore`).

Locations are written as tritonserver takes them: ``s3://bucket/path``, with an
endpoint of one's own as ``s3://host:port/bucket/path``; ``gs://bucket/path``;
``az://container/path`` (also ``as://account/container/path``, Triton's). S3 goes
through boto3, which reads the credentials and region as the AWS tools do
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, the config
files), and ``AWS_ENDPOINT_URL``; Google Cloud Storage and Azure go through fsspec
(gcsfs, adlfs). Each client is imported when a repository needs it: they are optional
(``pip install 'shoal[s3]'``), and a missing one is a clear error.

Every call is bounded (connect and read timeouts, few retries): a dead endpoint is an
error after seconds, never a hang. Each client is given :data:`CONNECT_TIMEOUT_S` and
:data:`READ_TIMEOUT_S` where it takes them: boto3 for every call (two tries); gcsfs for
every request (it retries up to six times on its own); adlfs for downloads, its listings
keeping the Azure SDK's own timeouts (20 s, 60 s; three retries), which it does not let a
caller set. Errors are `StorageError`, in Triton's words where it has them. Blocking I/O:
callers keep it off an event loop or a broker's turn.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SCHEMES = ("s3", "gs", "az", "as")
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
_RETRIES = 2


class StorageError(Exception):
    """An object store could not be read: the message says why, for the operator."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def is_remote(location: str) -> bool:
    """Whether ``location`` (a --model-repository value) names object storage."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme in SCHEMES


@dataclass(frozen=True)
class RemoteLocation:
    """A repository in object storage: its bucket (container), the key prefix of its
    models (no slashes at either end, "" for the bucket's top) and, for S3, an
    endpoint given in the location itself (``http://host:port``) or ""."""

    url: str
    scheme: str
    bucket: str
    prefix: str
    endpoint: str = ""

    @classmethod
    def parse(cls, url: str) -> RemoteLocation:
        scheme, _, rest = url.partition("://")
        if scheme not in SCHEMES:
            raise StorageError(f"unsupported model repository location '{url}'")
        parts = [p for p in rest.split("/") if p]
        endpoint = ""
        if scheme == "s3" and parts and ":" in parts[0]:  # s3://host:port/bucket/path
            endpoint = f"http://{parts.pop(0)}"
        if scheme == "as" and parts:  # as://account/container/path: the account is fsspec's
            parts.pop(0)
        if not parts:
            raise StorageError(f"model repository location '{url}' names no bucket")
        return cls(url, scheme, parts[0], "/".join(parts[1:]), endpoint)

    def display(self, key: str = "") -> str:
        """The object (or the repository) as a user writes it, for messages."""
        path = "/".join(p for p in (self.bucket, self.prefix, key) if p)
        return f"{self.scheme}://{path}"


class ObjectStore(Protocol):
    """What a repository mirror needs of a store (blocking calls, bounded in time)."""

    def list(self, prefix: str) -> dict[str, str]:
        """Every object under ``prefix`` (a folder path, "" for the bucket's top), by key
        relative to it, with a tag that changes whenever the object does (its ETag)."""
        ...

    def download(self, key: str, dest: Path) -> None:
        """Write the object ``key`` (full key) to the file ``dest``."""
        ...


def open_store(loc: RemoteLocation) -> ObjectStore:
    """The client for ``loc``'s kind of storage; StorageError if its package is missing."""
    if loc.scheme == "s3":
        return S3Store(loc)
    return FsspecStore(loc)


class S3Store:
    """S3 (and S3-compatible servers) through boto3."""

    def __init__(self, loc: RemoteLocation) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise StorageError(
                f"model repository '{loc.url}' is in S3, which needs boto3: pip install 'shoal[s3]'"
            ) from None
        self.loc = loc
        endpoint = loc.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": _RETRIES, "mode": "standard"},
        )
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, config=config
        )

    def list(self, prefix: str) -> dict[str, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        start = f"{prefix}/" if prefix else ""
        out: dict[str, str] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.loc.bucket, Prefix=start
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"][len(start) :]
                    if key and not key.endswith("/"):  # ("folder" markers carry nothing)
                        out[key] = str(obj.get("ETag", "")) + str(obj.get("Size", ""))
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(
                f"Could not get MetaData for bucket with name {self.loc.bucket} due to "
                f"exception: {type(exc).__name__}, error message: {exc}"
            ) from None
        return out

    def download(self, key: str, dest: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.download_file(self.loc.bucket, key, str(dest))
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(
                f"Failed to get object at s3://{self.loc.bucket}/{key} due to exception: "
                f"{type(exc).__name__}, error message: {exc}"
            ) from None


def _tag(info: dict[str, Any]) -> str:
    """What changes when an object does, from an fsspec listing: its hash where the
    filesystem gives one, else its size and time."""
    digest = info.get("etag") or info.get("md5Hash") or info.get("ETag")
    if digest:
        return str(digest)
    when = info.get("mtime") or info.get("last_modified") or info.get("updated")
    return f"{info.get('size')}:{when or info.get('created')}"


class FsspecStore:
    """Google Cloud Storage and Azure through fsspec (gcsfs, adlfs)."""

    _PROTOCOLS = {"gs": ("gcs", "gcsfs"), "az": ("az", "adlfs"), "as": ("az", "adlfs")}

    def __init__(self, loc: RemoteLocation) -> None:
        protocol, package = self._PROTOCOLS[loc.scheme]
        try:
            import fsspec

            self.fs: Any = fsspec.filesystem(protocol, **self.client_options(loc.scheme))
        except (ImportError, ValueError):
            raise StorageError(
                f"model repository '{loc.url}' needs fsspec and {package}: "
                f"pip install fsspec {package}"
            ) from None
        self.loc = loc
        if loc.scheme in ("az", "as"):
            # The Azure SDK logs every request and response, headers and all, at INFO:
            # a poll mode's rescans would fill the server's log. Its warnings still show.
            logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(
                logging.WARNING
            )

    @staticmethod
    def client_options(scheme: str) -> dict[str, Any]:
        """The filesystem's options that bound its calls in time. gcsfs hands its
        ``requests_timeout`` to every aiohttp request (left None, aiohttp's own five-minute
        total is off too: no bound at all); per socket operation, not a total, so that a
        large file downloads however long it takes while data flows."""
        if scheme == "gs":
            import aiohttp

            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
            )
            return {"requests_timeout": timeout}
        return {"connection_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S}

    def _path(self, key: str) -> str:
        return "/".join(p for p in (self.loc.bucket, key) if p)

    def list(self, prefix: str) -> dict[str, str]:
        root = self._path(prefix)
        try:
            found = self.fs.find(root, detail=True)
        except Exception as exc:  # (each filesystem raises its own)
            raise StorageError(
                f"Could not get MetaData for bucket with name {self.loc.bucket}: {exc}"
            ) from None
        out: dict[str, str] = {}
        for path, info in found.items():
            key = path.strip("/")[len(root.strip("/")) :].lstrip("/")
            if key and info.get("type") != "directory":
                out[key] = _tag(info)
        return out

    def download(self, key: str, dest: Path) -> None:
        try:
            self.fs.get_file(self._path(key), str(dest))
        except Exception as exc:
            where = f"{self.loc.scheme}://{self._path(key)}"
            raise StorageError(f"Failed to get object at {where}: {exc}") from None
