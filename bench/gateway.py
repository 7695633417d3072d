"""Gateway benchmark: what one request costs the gateway, and what more gateway processes add.

    python -m bench.gateway [--workers 1,2] [--connections 64] [--rounds 5] [--baseline SRC] [--traced]
                            [--out FILE]

The model is a BERT with 1 layer and hidden size 32 (built here, random weights), so small that serving
a request costs far more than running it: the gateway is what is measured. wrk sends one short
sentence per request to `POST /v1/embeddings`. Every configuration runs as its own server at once; wrk
alternates between them for `--rounds` rounds and the table gives medians, so a slow minute of a shared
machine hits all of them alike. `--baseline` adds a server running another checkout's `src` (the code
before a change), measured in the same run. `--traced` adds two processes with tracing on, exporting
over OTLP/HTTP to a collector that only takes them (a thread of this benchmark), one with every request
sampled and one with 1 in 10 (`parentbased_traceidratio`, as an operator would run it): what traces
cost the gateway and the replica.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.common import SENTENCE, Figures, Served, deploy, machine, serve, table, write_section, wrk
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
    "replica ms CPU / request",
    "errors",
]
# a configuration's figures per round, in `Config.runs`; the table gives their medians
FIELDS = (
    "requests_per_second",
    "p50_ms",
    "gateway_cores",
    "gateway_ms_per_request",
    "replica_cores",
    "replica_ms_per_request",
    "errors",  # summed over the rounds
)


@dataclass
class Config:
    label: str
    workers: int
    source: Path | None = None
    sampled: float = 0.0  # with tracing on: the share of requests sampled
    served: Served | None = None
    runs: list[tuple[float, float, float, float, float, float, int]] = field(default_factory=list)

    def median(self, index: int) -> float:
        return statistics.median(run[index] for run in self.runs)

    @property
    def key(self) -> str:
        """The configuration in figure names: `workers_2`, `traced_100` (percent sampled), or
        `baseline` (whatever its label)."""
        if self.source is not None:
            return "baseline"
        return f"traced_{self.sampled * 100:.0f}" if self.sampled else f"workers_{self.workers}"


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
    parser.add_argument("--traced", action="store_true", help="add two processes with tracing on")
    parser.add_argument("--port", type=int, default=18770)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    folder = tiny_bert(Path(tempfile.mkdtemp(prefix="mh-tiny-")) / "model")
    configs = [Config("modelhost", int(w)) for w in args.workers.split(",")]
    if args.baseline is not None:
        configs.insert(0, Config(args.baseline_label, 1, args.baseline.resolve()))
    collector = Collector() if args.traced else None
    if collector is not None:
        configs.append(Config("modelhost, tracing on, every request sampled", 1, sampled=1.0))
        configs.append(Config("modelhost, tracing on, 1 request in 10 sampled", 1, sampled=0.1))
    body = {"model": "tiny", "input": SENTENCE}
    try:
        for index, config in enumerate(configs):
            env = {**SETTINGS, "MODELHOST_WORKERS": str(config.workers)}
            if config.sampled and collector is not None:
                env |= {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": str(config.sampled),
                }
            config.served = serve(args.port + index, config.source, **env)
            deploy(config.served, folder, "feature-extraction", "tiny")
            wrk(config.served.url, "/v1/embeddings", body, config.served.key, 8, 2)  # warm-up
        for _ in range(args.rounds):
            for config in configs:
                assert config.served is not None
                served = config.served
                before, started = served.cpu(), time.monotonic()
                run = wrk(served.url, "/v1/embeddings", body, served.key, args.connections, args.seconds)
                used, wall = served.cpu() - before, time.monotonic() - started
                gateway, replica = used.gateway / wall, used.replicas / wall
                rate = run.requests_per_second
                config.runs.append(
                    (rate, run.p50_ms, gateway, gateway / rate * 1000, replica, replica / rate * 1000,
                     run.errors)
                )  # fmt: skip
    finally:
        for config in configs:
            if config.served is not None:
                config.served.stop()
        if collector is not None:
            collector.close()
    figures = Figures("gateway")
    if collector is not None:
        figures.add("traced.exports", collector.posts)
    section = report(configs, args, figures)
    print(section)
    write_section(args.out, "## Gateway:", section, figures)


def spread(config: Config, one: Config) -> tuple[float, float]:
    """The lowest and highest of `config`'s requests/s over `one`'s, round by round (rounds alternate
    the servers, so a round's two figures saw the machine in much the same state): how far a single
    round's ratio strays from the medians' ratio, which is the figure reported."""
    ratios = [a[0] / b[0] for a, b in zip(config.runs, one.runs, strict=True)]
    return min(ratios), max(ratios)


def report(configs: list[Config], args: argparse.Namespace, figures: Figures) -> str:
    """The section, and each configuration's medians and the ratios in `figures`."""
    rows = [
        [f"{c.label}, --workers {c.workers}", f"{c.median(0):.0f} req/s", f"{c.median(1):.2f}",
         f"{c.median(2):.2f}", f"{c.median(3):.3f}", f"{c.median(4):.2f}", f"{c.median(5):.3f}",
         str(sum(r[6] for r in c.runs))]
        for c in configs
    ]  # fmt: skip
    for c in configs:
        for index, name in enumerate(FIELDS[:-1]):
            figures.add(f"{c.key}.{name}", c.median(index))
        figures.add(f"{c.key}.errors", sum(r[6] for r in c.runs))
    ours = [c for c in configs if c.source is None and not c.sampled]
    one = next((c for c in ours if c.workers == 1), ours[0])
    scaling = []
    for c in ours:
        if c is not one:
            ratio, low, high = c.median(0) / one.median(0), *spread(c, one)
            figures.ratio(f"workers_{c.workers}_over_{one.workers}", ratio)
            figures.add(f"workers_{c.workers}_over_{one.workers}.lowest_round", low)
            figures.add(f"workers_{c.workers}_over_{one.workers}.highest_round", high)
            scaling.append(f"--workers {c.workers}: {ratio:.2f} (round by round {low:.2f} to {high:.2f})")
    lines = [f"- Requests/s against --workers 1: {', '.join(scaling)}."] if scaling else []
    baseline = next((c for c in configs if c.source is not None), None)
    if baseline is not None:
        before, now = baseline.median(3), one.median(3)
        figures.ratio("baseline_over_now.gateway_ms_per_request", before / now)
        lines.append(
            f"- **Gateway CPU per request, {baseline.label} → now (one process): {before:.3f} ms → "
            f"{now:.3f} ms ({before / now:.1f}× less)**."
        )
    exports = figures.values.get("gateway.traced.exports", 0)
    for traced in (c for c in configs if c.sampled):
        gateway, replica = traced.median(3) / one.median(3), traced.median(5) / one.median(5)
        rate = traced.median(0) / one.median(0)
        figures.ratio(f"{traced.key}_over_untraced.gateway_ms_per_request", gateway)
        figures.ratio(f"{traced.key}_over_untraced.replica_ms_per_request", replica)
        figures.ratio(f"{traced.key}_over_untraced.requests_per_second", rate)
        lines.append(
            f"- **{traced.label[len('modelhost, ') :].capitalize()}, against tracing off (one process each): "
            f"gateway CPU per request {gateway:.2f}×, replica {replica:.2f}×, requests/s {rate:.2f}×** "
            f"({traced.median(3):.3f} against {one.median(3):.3f} ms of gateway CPU per request)."
        )
    if exports:
        lines.append(f"- The traced servers' spans went out over OTLP/HTTP in {exports:.0f} posts.")
    return f"""## Gateway: a 1-layer BERT (hidden 32), where serving costs more than the model

Machine: {machine()}. One run of `python -m bench.gateway {" ".join(_argv())}`: {args.connections} wrk
connections, one short sentence per request, medians of {args.rounds} rounds of {args.seconds} s per
configuration (all servers up at once, rounds alternated). Cores are CPU seconds per wall second.

{table(HEADER, rows)}

{chr(10).join(lines)}
"""


class Collector:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing but their count: a collector
    that costs the servers nothing beyond sending to it."""

    def __init__(self) -> None:
        self.posts = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _argv() -> list[str]:
    import sys

    return [a if not a.startswith("/") else os.path.basename(a) for a in sys.argv[1:]]


if __name__ == "__main__":
    main()
