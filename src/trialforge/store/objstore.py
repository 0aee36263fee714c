"""One small interface over a local directory (file://) and S3 (s3://).

Everything trialforge persists (snapshots, checkpoints, Parquet datasets) goes
through ``ObjectStore`` so a run moves from a laptop to a cluster by changing a
URL. Both backends give the same guarantees: a put is atomic (a reader sees the
whole object or none of it), keys are relative ``/``-separated paths, and every
failure is a ``StoreError`` that names the object and what to check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import boto3
import botocore.loaders
import botocore.session
import pyarrow.fs as pafs
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from trialforge.errors import StoreError

# Temp files of in-flight atomic writes start with this; list() hides them and keys may not use it.
TMP_PREFIX = ".tmp-"
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_CONNECT_TIMEOUT_S = 5
_READ_TIMEOUT_S = 60
# Each botocore session parses its JSON service models again (~0.3 s); stores share one loader to pay that once.
_LOADER = botocore.loaders.create_loader()


def check_key(key: str) -> str:
    """Return ``key`` if it is a clean relative path, so no key can name a file outside the store root."""
    segments = key.split("/")
    if not key or "\\" in key or any(s in ("", ".", "..") or s.startswith(TMP_PREFIX) or "\x00" in s for s in segments):
        raise StoreError(
            f"invalid object key {key!r}: use a relative path of non-empty segments "
            f"(no leading '/', no '.' or '..', no backslash, no {TMP_PREFIX!r} names)"
        )
    return key


def _check_prefix(prefix: str) -> str:
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


class ObjectStore(ABC):
    """Keys are relative to ``url``; puts are atomic; missing objects and outages raise ``StoreError``."""

    url: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with ``prefix`` (a plain string prefix, as in S3)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; deleting a missing key is not an error (retries stay idempotent)."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Stream a local file into ``key`` without holding it in memory."""

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Stream ``key`` into a local file; ``path`` is replaced only once the download is complete."""

    @abstractmethod
    def arrow_filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the base path under which this store's keys live."""

    def uri(self, key: str) -> str:
        return f"{self.url}/{check_key(key)}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync and rename it over ``path``, else remove it.

    The temp file lives in the destination directory so ``os.replace`` is a same-filesystem
    rename, which POSIX makes atomic: a reader sees the old object or the new one, never a part.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    """Persist the rename itself, so a machine crash cannot roll back a published object."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_atomic(src: BinaryIO, dest: Path) -> None:
    with _atomic_path(dest) as tmp, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst)


@contextlib.contextmanager
def _os_errors(action: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise StoreError(f"could not {action}: {exc}") from exc


class FileStore(ObjectStore):
    """Objects are files under ``root``; the layout is the key, so a person can browse it."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with _os_errors(f"write {self.uri(key)}"), _atomic_path(path) as tmp:
            tmp.write_bytes(data)

    def get_bytes(self, key: str) -> bytes:
        with self._reading(key) as f:
            return f.read()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        start = self.root.joinpath(*_check_prefix(prefix).split("/")[:-1])
        keys = []
        for dirpath, _, files in os.walk(start):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            keys += [name if rel == "." else f"{rel}/{name}" for name in files if not name.startswith(TMP_PREFIX)]
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, key: str) -> None:
        with _os_errors(f"delete {self.uri(key)}"):
            self._path(key).unlink(missing_ok=True)

    def put_file(self, key: str, path: Path) -> None:
        with _os_errors(f"copy {path} to {self.uri(key)}"), path.open("rb") as src:
            _copy_atomic(src, self._path(key))

    def get_file(self, key: str, path: Path) -> None:
        with self._reading(key) as src, _os_errors(f"write {path}"):
            _copy_atomic(src, path)

    @contextlib.contextmanager
    def _reading(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            raise StoreError(f"no object at {self.uri(key)}: it was never written or was deleted") from None
        except OSError as exc:
            raise StoreError(f"could not read {self.uri(key)}: {exc}") from exc
        with f:
            yield f

    def arrow_filesystem(self) -> tuple[pafs.FileSystem, str]:
        return pafs.LocalFileSystem(), str(self.root)


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``; boto3 retries transient faults before we give up.

    Endpoint, credentials and region come from the explicit arguments or the standard
    AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION), so the same code talks to AWS, MinIO or a moto test server.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = 5,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.max_attempts = max_attempts
        core = botocore.session.Session()
        core.register_component("data_loader", _LOADER)
        self._session = boto3.session.Session(botocore_session=core, region_name=region)
        config = Config(
            retries={"mode": "standard", "max_attempts": max_attempts},
            connect_timeout=_CONNECT_TIMEOUT_S,
            read_timeout=_READ_TIMEOUT_S,
        )
        self._client = self._session.client("s3", endpoint_url=endpoint_url, config=config)
        self.endpoint: str = self._client.meta.endpoint_url
        region_name = self._client.meta.region_name
        self.region = region_name if region_name not in (None, "aws-global") else "us-east-1"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}" if self.prefix else check_key(key)

    @contextlib.contextmanager
    def _errors(self, op: str, where: str) -> Iterator[None]:
        """Turn boto faults into a StoreError that says which object (``where``, a URL), which endpoint
        and what to check."""
        try:
            yield
        except ClientError as exc:
            code = _code(exc)
            if code in _MISSING_CODES:
                raise StoreError(f"no object at {where}: it was never written or was deleted") from exc
            raise StoreError(
                f"S3 {op} {where} at {self.endpoint} was refused ({code}: {exc}); "
                "check that the bucket exists and the credentials may use it"
            ) from exc
        except (BotoCoreError, Boto3Error) as exc:
            raise StoreError(
                f"S3 {op} {where} failed at {self.endpoint} after up to {self.max_attempts} attempts: "
                f"{exc}; check that the endpoint is up (AWS_ENDPOINT_URL) and the credentials are set"
            ) from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("PUT", self.uri(key)):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        with self._errors("GET", self.uri(key)):
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def exists(self, key: str) -> bool:
        with self._errors("HEAD", self.uri(key)):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if _code(exc) in _MISSING_CODES:
                    return False
                raise
        return True

    def list(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=root + _check_prefix(prefix)
        )
        with self._errors("LIST", f"{self.url}/{prefix}"):
            return sorted(obj["Key"][len(root) :] for page in pages for obj in page.get("Contents", []))

    def delete(self, key: str) -> None:
        with self._errors("DELETE", self.uri(key)):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def put_file(self, key: str, path: Path) -> None:
        """A multipart upload becomes visible only when completed, so this is atomic too."""
        if not path.is_file():
            raise StoreError(f"could not upload {path} to {self.uri(key)}: not a file")
        with self._errors("PUT", self.uri(key)):
            self._client.upload_file(str(path), self.bucket, self._key(key))

    def get_file(self, key: str, path: Path) -> None:
        with _os_errors(f"write {path}"), _atomic_path(path) as tmp, self._errors("GET", self.uri(key)):
            self._client.download_file(self.bucket, self._key(key), str(tmp))

    def arrow_filesystem(self) -> tuple[pafs.FileSystem, str]:
        """An S3FileSystem with the same endpoint, credentials and retry budget as the boto3 client."""
        credentials = self._session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials else None
        endpoint = urlsplit(self.endpoint)
        fs = pafs.S3FileSystem(
            access_key=frozen.access_key if frozen else None,
            secret_key=frozen.secret_key if frozen else None,
            session_token=frozen.token if frozen else None,
            region=self.region,
            scheme=endpoint.scheme,
            endpoint_override=endpoint.netloc,
            connect_timeout=_CONNECT_TIMEOUT_S,
            request_timeout=_READ_TIMEOUT_S,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=self.max_attempts),
        )
        return fs, f"{self.bucket}/{self.prefix}".rstrip("/")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def open_store(
    url: str, *, endpoint_url: str | None = None, region: str | None = None, max_attempts: int = 5
) -> ObjectStore:
    """``file:///abs/path`` (a relative ``file://path`` resolves against the working directory) or ``s3://bucket/prefix``.

    ``endpoint_url``, ``region`` and ``max_attempts`` apply to S3 only.
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "file" and rest:
        return FileStore(Path(rest))
    if sep and scheme == "s3" and rest.partition("/")[0]:
        bucket, _, prefix = rest.partition("/")
        return S3Store(bucket, prefix, endpoint_url=endpoint_url, region=region, max_attempts=max_attempts)
    raise StoreError(f"unsupported store URL {url!r}: use file:///path/to/dir or s3://bucket[/prefix]")
