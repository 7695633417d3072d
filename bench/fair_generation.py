"""Fair shares of a generating model (issue 72): a light key beside a heavy one on one replica.

    python -m bench.fair_generation [--seconds 30] [--engines transformers,vllm] [--baseline SRC]
                                    [--weighted-seconds 60]

The text-generation benchmark's random-weight 33 M Llama (`bench.generation.build_model`), one replica
per engine. Two keys of one account:
- **A, heavy**: 32 clients, each streaming 256-token answers one after another;
- **B, light**: one client, one streamed request at a time, 32 tokens each (`min_tokens` 32).

Each runs alone, then both together (A starts 2 s before B, so the engine is full when B's first request
comes). Reported: B's time to first token and latency, p50, together over alone, and A's output tokens a
second together over alone. Issue 72's targets: B's TTFT ≤ 2 × alone and latency ≤ 3 × alone on the
transformers engine (TTFT ≤ 2 × on vLLM), and A's tokens/s together with fairness ≥ 0.9 × without: with
`--baseline SRC`, which serves another checkout's `src` too (the commit before issue 72: first come,
first served), measured in turn, A's rate together here over A's rate together there.

**Weights** (`--weighted-seconds`, 0: skip): two keys of weights 1:1, then 2:1, each with
`BACKLOGGED` clients streaming `BACKLOGGED_TOKENS`-token answers one after another (together more than
the engine's slots, so both are always waiting; on vLLM a KV cache that holds about 40 of them:
`WEIGHTED_ENV`), for that long, on a server of its own; reported: the keys' output tokens and their ratio
against the weights' (issue 72: within ± 10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import Figures, Served, deploy, machine, serve, table, write_section
from bench.generation import build_model
from bench.tenancy import new_key

MARKER = "## Fair shares: a light key beside a heavy one on a generating replica"
HEAVY, HEAVY_TOKENS, LIGHT_TOKENS = 32, 256, 32
BACKLOGGED, BACKLOGGED_TOKENS = 48, 32  # per key: 96 streams together, over the engine's 64 slots
# vLLM runs every one of 96 short streams at once (its KV cache pages hold only the tokens used): with
# room for everyone the keys are served what they ask, whatever their weights. A KV cache of 72 MiB
# (2,300 tokens of the 33 M Llama, just over one whole 2048-token context, which vLLM needs to start)
# holds about 40 of them, so both keys wait and vLLM's priority scheduler chooses, as weights need.
WEIGHTED_ENV = {"vllm": {"MODELHOST_KV_CACHE_MB": "72"}}


@dataclass
class Light:
    """B's requests: time to first token and whole latency, seconds."""

    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    failures: int = 0


@dataclass
class Heavy:
    tokens: int = 0
    seconds: float = 0.0
    failures: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _body(text: str, tokens: int) -> dict[str, object]:
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }


async def _light(http: httpx.AsyncClient, key: str, until: float, light: Light) -> None:
    turn = 0
    while time.perf_counter() < until:
        turn += 1
        started, first = time.perf_counter(), None
        try:
            body = _body(f"Turn {turn}: what should I do next?", LIGHT_TOKENS)
            headers = {"Authorization": f"Bearer {key}"}
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
                async for line in answer.aiter_lines():
                    if first is None and line.startswith("data: {") and '"content"' in line:
                        first = time.perf_counter()
            if answer.status_code != 200 or first is None:
                light.failures += 1
                continue
        except httpx.HTTPError:
            light.failures += 1
            continue
        light.ttft.append(first - started)
        light.latency.append(time.perf_counter() - started)


async def _heavy_client(
    http: httpx.AsyncClient,
    key: str,
    index: int,
    stop: asyncio.Event,
    heavy: Heavy,
    tokens: int = HEAVY_TOKENS,
) -> None:
    """One client streaming answers of `tokens` tokens one after another until `stop`, counting them."""
    turn = 0
    headers = {"Authorization": f"Bearer {key}"}
    while not stop.is_set():
        turn += 1
        body = _body(f"Background job {index}.{turn}: write a long report.", tokens)
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
                async for line in answer.aiter_lines():
                    if stop.is_set():
                        return  # leaving ends the generation
                    if line.startswith("data: {") and '"content"' in line:
                        heavy.tokens += 1
        except httpx.HTTPError:
            heavy.failures += 1


