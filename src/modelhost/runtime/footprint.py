"""A deployment's footprint before it loads: what one replica will take of host memory and of a GPU's.

Predicted from what is known before any process starts, in this order:
1. the footprint its artifact's replicas were last measured at, on the same engine, precision and
   device kind (remembered in the database: `DeploymentSpec.remembered`);
2. else the weights (the artifact's weight files, as large in memory as on disk: transformers and vLLM
   load a checkpoint in its own precision), plus the KV cache a generation engine is given (below),
   plus the engine's base cost: the most any replica of that engine measured above its weights and KV
   cache on this server, or a first guess (its row's `base_bytes` in `engine_table`: `BASE_COSTS`) until
   one has.

Once loaded, the measured footprint replaces the prediction (`runtime.supervisor.manager`).

**A GGUF on llama.cpp** (`engine: llamacpp`) is predicted from its header (`artifacts.gguf_check`): its
tensors' bytes (read into the replica's memory, not mapped: docs/engines-llamacpp.md), plus the KV cache
of its slots (`llamacpp_layout`: layers × KV heads × (key + value length) × 2 bytes, llama.cpp's f16 cache,
× slots × context per slot), plus llama.cpp's compute buffers (`LLAMACPP_UBATCH` tokens of logits and
activations, in float32: `ubatch × 4 × (vocabulary + 8 × embedding width)`; 2.3 MB predicted for the
tests' tiny Qwen3 against the 2.1 MiB llama.cpp reports, ~330 MB for an 8B Llama 3 against its ~260 MiB),
plus the engine's base cost (our Python, the tokenizer, the server's threads). Then measured, as every
replica is. An embedding GGUF (feature-extraction) reads a whole input in one batch of a slot's context
and computes no logits: its compute buffers are `context × 4 × 8 × width` plus the attention scores of
one batch (`context² × heads × 4`), and an encoder (BERT and the other `ENCODER_ARCHITECTURES`) has no
KV cache at all: all-MiniLM-L6-v2 is its 90 MB of float32 weights and ~19 MB of buffers.

**The KV cache** of a generation replica (text generation, chat with images) is part of its footprint,
so it is decided here and handed to the replica (`MODELHOST_KV_CACHE_MB` in its environment, read by
both engines; vLLM's own sizing, a fraction of the machine, is never used): `MODELHOST_KV_CACHE_MB` when
the operator sets it, else room for 64 whole contexts (the deployment's `max_model_len` where it sets one,
else the model's), at most an eighth of the host budget on a CPU, or
half of what the GPU's budget leaves beside the weights.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhost.artifacts.gguf_check import ENCODER_ARCHITECTURES, InvalidGguf, read_gguf_set
from modelhost.engine_table import AUTO, ENGINE_TABLE, spec
from modelhost.pipelines import BY_NAME
from modelhost.runtime.capacity import MB, Footprint

# First guesses of an engine's cost above its weights and KV cache, for a replica forked from the
# worker template (`transformers`, the encoder runtimes, `auto`: one that measures them at load) or
# started as a program of its own (vLLM's processes, llama.cpp's), until one is measured on this server:
# each engine's row says its own (`engine_table`, where the measurements behind them are).
BASE_COSTS = {name: row.base_bytes for name, row in ENGINE_TABLE.items()} | {AUTO: spec(AUTO).base_bytes}
# A worker started as a new program (no template): its imports are its own, not shared
EXECUTED_WORKER_COST = 400 * MB
# What a process holds on a GPU before its model: the CUDA context and the caching allocator's slack
GPU_PROCESS_COST = 512 * MB
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".onnx_data", ".gguf")
KV_SLOTS = 64  # tasks.text_generation.MAX_RUNNING_SEQUENCES: room for this many whole contexts
LLAMACPP_UBATCH = 512  # llama.cpp's default physical batch: its compute buffers hold this many tokens
LLAMACPP_CONTEXT_STEP = 256  # llama.cpp pads its whole context to this: each slot's is a multiple of it
F16_BYTES = 2  # llama.cpp's KV cache type (its default)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True, slots=True)
class Prediction:
    """One replica's predicted footprint, and its parts (what measurement is compared with)."""

    footprint: Footprint
    weights: int
    kv_cache: int  # bytes given to its generation engine's KV cache (0: not a generation task)
    remembered: bool  # from an earlier replica's measurement rather than estimated
    compute: int = 0  # an engine's own buffers predicted beside them (llama.cpp's compute buffers)


