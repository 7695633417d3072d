"""The floor of a served request's path: the least a Python server of modelhost's shape spends between a
client and a model in another process, with no model and no platform.

    python -m bench.relay_floor PORT [--model-ms MS] [--token-ms MS]

An ASGI app on uvicorn (httptools, uvloop: modelhost's HTTP stack) reads the JSON body, parses it with
orjson, sends it over a Unix socket to a second process that answers with an embedding's bytes (384
float32), and answers the client a JSON embedding of 384 numbers. Everything a served request needs beyond
that (keys, limits, metrics, billing, fair queues, the replica's batching, tokenization, the model) is
absent, so `bench.user_view` can say how far modelhost's path is above the floor and what ratio to raw a
served model could reach at best on this machine: raw / (raw + floor).

- `--model-ms`: the 'replica' spends that long on a core before each answer, as a model would, so the
  floor is measured at a served model's rate: on a small machine what a request's path costs depends on
  how often it runs (a process woken 150 times a second finds its caches cold each time, and pays more per
  wakeup than one woken 3,000 times), so modelhost at a model's rate compares with the floor at that rate.
- `POST /stream` (a body `{"max_tokens": N}`): the 'replica' sends N tokens, one every `--token-ms`, and
  the app relays each to the client as an OpenAI chat chunk in a server-sent event: the floor of a
  streamed output token (`bench.path_costs`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import httpx

from bench.common import COUNTER, _cpu_seconds, stop_process, wrk

DIM = 384
TOKEN = 4  # bytes of a token's frame from the 'replica'
STREAM = b"S"  # a message's first byte: a stream of tokens; anything else, an embedding


def _spend(seconds: float) -> None:
    """Keep this process on a core for `seconds`, as a model's forward pass does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def answer(listener: socket.socket, model_seconds: float = 0.0, token_seconds: float = 0.0) -> None:
    """The 'replica': every message (a 4-byte length, then the body) answered in order, an embedding's
    bytes after `model_seconds` on a core, or a stream's tokens one every `token_seconds`, so any number of
    connections can share the socket."""
    connection, _ = listener.accept()
    vector = b"\0" * (4 * DIM)
    pending = b""
    while chunk := connection.recv(1 << 16):
        pending += chunk
        embeddings = 0
        while len(pending) >= 4 and len(pending) >= 4 + (size := int.from_bytes(pending[:4], "little")):
            body, pending = pending[4 : 4 + size], pending[4 + size :]
            if body[:1] == STREAM:
                for number in range(int(body[1:])):
                    _spend(token_seconds)
                    connection.sendall(number.to_bytes(TOKEN, "little"))
            else:
                embeddings += 1
                _spend(model_seconds)
        if embeddings:
            connection.sendall(vector * embeddings)


class _Replica(asyncio.Protocol):
    """The gateway's end of the socket: answers come in the order the requests were sent; one stream at
    a time (the benchmark's one stream)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.tokens: asyncio.Queue[int] | None = None
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.tokens is not None:
            while len(self.received) >= TOKEN:
                self.tokens.put_nowait(int.from_bytes(self.received[:TOKEN], "little"))
                self.received = self.received[TOKEN:]
            return
        while len(self.received) >= 4 * DIM and self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(self.received[: 4 * DIM])
            self.received = self.received[4 * DIM :]

    def _send(self, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(len(body).to_bytes(4, "little") + body)

    async def call(self, body: bytes) -> bytes:
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self._send(body)
        return await waiter

    def stream(self, count: int) -> asyncio.Queue[int]:
        self.tokens = asyncio.Queue()
        self._send(STREAM + str(count).encode())
        return self.tokens


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
        request = orjson.loads(body)
        if scope["path"] == "/stream":
            await _relay(replica.stream(int(request["max_tokens"])), int(request["max_tokens"]), send)
            return
        vector = await replica.call(body)
        numbers = [float(x) for x in memoryview(vector).cast("f")]
        data = [{"object": "embedding", "index": 0, "embedding": numbers}]
        payload = orjson.dumps({"object": "list", "data": data})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _relay(tokens: asyncio.Queue[int], count: int, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(count):
            token = await tokens.get()
            chunk = {
                "id": "chatcmpl-floor",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "floor",
                "choices": [{"index": 0, "delta": {"content": f" {token}"}, "finish_reason": None}],
            }
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


class Floor:
    """`python -m bench.relay_floor` on `port` in its own process while a benchmark runs (a context
    manager): its rate under a load, and the CPU its server process spent (not its stand-in replica's)."""

    def __init__(self, port: int, *, model_ms: float = 0.0, token_ms: float = 0.0) -> None:
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "bench.relay_floor", str(port)]
        command += ["--model-ms", str(model_ms), "--token-ms", str(token_ms)]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.post(self.url, json={"input": "ready?"}, timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("bench.relay_floor did not answer in 30 s")

    def rate(
        self, connections: int, seconds: int, unit: str = "request", body: dict[str, str] | None = None
    ) -> float:
        """Requests (wrk, a distinct body each) or streamed tokens (one stream after another) a second."""
        if unit == "output token":
            return self._tokens(seconds) / seconds
        body = body or {"model": "floor", "input": f"sentence number {COUNTER} of the floor"}
        run = wrk(self.url, "/v1/embeddings", body, "floor", connections, seconds, distinct=True)
        if run.errors:  # wrk counts answers of any status: a failing relay would read as a fast floor
            raise RuntimeError(f"bench.relay_floor answered {run.errors} requests with an error")
        return run.requests_per_second

    def _tokens(self, seconds: int) -> int:
        tokens, until = 0, time.monotonic() + seconds
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < until:
                with client.stream("POST", f"{self.url}/stream", json={"max_tokens": 64}) as answer:
                    tokens += sum(line.startswith("data: {") for line in answer.iter_lines())
        return tokens

    def cpu(self) -> float:
        """CPU seconds of the floor's server process so far."""
        return _cpu_seconds(self.process.pid)

    def stop(self) -> None:
        stop_process(self.process)

    def __enter__(self) -> Floor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("port", type=int)
    parser.add_argument("--model-ms", type=float, default=0.0, help="the replica's time per embedding")
    parser.add_argument("--token-ms", type=float, default=0.0, help="the replica's time per streamed token")
    args = parser.parse_args()
    path = str(Path(tempfile.mkdtemp(prefix="mh-floor-")) / "replica.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)  # before the fork: the server's first connect finds it listening
    if os.fork() == 0:
        answer(listener, args.model_ms / 1000, args.token_ms / 1000)
        os._exit(0)
    listener.close()
    app = app_for(path)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", log_level="warning")


if __name__ == "__main__":
    main()
