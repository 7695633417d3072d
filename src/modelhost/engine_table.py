"""Every engine a replica can run a model on, declared once (docs/architecture.md, "Adding an engine").

One row says all there is to know about an engine outside its own modules: the worker program its
replicas run and the Python environment it runs under, what a replica costs above its weights, the tasks
it serves, the files it reads (and the quantized checkpoints it has kernels for), the devices it runs on,
how `auto` ranks it, and what it can do (adapters, choosing its runtime at load). The choice of engine
(`runtime.engine_choice`), a replica's launch (`runtime.supervisor.launch`), its footprint
(`runtime.footprint`), the engines each task lists (`pipelines`), where a quantized checkpoint is served
(`artifacts.quantization`) and the adapter and fallback rules (`services`) are all read from `ENGINE_TABLE`:
the other modules ask a row for a property, and never compare an engine's name (tests/test_engine_table.py
keeps it so).

This module sits in the base layer, beside `pipelines`: it names worker modules as strings, since they
pull in the engines' libraries, which only replica processes load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineName = Literal["vllm", "llamacpp", "onnxruntime", "openvino", "transformers"]
# what a deployment asks for (`engine`): an engine, or `auto` (`runtime.engine_choice.choose` picks one)
EngineSetting = Literal["auto", "vllm", "llamacpp", "onnxruntime", "openvino", "transformers"]
AUTO: Literal["auto"] = "auto"
Python = Literal[".venv", ".venv-vllm"]  # the server's, or vLLM's own (scripts/setup.sh: vLLM pins its torch)
Format = Literal["safetensors", "gguf"]

MB = 2**20
# The tasks the encoder runtimes serve: a replica exports the checkpoint to them at load
ENCODER_TASKS = (
    "feature-extraction", "image-feature-extraction", "text-classification", "zero-shot-classification",
    "token-classification", "fill-mask", "question-answering", "text-ranking", "image-classification",
)  # fmt: skip
# vLLM 0.32's `QUANTIZATION_METHODS` that a checkpoint's `quant_method` names (its online shorthands aside)
VLLM_METHODS = frozenset(
    {"awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
     "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
     "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine (see the module docstring, and docs/architecture.md for what each field means)."""

    name: str  # an EngineName (or `auto`, for `AT_LOAD`)
    label: str  # how reasons and messages name it
    # `auto`'s preference among the engines of a task, lowest first; also the order a task lists them in.
    # An engine that alone reads the artifact's format (llama.cpp, GGUF) is taken whatever its rank.
    rank: int
    # the module its replicas run as a program of their own (in their own session: the processes the
    # engine starts end with it); None: our worker (`runtime.worker.sync_worker`), forked from the worker
    # template
    worker: str | None
    python: Python  # the environment that program runs under
    # first guess of a replica's cost above its weights and KV cache, until one is measured on this
    # server (`runtime.footprint`)
    base_bytes: int
    tasks: tuple[str, ...] | None  # the pipeline tasks it serves; None: every task (the fallback)
    formats: frozenset[Format]  # the artifact files it reads
    quantizations: frozenset[str] = frozenset()  # the quantized safetensors methods it has kernels for
    devices: frozenset[str] = frozenset({"cpu", "cuda"})  # the device kinds its replicas run on
    precisions: tuple[str, ...] = ("float32",)  # the `precision`s it runs a checkpoint at
    # `auto` takes it only for an architecture its own model registry lists (vLLM's:
    # `runtime.worker.vllm_registry`); one it lists but cannot load falls back to the fallback engine
    lists_architectures: bool = False
    serves_adapters: bool = False  # applies PEFT adapters on its replicas (docs/adapters.md)
    # a replica measures it against torch when it loads and keeps the faster (`engines.encoders`)
    measured_at_load: bool = False
    # every task it serves generates with a KV cache, which the replica's footprint reserves
    generates: bool = False

    def serves(self, task: str) -> bool:
        return self.tasks is None or task in self.tasks


