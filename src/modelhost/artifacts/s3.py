"""Blob storage in one bucket of an S3-compatible server (AWS S3, MinIO, Ceph, moto) via boto3.

Keys map to `{key_prefix}{key}` objects. A key names a file and, like a path, a folder: the
prefix `ab` covers `ab` and `ab/...` but never `abc/...`. Model files are read by worker processes
as real files, so `local_dir` mirrors a prefix into a local cache directory first.

boto3 is imported only by `blob_store_of` when `blob_store = "s3"`: the local default never loads it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from modelhost.artifacts.blobstore import (
    PARTIAL_DIR,
    BlobInfo,
    BlobStore,
    BlobWriter,
    LocalBlobStore,
    SpoolWriter,
)
from modelhost.config import Settings

log = logging.getLogger("modelhost.blobs")
DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
MISSING = ("404", "NoSuchKey", "NotFound")
SPOOL_BYTES = 8 * 1024 * 1024  # `open` keeps smaller objects in memory, spills bigger ones to disk


def blob_store_of(settings: Settings) -> BlobStore:
    """The store the settings ask for. S3 credentials: the store's own settings (MODELHOST_S3_ACCESS_KEY_ID
    and MODELHOST_S3_SECRET_ACCESS_KEY, best as secret files, so that no environment holds them), else
    boto3's usual sources (the AWS_* variables, a profile, the instance or pod role)."""
    if settings.blob_store == "local":
        return LocalBlobStore(settings.data_dir / "blobs")
    import boto3

    if not settings.s3_bucket:
        raise ValueError("blob_store = 's3' needs MODELHOST_S3_BUCKET")
    key_id, secret = settings.s3_access_key_id, settings.s3_secret_access_key
    client = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=key_id.get_secret_value() if key_id else None,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
    )
    return S3BlobStore(client, settings.s3_bucket, settings.data_dir / "blob-cache", settings.s3_key_prefix)


class _S3Writer(SpoolWriter):
    """Spools locally; publishing is the upload, so a crash mid-write leaves no object."""

    store_name = "the blob store's local spool in the data directory"

    def __init__(self, store: S3BlobStore, key: str, temp: Path) -> None:
        super().__init__(temp, key)
        self._store = store

    def _publish(self, spooled: Path) -> None:
        self._store.upload(spooled, self._key)


