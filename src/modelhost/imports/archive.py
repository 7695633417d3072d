"""Unpacking an imported archive (`.tar`, `.tar.gz` / `.tgz`, `.zip`) safely.

An archive comes from anywhere, so every member is judged before a byte of it is staged: a first pass
reads the member list (for a gzipped tar, the whole stream, counting what it inflates) and refuses the
archive as `unsafe_archive` if any member has an absolute path, a `..`, a path `clean_upload_path`
refuses, a duplicate path, or is anything but a regular file or a folder (links of every kind,
devices, fifos: refusing all links is simpler than proving where each points); or if there are more
members than `max_members`, more bytes than `max_bytes`, or more bytes than `MAX_RATIO` times the
archive's own size (a zip or gzip bomb). Bytes are counted as they are actually inflated, never taken
from headers. The second pass yields each member for the runner to stage, counting again.

What an archive expands to is judged before it is read, where a header could make a reader hold or make
more than the bytes it stands on:
- a tar's sparse members (GNU `S`, or pax `GNU.sparse.*`) are refused: their holes are made of zeros
  that no stream byte pays for (269 bytes of `.tar.gz` would stage 200 MiB), and model files are never
  sparse. Refused on the header, before the sparse map is read (its pax 1.0 form may be as long as the
  archive);
- a tar's long-name and pax headers (GNU `L` / `K`, pax `x` / `g`, Solaris `X`) are read whole into
  memory by `tarfile`, so their stated size is checked first (`MAX_HEADER_BYTES`), at most
  `MAX_HEADERS_PER_MEMBER` of them before a member (each calls the next: a long chain would exhaust the
  stack), and global headers, which `tarfile` keeps for the whole archive, `MAX_HEADER_BYTES` in all.
  `_BoundedTarInfo._proc_member` does it: `tarfile`'s own entry point for a header, documented in its
  source as the method a subclass overrides, the same in Python 3.11 to 3.13;
- a member's path longer than any artifact path could be (`MAX_NAME_LENGTH`) is refused on sight, rather
  than held with the others until every path is checked;
- a zip's central directory, which `zipfile` reads whole and turns into one object per entry before
  anything else, is judged from its end record first: more entries than `max_members`, or more than
  `ZIP_DIRECTORY_BYTES_PER_ENTRY` bytes per entry on average (huge names, extra fields or comments), is
  `unsafe_archive`. Zip64 sizes are headers like any other: the expansion is counted as it inflates.

Paths: a leading `./` is dropped, and one folder that holds everything (`model/config.json`,
`model/model.safetensors`, as `tar czf model.tgz model` makes) is stripped, so the files land at the
artifact's root. Folders are implied by their files; macOS's `__MACOSX/` resource forks are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from modelhost.artifacts.paths import MAX_PATH_LENGTH, MAX_SEGMENT_LENGTH, clean_upload_path
from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports.sources import ImportFailed

# An archive may inflate to at most this many times its own size (model weights barely compress; a
# bomb inflates a thousandfold) ...
MAX_RATIO = 100
# ... except that small archives may always inflate this far: tiny test models and config-only
# archives compress well, and this much is harmless.
RATIO_FLOOR_BYTES = 64 * 1024**2
_CHUNK = 1024**2
_SKIPPED_FOLDERS = ("__MACOSX/",)
# A tar's long-name and pax headers, read whole by `tarfile`: a path (512 characters at most in an
# artifact), times, a few extended attributes fit many times over.
MAX_HEADER_BYTES = 64 * 1024
# Extended headers before one member: pax, long name and long link make three.
MAX_HEADERS_PER_MEMBER = 8
# The longest member path that can still land at an artifact path (one top folder is stripped).
MAX_NAME_LENGTH = MAX_PATH_LENGTH + MAX_SEGMENT_LENGTH + 1
# A zip's central directory, per entry on average: 46 bytes, the name, small extra fields.
ZIP_DIRECTORY_BYTES_PER_ENTRY = 4096
_EXTENDED_HEADERS = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


@dataclass(frozen=True)
class ArchiveLimits:
    """How far an archive may expand."""

    max_members: int
    max_bytes: int
    max_ratio: int = MAX_RATIO

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchiveLimits:
        return cls(max_members=settings.max_upload_files, max_bytes=settings.import_archive_max_bytes)


@dataclass(frozen=True)
class ArchiveMember:
    """One regular file of an archive: where it lands in the artifact, its size, and its bytes (read
    it to the end before asking for the next member; ImportFailed if the bytes break a bound)."""

    path: str
    size: int
    stream: IO[bytes]


def unpack(archive: Path, limits: ArchiveLimits) -> Iterator[ArchiveMember]:
    """The regular files of `archive` (tar, gzipped tar or zip, told by their first bytes), each with
    its clean path, after every member passed the checks; ImportFailed(`unsafe_archive`) otherwise."""
    with archive.open("rb") as probe:
        magic = probe.read(4)
    budget = _Budget(limits, archive.stat().st_size)
    if magic.startswith(b"PK"):
        return _unpack_zip(archive, limits, budget)
    return _unpack_tar(archive, limits, budget, gzipped=magic.startswith(b"\x1f\x8b"))


async def unpack_async(
    archive: Path, limits: ArchiveLimits
) -> AsyncIterator[tuple[str, int, AsyncIterator[bytes]]]:
    """`unpack` for the event loop, as the runner stages members with `put_file`: (path, size, chunks)
    of each member, every read of the archive in a worker thread. Read a member's chunks to the end
    before asking for the next member."""
    members = unpack(archive, limits)
    while (member := await asyncio.to_thread(next, members, None)) is not None:
        yield member.path, member.size, _chunks(member.stream)


async def _chunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(stream.read, _CHUNK):
        yield chunk


def _unsafe(message: str) -> ImportFailed:
    return ImportFailed("unsafe_archive", message)


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Budget:
    """The bytes an archive has inflated so far, against `max_bytes` and `max_ratio` × its size."""

    def __init__(self, limits: ArchiveLimits, archive_size: int) -> None:
        self.limit = min(limits.max_bytes, max(limits.max_ratio * archive_size, RATIO_FLOOR_BYTES))
        self.spent = 0

    def spend(self, count: int) -> None:
        self.spent += count
        if self.spent > self.limit:
            raise _unsafe(
                f"The archive expands to more than {self.limit} bytes (the bound: the server's "
                f"MODELHOST_IMPORT_ARCHIVE_MAX_BYTES, and {MAX_RATIO} times the archive's own size)"
            )


class _Counted(io.RawIOBase):
    """A stream whose every byte read is charged to a budget: what is actually inflated, not what a
    header claims."""

    def __init__(self, raw: _Readable, budget: _Budget) -> None:
        self._raw = raw
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            data = self._raw.read(len(buffer))
        except (OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError) as exc:
            raise _unsafe(f"The archive is corrupt: {exc}") from None
        self._budget.spend(len(data))
        buffer[: len(data)] = data
        return len(data)


# ---------------------------------------------------------------- paths


def _member_path(name: str) -> str | None:
    """The member's path with a leading `./` dropped; None for a folder or a skipped entry."""
    if len(name) > MAX_NAME_LENGTH:
        raise _unsafe(f"The archive holds a path longer than {MAX_NAME_LENGTH} characters: {name[:200]!r}…")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(f"The archive holds an absolute path: {name[:200]!r}")
    if ".." in name.replace("\\", "/").split("/"):
        raise _unsafe(f"The archive holds a path leading out of it: {name[:200]!r}")
    while name.startswith("./"):
        name = name[2:]
    if name in ("", ".") or name.endswith("/") or name.startswith(_SKIPPED_FOLDERS):
        return None
    return name


