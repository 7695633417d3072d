"""Text-generation benchmark: a random-weight Llama served by modelhost vs in-process `model.generate` and
vs `transformers serve`, one run.

    python -m bench.generation [--seconds 20] [--tokens 64] [--out docs/benchmarks.md]

The model (about 33 M parameters: hidden 512, 8 layers, a byte-level BPE of 8000 tokens trained offline,
a ChatML template) is built in a temporary folder. Raw: `model.generate` one request at a time. Served:
streaming `POST /v1/chat/completions` from C = 1, 4, 16 asyncio workers over httpx; each worker sends
requests for `--seconds`, then finishes the one in flight. Aggregate output tokens/s = output tokens of
all responses / (first request sent → last response finished); TTFT = send → first non-empty content.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.common import _cpu_seconds, deploy, serve, table, write_section

RAW_REQUESTS = 8


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


CPU_SHAPE = Shape("cpu", 512, 8, 8, 1376, 8000, torch.float32, (1, 4, 16), 64, 400, 16)
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
    before, produced = _clocks(lambda: 0.0), 0
    for _ in range(RAW_REQUESTS):
        produced += generate(tokens)
    load = _finish(Load(completed=RAW_REQUESTS), before, lambda: 0.0)
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
    wall: float = 0.0

    @property
    def ttft_p50(self) -> str:
        return f"{statistics.median(self.ttft_ms):.1f}" if self.ttft_ms else "-"

    def error(self, message: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or " ".join(message.split())[:300]


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], load: Load) -> None:
    """One streaming chat completion, recorded in `load`: its output tokens and TTFT, or its error."""
    sent, first, chunks, usage = time.perf_counter(), 0.0, 0, None
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            load.error(f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}")
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                load.error(f"error event: {event['error']}")
                return
            usage = event.get("usage") or usage
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                chunks += 1
                first = first or time.perf_counter()
    if not first:
        load.error("no content in the stream")
        return
    load.ttft_ms.append((first - sent) * 1000)
    load.completed += 1
    load.tokens += int(usage["completion_tokens"]) if usage else chunks


async def drive(url: str, key: str, body: dict[str, Any], concurrency: int, seconds: float) -> Load:
    """C workers, each sending requests until the deadline and then finishing the one in flight."""
    load = Load()
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(headers=headers, timeout=300, limits=limits) as client:

        async def worker() -> None:
            while True:  # at least one request each, so a slow server still shows a figure
                try:
                    await _stream(client, f"{url}/v1/chat/completions", body, load)
                except (httpx.HTTPError, ValueError) as exc:
                    load.error(f"{type(exc).__name__}: {exc}")
                if time.perf_counter() >= deadline:
                    return

        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        load.tokens_per_second = load.tokens / (time.perf_counter() - started)
    return load


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _clocks(server_cpu: Callable[[], float]) -> tuple[float, float, float, float]:
    """(server CPU s, this process's CPU s, the machine's busy CPU s, wall s)."""
    times = os.times()
    return server_cpu(), times.user + times.system, _busy_seconds(), time.monotonic()


def _finish(load: Load, before: tuple[float, ...], server_cpu: Callable[[], float]) -> Load:
    """Set the load's wall time and cores since `before` (a `_clocks` reading)."""
    server, own, busy, load.wall = (a - b for a, b in zip(_clocks(server_cpu), before, strict=True))
    load.cores = (server / load.wall, own / load.wall, max(0.0, busy - server - own) / load.wall)
    return load


def measure(
    url: str,
    key: str,
    body: dict[str, Any],
    seconds: float,
    server_cpu: Callable[[], float],
    concurrency: tuple[int, ...],
) -> dict[int, Load]:
    """A warm-up request, then the load at each concurrency, with the cores each party used."""
    warm = asyncio.run(drive(url, key, body, 1, 0))
    if warm.errors:
        raise RuntimeError(f"warm-up request failed: {warm.first_error}")
    loads: dict[int, Load] = {}
    for c in concurrency:
        before = _clocks(server_cpu)
        load = _finish(asyncio.run(drive(url, key, body, c, seconds)), before, server_cpu)
        print(f"  {c} streams: {load.tokens_per_second:.1f} tokens/s, errors {load.errors}", flush=True)
        loads[c] = load
    return loads


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


