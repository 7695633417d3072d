"""Gateway ↔ worker messages: msgpack headers over a ZeroMQ PAIR socket on a local IPC path.

A message is one msgpack map. Large numeric payloads travel as msgpack `bin` (raw bytes), so vectors
cross the process boundary without float formatting.
"""

from __future__ import annotations

from typing import Any

import msgpack


def pack(message: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def unpack(data: bytes) -> dict[str, Any]:
    message = msgpack.unpackb(data, raw=False)
    assert isinstance(message, dict)
    return message
