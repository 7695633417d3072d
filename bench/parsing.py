"""The cost of parsing a chat stream: the gateway's CPU per output token with parsing on against off.

    python -m bench.parsing [--requests 40] [--tokens 64] [--out docs/benchmarks.md]

The benchmark's text-generation model (bench.generation: a 33 M random-weight Llama) is served by
modelhost; one client streams the same conversation once per case in turn (exactly `--tokens` output
tokens each: `min_tokens`), one request at a time, so every case sees the same machine. A case is the
fields it adds to the request (`CASES`): `off` adds none (the text goes out as it comes), `tools` offers
a tool with `tool_choice: auto`, so the gateway scans every delta for the family's call markup (the
model's family is `hermes`: `<tool_call>`) and parses the whole text at the end; `reasoning` adds, on a
deployment whose `reasoning_parser` is DeepSeek-R1's, a reasoning parser before the tool parser: R1's
answer starts inside its reasoning, so every token is reasoning, scanned for the end of the thought.
Random weights write no markup, so these cases pay the scanning and the parse without turning anything
into a call: the cost every streamed token of such a request pays. Reported per output token: the gateway
processes' CPU (where the parsers run), the replica's (the same generation for every case: a check that
the comparison is like for like), and the wall time; each case's gateway CPU over `off`'s.

/proc counts CPU in 10 ms ticks and the gateway spends well under a millisecond per token, so the served
figures move by several percent from run to run. The parsing itself is therefore also timed in process,
precisely: the content pieces of one streamed answer fed, as the replica's events, to the gateway's own
assembler of a choice (`serving.chat.chat_choices`, built as for a served request of each case), many
times over; its CPU per token above `off`'s, added to the served `off` figure, is the parsing's share.

A new parser is one more line of `CASES` (a reasoning case: the request fields that turn it on, and the
deployment fields that choose its parser where the model's family does not, e.g.
`"reasoning": ("reasoning parsed", {...}, {"reasoning_parser": "qwen3"})`): cases with the same
deployment fields share one deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figures, Served, ServerCpu, deploy, serve, table, write_section
from bench.generation import MESSAGES, build_model
from bench.responses import stream_to_end
from modelhost.generation.choices import chat_requests
from modelhost.generation.contract import GenerationStarted, Text
from modelhost.protocol.chat import ChatCompletionRequest
from modelhost.serving.chat import chat_choices

HEADING = "## Parsing on the stream: gateway CPU per output token, parsing on against off"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# name → (what it is, the request's fields, the deployment's fields). `off` first: the baseline.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "off": ("no parsing (no tools)", {}, {}),
    "tools": (
        "tool parsing (tools, `tool_choice: auto`, hermes)",
        {"tools": [TOOL], "tool_choice": "auto"},
        {},
    ),
    # DeepSeek-R1's parser: the answer starts inside its reasoning, so every token is scanned for its end
    "reasoning": (
        "reasoning parsing (deepseek_r1: every token reasoning) and tool parsing",
        {"tools": [TOOL], "tool_choice": "auto"},
        {"reasoning_parser": "deepseek_r1"},
    ),
}


def _deployments(folder: Path, served: Served) -> dict[str, str]:
    """One deployment per distinct set of deployment fields: each case's model ID."""
    models: dict[str, str] = {}
    made: dict[str, str] = {}
    for name, (_, _, fields) in CASES.items():
        key = repr(sorted(fields.items()))
        if key not in made:
            made[key] = f"llama-{len(made)}"
            deploy(served, folder, "text-generation", made[key], readiness="hot", **fields)
        models[name] = made[key]
    return models


def _pieces(http: httpx.Client, body: dict[str, Any]) -> list[str]:
    """The text pieces (content or reasoning) of one streamed answer: one per text event of the replica."""
    pieces = []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                deltas = [c["delta"] for c in json.loads(line[6:])["choices"]]
                pieces += [d.get("reasoning_content") or d.get("content") for d in deltas]
    return [piece for piece in pieces if piece]


