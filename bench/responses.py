"""A streamed Responses call against the same chat completion stream, one run.

    python -m bench.responses [--requests 40] [--tokens 64] [--out docs/benchmarks.md]

The benchmark's text-generation model (bench.generation: a 33 M random-weight Llama) is served by
modelhost; one client sends the same conversation, streamed, alternately as `POST /v1/chat/completions`
and as `POST /v1/responses` (exactly `--tokens` output tokens each: `min_tokens`), one request at a
time, so both see the same machine. Reported per output token: wall time (request sent → stream
finished), the gateway processes' CPU time and the replica's (the same generation for both: a check
that the comparison is like for like), from the server's whole process tree (`bench.common.server_cpu`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figures, ServerCpu, deploy, serve, table, write_section
from bench.generation import MESSAGES, build_model

HEADING = "## Responses API stream vs chat completion stream"


def _bodies(tokens: int) -> dict[str, tuple[str, dict[str, Any]]]:
    common = {"model": "llama", "stream": True, "temperature": 0, "min_tokens": tokens}
    return {
        "chat": ("/v1/chat/completions", {**common, "messages": MESSAGES, "max_tokens": tokens}),
        "responses": ("/v1/responses", {**common, "input": MESSAGES, "max_output_tokens": tokens}),
    }


def stream_to_end(http: httpx.Client, path: str, body: dict[str, Any]) -> int:
    """Send one streamed request, read it to the end; the number of SSE data lines (checked > 0)."""
    lines = 0
    with http.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.read()!r}")
        for line in response.iter_lines():
            lines += line.startswith("data: ")
    if not lines:
        raise RuntimeError(f"{path}: empty stream")
    return lines


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--requests", type=int, default=40, help="requests of each kind")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=18770)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(tempfile.mkdtemp(prefix="mh-bench-llama-"))
    walls: dict[str, list[float]] = {"chat": [], "responses": []}
    cpus: dict[str, list[ServerCpu]] = {"chat": [], "responses": []}  # CPU ms per output token
    try:
        build_model(folder)
        served = serve(args.port)
        try:
            deploy(served, folder, "text-generation", "llama", readiness="hot")
            bodies = _bodies(args.tokens)
            headers = {"Authorization": f"Bearer {served.key}"}
            with httpx.Client(base_url=served.url, headers=headers, timeout=300) as http:
                for path, body in bodies.values():  # warm-up: compiled templates, first-call paths
                    stream_to_end(http, path, body)
                for _ in range(args.requests):
                    for kind, (path, body) in bodies.items():
                        cpu, wall = served.cpu(), time.perf_counter()
                        stream_to_end(http, path, body)
                        walls[kind].append((time.perf_counter() - wall) / args.tokens)
                        cpus[kind].append((served.cpu() - cpu).ms_per(args.tokens))
        finally:
            served.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures = Figures("responses")
    section = report(args, walls, cpus, figures)
    print(section)
    write_section(args.out, HEADING, section, figures)


def report(
    args: argparse.Namespace,
    walls: dict[str, list[float]],
    cpus: dict[str, list[ServerCpu]],
    figures: Figures,
) -> str:
    """The section; its figures and ratios in `figures`."""
    # /proc counts 10 ms ticks: CPU figures are means over all requests
    wall = {kind: statistics.median(values) * 1000 for kind, values in walls.items()}
    gateway = {kind: statistics.fmean(c.gateway for c in values) for kind, values in cpus.items()}
    replica = {kind: statistics.fmean(c.replicas for c in values) for kind, values in cpus.items()}
    for kind in walls:
        figures.add(f"{kind}.wall_ms_per_output_token", wall[kind])
        figures.add(f"{kind}.gateway_ms_per_output_token", gateway[kind])
        figures.add(f"{kind}.replica_ms_per_output_token", replica[kind])
    wall_ratio = wall["responses"] / wall["chat"]
    cpu_ratio = gateway["responses"] / gateway["chat"]
    figures.ratio("responses_over_chat.wall_per_output_token", wall_ratio)
    figures.ratio("responses_over_chat.gateway_cpu_per_output_token", cpu_ratio)
    rows = [
        [label, f"{wall[kind]:.2f}", f"{gateway[kind]:.3f}", f"{replica[kind]:.3f}"]
        for kind, label in (
            ("chat", "`POST /v1/chat/completions`, streamed"),
            ("responses", "`POST /v1/responses`, streamed"),
        )
    ]
    header = ["what", "wall ms per output token (median)", "gateway CPU ms per output token (mean)"]
    header += ["replica CPU ms per output token (mean)"]
    return "\n".join(
        [
            HEADING,
            "",
            f"One run of `python -m bench.responses` (`make bench`): the benchmark's 33 M Llama, the same "
            f"conversation streamed {args.requests} times each way, alternating, one request at a time, "
            f"exactly {args.tokens} output tokens each.",
            "",
            table(header, rows),
            "",
            f"- **Responses / chat, wall time per token: {wall_ratio:.3f}** (target ≤ 1.05).",
            f"- Responses / chat, gateway CPU per token: {cpu_ratio:.3f} (the same token deltas as "
            "a chat stream, plus its opening and closing events with the response object).",
            "",
        ]
    )


if __name__ == "__main__":
    main()
