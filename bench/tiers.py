"""Service-tier benchmark (issue 63): one key's interactive requests alone, then while the same key floods
32 `flex` requests, then while it floods 32 `default` ones (what modelhost did before tiers: every
request in one tier).

    python -m bench.tiers [--requests 15] [--out docs/benchmarks.md]

The model is the text-generation benchmark's random-weight 33 M Llama (`bench.generation.build_model`,
float32) on the transformers engine (modelhost's continuous-batching engine), one replica. Interactive:
one client, one request at a time, a short chat turn, 32 tokens generated (`min_tokens` 32), not
streamed; its latency is the whole request's. The flood: 32 clients of the same key, each streaming
256-token answers one after another for as long as the interactive requests run (they start 2 s
before, so the engine is full when the first interactive request comes).

Reported: interactive p50 and p95, each run's p50 against the p50 alone (target ≤ 1.5 with the flex
flood), and the flood's tokens a second while the interactive turns ran (what holding flex back costs
it; flex moves between one turn and the next, and at full speed once the turns stop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import Figures, deploy, machine, serve, stop_process, table, write_section
from bench.generation import build_model

MARKER = "## Service tiers: interactive turns beside a flex flood"
FLOOD = 32
INTERACTIVE_TOKENS = 32
FLOOD_TOKENS = 256
HEADER = ["run", "interactive p50 ms", "p95 ms", "p50 / alone", "flood tokens/s", "failed"]


@dataclass
class Run:
    label: str
    latencies: list[float] = field(default_factory=list)
    flood_tokens: int = 0
    flood_seconds: float = 0.0
    failures: int = 0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")


async def interactive(http: httpx.AsyncClient, headers: dict[str, str], requests: int, run: Run) -> None:
    for turn in range(requests):
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"Turn {turn}: what should I do next?"}],
            "max_tokens": INTERACTIVE_TOKENS,
            "min_tokens": INTERACTIVE_TOKENS,
            "temperature": 0,
        }
        started = time.perf_counter()
        answer = await http.post("/v1/chat/completions", json=body, headers=headers)
        if answer.status_code == 200:
            run.latencies.append(time.perf_counter() - started)
        else:
            run.failures += 1


async def flood(
    http: httpx.AsyncClient, headers: dict[str, str], tier: str, index: int, stop: asyncio.Event, run: Run
) -> None:
    """One flood client: 256-token answers streamed one after another until `stop`."""
    turn = 0
    while not stop.is_set():
        turn += 1
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"Background job {index}.{turn}: write a long report."}],
            "max_tokens": FLOOD_TOKENS,
            "min_tokens": FLOOD_TOKENS,
            "service_tier": tier,
            "stream": True,
        }
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
                async for line in answer.aiter_lines():
                    if stop.is_set():
                        return  # leaving ends the generation
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content") is not None:
                            run.flood_tokens += 1
        except httpx.HTTPError:
            run.failures += 1


async def measure(url: str, key: str, tier: str | None, requests: int, run: Run) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=FLOOD + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        stop = asyncio.Event()
        flooding = [
            asyncio.create_task(flood(http, headers, tier, i, stop, run)) for i in range(FLOOD if tier else 0)
        ]
        if flooding:
            await asyncio.sleep(2)  # the engine full of the flood before the first interactive turn
        started, run.flood_tokens = time.perf_counter(), 0  # the flood's tokens beside the turns only
        await interactive(http, headers, requests, run)
        run.flood_seconds = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*flooding, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--port", type=int, default=8391)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mh-bench-tiers-"))
    model = root / "chat"
    build_model(model)
    served = serve(args.port)
    try:
        deploy(served, model, "text-generation", "chat", engine="transformers")
        asyncio.run(measure(served.url, served.key, None, 3, Run("warm-up")))  # first passes, off the record
        runs = [
            Run("alone"),
            Run(f"beside {FLOOD} flex requests of the same key"),
            Run(f"beside {FLOOD} default requests of the same key (before: tiers ignored)"),
        ]
        for run, tier in zip(runs, (None, "flex", "default"), strict=True):
            asyncio.run(measure(served.url, served.key, tier, args.requests, run))
    finally:
        stop_process(served.process)
    alone = runs[0].p50
    figures = Figures("tiers")
    rows = []
    for name, run in zip(("alone", "flex_flood", "default_flood"), runs, strict=True):
        ratio = run.p50 / alone
        rate = run.flood_tokens / run.flood_seconds if run.flood_seconds else 0.0
        figures.add(f"{name}.p50_ms", run.p50 * 1000)
        figures.ratio(f"{name}.p50_vs_alone", ratio)
        figures.add(f"{name}.flood_tokens_per_s", rate)
        rows.append(
            [
                run.label,
                f"{run.p50 * 1000:.0f}",
                f"{run.percentile(0.95) * 1000:.0f}",
                f"{ratio:.2f}",
                f"{rate:.0f}" if run is not runs[0] else "",
                str(run.failures),
            ]
        )
    section = f"""{MARKER}

`python -m bench.tiers` ({machine()}; {args.requests} interactive requests per run): the text-generation
benchmark's 33 M model on the transformers engine, one replica; one key's interactive chat turns
({INTERACTIVE_TOKENS} tokens, one at a time) alone, then while the same key streams {FLOOD} requests of
{FLOOD_TOKENS} tokens at once in the `flex` tier, then in the `default` tier (what every request was
before tiers). Target: p50 beside the flex flood ≤ 1.5 × alone (bench/tiers.py says more).

{table(HEADER, rows)}
"""
    write_section(args.out, MARKER, section, figures)
    print(section)


if __name__ == "__main__":
    main()