class S3BlobStore:
    """`BlobStore` on one bucket; `cache_root` holds write spools and the `local_dir` mirrors."""

    def __init__(self, client: Any, bucket: str, cache_root: Path, key_prefix: str = "") -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = key_prefix
        self.cache_root = cache_root.resolve()
        self._scratch = self.cache_root / PARTIAL_DIR  # same filesystem as the mirrors: os.replace works
        self._scratch.mkdir(parents=True, exist_ok=True)

    def wait_for_bucket(self, seconds: float, create: bool) -> None:
        """At start: wait up to `seconds` for the S3 server to answer (a container started beside its
        store), then make the bucket if it is missing and `create` (a local store such as the compose
        stack's, which starts empty). Never fatal: the first blob operation reports a store still away."""
        import botocore.exceptions

        deadline = time.monotonic() + seconds
        while True:
            try:
                self._client.head_bucket(Bucket=self._bucket)
                return
            except self._client.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in MISSING:
                    log.warning("the bucket %s cannot be used: %s", self._bucket, exc)
                    return
                if not create:
                    log.warning("no bucket %s (MODELHOST_S3_CREATE_BUCKET makes it)", self._bucket)
                    return
                self._create_bucket()
                return
            except botocore.exceptions.BotoCoreError as exc:  # no answer yet: connection refused, DNS
                if time.monotonic() >= deadline:
                    log.warning("the S3 store is still unreachable after %.0f s: %s", seconds, exc)
                    return
                log.warning("waiting for the S3 store: %s", exc)
                time.sleep(1)

    def _create_bucket(self) -> None:
        region = self._client.meta.region_name
        placed = {} if region in (None, "us-east-1") else {"LocationConstraint": region}
        try:
            if placed:
                self._client.create_bucket(Bucket=self._bucket, CreateBucketConfiguration=placed)
            else:
                self._client.create_bucket(Bucket=self._bucket)
            log.info("created the bucket %s", self._bucket)
        except self._client.exceptions.BucketAlreadyOwnedByYou:
            pass

    # ---------------------------------------------------------------- the BlobStore interface

    def writer(self, key: str) -> BlobWriter:
        self._cache_path(key)  # refuses keys that could escape the cache
        return _S3Writer(self, key, self._scratch / secrets.token_hex(8))

    def list(self, prefix: str) -> list[BlobInfo]:
        """Objects under the folder `prefix`; empty while a `move_prefix` into it is unfinished."""
        found = list(self._objects(self._folder(prefix)))
        if any(b.key == self._moving_marker(prefix) for b in found):
            return []
        return sorted((b for b in found if not self._internal(b.key)), key=lambda b: b.key)

    def exists(self, prefix: str) -> bool:
        return self._is_object(prefix) or self._any_under(prefix)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=self._prefix + key, Range=f"bytes={start}-{start + length - 1}"
            )
        except self._client.exceptions.ClientError as exc:
            if _code(exc) == "InvalidRange":  # starts past the end: a short read, like a local file
                return b""
            _raise_if_missing(exc, key)
            raise
        return cast(bytes, response["Body"].read())

    def open(self, key: str) -> BinaryIO:
        """A seekable copy of the object (memory, or disk when big), so callers may hold it freely."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, dir=str(self._scratch))  # noqa: SIM115
        try:
            self._client.download_fileobj(self._bucket, self._prefix + key, spool)
        except self._client.exceptions.ClientError as exc:
            spool.close()
            _raise_if_missing(exc, key)
            raise
        spool.seek(0)
        return cast(BinaryIO, spool)

    def move_prefix(self, source: str, target: str) -> None:
        """Server-side copy of every object, then delete the sources (S3 has no rename).

        Not atomic, and that is fine: publishing is decided by the database's `published_version`,
        and each upload moves into its own new version prefix, so a half-copied prefix is never
        served. A marker object hides the target from `list` until every copy is done, so
        `ArtifactService.recover` sees either the whole published version or none of it, and then
        re-checks the staged objects, which are deleted only after the copy completed.
        """
        keys = self._keys_at(source)
        if not keys:
            raise FileNotFoundError(f"no blobs under {source!r}")
        marker = self._moving_marker(target)
        self._client.put_object(Bucket=self._bucket, Key=self._prefix + marker, Body=b"")
        for key in keys:
            copy_source = {"Bucket": self._bucket, "Key": self._prefix + key}
            self._client.copy(copy_source, self._bucket, self._prefix + target + key[len(source) :])
        self._delete_keys([marker])
        self._delete_keys(keys)
        self._move_cached(source, target)

    def delete_prefix(self, prefix: str) -> None:
        self._delete_keys(self._keys_at(prefix))
        cached = self._cache_path(prefix)
        if cached.is_dir():
            shutil.rmtree(cached, ignore_errors=True)
        else:
            cached.unlink(missing_ok=True)

    def local_dir(self, prefix: str) -> Path:
        """Mirror the folder into the cache and return it; files already there with their size stay.

        Published versions never change (each upload gets a new prefix), and every write or delete
        through this store evicts its cached copy, so a file of the right size is the right file.
        Downloads go to a temp name then `os.replace`, so concurrent callers never see half a file.
        """
        for blob in self.list(prefix):
            path = self._cache_path(blob.key)
            if path.is_file() and path.stat().st_size == blob.size:
                continue
            temp = self._scratch / secrets.token_hex(8)
            try:
                self._client.download_file(self._bucket, self._prefix + blob.key, str(temp))
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temp, path)
            finally:
                temp.unlink(missing_ok=True)
        return self._cache_path(prefix)

    # ---------------------------------------------------------------- internals

    def upload(self, source: Path, key: str) -> None:
        """Upload (multipart when big), refusing a file where a folder is, or under a file, as locally."""
        if self._any_under(key):
            raise IsADirectoryError(f"blob key is a folder: {key!r}")
        parts = key.split("/")
        for depth in range(1, len(parts)):
            if self._is_object("/".join(parts[:depth])):
                raise NotADirectoryError(f"blob key is under a file: {key!r}")
        self._client.upload_file(str(source), self._bucket, self._prefix + key)
        self._cache_path(key).unlink(missing_ok=True)

    def _objects(self, full_prefix: str) -> Iterator[BlobInfo]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=full_prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield BlobInfo(key=str(item["Key"])[len(self._prefix) :], size=int(item["Size"]))

    def _keys_at(self, prefix: str) -> Sequence[str]:
        """The object named `prefix` (if any) and every object in the folder `prefix`."""
        under = [b.key for b in self._objects(self._folder(prefix))]
        return [prefix, *under] if prefix and self._is_object(prefix) else under

    def _any_under(self, prefix: str) -> bool:
        listed = self._client.list_objects_v2(Bucket=self._bucket, Prefix=self._folder(prefix), MaxKeys=1)
        return bool(listed.get("KeyCount", 0))

    def _is_object(self, key: str) -> bool:
        if not key:
            return False
        try:
            self._client.head_object(Bucket=self._bucket, Key=self._prefix + key)
        except self._client.exceptions.ClientError as exc:
            if _code(exc) in MISSING:
                return False
            raise
        return True

    def _delete_keys(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": self._prefix + k} for k in keys[start : start + DELETE_BATCH]]
            response = self._client.delete_objects(
                Bucket=self._bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if response.get("Errors"):
                first = response["Errors"][0]
                raise OSError(f"S3 refused to delete {first.get('Key')}: {first.get('Message')}")

    def _move_cached(self, source: str, target: str) -> None:
        """Keep the mirror `local_dir` made of the source (inspection did): workers load it at once."""
        old, new = self._cache_path(source), self._cache_path(target)
        if old.exists():
            shutil.rmtree(new, ignore_errors=True)
            new.parent.mkdir(parents=True, exist_ok=True)
            os.replace(old, new)

    def _folder(self, prefix: str) -> str:
        return f"{self._prefix}{prefix.rstrip('/')}/" if prefix else self._prefix

    @staticmethod
    def _moving_marker(prefix: str) -> str:
        return f"{prefix.rstrip('/')}/{PARTIAL_DIR}/moving"

    @staticmethod
    def _internal(key: str) -> bool:
        return PARTIAL_DIR in key.split("/")

    def _cache_path(self, key: str) -> Path:
        path = (self.cache_root / key).resolve()
        if path != self.cache_root and self.cache_root not in path.parents:
            raise ValueError(f"blob key escapes the store: {key!r}")
        return path


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _raise_if_missing(exc: Exception, key: str) -> None:
    """A missing object reads as a missing local file, as with the local store."""
    if _code(exc) in MISSING:
        raise FileNotFoundError(f"no blob {key!r}") from exc
