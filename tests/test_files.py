"""Generated files behind signed, expiring links (`services.files`), without a server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from sqlalchemy import update

from modelhost.artifacts.blobstore import LocalBlobStore
from modelhost.errors import NotFound
from modelhost.services.files import FileService, file_secret
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, GeneratedFile
from modelhost.store.types import utcnow


@pytest.fixture
def files(sqlite_url: str, tmp_path: Path) -> FileService:
    database = Database(sqlite_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add(Account(id="acct_a", name="a"))
    return FileService(database, LocalBlobStore(tmp_path / "blobs"), b"secret", ttl_seconds=60)


def link(files: FileService, data: bytes = b"png-bytes") -> tuple[str, int, str]:
    url = files.url("http://gw/", files.store("acct_a", data, "image/png", "png"))
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    assert parsed.path.startswith("/v1/files/file_") and parsed.path.endswith("/content")
    return parsed.path.split("/")[3], int(query["expires"][0]), query["signature"][0]


def test_a_genuine_link_reads_the_file(files: FileService) -> None:
    file_id, expires, signature = link(files)
    assert files.read(file_id, expires, signature) == (b"png-bytes", "image/png")


@pytest.mark.parametrize("tamper", ["signature", "expires", "id"])
def test_a_tampered_link_is_not_found(files: FileService, tamper: str) -> None:
    file_id, expires, signature = link(files)
    if tamper == "signature":
        signature = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    elif tamper == "expires":
        expires += 3600  # a later expiry needs a new signature
    else:
        file_id = link(files, b"other")[0]
    with pytest.raises(NotFound):
        files.read(file_id, expires, signature)


def test_an_expired_link_is_not_found_and_the_sweep_deletes_the_file(files: FileService) -> None:
    file_id, expires, signature = link(files)
    with files._database.transaction() as session:
        session.execute(update(GeneratedFile).values(expires_at=utcnow() - timedelta(seconds=1)))
    with pytest.raises(NotFound):
        files.read(file_id, expires, signature)
    assert files.sweep() == 1
    assert files.sweep() == 0
    assert files._blobs.list("generated") == []


def test_the_secret_is_made_once_and_kept_in_the_data_directory(tmp_path: Path) -> None:
    first = file_secret(tmp_path, None)
    assert first == file_secret(tmp_path, None) and len(first) == 64
    assert (tmp_path / "file-url-secret").stat().st_mode & 0o077 == 0
    assert file_secret(tmp_path, "operator-secret") == b"operator-secret"
