"""Adapters benchmark (issue 40): many LoRA fine-tunes served by one base replica on vLLM.

    python -m bench.adapters [--seconds 20] [--tokens 32] [--streams 16] [--out docs/benchmarks.md]

The model is the text-generation benchmark's random-weight 33 M Llama (`bench.generation.build_model`,
float32); its adapters are made with PEFT at rank 52 on every linear module of every layer (16 MB each,
the issue's size), `lora_B` drawn at random so that each changes the answers. Two `modelhost serve`s with
vLLM's CPU build, one after the other, in one run:

1. **Throughput** (vLLM compiled, its default): 16 streams of `--tokens` tokens for `--seconds` on the
   base alone, before any adapter is attached (LoRA off); then 4 adapters attached (the base reloads
   with LoRA on, which vLLM's CPU build runs eager), 16 streams on the base alone again (the base's own
   cost of LoRA on) and 16 streams spread over the 4 adapters. Target: adapters / base alone (LoRA off)
   ≥ 0.7. The same again on the model widened to a production model's width (hidden 2048, 4 layers,
   238 M parameters) with adapters of rank 16 on every linear module: LoRA's share of a step shrinks
   with the width. The second server (eager) runs the base alone too: how much of LoRA's cost is the
   compile's.
2. **First request to an adapter not loaded yet**: a fifth adapter attached, its first request's TTFT (1
   token) against its second's: the added latency of loading it. Target ≤ 1 s for 16 MB.
3. **Memory**: 8 adapter deployments used on one base, against the 8 adapters merged into the base's
   weights (`merge_and_unload`) and deployed as 8 full models: the replicas' footprints as the server
   measures them (`runtime.memory.tree_footprint_bytes` of each replica worker and vLLM's processes
   under it, the model's files counted whole). Target: ratio ≤ 0.2.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figures, Served, machine, push_artifact, serve, table, wait_ready, write_section
from bench.generation import CPU_SHAPE, MESSAGES, Load, build_model, drive_each
from bench.models import build_adapter, build_merged
from modelhost.runtime.memory import parents, tree, tree_footprint_bytes

MiB = 1 << 20
# the benchmark model's width and depth, widened to a production model's (hidden 2048; 4 layers, so that
# it runs on two cores): LoRA's share of a step shrinks with the width
WIDE = replace(CPU_SHAPE, name="wide", hidden=2048, layers=4, heads=16, intermediate=5632)
RANK = 52  # 16 MB of float32 matrices on this model's 7 modules x 8 layers
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MARKER = "## Adapters: LoRA fine-tunes on one base replica"


def build_adapters(base: Path, root: Path, count: int) -> list[Path]:
    """`count` PEFT adapters of `base`, rank 52 on every linear module, seeded `lora_B` (tests' builder)."""
    return [
        build_adapter(
            base, root / f"adapter-{seed}", seed, rank=RANK, targets=TARGETS, alpha=RANK, scale=0.02
        )
        for seed in range(count)
    ]


class Api:
    """The account's calls this benchmark makes, on one server."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.http = httpx.Client(
            base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=900
        )

    def push(self, folder: Path) -> str:
        return push_artifact(self.served, folder, folder.name, "text-generation")

    def deploy(self, **body: Any) -> dict[str, Any]:
        answer = self.http.post("/v1/deployments", json=body)
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        return created

    def wait_ready(self, deployment_id: str) -> None:
        wait_ready(self.served, deployment_id, timeout=900)

    def hot_base(self, folder: Path, model: str) -> dict[str, Any]:
        """`folder` deployed hot on vLLM as `model`, loaded."""
        base = self.deploy(model=model, artifact_id=self.push(folder), engine="vllm", readiness="hot")
        self.wait_ready(base["id"])
        return base

    def find(self, model: str) -> str:
        found = [d["id"] for d in self.http.get("/v1/deployments").json()["data"] if d["model"] == model]
        return str(found[0])

    def ttft(self, model: str) -> float:
        body = {"model": model, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
        started = time.perf_counter()
        answer = self.http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        return time.perf_counter() - started


def run(served: Served, models: list[str], args: argparse.Namespace) -> Load:
    body = {"messages": MESSAGES, "max_tokens": args.tokens, "temperature": 0.7, "stream": True}
    body["stream_options"] = {"include_usage": True}
    bodies = [{**body, "model": model} for model in models]
    load = asyncio.run(drive_each(served.url, served.key, bodies, args.seconds))
    what = f"{len(models)} streams over {sorted(set(models))}"
    print(f"  {what}: {load.tokens_per_second:.1f} tokens/s, errors {load.errors} {load.first_error}")
    return load


def replica_bytes(served: Served, deployment_ids: list[str]) -> int:
    """The footprints of these deployments' replica workers (and vLLM's processes under them)."""
    table_ = parents()
    total = 0
    for pid in tree(served.process.pid, table_):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "modelhost.runtime.worker.vllm_worker" in command and any(
            f"--deployment {d}" in command for d in deployment_ids
        ):
            total += tree_footprint_bytes(pid, table_)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mh-adapters-"))
    base_dir = root / "base"
    parameters = build_model(base_dir)
    adapters = build_adapters(base_dir, root, 8)
    wide_dir = root / "wide"
    wide_parameters = build_model(wide_dir, WIDE)
    wide_adapters = [
        build_adapter(wide_dir, root / f"wide-{seed}", seed, rank=16, targets=TARGETS, alpha=16, scale=0.02)
        for seed in range(4)
    ]
    adapter_mb = (adapters[0] / "adapter_model.safetensors").stat().st_size / MiB
    print(
        f"base: {parameters / 1e6:.1f} M parameters; adapters of rank {RANK}: {adapter_mb:.1f} MiB each",
        flush=True,
    )
    figures = Figures("adapters")

    # 1. vLLM compiled, as deployed by default: the base alone (compiled), then with LoRA on (which
    # vLLM's CPU build runs eager), 16 streams over 4 adapters, and a fifth adapter's first request
    served = serve(args.port, MODELHOST_KV_CACHE_MB="256")
    try:
        api = Api(served)
        base = api.hot_base(base_dir, "base")
        plain = run(served, ["base"] * args.streams, args)
        ids = [api.push(folder) for folder in adapters[:5]]
        for i in range(4):
            api.deploy(model=f"tuned-{i}", artifact_id=ids[i], base_deployment="base")
        api.wait_ready(base["id"])  # reloaded with LoRA on
        with_lora = run(served, ["base"] * args.streams, args)
        mixed = run(served, [f"tuned-{i % 4}" for i in range(args.streams)], args)
        api.deploy(model="tuned-4", artifact_id=ids[4], base_deployment="base")
        first, second = api.ttft("tuned-4"), api.ttft("tuned-4")
        # the same at a realistic width, where LoRA's share of the work is what it is in production
        for i in range(5):  # a base with adapters cannot be deleted: they go first, then it
            api.http.delete(f"/v1/deployments/{api.find(f'tuned-{i}')}")
        api.http.delete(f"/v1/deployments/{base['id']}")
        wide = api.hot_base(wide_dir, "wide")
        wide_plain = run(served, ["wide"] * args.streams, args)
        for i, folder in enumerate(wide_adapters):
            api.deploy(model=f"wide-{i}", artifact_id=api.push(folder), base_deployment="wide")
        api.wait_ready(wide["id"])
        wide_lora = run(served, ["wide"] * args.streams, args)
        wide_mixed = run(served, [f"wide-{i % 4}" for i in range(args.streams)], args)
    finally:
        served.stop()

    # 2. eager (as LoRA runs): the base alone, for the cost of LoRA's ops without the compile's; then the
    # memory of 8 adapters used on one base against the 8 merged into full deployments
    served = serve(args.port, MODELHOST_VLLM_COMPILE="false", MODELHOST_KV_CACHE_MB="256")
    try:
        api = Api(served)
        base = api.hot_base(base_dir, "base")
        eager = run(served, ["base"] * args.streams, args)
        for i, folder in enumerate(adapters):
            api.deploy(model=f"tuned-{i}", artifact_id=api.push(folder), base_deployment="base")
        api.wait_ready(base["id"])
        for i in range(8):
            api.ttft(f"tuned-{i}")  # every adapter loaded and used
        adapters_bytes = replica_bytes(served, [base["id"]])
        merged_ids = []
        for i in range(8):
            merged = build_merged(base_dir, adapters[i], root / f"merged-{i}")
            deployment = api.deploy(
                model=f"merged-{i}", artifact_id=api.push(merged), engine="vllm", readiness="warm"
            )
            api.wait_ready(deployment["id"])
            api.ttft(f"merged-{i}")
            merged_ids.append(deployment["id"])
        merged_bytes = replica_bytes(served, merged_ids)
    finally:
        served.stop()

    throughput = mixed.tokens_per_second / plain.tokens_per_second
    wide_throughput = wide_mixed.tokens_per_second / wide_plain.tokens_per_second
    wide_lora_cost = wide_lora.tokens_per_second / wide_plain.tokens_per_second
    figures.ratio("wide_adapters_over_base", wide_throughput)
    figures.ratio("wide_base_lora_on_over_off", wide_lora_cost)
    lora_cost = with_lora.tokens_per_second / plain.tokens_per_second
    compile_cost = eager.tokens_per_second / plain.tokens_per_second
    added = first - second
    memory = adapters_bytes / merged_bytes
    figures.ratio("adapters_over_base", throughput)
    figures.ratio("base_lora_on_over_off", lora_cost)
    figures.ratio("base_eager_over_compiled", compile_cost)
    figures.ratio("memory_adapters_over_merged", memory)
    figures.add("first_request_added_s", added)
    rows = [
        [f"{name}, {args.streams} streams", f"{load.tokens_per_second:.1f}", load.ttft_p50, str(load.errors)]
        for name, load in (
            ("33 M, base alone, LoRA off (compiled)", plain),
            ("33 M, base alone, LoRA off, eager (a second server)", eager),
            ("33 M, base alone, LoRA on (4 adapters attached; eager)", with_lora),
            ("33 M, over 4 adapters of rank 52", mixed),
            (f"{wide_parameters / 1e6:.0f} M (hidden 2048), base alone, LoRA off (compiled)", wide_plain),
            (f"{wide_parameters / 1e6:.0f} M, base alone, LoRA on (eager)", wide_lora),
            (f"{wide_parameters / 1e6:.0f} M, over 4 adapters of rank 16", wide_mixed),
        )
    ]
    section = "\n".join(
        [
            MARKER,
            "",
            f"Machine: {machine()}. One run of `python -m bench.adapters --seconds {args.seconds:g} "
            f"--tokens {args.tokens}`: the text-generation benchmark's random-weight Llama "
            f"({parameters / 1e6:.0f} M parameters, float32) on vLLM's CPU build (compiled, the default; "
            f"with LoRA on, vLLM's CPU build runs eager); adapters made with PEFT at rank {RANK} on every "
            f"linear module ({adapter_mb:.1f} MiB each). Memory on a second server, eager.",
            "",
            table(["what", "output tokens/s (aggregate)", "TTFT p50 ms", "errors"], rows),
            "",
            f"- **{args.streams} streams over 4 adapters / {args.streams} streams on the base alone (LoRA "
            f"off, compiled): {throughput:.2f}** on the 33 M model (target ≥ 0.7); **{wide_throughput:.2f}** "
            f"on the {wide_parameters / 1e6:.0f} M one of a production model's width (hidden 2048), rank 16 "
            f"on every linear module (its base with LoRA on / off: {wide_lora_cost:.2f}).",
            f"- The base's own cost of LoRA on: base alone with LoRA on / off = {lora_cost:.2f}, of which "
            f"vLLM's compiled mode turned off: eager / compiled = {compile_cost:.2f}; the rest is vLLM's CPU "
            "LoRA ops on every token (its PyTorch fallback for the Punica kernels gathers each token's "
            "adapter matrices, a copy of rank × width floats per token, module and layer), which is also "
            "why streams over adapters fall so far behind on this CPU.",
            f"- **First request to an adapter not loaded yet ({adapter_mb:.1f} MiB): +{added * 1000:.0f} "
            f"ms** (first {first * 1000:.0f} ms, second {second * 1000:.0f} ms, 1 token; target ≤ 1 s).",
            "- **Memory, 8 adapter deployments on one base / the 8 merged into 8 full deployments: "
            f"{memory:.2f}** ({adapters_bytes / MiB:,.0f} MiB against {merged_bytes / MiB:,.0f} MiB; "
            "target ≤ 0.2). One replica of the base (vLLM's processes included) serves all eight.",
            "",
        ]
    )
    print(section)
    write_section(args.out, MARKER, section, figures)


if __name__ == "__main__":
    main()