async def _run(url: str, a: str | None, b: str | None, seconds: float) -> tuple[Heavy, Light]:
    """A's clients (when `a`) and B's (when `b`) for `seconds`, A's started 2 s before."""
    heavy, light = Heavy(), Light()
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=HEAVY + 8)
    ) as http:
        stop = asyncio.Event()
        clients = [
            asyncio.create_task(_heavy_client(http, a, i, stop, heavy)) for i in range(HEAVY if a else 0)
        ]
        if clients:
            await asyncio.sleep(2)
        started, heavy.tokens = time.perf_counter(), 0
        if b is not None:
            await _light(http, b, started + seconds, light)
        else:
            await asyncio.sleep(seconds)
        heavy.seconds = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
    return heavy, light


@dataclass
class Measured:
    a_alone: Heavy
    b_alone: Light
    a_together: Heavy
    b_together: Light

    def ratios(self) -> dict[str, float]:
        def p50(values: list[float]) -> float:
            return statistics.median(values) if values else float("nan")

        return {
            "b_ttft": p50(self.b_together.ttft) / p50(self.b_alone.ttft),
            "b_latency": p50(self.b_together.latency) / p50(self.b_alone.latency),
            "a_rate": self.a_together.rate / self.a_alone.rate if self.a_alone.rate else float("nan"),
        }


def measure(served: Served, seconds: float) -> Measured:
    a, b = new_key(served, name="heavy"), new_key(served, name="light")
    asyncio.run(_run(served.url, None, b, 3))  # warm-up, off the record
    b_alone = asyncio.run(_run(served.url, None, b, seconds))[1]
    a_alone = asyncio.run(_run(served.url, a, None, seconds))[0]
    a_together, b_together = asyncio.run(_run(served.url, a, b, seconds))
    return Measured(a_alone, b_alone, a_together, b_together)


async def _backlogged(url: str, keys: list[str], seconds: float) -> list[int]:
    """Each key's output tokens over `seconds` while every key keeps `BACKLOGGED` streams going (counted
    after a 5 s start, once the engine is full)."""
    tallies = [Heavy() for _ in keys]
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=BACKLOGGED * len(keys) + 8)
    ) as http:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_heavy_client(http, key, i, stop, tally, BACKLOGGED_TOKENS))
            for key, tally in zip(keys, tallies, strict=True)
            for i in range(BACKLOGGED)
        ]
        await asyncio.sleep(5)
        for tally in tallies:
            tally.tokens = 0
        await asyncio.sleep(seconds)
        counted = [tally.tokens for tally in tallies]
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return counted


def weighted(served: Served, seconds: float) -> dict[tuple[float, float], list[int]]:
    """The keys' output tokens with weights 1:1 and 2:1 (new keys each time: fresh counters)."""
    found: dict[tuple[float, float], list[int]] = {}
    for weights in ((1.0, 1.0), (2.0, 1.0)):
        keys = [new_key(served, name=f"weighted-{i}", weight=w) for i, w in enumerate(weights)]
        found[weights] = asyncio.run(_backlogged(served.url, keys, seconds))
    return found


