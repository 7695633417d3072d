"""A streamed Responses call against the same chat completion stream, one run.

    python -m bench.responses [--requests 40] [--tokens 64] [--out docs/benchmarks.md]

The benchmark's text-generation model (bench.generation: a 33 M random-weight Llama) is served by
modelhost; one client sends the same conversation, streamed, alternately as `POST /v1/chat/completions`
and as `POST /v1/responses` (exactly `--tokens` output tokens each: `min_tokens`), one request at a
time, so both see the same machine. Reported per output token: wall time (request sent → stream
finished) and the gateway processes' CPU time (the replica's work is the same generation for both).
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

from bench.common import deploy, serve, table, write_section
from bench.generation import MESSAGES, build_model

HEADING = "## Responses API stream vs chat completion stream"


def _bodies(tokens: int) -> dict[str, tuple[str, dict[str, Any]]]:
    common = {"model": "llama", "stream": True, "temperature": 0, "min_tokens": tokens}
    return {
        "chat": ("/v1/chat/completions", {**common, "messages": MESSAGES, "max_tokens": tokens}),
        "responses": ("/v1/responses", {**common, "input": MESSAGES, "max_output_tokens": tokens}),
    }


def _stream(http: httpx.Client, path: str, body: dict[str, Any]) -> int:
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
    cpus: dict[str, list[float]] = {"chat": [], "responses": []}
    try:
        build_model(folder)
        served = serve(args.port)
        try:
            deploy(served, folder, "text-generation", "llama", readiness="hot")
            bodies = _bodies(args.tokens)
            headers = {"Authorization": f"Bearer {served.key}"}
            with httpx.Client(base_url=served.url, headers=headers, timeout=300) as http:
                for path, body in bodies.values():  # warm-up: compiled templates, first-call paths
                    _stream(http, path, body)
                for _ in range(args.requests):
                    for kind, (path, body) in bodies.items():
                        cpu, wall = served.cpu_seconds()[0], time.perf_counter()
                        _stream(http, path, body)
                        walls[kind].append((time.perf_counter() - wall) / args.tokens)
                        cpus[kind].append((served.cpu_seconds()[0] - cpu) / args.tokens)
        finally:
            served.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    section = report(args, walls, cpus)
    print(section)
    write_section(args.out, HEADING, section)


def report(args: argparse.Namespace, walls: dict[str, list[float]], cpus: dict[str, list[float]]) -> str:
    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.2f}"

    def mean_ms(values: list[float]) -> str:  # /proc counts 10 ms ticks: a mean over all requests
        return f"{statistics.fmean(values) * 1000:.3f}"

    wall_ratio = statistics.median(walls["responses"]) / statistics.median(walls["chat"])
    cpu_ratio = statistics.fmean(cpus["responses"]) / statistics.fmean(cpus["chat"])
    rows = [
        ["`POST /v1/chat/completions`, streamed", ms(walls["chat"]), mean_ms(cpus["chat"])],
        ["`POST /v1/responses`, streamed", ms(walls["responses"]), mean_ms(cpus["responses"])],
    ]
    header = ["what", "wall ms per output token (median)", "gateway CPU ms per output token (mean)"]
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
