"""Gateway benchmark: what one request costs the gateway, and what more gateway processes add.

    python -m bench.gateway [--workers 1,2] [--connections 64] [--rounds 5] [--baseline SRC] [--out FILE]

The model is a BERT with 1 layer and hidden size 32 (built here, random weights), so small that serving
a request costs far more than running it: the gateway is what is measured. wrk sends one short
sentence per request to `POST /v1/embeddings`. Every configuration runs as its own server at once; wrk
alternates between them for `--rounds` rounds and the table gives medians, so a slow minute of a shared
machine hits all of them alike. `--baseline` adds a server running another checkout's `src` (the code
before a change), measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import SENTENCE, Served, deploy, serve, table, write_section, wrk
from bench.embeddings import machine
from bench.models import tiny_bert

# A model this small gains nothing from more torch threads or from waiting for fuller batches.
SETTINGS = {"MODELHOST_WORKER_THREADS": "1", "MODELHOST_MAX_BATCH_WAIT_MS": "0"}
HEADER = [
    "what",
    "throughput",
    "p50 ms",
    "gateway cores",
    "gateway ms CPU / request",
    "replica cores",
    "errors",
]


@dataclass
class Config:
    label: str
    workers: int
    source: Path | None = None
    served: Served | None = None
    runs: list[tuple[float, float, float, float, float, int]] = field(default_factory=list)

    def median(self, index: int) -> float:
        return statistics.median(run[index] for run in self.runs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2", help="gateway process counts")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="wrk time per round and configuration")
    parser.add_argument("--baseline", type=Path, help="another checkout's src folder, served with 1 process")
    parser.add_argument("--baseline-label", default="before")
    parser.add_argument("--port", type=int, default=18770)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    folder = tiny_bert(Path(tempfile.mkdtemp(prefix="mh-tiny-")) / "model")
    configs = [Config("modelhost", int(w)) for w in args.workers.split(",")]
    if args.baseline is not None:
        configs.insert(0, Config(args.baseline_label, 1, args.baseline.resolve()))
    body = {"model": "tiny", "input": SENTENCE}
    try:
        for index, config in enumerate(configs):
            env = {**SETTINGS, "MODELHOST_WORKERS": str(config.workers)}
            config.served = serve(args.port + index, config.source, **env)
            deploy(config.served, folder, "feature-extraction", "tiny")
            wrk(config.served.url, "/v1/embeddings", body, config.served.key, 8, 2)  # warm-up
        for _ in range(args.rounds):
            for config in configs:
                assert config.served is not None
                served = config.served
                before, started = served.cpu_seconds(), time.monotonic()
                run = wrk(served.url, "/v1/embeddings", body, served.key, args.connections, args.seconds)
                after, wall = served.cpu_seconds(), time.monotonic() - started
                gateway, replica = (after[0] - before[0]) / wall, (after[1] - before[1]) / wall
                per_request = gateway / run.requests_per_second * 1000
                config.runs.append(
                    (run.requests_per_second, run.p50_ms, gateway, per_request, replica, run.errors)
                )
    finally:
        for config in configs:
            if config.served is not None:
                config.served.stop()
    print(report(configs, args))
    write_section(args.out, "## Gateway:", report(configs, args))


def report(configs: list[Config], args: argparse.Namespace) -> str:
    rows = [
        [f"{c.label}, --workers {c.workers}", f"{c.median(0):.0f} req/s", f"{c.median(1):.2f}",
         f"{c.median(2):.2f}", f"{c.median(3):.3f}", f"{c.median(4):.2f}", str(sum(r[5] for r in c.runs))]
        for c in configs
    ]  # fmt: skip
    ours = [c for c in configs if c.source is None]
    one = next((c for c in ours if c.workers == 1), ours[0])
    scaling = [f"--workers {c.workers}: {c.median(0) / one.median(0):.2f}" for c in ours if c is not one]
    lines = [f"- Requests/s against --workers 1: {', '.join(scaling)}."] if scaling else []
    baseline = next((c for c in configs if c.source is not None), None)
    if baseline is not None:
        before, now = baseline.median(3), one.median(3)
        lines.append(
            f"- **Gateway CPU per request, {baseline.label} → now (one process): {before:.3f} ms → "
            f"{now:.3f} ms ({before / now:.1f}× less)**."
        )
    return f"""## Gateway: a 1-layer BERT (hidden 32), where serving costs more than the model

Machine: {machine()}. One run of `python -m bench.gateway {" ".join(_argv())}`: {args.connections} wrk
connections, one short sentence per request, medians of {args.rounds} rounds of {args.seconds} s per
configuration (all servers up at once, rounds alternated). Cores are CPU seconds per wall second.

{table(HEADER, rows)}

{chr(10).join(lines)}
"""


def _argv() -> list[str]:
    import sys

    return [a if not a.startswith("/") else os.path.basename(a) for a in sys.argv[1:]]


if __name__ == "__main__":
    main()