def _feed_ms_per_token(body: dict[str, Any], deployment: dict[str, Any], pieces: list[str]) -> float:
    """CPU ms per token of assembling a choice from `pieces` as the gateway does for `body` (its mode
    from `chat_requests`, its parsers from the replica's `started` event)."""
    request = ChatCompletionRequest.model_validate({**body, "stream": True})
    _, mode = chat_requests(request, 512)
    started = GenerationStarted(
        prompt_tokens=1,
        tool_format=deployment.get("tool_parser", "hermes"),
        reasoning_format=deployment.get("reasoning_parser"),
    )
    rounds = max(1, 20_000 // len(pieces))
    begin = time.process_time()
    for _ in range(rounds):
        (choice,) = chat_choices(request, mode, 1)
        choice.feed(started)
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            choice.feed(Text(text=piece, completion_tokens=index + 1, finish="length" if last else None))
    return (time.process_time() - begin) * 1000 / (rounds * len(pieces))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--requests", type=int, default=40, help="requests of each case")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=18771)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(tempfile.mkdtemp(prefix="mh-bench-llama-"))
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    cpus: dict[str, list[ServerCpu]] = {name: [] for name in CASES}  # CPU ms per output token
    feeds: dict[str, float] = {}  # CPU ms per output token of assembling the choice, in process
    try:
        build_model(folder)
        served = serve(args.port)
        try:
            models = _deployments(folder, served)
            bodies = {
                name: {
                    "model": models[name],
                    "messages": MESSAGES,
                    "stream": True,
                    "temperature": 0,
                    "max_tokens": args.tokens,
                    "min_tokens": args.tokens,
                    **fields,
                }
                for name, (_, fields, _) in CASES.items()
            }
            headers = {"Authorization": f"Bearer {served.key}"}
            with httpx.Client(base_url=served.url, headers=headers, timeout=300) as http:
                for body in bodies.values():  # warm-up: compiled templates, first-call paths
                    stream_to_end(http, "/v1/chat/completions", body)
                for _ in range(args.requests):
                    for name, body in bodies.items():
                        cpu, wall = served.cpu(), time.perf_counter()
                        stream_to_end(http, "/v1/chat/completions", body)
                        walls[name].append((time.perf_counter() - wall) / args.tokens)
                        time.sleep(0.1)  # the request's last work (usage, logs) in its own reading
                        cpus[name].append((served.cpu() - cpu).ms_per(args.tokens))
                pieces = _pieces(http, bodies["off"])
            for name, (_, _, deployment) in CASES.items():
                feeds[name] = _feed_ms_per_token(bodies[name], deployment, pieces)
        finally:
            served.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures = Figures("parsing")
    section = report(args, walls, cpus, feeds, figures)
    print(section)
    write_section(args.out, HEADING, section, figures)


def report(
    args: argparse.Namespace,
    walls: dict[str, list[float]],
    cpus: dict[str, list[ServerCpu]],
    feeds: dict[str, float],
    figures: Figures,
) -> str:
    """The section; its figures and ratios (each case's gateway CPU over `off`'s, served and with the
    parsing timed in process) in `figures`."""
    # /proc counts 10 ms ticks: CPU figures are means over all requests
    wall = {name: statistics.median(values) * 1000 for name, values in walls.items()}
    gateway = {name: statistics.fmean(c.gateway for c in values) for name, values in cpus.items()}
    replica = {name: statistics.fmean(c.replicas for c in values) for name, values in cpus.items()}
    # the gateway's CPU per token with only the parsing's difference added: precise where `gateway` is not
    timed = {name: gateway["off"] + feeds[name] - feeds["off"] for name in CASES}
    rows = []
    for name, (label, _, _) in CASES.items():
        figures.add(f"{name}.wall_ms_per_output_token", wall[name])
        figures.add(f"{name}.gateway_ms_per_output_token", gateway[name])
        figures.add(f"{name}.replica_ms_per_output_token", replica[name])
        figures.add(f"{name}.choice_ms_per_output_token", feeds[name])
        served, parsed = gateway[name] / gateway["off"], timed[name] / gateway["off"]
        if name != "off":
            figures.ratio(f"{name}_over_off.gateway_cpu_per_output_token", served)
            figures.ratio(f"{name}_over_off.gateway_cpu_per_output_token_timed", parsed)
        row = [label, f"{wall[name]:.2f}", f"{gateway[name]:.3f}", f"{replica[name]:.3f}"]
        rows.append([*row, f"{feeds[name] * 1000:.1f}", f"{served:.3f}", f"{parsed:.3f}"])
    header = ["case", "wall ms per output token (median)", "gateway CPU ms per output token (mean)"]
    header += ["replica CPU ms per output token (mean)", "choice assembly CPU µs per output token"]
    header += ["gateway CPU / off, served", "gateway CPU / off, parsing timed in process"]
    lines = [
        HEADING,
        "",
        f"One run of `python -m bench.parsing` (`make bench`): the benchmark's 33 M Llama, the same "
        f"conversation streamed {args.requests} times per case, the cases in turn, one request at a "
        f"time, exactly {args.tokens} output tokens each. The parsers run in the gateway, on every "
        "streamed delta; the random-weight model writes no call markup, so the tool case pays the "
        "scanning of every delta and the final parse and turns nothing into a call. The served gateway "
        "CPU moves by several percent from run to run (10 ms ticks); the last column is the served "
        "`off` figure plus the difference of the choice's assembly timed in process (one answer's "
        "pieces fed to the gateway's own code many times), the parsing's precise share. The reasoning "
        "case runs on a deployment of its own (its `reasoning_parser`): `off`, on the other deployment, "
        "runs right after it, and on 2 cores its served figures came out high (most likely the second vLLM "
        "engine still at work), the served ratios low; the in-process column is the measure.",
        "",
        table(header, rows),
        "",
    ]
    for name, (label, _, _) in CASES.items():
        if name != "off":
            cost, served = timed[name] / gateway["off"] - 1, gateway[name] / gateway["off"] - 1
            lines.append(
                f"- **{label}: {cost:+.1%} gateway CPU per output token** (timed in process; served: "
                f"{served:+.1%}; target < +10 %)."
            )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
