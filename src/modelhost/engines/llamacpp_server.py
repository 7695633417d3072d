"""llama.cpp's server as the replica worker's child process, and the ways the worker reaches it.

Both builds run the same way (docs/engines-llamacpp.md, "How it runs"): a `llama-server` program
(MODELHOST_LLAMA_SERVER, the native build) with our settings as its command line (`binary_arguments`),
or the `xllamacpp` wheel's server, started by this module run as a program (`python -m
modelhost.engines.llamacpp_server`) with the same settings as the wheel's parameters (`server_params`).
Either is the worker's child, dying with it (`_die_with_parent`; the supervisor also kills the worker's
process group), on a loopback port with an API key only the worker knows; the replica's memory is its
process tree's, the child's included (`runtime.memory`).

Why a process of its own for the wheel's server too: in the worker's process, llama.cpp's compute and
HTTP threads share the process with our asyncio loop; apart, the worker is our Python alone, and one path
serves both builds (a server that exits is noticed the same way: `errored`).

Generations stream from llama.cpp's `/completion` over a plain asyncio connection (`post_lines`), parsed
in the loop's read callback: no task wakes per token, and with uvloop (`runtime.worker.llamacpp_worker`)
about half the worker's CPU per token of httpx's streams (docs/engines-llamacpp.md, "Measured"); on a
small machine every cycle of ours per token is taken from llama.cpp's compute threads. Everything else
(warm-up, embeddings, `/tokenize`, the tests' `/metrics`) goes through the httpx client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhost.engines.interface import AsyncEngine


@dataclass(frozen=True, slots=True)
class Embedding:
    """The server serves embeddings (`engines.llamacpp_embeddings`): pooled as the GGUF says, or by the
    mean of its tokens where it names no pooling (`mean_pooling`), as a plain encoder is on our engines."""

    mean_pooling: bool = False


@dataclass
class LlamaCppServer(AsyncEngine):
    """A running llama.cpp server, as the replica worker's loop holds it (`runtime.worker.async_worker`):
    what its two engines (`engines.llamacpp.LlamaCppModel`, `engines.llamacpp_embeddings.LlamaCppEmbedder`)
    share."""

    process: subprocess.Popen[bytes]  # `llama-server`, or the wheel's server in a Python of its own
    client: Any  # httpx.AsyncClient on the server's address, with its key

    @property
    def errored(self) -> bool:
        """The server exited: no request can run any more."""
        return self.process.poll() is not None

    def shutdown(self) -> None:
        self.process.kill()
        self.process.wait()

    async def post_lines(self, path: str, body: bytes, on_line: Callable[[bytes], bool]) -> Answered:
        """POST `body` (JSON) to `path` and hand each line of a 200 answer's body to `on_line` as it
        arrives, until `on_line` answers True (the caller has its answer) or the body ends. The
        connection is closed then, or when the caller is cancelled, which stops llama.cpp's slot before
        its next token."""
        url = self.client.base_url
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Answered] = loop.create_future()
        transport, _ = await loop.create_connection(lambda: _Answer(on_line, done), url.host, url.port)
        try:
            transport.write(
                b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (
                    path.encode(),
                    url.host.encode(),
                    url.port,
                    self.client.headers["Authorization"].encode(),
                    len(body),
                    body,
                )
            )
            return await done
        finally:
            transport.close()


@dataclass(frozen=True, slots=True)
class Answered:
    """How a `post_lines` request ended: its status, the body of an answer that was not a 200 (whole),
    and whether `on_line` said it was done (else the body ended first)."""

    status: int
    body: bytes = b""
    finished: bool = False


class Lines:
    """A server-sent event stream's lines, split at `\n` alone: `str.splitlines` (httpx's `aiter_lines`)
    also splits at U+2028, U+0085 and the other Unicode breaks, which llama.cpp's JSON leaves unescaped in
    a token's text (a model may well write one), cutting a chunk in two."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [line.rstrip(b"\r") for line in lines]


class _Answer(asyncio.Protocol):
    """One answer of llama.cpp's, parsed in the loop's read callback as its bytes arrive (no task wakes
    per token): the status line and headers, then a 200's chunked body, line by line to `on_line`; any
    other body is kept whole for the caller's error."""

    def __init__(self, on_line: Callable[[bytes], bool], done: asyncio.Future[Answered]) -> None:
        self.on_line = on_line
        self.done = done
        self.buffer = b""
        self.status = 0
        self.chunked = False
        self.length = 0  # an unchunked body's
        self.lines = Lines()
        self.kept: list[bytes] = []  # a chunked error's body

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.buffer += data
        try:
            if not self.status and not self._head():
                return
            if self.chunked:
                self._chunks()
            elif len(self.buffer) >= self.length:
                self.done.set_result(Answered(self.status, self.buffer[: self.length]))
        except Exception as exc:  # `on_line`'s, or a malformed answer: the caller's
            if not self.done.done():
                self.done.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():  # the body ended without its end: what `on_line` saw is all
            self.done.set_result(Answered(self.status, b"".join(self.kept) or self.buffer))

    def _head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        status_line, *lines = self.buffer[:end].split(b"\r\n")
        self.buffer = self.buffer[end + 4 :]
        self.status = int(status_line.split(b" ", 2)[1])
        headers = {
            name.strip().lower(): value.strip() for name, _, value in (h.partition(b":") for h in lines)
        }
        self.chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
        self.length = int(headers.get(b"content-length") or 0)
        return True

    def _chunks(self) -> None:
        while (line_end := self.buffer.find(b"\r\n")) >= 0:
            size = int(self.buffer[:line_end].split(b";", 1)[0], 16)
            start = line_end + 2
            if len(self.buffer) < start + size + 2:
                return
            piece, self.buffer = self.buffer[start : start + size], self.buffer[start + size + 2 :]
            if self.status != 200:
                self.kept.append(piece)
                lines = []
            else:  # the last piece (size 0) releases a last line without its newline
                lines = self.lines.feed(piece) if size else [self.lines.rest] if self.lines.rest else []
            if any(self.on_line(line) for line in lines):
                self.done.set_result(Answered(self.status, finished=True))
                return
            if not size:
                self.done.set_result(Answered(self.status, b"".join(self.kept)))
                return