def _p50_ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.0f}" if seconds else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--engines", default="transformers")
    parser.add_argument("--baseline", type=Path, help="another checkout's src, measured in turn")
    parser.add_argument("--weighted-seconds", type=float, default=60, help="0: no weights measured")
    parser.add_argument("--port", type=int, default=8395)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    model = Path(tempfile.mkdtemp(prefix="mh-bench-fair-")) / "chat"
    build_model(model)
    sources: dict[str, Path | None] = {"this tree": None}
    if args.baseline is not None:
        sources = {"baseline": args.baseline, **sources}
    results: dict[tuple[str, str], Measured] = {}
    shares: dict[str, dict[tuple[float, float], list[int]]] = {}
    for engine in args.engines.split(","):
        for index, (name, source) in enumerate(sources.items()):
            served = serve(args.port + index, source)
            try:
                deploy(served, model, "text-generation", "chat", engine=engine)
                results[engine, name] = measure(served, args.seconds)
            finally:
                served.stop()
        if args.weighted_seconds > 0:
            served = serve(args.port, None, **WEIGHTED_ENV.get(engine, {}))
            try:
                deploy(served, model, "text-generation", "chat", engine=engine)
                shares[engine] = weighted(served, args.weighted_seconds)
            finally:
                served.stop()
    figures = Figures("fair_generation")
    rows = []
    for (engine, name), found in results.items():
        ratios = found.ratios()
        unfair = results.get((engine, "baseline"))
        kept = "-"
        if name != "baseline" and unfair is not None and unfair.a_together.rate:
            ratios["a_rate_kept"] = found.a_together.rate / unfair.a_together.rate
            kept = f"{ratios['a_rate_kept']:.2f}"
        for what, value in ratios.items():
            figures.ratio(f"{engine}.{name.replace(' ', '_')}.{what}", value)
        rows.append(
            [
                engine,
                name,
                f"{_p50_ms(found.b_alone.ttft)} / {_p50_ms(found.b_alone.latency)}",
                f"{ratios['b_ttft']:.2f}",
                f"{ratios['b_latency']:.2f}",
                f"{found.a_alone.rate:.0f}",
                f"{ratios['a_rate']:.2f}",
                kept,
                str(
                    sum(
                        r.failures for r in (found.a_alone, found.b_alone, found.a_together, found.b_together)
                    )
                ),
            ]
        )
    header = [
        "engine",
        "server",
        "B alone: TTFT / latency p50 ms",
        "B's TTFT together / alone",
        "B's latency together / alone",
        "A alone tokens/s",
        "A's tokens/s together / alone",
        "A's tokens/s together, fair / baseline",
        "failed",
    ]
    weight_rows = []
    for engine, found_shares in shares.items():
        for (first, second), tokens in found_shares.items():
            measured = tokens[0] / tokens[1] if tokens[1] else float("nan")
            off = measured / (first / second) - 1
            figures.ratio(f"{engine}.weights_{first:g}_{second:g}.tokens_ratio", measured)
            weight_rows.append(
                [
                    engine,
                    f"{first:g} : {second:g}",
                    f"{tokens[0]} / {tokens[1]}",
                    f"{measured:.2f}",
                    f"{off:+.1%}",
                ]
            )
    weight_header = ["engine", "weights", "output tokens", "ratio", "off the weights' ratio"]
    weights_text = (
        f"""
Weights (`--weighted-seconds {args.weighted_seconds:g}`): two keys, each with {BACKLOGGED} clients streaming
answers of {BACKLOGGED_TOKENS} tokens one after another ({2 * BACKLOGGED} streams, over the engine's slots,
so both always wait), output tokens over {args.weighted_seconds:g} s. Target (issue 72): the weights' ratio
± 10 %.

{table(weight_header, weight_rows)}
"""
        if weight_rows
        else ""
    )
    section = f"""{MARKER}

`python -m bench.fair_generation --seconds {args.seconds:g}` ({machine()}): the 33 M Llama, one replica;
key A streams {HEAVY} answers of {HEAVY_TOKENS} tokens at once, key B one answer of {LIGHT_TOKENS} tokens at a
time (bench/fair_generation.py says more). Targets (issue 72): B's TTFT ≤ 2 × alone (both engines) and
latency ≤ 3 × alone (transformers); A's tokens/s together with fairness ≥ 0.9 × without (this tree's
over the baseline's: first come, first served).

{table(header, rows)}
{weights_text}"""
    write_section(args.out, MARKER, section, figures)
    print(section)


if __name__ == "__main__":
    main()