def _final_paths(names: list[str]) -> list[str]:
    """Clean paths, one common top folder stripped; refuses what `clean_upload_path` refuses and
    paths given twice (or a file where another member needs a folder)."""
    if not names:
        raise ImportFailed("source_not_found", "The archive holds no files")
    parts = [name.split("/") for name in names]
    if parts and all(len(p) > 1 for p in parts) and len({p[0] for p in parts}) == 1:
        names = ["/".join(p[1:]) for p in parts]
    for name in names:
        try:
            clean_upload_path(name)
        except InvalidRequest as exc:
            raise _unsafe(
                f"The archive holds a path that cannot be a file of an artifact ({name[:200]!r}): {exc}"
            ) from None
    seen = set(names)
    if len(seen) != len(names):
        raise _unsafe("The archive holds the same path twice")
    for name in names:
        folders = name.split("/")[:-1]
        if any("/".join(folders[: i + 1]) in seen for i in range(len(folders))):
            raise _unsafe(f"The archive holds a file where a folder is needed: {name[:200]!r}")
    return names


def _check_count(count: int, limits: ArchiveLimits) -> None:
    if count > limits.max_members:
        raise _unsafe(f"The archive holds more than {limits.max_members} members")


# ---------------------------------------------------------------- tar


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header judged before `tarfile` acts on it (see the module's docstring)."""

    def _proc_member(self, tar: tarfile.TarFile) -> Any:
        assert isinstance(tar, _BoundedTarFile)
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse(self.name)
        if self.type not in _EXTENDED_HEADERS:
            tar.headers_in_a_row = 0
            return super()._proc_member(tar)  # type: ignore[misc]
        tar.headers_in_a_row += 1
        if self.type == tarfile.XGLTYPE:
            tar.global_header_bytes += self.size
        if self.size > MAX_HEADER_BYTES or tar.global_header_bytes > MAX_HEADER_BYTES:
            raise _unsafe(
                f"The archive holds a {self.size}-byte long-name or pax header (at most {MAX_HEADER_BYTES})"
            )
        if tar.headers_in_a_row > MAX_HEADERS_PER_MEMBER:
            raise _unsafe(f"The archive holds more than {MAX_HEADERS_PER_MEMBER} headers for one member")
        return super()._proc_member(tar)  # type: ignore[misc]

    # The pax forms of a sparse member: refused before their map is read (called by `_proc_pax` with
    # arguments that differ between Python versions).
    def _proc_gnusparse_00(self, member: tarfile.TarInfo, *_: Any) -> None:
        raise _sparse(member.name)

    def _proc_gnusparse_01(self, member: tarfile.TarInfo, *_: Any) -> None:
        raise _sparse(member.name)

    def _proc_gnusparse_10(self, member: tarfile.TarInfo, *_: Any) -> None:
        raise _sparse(member.name)


class _BoundedTarFile(tarfile.TarFile):
    """A TarFile of `_BoundedTarInfo` headers, keeping what their bounds count."""

    tarinfo = _BoundedTarInfo
    headers_in_a_row = 0
    global_header_bytes = 0


def _sparse(name: str) -> ImportFailed:
    return _unsafe(f"The archive holds a sparse file: {name[:200]!r} (only regular files are imported)")


@contextlib.contextmanager
def _open_tar(archive: Path, budget: _Budget, gzipped: bool) -> Iterator[tarfile.TarFile]:
    with archive.open("rb") as file:
        raw: _Readable = gzip.GzipFile(fileobj=file) if gzipped else file
        counted = io.BufferedReader(_Counted(raw, budget), _CHUNK)
        try:
            # stream mode: one pass in order, every byte of the stream read (and counted) once
            tar = _BoundedTarFile.open(fileobj=counted, mode="r|")  # closed by the `with` below
        except tarfile.TarError as exc:
            raise _unsafe(f"Not a tar, gzipped tar or zip archive: {exc}") from None
        with tar:
            yield tar


def _tar_members(tar: tarfile.TarFile, limits: ArchiveLimits) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """(member, raw path) of each regular file; refuses links, devices and fifos on sight."""
    count = 0
    try:
        for member in tar:
            count += 1
            _check_count(count, limits)
            path = _member_path(member.name)
            if member.isdir():
                continue
            if member.issparse():  # whatever form it came in
                raise _sparse(member.name)
            if not member.isreg():
                kind = "link" if member.issym() or member.islnk() else "device, fifo or other special file"
                raise _unsafe(
                    f"The archive holds a {kind}: {member.name[:200]!r} (only regular files are imported)"
                )
            if path is not None:
                yield member, path
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise _unsafe(f"The archive is corrupt: {exc}") from None


def _unpack_tar(
    archive: Path, limits: ArchiveLimits, budget: _Budget, *, gzipped: bool
) -> Iterator[ArchiveMember]:
    with _open_tar(archive, budget, gzipped) as tar:
        paths = _final_paths([path for _member, path in _tar_members(tar, limits)])
    budget.spent = 0  # the second pass inflates the same bytes again
    with _open_tar(archive, budget, gzipped) as tar:
        for (member, _raw), path in zip(_tar_members(tar, limits), paths, strict=True):
            stream = tar.extractfile(member)
            assert stream is not None  # a regular file
            yield ArchiveMember(path, member.size, stream)


# ---------------------------------------------------------------- zip


def _zip_members(
    zf: zipfile.ZipFile, limits: ArchiveLimits, budget: _Budget
) -> list[tuple[zipfile.ZipInfo, str]]:
    infos = zf.infolist()
    _check_count(len(infos), limits)
    members = []
    for info in infos:
        path = _member_path(info.filename)
        mode = info.external_attr >> 16
        if info.is_dir() or path is None:
            continue
        if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # zips made off Unix say no type: a file
            kind = "link" if stat.S_ISLNK(mode) else "device, fifo or other special file"
            raise _unsafe(
                f"The archive holds a {kind}: {info.filename[:200]!r} (only regular files are imported)"
            )
        if info.flag_bits & 0x1:
            raise _unsafe(f"The archive holds an encrypted file: {info.filename[:200]!r}")
        members.append((info, path))
    # Headers can lie, so this only refuses early; the bytes are counted again as they inflate.
    budget.spend(sum(info.file_size for info, _path in members))
    budget.spent = 0
    return members


_END = struct.Struct("<4s4H2LH")  # the end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


def _zip_directory(archive: Path) -> tuple[int, int]:
    """(entries, bytes) of a zip's central directory, read from its end record (zip64's where it has
    one), as `zipfile` would find them; BadZipFile when there is none."""
    size = archive.stat().st_size
    with archive.open("rb") as file:
        file.seek(max(0, size - _END.size - 0xFFFF))  # the record, after at most a 64 KiB comment
        tail = file.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _END.size:
            raise zipfile.BadZipFile("no end of central directory record")
        _, _, _, _, entries, directory, _, _ = _END.unpack_from(tail, at)
        start = size - len(tail) + at - _END64_LOCATOR.size
        if start >= 0:
            file.seek(start)
            signature, _, end64, _ = _END64_LOCATOR.unpack(file.read(_END64_LOCATOR.size))
            if signature == b"PK\x06\x07":
                file.seek(end64)
                record = file.read(_END64.size)
                if len(record) == _END64.size and record[:4] == b"PK\x06\x06":
                    entries, directory = _END64.unpack(record)[7:9]
    return entries, directory


def _check_zip_directory(archive: Path, limits: ArchiveLimits) -> None:
    """Refuse, before `zipfile` reads it whole, a central directory with too many entries or too many
    bytes for them."""
    try:
        entries, directory = _zip_directory(archive)
    except (zipfile.BadZipFile, OSError, struct.error) as exc:
        raise _unsafe(f"Not a valid zip archive: {exc}") from None
    _check_count(entries, limits)
    if directory > max(entries, 1) * ZIP_DIRECTORY_BYTES_PER_ENTRY:
        raise _unsafe(
            f"The archive's directory takes {directory} bytes for {entries} entries (at most "
            f"{ZIP_DIRECTORY_BYTES_PER_ENTRY} each: names, extra fields and comments that large are refused)"
        )


def _unpack_zip(archive: Path, limits: ArchiveLimits, budget: _Budget) -> Iterator[ArchiveMember]:
    _check_zip_directory(archive, limits)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise _unsafe(f"Not a valid zip archive: {exc}") from None
    with zf:
        members = _zip_members(zf, limits, budget)
        paths = _final_paths([path for _info, path in members])
        for (info, _raw), path in zip(members, paths, strict=True):
            with zf.open(info) as raw:
                stream = io.BufferedReader(_Counted(raw, budget), _CHUNK)
                yield ArchiveMember(path, info.file_size, stream)