# ---------------------------------------------------------------- settings, for either build


def server_params(
    model: Path, slots: int, context: int, threads: int | None, embedding: Embedding | None = None
) -> Any:
    """The wheel's server parameters, each one we decide set here (docs/engines-llamacpp.md, "How it
    runs"); an embedding model's (`embedding`) with its pooling and a whole input in one batch."""
    import xllamacpp as xlc  # type: ignore[import-untyped]

    params = xlc.CommonParams()
    params.model.path = str(model)
    params.n_parallel = slots
    params.n_ctx = slots * context
    params.kv_unified = False  # each slot its own `context` tokens, never more, never less
    params.ctx_shift = False  # a request that would overflow is refused (ours first), never shifted
    params.cont_batching = True
    params.fit_params = False  # llama.cpp must not shrink what the footprint reserved
    params.load_mode = xlc.llama_load_mode.LLAMA_LOAD_MODE_NONE  # no mmap: see `engines.llamacpp`
    params.warmup = True
    params.cache_prompt = True
    params.cache_ram_mib = 0  # no host-memory prompt cache: see `engines.llamacpp`, "Cache salts"
    if threads:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    params.n_threads_http = slots + 4  # a streaming request holds an HTTP thread to its end
    params.endpoint_metrics = True  # its counters, behind the key: what the tests read of its slots
    params.verbosity = 0  # errors only: its per-request log would flood the supervisor's
    params.api_keys = [secrets.token_urlsafe(24)]
    if embedding is not None:
        params.embedding = True
        params.n_batch = params.n_ubatch = context  # an encoder reads a whole input in one batch
        if embedding.mean_pooling:
            params.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    return params


def binary_arguments(
    path: Path, slots: int, context: int, threads: int | None, embedding: Embedding | None = None
) -> list[str]:
    """`llama-server`'s command line for what `server_params` sets."""
    arguments = [
        "--model", str(path),
        "--parallel", str(slots),
        "--ctx-size", str(slots * context),
        "--no-kv-unified",
        "--no-context-shift",
        "--cont-batching",
        "--fit", "off",
        "--load-mode", "none",
        "--warmup",
        "--cache-prompt",
        "--cache-ram", "0",
        "--threads-http", str(slots + 4),
        "--metrics",
        "--slots",
        "--log-verbosity", "0",
    ]  # fmt: skip
    if threads:
        arguments += ["--threads", str(threads), "--threads-batch", str(threads)]
    if embedding is not None:
        arguments += ["--embedding", "--batch-size", str(context), "--ubatch-size", str(context)]
        if embedding.mean_pooling:
            arguments += ["--pooling", "mean"]
    return arguments


# ---------------------------------------------------------------- starting it


def start(
    path: Path,
    slots: int,
    context: int,
    threads: int | None,
    binary: str | None = None,
    embedding: Embedding | None = None,
) -> tuple[subprocess.Popen[bytes], Any]:
    """llama.cpp's server over the GGUF at `path` as this process's child (the `binary` program, else the
    wheel's), once it answers healthy, and an HTTP client on its address with its key."""
    import httpx

    key = secrets.token_urlsafe(24)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as private:  # mode 0700; read by the server as it starts
        key_file = Path(private, "key")
        key_file.write_text(key)
        if binary:
            command = [binary, *binary_arguments(path, slots, context, threads, embedding)]
        else:
            settings = {"model": str(path), "slots": slots, "context": context, "threads": threads}
            if embedding is not None:
                settings["mean_pooling"] = embedding.mean_pooling
            command = [sys.executable, "-m", __name__, json.dumps(settings)]
        command += ["--host", "127.0.0.1", "--port", str(port), "--api-key-file", str(key_file)]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        address = f"http://127.0.0.1:{port}"
        _wait_healthy(process, address, binary or "the xllamacpp wheel's server")
    client = httpx.AsyncClient(
        base_url=address,
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=slots + 4, max_keepalive_connections=slots + 4),
    )
    return process, client


def _wait_healthy(process: subprocess.Popen[bytes], address: str, what: str) -> None:
    import httpx

    while (code := process.poll()) is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{address}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} exited with code {code} while loading (its log is above)")


def _die_with_parent() -> None:
    """In the child before it runs: SIGKILL when the worker dies, even by SIGKILL."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ---------------------------------------------------------------- the wheel's server, as a program


def main(argv: list[str]) -> None:
    """The wheel's server, run by `start` as the worker's child: `SETTINGS --host H --port P
    --api-key-file F` (the settings as JSON), serving until killed."""
    import xllamacpp as xlc

    settings = json.loads(argv[0])
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    embedding = Embedding(settings["mean_pooling"]) if "mean_pooling" in settings else None
    params = server_params(
        Path(settings["model"]), settings["slots"], settings["context"], settings["threads"], embedding
    )
    params.hostnames = [options["--host"]]
    params.port = int(options["--port"])
    params.api_keys = [Path(options["--api-key-file"]).read_text()]
    server = xlc.Server(params)  # loads the model and serves on its own threads
    try:
        while True:
            signal.pause()
    finally:
        del server


if __name__ == "__main__":
    main(sys.argv[1:])
