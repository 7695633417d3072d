"""Routing benchmark (issue 62): two replicas of a small chat model, requests routed by prompt prefix
against least-busy routing.

    python -m bench.routing [--seconds 40] [--out docs/benchmarks.md]

The model is the text-generation benchmark's random-weight 33 M Llama (`bench.generation.build_model`,
float32, 2048 positions) on the transformers engine (modelhost's continuous-batching engine), deployed
with `min_replicas = max_replicas = 2`. The traffic: 8 system prompts of about 1,000 tokens each, every
request one of them (at random) with a short user turn of its own, 4 tokens generated, streamed; 2
clients at a time for `--seconds`. Each run is its own `modelhost serve`:

1. `least_busy` (`MODELHOST_ROUTING_POLICY=least_busy`, what modelhost did before), 1 gateway process;
2. `prefix` (the default), 1 gateway process;
3. `prefix`, 3 gateway processes (each routes on its own: the choice must still agree);
4. no shared prefix: every request's system prompt is new (the cost of computing the whole prompt).

5. autoscaling: the same model with `min_replicas` 1 and `max_replicas` 2 (routing by prefix), 4 clients
   of long streamed generations for `--load-seconds` (60), then idle; the deployment's `replicas` sampled
   every second until it is back to 1 (`MODELHOST_SCALE_DOWN_IDLE_SECONDS` = `--idle-seconds`, 20: the
   default 120 s only lengthens the run).

Reported: the share of prompt tokens served from the KV cache (`usage.prompt_tokens_details.
cached_tokens` / `prompt_tokens`; target ≥ 0.85 with `prefix`), TTFT p50 and p95, and TTFT p50 of each run
against run 4's (target ≤ 0.5 with `prefix`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import Figures, deploy, machine, serve, stop_process, table, write_section
from bench.generation import _corpus, build_model

MARKER = "## Routing: replicas chosen by prompt prefix"
PROMPTS = 8
PROMPT_TOKENS = 1000
CLIENTS = 2
HEADER = [
    "run",
    "requests",
    "cached share",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "TTFT p50 / no shared prefix",
    "failed",
]
KV_CACHE_MB = "384"  # per replica: six 2048-token contexts of this model, fewer than the 8 prompts


@dataclass
class Run:
    label: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def system_prompts(model: Path, count: int, seed: int) -> list[str]:
    """`count` system prompts of about PROMPT_TOKENS tokens each, of generated text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    sentences = _corpus(sentences=400 * count, seed=seed)
    prompts, current = [], ""
    for sentence in sentences:
        current += sentence + " "
        if len(tokenizer(current)["input_ids"]) >= PROMPT_TOKENS:
            prompts.append(current)
            current = ""
            if len(prompts) == count:
                return prompts
    raise RuntimeError("the corpus is too short for the prompts asked")


async def drive(url: str, key: str, systems: list[str] | None, model: Path, seconds: float, run: Run) -> None:
    """CLIENTS clients for `seconds`; `systems` None: a new system prompt for every request."""
    headers = {"Authorization": f"Bearer {key}"}
    rng = random.Random(7)
    fresh = iter(system_prompts(model, 400, seed=1000)) if systems is None else None
    deadline = time.monotonic() + seconds

    async def client(index: int, http: httpx.AsyncClient) -> None:
        turn = 0
        while time.monotonic() < deadline:
            turn += 1
            system = next(fresh) if fresh is not None else rng.choice(systems or [])
            body = {
                "model": "chat",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Question {index}.{turn}: what happens next?"},
                ],
                "max_tokens": 4,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started, first = time.perf_counter(), 0.0
            try:
                async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
                    async for line in answer.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if not first and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            first = time.perf_counter()
                        if chunk.get("usage"):
                            run.prompt_tokens += chunk["usage"]["prompt_tokens"]
                            details = chunk["usage"].get("prompt_tokens_details") or {}
                            run.cached_tokens += details.get("cached_tokens") or 0
                if first:
                    run.ttft.append(first - started)
            except httpx.HTTPError:
                run.failures += 1

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await asyncio.gather(*(client(i, http) for i in range(CLIENTS)))


def measure(label: str, model: Path, systems: list[str] | None, seconds: float, port: int, **env: str) -> Run:
    served = serve(port, MODELHOST_KV_CACHE_MB=KV_CACHE_MB, **env)
    try:
        deploy(
            served, model, "text-generation", "chat", engine="transformers", min_replicas=2, max_replicas=2
        )
        run = Run(label)
        warm = Run("warm-up")  # each replica's first forward passes, off the record
        asyncio.run(drive(served.url, served.key, systems, model, 5, warm))
        asyncio.run(drive(served.url, served.key, systems, model, seconds, run))
        return run
    finally:
        stop_process(served.process)


