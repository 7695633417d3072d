"""Gateway ↔ worker messages: length-prefixed msgpack maps over a Unix socketpair.

The gateway creates the pair and hands one end to the worker at spawn, so there is no path to
clean up, no listener to guard, and the worker sees end-of-file the moment its gateway goes away.
Neither side runs an I/O thread: the gateway reads on its event loop, the worker blocks in `recv`
between batches. Large numeric payloads travel as msgpack `bin` (raw bytes), so vectors cross the
process boundary without float formatting.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import msgpack

_LENGTH = struct.Struct("!I")


def frame(message: dict[str, Any]) -> bytes:
    """One message as bytes on the wire: a 4-byte length, then the msgpack map."""
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def _unpack(body: bytes) -> dict[str, Any]:
    message = msgpack.unpackb(body, raw=False)
    assert isinstance(message, dict)
    return message


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next message; `asyncio.IncompleteReadError` when the worker is gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return _unpack(await reader.readexactly(length))


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(frame(message))


def recv_message(sock: socket.socket) -> dict[str, Any] | None:
    """Block for the next message; None when the gateway has closed its end (or died)."""
    header = _recv_exactly(sock, _LENGTH.size)
    if header is None:
        return None
    (length,) = _LENGTH.unpack(header)
    body = _recv_exactly(sock, length)
    return None if body is None else _unpack(body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if count == 0:
            return None
        received += count
    return bytes(buffer)