ENGINE_TABLE: dict[EngineName, EngineSpec] = {
    "vllm": EngineSpec(
        name="vllm",
        label="vLLM",
        rank=0,
        worker="modelhost.runtime.worker.vllm_worker",
        python=".venv-vllm",
        base_bytes=1536 * MB,  # vLLM's CPU engine (eager), a tiny chat model: 1,329 MiB
        tasks=("text-generation", "image-text-to-text"),
        formats=frozenset({"safetensors"}),
        quantizations=VLLM_METHODS,
        lists_architectures=True,
        serves_adapters=True,
        generates=True,
    ),
    "llamacpp": EngineSpec(
        name="llamacpp",
        label="llama.cpp",
        rank=3,
        worker="modelhost.runtime.worker.llamacpp_worker",
        python=".venv",
        # the interpreter, transformers' tokenizer and the server's threads: 194 MiB measured for the
        # tests' tiny GGUF (2 slots), rounded up
        base_bytes=256 * MB,
        tasks=("text-generation", "feature-extraction"),
        formats=frozenset({"gguf"}),
        devices=frozenset({"cpu"}),
    ),
    "onnxruntime": EngineSpec(
        name="onnxruntime",
        label="ONNX Runtime",
        rank=1,
        worker=None,
        python=".venv",
        base_bytes=64 * MB,
        tasks=ENCODER_TASKS,
        formats=frozenset({"safetensors"}),
        precisions=("float32", "int8"),
        measured_at_load=True,
    ),
    "openvino": EngineSpec(
        name="openvino",
        label="OpenVINO",
        rank=2,
        worker=None,
        python=".venv",
        base_bytes=64 * MB,
        tasks=ENCODER_TASKS,
        formats=frozenset({"safetensors"}),
        devices=frozenset({"cpu"}),
        measured_at_load=True,
    ),
    "transformers": EngineSpec(
        name="transformers",
        label="transformers",
        rank=4,
        worker=None,
        python=".venv",
        # a tiny model's forked worker 35 MiB, all-MiniLM-L6-v2 on torch 138 MiB (90 of it its weights)
        base_bytes=64 * MB,
        tasks=None,
        formats=frozenset({"safetensors"}),
    ),
}
# A replica started with `auto`: our worker, which measures the encoder runtimes when it loads
AT_LOAD = EngineSpec(
    name=AUTO,
    label="auto",
    rank=len(ENGINE_TABLE),
    worker=None,
    python=".venv",
    base_bytes=96 * MB,
    tasks=ENCODER_TASKS,
    formats=frozenset({"safetensors"}),
    measured_at_load=True,
)
# the rows in `auto`'s order
RANKED: tuple[tuple[EngineName, EngineSpec], ...] = tuple(
    sorted(ENGINE_TABLE.items(), key=lambda item: item[1].rank)
)
# the engine that serves every task: what `auto` falls back to
FALLBACK: EngineName = next(name for name, row in RANKED if row.tasks is None)
_ROWS: dict[str, EngineSpec] = {name: row for name, row in ENGINE_TABLE.items()} | {AUTO: AT_LOAD}


def spec(engine: str) -> EngineSpec:
    """The row of `engine`: an engine's name, or `auto` (a replica that chooses at load: `AT_LOAD`);
    KeyError for anything else."""
    return _ROWS[engine]


def lookup(engine: str) -> EngineSpec | None:
    """The row of the engine named `engine`, or None where no engine is so named."""
    return _ROWS.get(engine) if engine != AUTO else None


def engines_for(task: str) -> tuple[EngineName, ...]:
    """The engines that serve `task`, in `auto`'s order (the fallback last)."""
    return tuple(name for name, row in RANKED if row.serves(task))


def engines_where(field: str) -> tuple[EngineName, ...]:
    """The engines whose boolean `field` is set (`serves_adapters`...), in `auto`'s order."""
    return tuple(name for name, row in RANKED if getattr(row, field))


def reader_of(fmt: Format) -> EngineName:
    """The first engine, in `auto`'s order, that reads `fmt` files."""
    return next(name for name, row in RANKED if fmt in row.formats)


def sole_reader(engine: str) -> bool:
    """Whether `engine` reads a format no other engine reads (llama.cpp: GGUF): it serves those artifacts
    whatever was asked, and no other engine can take them over."""
    row = spec(engine)
    others = [other for other in ENGINE_TABLE.values() if other is not row]
    return any(all(fmt not in other.formats for other in others) for fmt in row.formats)