def run_modelhost(
    folder: Path, port: int, body: dict[str, Any], seconds: float, concurrency: tuple[int, ...]
) -> dict[int, Load]:
    served = serve(port)
    try:
        deploy(served, folder, "text-generation", "llama", readiness="hot")
        cpu = lambda: sum(served.cpu_seconds())  # noqa: E731
        return measure(served.url, served.key, body, seconds, cpu, concurrency)
    finally:
        served.stop()


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

    from modelhost.generation.engine import GenerationEngine, SamplingParams
    from modelhost.generation.engine import Sequence as EngineSequence
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
    _stop(process)
    raise RuntimeError(f"did not start (exit code {process.returncode}): {_last_error(log)}")


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_transformers_serve(
    folder: Path, port: int, flags: Sequence[str], tokens: int, seconds: float, concurrency: tuple[int, ...]
) -> dict[int, Load] | str:
    """The load on `transformers serve` with these flags, or why it could not be measured."""
    log = Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    try:
        process = _start_transformers_serve(folder, port, flags, log)
        try:
            body = transformers_body(folder, tokens)
            cpu = lambda: _cpu_seconds(process.pid)  # noqa: E731
            return measure(f"http://127.0.0.1:{port}", "-", body, seconds, cpu, concurrency)
        finally:
            _stop(process)
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


def _summary(result: dict[int, Load] | str) -> str:
    if isinstance(result, str):
        return result
    return ", ".join(f"{c}: {load.tokens_per_second:.1f} tokens/s" for c, load in result.items())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def _ratios(raw: Load, ours: dict[int, Load], theirs: dict[str, dict[int, Load] | str]) -> list[str]:
    most = max(ours)
    top, one = ours[most].tokens_per_second, ours[1].tokens_per_second
    lines = [f"- **modelhost {most} streams / modelhost 1 stream: {_ratio(top, one)}** (target ≥ 4)."]
    for name, result in theirs.items():
        if isinstance(result, str):
            lines.append(f"- modelhost {most} streams / {name}: not measured: `` {result} ``.")
        else:
            other = result[most].tokens_per_second
            target = "≥ 1.3" if "continuous" in name else "> 1"
            lines.append(
                f"- **modelhost {most} streams / {name} {most} streams: {_ratio(top, other)}** "
                f"(target {target})."
            )
    lines.append(f"- modelhost 1 stream / raw `model.generate`: {_ratio(one, raw.tokens_per_second)}.")
    return lines


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


def report(
    shape: Shape,
    parameters: int,
    seconds: float,
    raw: Load,
    ours: dict[int, Load],
    theirs: dict[str, dict[int, Load] | str],
    reuse: PrefixReuse,
) -> str:
    tokens = shape.tokens
    runs = {"raw `model.generate`": {1: raw}, "modelhost": ours}
    runs.update({name: result for name, result in theirs.items() if not isinstance(result, str)})
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
        f"everything else on the machine (from /proc/stat). One run of `make bench`; figures vary run "
        f"to run.",
        "",
        table(header, _rows(runs)),
        "",
        *_ratios(raw, ours, theirs),
        *_errors(runs),
        *_warnings(runs),
        "",
        reuse.report(),
    ]
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
    parser.add_argument("--port", type=int, default=18766)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--skip-transformers-serve", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu needs CUDA")
    shape = GPU_SHAPE if args.gpu else CPU_SHAPE
    if args.tokens:
        shape = dataclasses.replace(shape, tokens=args.tokens)

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
        body = modelhost_body(shape.tokens)
        ours = run_modelhost(folder, args.port, body, args.seconds, shape.concurrency)
        print(f"modelhost: {_summary(ours)}", flush=True)
        theirs: dict[str, dict[int, Load] | str] = {}
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
    section = report(shape, parameters, args.seconds, raw, ours, theirs, reuse)
    print(section)
    heading = "## Text generation on a GPU:" if args.gpu else "## Text generation:"
    write_section(args.out, heading, section)


if __name__ == "__main__":
    main()
