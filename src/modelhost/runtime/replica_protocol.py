"""The replica protocol: every message between a gateway process and a replica, declared once.

A replica is reached by every gateway process of a server (and by the supervisor over the replica's
lifeline), so its messages are typed structs rather than ad-hoc dicts: `msgspec` checks them when they
are decoded and packs them as compact msgpack arrays. A streaming request is typed too
(`generation.contract`: what an engine request can contain); the other payloads inside them (a batch
task's item, a handler's output, a generation event) stay plain dicts: each pipeline task defines its
own.

On the wire a message is a 4-byte big-endian length, then its msgpack body. `FrameReader` cuts a byte
stream into bodies; `encode` and `decode` turn messages into frames and back.

- gateway → replica: `Run` (one request of a batch task), `Generate` (start a stream), `Cancel`,
  `StatsRequest`;
- replica → gateway: `Started` (these requests go to the model now), `Results` (a batch's answers for
  this connection), `Failed` (the batch raised), `Events` (stream events), `Stats`;
- supervisor ↔ replica, on the lifeline only: `Ready` / `LoadFailed` (the model loaded or not), `Stop`.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from modelhost.generation.contract import GenerationEvent, StreamRequest

_LENGTH = struct.Struct("!I")
Payload = dict[str, Any]


class Run(msgspec.Struct, tag="run", array_like=True):
    """One request for a batch task; the replica batches it with whatever else is waiting, taking
    turns between `tenant`s (the key it runs for; "" where none is known). A `low` one (a line of a
    batch job) only takes the room in a batch that interactive requests leave. `trace` is the W3C
    `traceparent` of the gateway's span it serves ("" while tracing is off): the replica's span for it
    joins that trace."""

    id: int
    item: Payload
    tenant: str = ""
    low: bool = False
    trace: str = ""


class Generate(msgspec.Struct, tag="generate", array_like=True):
    """Start a streaming request (text generation, a video job: `generation.contract`); its events
    follow in `Events`. A `low` one (a line of a batch job) is held back by the engine as a `flex`
    request is (`generation.priority`). `trace`: as `Run`'s; `tenant`: the key it runs for, within whose
    requests its `priority` orders, with its `weights` (account, key: `generation.fairness`)."""

    id: int
    request: StreamRequest
    low: bool = False
    trace: str = ""
    tenant: str = ""
    weights: tuple[float, float] = (1.0, 1.0)


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    """The caller gave up (timeout, disconnect): drop a waiting `Run`, or stop a generation at its next
    step. Unknown or finished IDs are ignored."""

    id: int


class StatsRequest(msgspec.Struct, tag="stats_request", array_like=True):
    id: int


class Stop(msgspec.Struct, tag="stop", array_like=True):
    """Exit now (the supervisor unloads the replica)."""


class Handoff(msgspec.Struct, tag="handoff", array_like=True):
    """Hand every generation off now (a drain: a rollout's old version, a scale-down): each ends with a
    `Moved` event and continues elsewhere, and a generation that arrives later is handed off at once.
    An engine that cannot continue another's generation keeps its own until they end."""


class Started(msgspec.Struct, tag="started", array_like=True):
    """These requests of this connection are in the batch the model runs now. Sent before the model
    call: if the replica dies, the gateway knows which requests may have caused it (they fail) and which
    were still waiting (they are sent to its replacement)."""

    ids: list[int]


class Result(msgspec.Struct, array_like=True):
    id: int
    output: Payload  # the handler's output for the item, or `{"error": {...}}` for a bad item


class Results(msgspec.Struct, tag="results", array_like=True):
    """One batch's answers to the requests one connection sent: one message per batch and connection."""

    results: list[Result]


class Failed(msgspec.Struct, tag="failed", array_like=True):
    """The handler raised on a whole batch: each of these requests failed inside the replica."""

    ids: list[int]
    message: str


class Event(msgspec.Struct, array_like=True):
    id: int
    event: GenerationEvent  # `generation.contract`: the stream ends with its last (`is_last`)


class Events(msgspec.Struct, tag="events", array_like=True):
    events: list[Event]


class Stats(msgspec.Struct, tag="stats", array_like=True):
    """What a replica holds right now, for the supervisor's idle reaper and for tests."""

    id: int
    queued: int  # batch requests waiting for the model
    running: int  # sequences its streaming handler holds (running or waiting)


class Ready(msgspec.Struct, tag="ready", array_like=True):
    load_seconds: float
    # the engine an encoder replica chose at load (`engines.encoders`) and why; None: as asked
    engine: str | None = None
    engine_reason: str | None = None
    quality: str | None = None  # precision int8: its measured quality against float32


class LoadFailed(msgspec.Struct, tag="load_failed", array_like=True):
    reason: str


ToReplica = Run | Generate | Cancel | StatsRequest | Stop | Handoff
FromReplica = Started | Results | Failed | Events | Stats | Ready | LoadFailed

_encoder = msgspec.msgpack.Encoder()
_to_replica = msgspec.msgpack.Decoder(ToReplica)
_from_replica = msgspec.msgpack.Decoder(FromReplica)


def encode(message: msgspec.Struct) -> bytes:
    """One message as a frame: its length, then its body."""
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode_to_replica(body: bytes | memoryview) -> ToReplica:
    message: ToReplica = _to_replica.decode(body)
    return message


def decode_from_replica(body: bytes | memoryview) -> FromReplica:
    message: FromReplica = _from_replica.decode(body)
    return message


class FrameReader:
    """Cuts a byte stream into frame bodies, however the bytes arrive (partial frames, many at once)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        start, size = 0, len(buffer)
        while size - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + 4 + length
            if end > size:
                break
            bodies.append(bytes(buffer[start + 4 : end]))
            start = end
        if start:
            del buffer[:start]
        return bodies
