"""Hostile archives, as a tenant would serve them to an import (issue 58): each builder returns a small
archive's bytes that stand for much more when read naively. Gzipped where the point is a small
download; every large run of bytes is written in chunks, never held whole.

- `sparse_tar_gz`: a GNU sparse member (`S`) whose map is one byte at the end of a hole: some 270 bytes
  that `tarfile` expands to `expanded` bytes of zeros.
- `pax_sparse_tar_gz`: the same in pax form (GNU sparse 1.0: `GNU.sparse.*` records, the map in the
  member's data).
- `long_name_tar_gz`: a GNU long-name header (`L`) of `name_bytes`, which `tarfile` reads whole.
- `pax_header_tar_gz`: a pax header (`x`) of `header_bytes`, one `comment` record.
- `chained_headers_tar_gz`: `count` long-name headers in a row before one member (each makes `tarfile`
  call itself for the next).
- `zip_with_extra_fields`: a zip whose central directory gives each entry an `extra_bytes` extra field.
- `zip_with_entries`: a zip of `count` empty files.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile

BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1024 * 1024


def sparse_tar_gz(expanded: int = 200 * 1024**2, name: str = "model/model.safetensors") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 1  # one byte stored, at the end of the hole
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[386:398] = tarfile.itn(expanded - 1, 12, tarfile.GNU_FORMAT)  # the first struct: offset
    header[398:410] = tarfile.itn(1, 12, tarfile.GNU_FORMAT)  # ... and its length
    header[483:495] = tarfile.itn(expanded, 12, tarfile.GNU_FORMAT)  # the file's real size
    _checksum(header)
    return _gzipped([bytes(header), _padded(b"x"), bytes(2 * BLOCK)])


def pax_sparse_tar_gz(expanded: int = 200 * 1024**2, name: str = "model/model.safetensors") -> bytes:
    sparse_map = _padded(f"1\n{expanded - 1}\n1\n".encode())
    info = tarfile.TarInfo("model/GNUSparseFile.0/model.safetensors")
    info.size = len(sparse_map) + 1
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(expanded),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(sparse_map + b"x"))
    return buffer.getvalue()


def long_name_tar_gz(name_bytes: int) -> bytes:
    return _extended_header_tar_gz(tarfile.GNUTYPE_LONGNAME, _repeated(b"a", name_bytes))


def pax_header_tar_gz(header_bytes: int) -> bytes:
    """One pax record, `<length> comment=aaa…\\n`, `header_bytes` long."""
    prefix = f"{header_bytes} comment=".encode()
    value = header_bytes - len(prefix) - 1
    return _extended_header_tar_gz(tarfile.XHDTYPE, [prefix, *_repeated(b"a", value), b"\n"])


def chained_headers_tar_gz(count: int) -> bytes:
    link = tarfile.TarInfo("././@LongLink")
    link.type, link.size = tarfile.GNUTYPE_LONGNAME, len(b"model/config.json\0")
    one = link.tobuf(tarfile.GNU_FORMAT) + _padded(b"model/config.json\0")
    return _gzipped([one] * count + [_member("model/config.json", b"{}"), bytes(2 * BLOCK)])


def zip_with_extra_fields(entries: int, extra_bytes: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for i in range(entries):
            info = zipfile.ZipInfo(f"model/file{i}.json")
            # one field of an id no reader knows: (id, length, data)
            info.extra = (0xCAFE).to_bytes(2, "little") + (extra_bytes - 4).to_bytes(2, "little")
            info.extra += bytes(extra_bytes - 4)
            zf.writestr(info, b"{}")
    return buffer.getvalue()


def zip_with_entries(count: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for i in range(count):
            zf.writestr(f"model/file{i}.json", b"")
    return buffer.getvalue()


# ---------------------------------------------------------------- pieces


def _extended_header_tar_gz(kind: bytes, content: list[bytes]) -> bytes:
    size = sum(len(part) for part in content)
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "pax")
    info.type, info.size = kind, size
    padding = bytes(-size % BLOCK)
    end = [_member("model/config.json", b"{}"), bytes(2 * BLOCK)]
    return _gzipped([info.tobuf(tarfile.GNU_FORMAT), *content, padding, *end])


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.GNU_FORMAT) + _padded(data)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def _repeated(byte: bytes, count: int) -> list[bytes]:
    chunks = [byte * _CHUNK] * (count // _CHUNK)
    return [*chunks, byte * (count % _CHUNK)]


def _checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\0" % sum(header)


def _gzipped(parts: list[bytes]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as out:
        for part in parts:
            out.write(part)
    return buffer.getvalue()