def autoscaling(model: Path, load_seconds: float, idle_seconds: float, port: int) -> list[tuple[float, int]]:
    """The deployment's replica count over time, (seconds since the load began, replicas) at each change,
    under `load_seconds` of 4 long streams then idle until it is back to 1."""
    served = serve(
        port, MODELHOST_KV_CACHE_MB=KV_CACHE_MB, MODELHOST_SCALE_DOWN_IDLE_SECONDS=str(idle_seconds)
    )
    try:
        deploy(
            served, model, "text-generation", "chat", engine="transformers", min_replicas=1, max_replicas=2
        )
        headers = {"Authorization": f"Bearer {served.key}"}
        listed = httpx.get(f"{served.url}/v1/deployments", headers=headers, timeout=30).json()["data"]
        view = f"{served.url}/v1/deployments/{listed[0]['id']}"
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 1500,
            "min_tokens": 1500,
            "stream": True,
        }
        started = time.monotonic()
        timeline = [(0.0, 1)]

        async def load() -> None:
            async def stream(http: httpx.AsyncClient) -> None:
                while time.monotonic() - started < load_seconds:
                    async with http.stream(
                        "POST", "/v1/chat/completions", json=body, headers=headers
                    ) as answer:
                        async for _ in answer.aiter_lines():
                            if time.monotonic() - started >= load_seconds:
                                return  # the load stops at once: leaving ends the generation

            async def watch() -> None:
                async with httpx.AsyncClient(timeout=30) as http:
                    while True:
                        replicas = (await http.get(view, headers=headers)).json()["replicas"]
                        if replicas != timeline[-1][1]:
                            timeline.append((time.monotonic() - started, replicas))
                        if time.monotonic() - started > load_seconds and replicas == 1:
                            return
                        if time.monotonic() - started > load_seconds + idle_seconds + 120:
                            return  # never came back: the timeline says so
                        await asyncio.sleep(1)

            async with httpx.AsyncClient(base_url=served.url, timeout=600) as http:
                await asyncio.gather(watch(), *(stream(http) for _ in range(4)))

        asyncio.run(load())
        return timeline
    finally:
        stop_process(served.process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--port", type=int, default=8390)
    parser.add_argument("--load-seconds", type=float, default=60)
    parser.add_argument("--idle-seconds", type=float, default=20)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mh-bench-routing-"))
    model = root / "chat"
    build_model(model)
    systems = system_prompts(model, PROMPTS, seed=11)

    def run(label: str, shared: list[str] | None, **env: str) -> Run:
        return measure(label, model, shared, args.seconds, args.port, **env)

    runs = [
        run(
            "least busy, 1 gateway process",
            systems,
            MODELHOST_ROUTING_POLICY="least_busy",
            MODELHOST_WORKERS="1",
        ),
        run("prefix, 1 gateway process", systems, MODELHOST_WORKERS="1"),
        run("prefix, 3 gateway processes", systems, MODELHOST_WORKERS="3"),
        run("no shared prefix (every prompt new), prefix, 1 process", None, MODELHOST_WORKERS="1"),
    ]
    timeline = autoscaling(model, args.load_seconds, args.idle_seconds, args.port)
    unshared = runs[-1].percentile(0.5)
    figures = Figures("routing")
    rows = []
    for name, run in zip(("least_busy", "prefix", "prefix_3", "unshared"), runs, strict=True):
        ratio = run.percentile(0.5) / unshared
        figures.add(f"{name}.requests", len(run.ttft))
        figures.add(f"{name}.ttft_p50_ms", run.percentile(0.5) * 1000)
        figures.ratio(f"{name}.cached_share", run.share)
        figures.ratio(f"{name}.ttft_p50_vs_unshared", ratio)
        rows.append(
            [
                run.label,
                str(len(run.ttft)),
                f"{run.share:.2f}",
                f"{run.percentile(0.5) * 1000:.0f}",
                f"{run.percentile(0.95) * 1000:.0f}",
                f"{ratio:.2f}",
                str(run.failures),
            ]
        )
    section = f"""{MARKER}

`python -m bench.routing` ({machine()}; {args.seconds:g} s per run, {CLIENTS} clients): two replicas of the
text-generation benchmark's 33 M model on the transformers engine, {PROMPTS} system prompts of about
{PROMPT_TOKENS} tokens, each request one of them with a short user turn of its own, 4 tokens generated
(bench/routing.py says more). Cached share: prompt tokens served from the replicas' KV caches (target ≥ 0.85
routed by prefix); TTFT p50 against the same traffic with no shared prefix (target ≤ 0.5).

{table(HEADER, rows)}

Autoscaling (`min_replicas` 1, `max_replicas` 2; 4 long streams for {args.load_seconds:g} s, then idle;
`MODELHOST_SCALE_DOWN_IDLE_SECONDS={args.idle_seconds:g}`): replicas
{" → ".join(f"{count} ({at:.0f} s)" for at, count in timeline)}.

How the {PROMPTS} prompts split between the two replicas (six slots each) is decided by hashing against
the replicas' routes, new in every run: an even split keeps every prompt cached after its first
request, a 6/2 or 7/1 split makes the larger side give up prefixes; and each prompt's first request
is a miss (8 of the run's requests). Runs of this benchmark read 0.80 to 0.95 routed by prefix (1 and
3 gateway processes alike), 0.67 to 0.68 least busy; a busier machine (fewer requests in the 40 s)
reads lower.
"""
    figures.add("autoscale.peak_replicas", max(count for _, count in timeline))
    figures.add("autoscale.final_replicas", timeline[-1][1])
    write_section(args.out, MARKER, section, figures)
    print(section)


if __name__ == "__main__":
    main()
