"""The floor of a served request's path: the least a Python server of modelhost's shape spends between a
client and a model in another process, with no model and no platform.

    python -m bench.relay_floor PORT

An ASGI app on uvicorn (httptools, uvloop: modelhost's HTTP stack) reads the JSON body, parses it with
orjson, sends it over a Unix socket to a second process that answers at once with an embedding's bytes
(384 float32), and answers the client a JSON embedding of 384 numbers. Everything a served request needs
beyond that (keys, limits, metrics, billing, fair queues, the replica's batching, tokenization, the model)
is absent, so `bench.user_view` can say how far modelhost's path is above the floor and what ratio to raw a
served model could reach at best on this machine: raw / (raw + floor).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

DIM = 384


def answer_at_once(listener: socket.socket) -> None:
    """The 'replica': every message answered at once with an embedding's bytes."""
    connection, _ = listener.accept()
    vector = b"\0" * (4 * DIM)
    while connection.recv(1 << 16):
        connection.sendall(vector)


class _Replica(asyncio.Protocol):
    """The gateway's end of the socket: one request at a time (the benchmark's one connection)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[bytes] | None = None
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.received += data
        if len(self.received) >= 4 * DIM and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.received[: 4 * DIM])
            self.received = self.received[4 * DIM :]

    async def call(self, body: bytes) -> bytes:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(body)
        return await self.waiter


def app_for(path: str) -> Any:
    import orjson

    replica = _Replica()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await asyncio.get_running_loop().create_unix_connection(lambda: replica, path)
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        orjson.loads(body)
        vector = await replica.call(body)
        numbers = [float(x) for x in memoryview(vector).cast("f")]
        data = [{"object": "embedding", "index": 0, "embedding": numbers}]
        payload = orjson.dumps({"object": "list", "data": data})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


def main() -> None:
    import uvicorn

    port = int(sys.argv[1])
    path = str(Path(tempfile.mkdtemp(prefix="mh-floor-")) / "replica.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)  # before the fork: the server's first connect finds it listening
    if os.fork() == 0:
        answer_at_once(listener)
        os._exit(0)
    listener.close()
    app = app_for(path)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning")


if __name__ == "__main__":
    main()
