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

Generations stream from llama.cpp's `/completion` over a plain asyncio connection (`stream`): httpx's
layers (httpcore, h11, anyio) cost twice the CPU per streamed token of reading the chunked body here, and
on a small machine every cycle of ours per token is taken from llama.cpp's compute threads. Everything
else (warm-up, embeddings, `/tokenize`, the tests' `/metrics`) goes through the httpx client.
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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Embedding:
    """The server serves embeddings (`engines.llamacpp_embeddings`): pooled as the GGUF says, or by the
    mean of its tokens where it names no pooling (`mean_pooling`), as a plain encoder is on our engines."""

    mean_pooling: bool = False


@dataclass
class LlamaCppServer:
    """A running llama.cpp server, as the replica worker's loop holds it (`runtime.worker.async_worker`)."""

    process: subprocess.Popen[bytes]  # `llama-server`, or the wheel's server in a Python of its own
    client: Any  # httpx.AsyncClient on the server's address, with its key

    async def abort(self, request_id: str) -> None:
        """Nothing to do: a cancelled request's stream is closed as its task unwinds, which stops its
        slot."""

    @property
    def errored(self) -> bool:
        """The server exited: no request can run any more."""
        return self.process.poll() is not None

    def shutdown(self) -> None:
        self.process.kill()
        self.process.wait()

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: bytes) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        """POST `body` (JSON) to `path`: (the status, the response body's pieces as they arrive). Leaving
        the block closes the connection, which stops llama.cpp's slot before its next token."""
        url = self.client.base_url
        reader, writer = await asyncio.open_connection(url.host, url.port)
        try:
            writer.write(
                b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (
                    path.encode(),
                    url.host.encode(),
                    url.port,
                    self.client.headers["Authorization"].encode(),
                    len(body),
                    body,
                )
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _head(head)
            yield status, _body(reader, headers)
        finally:
            writer.close()


def _head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """An HTTP response's status and headers (names lower case)."""
    status_line, *lines = head[:-4].split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(b" ", 2)[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> AsyncIterator[bytes]:
    """A response body as it arrives: chunked (llama.cpp's streams), else whole."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
            yield (await reader.readexactly(size + 2))[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        yield await reader.read()


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