@dataclass(frozen=True, slots=True)
class LlamaCppLayout:
    """What a llama.cpp replica is started with and what it holds beyond its base cost."""

    slots: int
    context: int  # tokens of context per slot (the context check's limit)
    weights: int  # the GGUF's tensor bytes
    kv_cache: int  # every slot's whole context, f16
    compute: int  # llama.cpp's compute buffers, estimated (see the module docstring)


def llamacpp_layout(
    model_dir: Path, max_model_len: int | None, slots: int, context_cap: int
) -> LlamaCppLayout:
    """A GGUF replica's slots and context per slot: the deployment's `max_model_len` where it sets one,
    else `context_cap` (MODELHOST_LLAMACPP_CONTEXT), never above the GGUF's training context (llama.cpp
    caps a slot's there); and its parts.
    `InvalidGguf` for a file that is not a readable GGUF (inspection has passed it: it was replaced)."""
    _, info = read_gguf_set(model_dir)
    context = max_model_len or context_cap
    if info.context_length:  # llama.cpp gives a slot no more than the model was trained for
        context = min(context, info.context_length)
    kept = -(-context // LLAMACPP_CONTEXT_STEP) * LLAMACPP_CONTEXT_STEP  # what llama.cpp allocates
    heads = info.head_count or 1
    width = info.embedding_length or 512
    key = info.key_length or width // heads
    value = info.value_length or key
    per_token = (info.block_count or 1) * (info.head_count_kv or heads) * (key + value) * F16_BYTES
    if info.architecture in ENCODER_ARCHITECTURES:
        per_token = 0  # an encoder keeps no KV cache between batches
    if info.embedding:  # a whole input in one batch of `kept` tokens, and no logits
        compute = kept * 4 * 8 * width + kept * kept * heads * 4
    else:
        compute = LLAMACPP_UBATCH * 4 * ((info.vocab_size or 32_000) + 8 * width)
    return LlamaCppLayout(slots, context, info.tensor_bytes, per_token * slots * kept, compute)


def generates(pipeline: str) -> bool:
    """A task whose replicas run a generation engine with a KV cache (the tasks vLLM may serve: its row
    says `generates`)."""
    return any(spec(engine).generates for engine in BY_NAME[pipeline].engines)


def predict(
    *,
    model_dir: Path,
    pipeline: str,
    engine: str,
    on_gpu: bool,
    remembered: Footprint | None,
    kv_cache_mb: int | None,
    host_budget: int,
    gpu_budget: int,
    base_costs: Mapping[str, int],
    preload: bool,
    max_model_len: int | None = None,
    llamacpp: tuple[int, int] = (4, 4096),
) -> Prediction:
    """One replica's footprint (see the module docstring). `llamacpp`: the server's slots and context
    cap per slot (MODELHOST_LLAMACPP_SLOTS, MODELHOST_LLAMACPP_CONTEXT)."""
    row = spec(engine)
    if "gguf" in row.formats:  # llama.cpp: predicted from the GGUF's header
        return _predict_llamacpp(model_dir, engine, remembered, base_costs, max_model_len, llamacpp)
    weights = weight_bytes(model_dir)
    kv = 0
    if generates(pipeline):
        gpu_room = gpu_budget - weights if on_gpu else None
        kv = kv_cache_bytes(model_dir, kv_cache_mb, host_budget, gpu_room, max_model_len)
    if remembered is not None:
        return Prediction(remembered, weights, kv, remembered=True)
    base = base_costs.get(engine) or row.base_bytes
    if not preload and row.worker is None:  # our worker, executed rather than forked from the template
        base = max(base, EXECUTED_WORKER_COST)
    if on_gpu:
        return Prediction(Footprint(base, weights + kv + GPU_PROCESS_COST), weights, kv, remembered=False)
    return Prediction(Footprint(base + weights + kv), weights, kv, remembered=False)


def _predict_llamacpp(
    model_dir: Path,
    engine: str,
    remembered: Footprint | None,
    base_costs: Mapping[str, int],
    max_model_len: int | None,
    llamacpp: tuple[int, int],
) -> Prediction:
    """A GGUF on llama.cpp, on the CPU (see the module docstring)."""
    try:
        layout = llamacpp_layout(model_dir, max_model_len, *llamacpp)
    except InvalidGguf:  # replaced since its inspection: the load fails and says so
        layout = LlamaCppLayout(llamacpp[0], 0, weight_bytes(model_dir), 0, 0)
    if remembered is not None:
        return Prediction(remembered, layout.weights, layout.kv_cache, True, layout.compute)
    base = base_costs.get(engine) or spec(engine).base_bytes
    host = base + layout.weights + layout.kv_cache + layout.compute
    return Prediction(Footprint(host), layout.weights, layout.kv_cache, False, layout.compute)


def base_cost(measured: Footprint, prediction: Prediction, on_gpu: bool) -> int:
    """What a measured replica took above its weights, KV cache and engine buffers: its engine's base
    cost."""
    if on_gpu:
        return measured.host
    return max(0, measured.host - prediction.weights - prediction.kv_cache - prediction.compute)


def weight_bytes(model_dir: Path) -> int:
    """The size of the artifact's weight files (every folder: diffusers keeps one per component)."""
    try:
        files = [p for p in model_dir.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file()]
        return sum(p.stat().st_size for p in files)
    except OSError:
        return 0  # the folder is gone: the load fails and says so


def kv_cache_bytes(
    model_dir: Path,
    kv_cache_mb: int | None,
    host_budget: int,
    gpu_room: int | None,
    max_model_len: int | None = None,
) -> int:
    """The KV cache a generation replica is given: the operator's `kv_cache_mb`, else 64 whole contexts
    (of `max_model_len` tokens where the deployment sets it) capped at an eighth of the host budget (CPU)
    or half of `gpu_room`, what the GPU's budget leaves beside the weights. Whole MB, as the replica is
    told."""
    if kv_cache_mb:
        return kv_cache_mb * MB
    per_token, context = _kv_layout(model_dir)
    if max_model_len:
        context = min(context, max_model_len)
    wanted = KV_SLOTS * (context + 1) * per_token
    cap = host_budget // 8 if gpu_room is None else max(0, gpu_room) // 2
    return max(MB, -(-min(wanted, cap) // MB) * MB)


def model_context(model_dir: Path) -> int | None:
    """The model's own context (`max_position_embeddings` in `config.json`, a GGUF's `context_length`),
    None where it says none (or an unbounded one): what a deployment's `max_model_len` may be at most."""
    config = _config(model_dir)
    context = _int(_text_part(config).get("max_position_embeddings"), 0)
    if not config:  # a GGUF says it in its header
        with contextlib.suppress(InvalidGguf):
            context = read_gguf_set(model_dir)[1].context_length or 0
    return context if 0 < context < 10_000_000 else None


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _text_part(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (a vision-language model's `text_config`)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _kv_layout(model_dir: Path) -> tuple[int, int]:
    """(bytes one token takes in the KV cache, the model's context), from `config.json` as the engines
    read it (`engines.native.kv_cache.CacheLayout`); a small default for a config without them."""
    config = _config(model_dir)
    text = _text_part(config)
    heads = _int(text.get("num_attention_heads"), 8)
    kv_heads = _int(text.get("num_key_value_heads"), heads)
    hidden = _int(text.get("hidden_size"), 512)
    head_dim = _int(text.get("head_dim"), max(1, hidden // max(1, heads)))
    layers = _int(text.get("num_hidden_layers"), 4)
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    itemsize = DTYPE_BYTES.get(str(dtype), 4)
    context = _int(text.get("max_position_embeddings"), 2048)
    if context >= 10_000_000:
        context = 2048
    return 2 * layers * kv_heads * head_dim * itemsize, context


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
