"""What each piece of a request's path costs, measured alone in this process (issue 39).

    python -m bench.path_costs [--repeat 20000] [--out FILE]

Every figure is microseconds of CPU per request (or per batch, where the piece runs once a batch),
timed in a tight loop with `time.process_time`, so the pieces can be weighed against each other and
against the whole request (the gateway benchmark's ms of CPU per request):
- **request ID and metrics**: the outermost middleware (`RequestPath`) around an ASGI app that answers
  at once, against the app alone: the request's ID, its header, its counter and latency histogram;
- **rate limits**: admitting and releasing a request of a key with limits (`RateLimiter`, its table
  in this process) and the `x-ratelimit-*` headers it makes;
- **fair queuing**: a replica's queue per key, a batch of 16 taken from 16 keys against from 1;
- **`Started`**: the message a replica sends before a batch runs (built and encoded), per batch.

Then the whole path, served (issue 59): a server's gateway and replica CPU per request (all-MiniLM-L6-v2
on ONNX Runtime, wrk at 1 connection, one distinct sentence per request) and per output token (the
text-generation benchmark's 33 M Llama on modelhost's own engine, 1 stream of 64 tokens). `--baseline
SRC` serves another checkout's `src` beside this tree's (the commit before a change), measured in turn:
"before and after" in one run. `--no-served` skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Figures, Served, deploy, minilm_dir, serve, table, write_section, wrk
from bench.embeddings import machine
from bench.generation import build_model, drive, modelhost_body
from bench.relay_floor import Floor
from bench.user_view import TEMPLATE
from modelhost.api.middleware import RequestPath
from modelhost.auth.limits import Limits, RateLimiter, Subject
from modelhost.runtime.replica_protocol import Run, Started, encode
from modelhost.runtime.worker.host import ReplicaHost

BATCH = 16


def per_call(work: Callable[[], Any], repeat: int) -> float:
    """CPU microseconds per call of `work`."""
    for _ in range(min(1000, repeat)):
        work()
    started = time.process_time()
    for _ in range(repeat):
        work()
    return (time.process_time() - started) / repeat * 1e6


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": b"{}"})


def request_path(repeat: int) -> tuple[float, float]:
    """(the app alone, the app inside `RequestPath`), µs per request, on one event loop."""

    async def nothing() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def sent(message: dict[str, Any]) -> None:
        return None

    def scope() -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": [], "app": None}

    path = RequestPath(_answer)
    loop = asyncio.new_event_loop()
    try:
        bare = per_call(lambda: loop.run_until_complete(_answer(scope(), nothing, sent)), repeat)
        wrapped = per_call(lambda: loop.run_until_complete(path(scope(), nothing, sent)), repeat)
    finally:
        loop.close()
    return bare, wrapped


def rate_limits(repeat: int) -> float:
    """Admit and release one request of a key with limits (and of its account), µs."""
    limits = Limits(requests_per_minute=10**12, tokens_per_minute=10**12, concurrent_requests=10**6)
    subjects = tuple(s for s in (Subject.of("key", "k", limits), Subject.of("account", "a", limits)) if s)
    limiter = RateLimiter()

    def admit_release() -> None:
        admitted = limiter.admit(subjects)
        limiter.release(admitted.ticket, 7)

    return per_call(admit_release, repeat)


class _Handler:
    """A batch handler that does nothing: the host's own work is what is timed."""

    streaming = False

    def run(self, state: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{} for _ in batch]


def fair_queuing(repeat: int) -> tuple[float, float]:
    """A batch of `BATCH` requests through a replica's host, from one key and from `BATCH` keys, µs per
    batch (receiving them, taking the batch, running a handler that does nothing, the answers)."""

    def batch_from(keys: int) -> Callable[[], None]:
        host = ReplicaHost(_Handler(), None, deployment="bench", max_batch=BATCH, max_wait=0.0)  # type: ignore[arg-type]

        def run() -> None:
            for i in range(BATCH):
                host.receive("peer", Run(i, {"inputs": ["x"]}, tenant=f"key-{i % keys}"))
            host.work()
            host.take_outgoing()

        return run

    return per_call(batch_from(1), repeat // 10), per_call(batch_from(BATCH), repeat // 10)


def started(repeat: int) -> float:
    """The `Started` message of a batch of `BATCH`, built and encoded, µs per batch."""
    ids = list(range(BATCH))
    return per_call(lambda: encode(Started(ids)), repeat)


# The served loads: (name, unit, deployment's model, connections): embeddings, a distinct sentence each,
# on MiniLM deployed on ONNX Runtime (at 1 and at 64 connections) and on torch; generation, 1 stream of
# 64 tokens, on the Llama
LOADS = (
    ("embeddings on ONNX Runtime", "request", "minilm", 1),
    ("embeddings on ONNX Runtime, 64 connections", "request", "minilm", 64),
    ("embeddings on torch", "request", "minilm-torch", 1),
    ("generation on modelhost's engine", "output token", "llama", 1),
)
Costs = dict[str, tuple[float, float, float]]  # per load: (gateway, replica) CPU ms per unit, units/s
FLOOR = "the floor at the same rate"  # `bench.relay_floor`, its replica as slow as the served model


def served_costs(sources: dict[str, Path | None], seconds: int, rounds: int) -> dict[str, Costs]:
    """Each source's server (None: this tree) with MiniLM (on ONNX Runtime and on torch) and the 33 M
    Llama (modelhost's own engine) deployed; `rounds` rounds of each load on each server in turn; the
    median of each figure."""
    folder = Path(tempfile.mkdtemp(prefix="mh-path-costs-")) / "llama"
    build_model(folder)
    servers: dict[str, Served] = {}
    taken: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    try:
        for index, (name, source) in enumerate(sources.items()):
            served = servers[name] = serve(18_900 + index, source)
            deploy(served, minilm_dir(), "feature-extraction", "minilm", engine="onnxruntime")
            deploy(served, minilm_dir(), "feature-extraction", "minilm-torch", engine="transformers")
            deploy(served, folder, "text-generation", "llama", engine="transformers")
            for _, unit, model, connections in LOADS:
                _load(served, model, unit, connections, 2)  # warm-up
        for _ in range(rounds):
            for name, served in servers.items():
                for load, unit, model, connections in LOADS:
                    before = served.cpu()
                    units = _load(served, model, unit, connections, seconds)
                    used = served.cpu() - before
                    taken.setdefault((name, load), []).append(
                        (used.gateway * 1000 / units, used.engine * 1000 / units, units / seconds)
                    )
    finally:
        for served in servers.values():
            served.stop()
    return {
        name: {
            load: (
                statistics.median(g for g, _, _ in taken[name, load]),
                statistics.median(r for _, r, _ in taken[name, load]),
                statistics.median(rate for _, _, rate in taken[name, load]),
            )
            for load, _, _, _ in LOADS
        }
        for name in sources
    }


def _load(served: Served, model: str, unit: str, connections: int, seconds: int) -> float:
    """Run one load for `seconds`: the requests (embeddings) or output tokens (generation) served."""
    if unit == "output token":
        return float(asyncio.run(drive(served.url, served.key, modelhost_body(64), 1, seconds)).tokens)
    body = {"model": model, "input": TEMPLATE}
    run = wrk(served.url, "/v1/embeddings", body, served.key, connections, seconds, distinct=True)
    return run.requests_per_second * seconds


def floor_costs(served: Costs, seconds: int, rounds: int) -> Costs:
    """`bench.relay_floor` for each load at the rate the served server reached (`served`): its replica
    spends on a core, per request and one request after another, what the served rate leaves beyond the
    floor's own path (embeddings), or the served time between tokens (generation), so both wake about as
    often. CPU ms of the floor's server process per
    unit (the replica's is the stand-in's, not counted), the median of `rounds`."""
    found: Costs = {}
    for load, unit, _, connections in LOADS:
        rate = served[load][2]
        if unit == "output token":
            floor = Floor(18_950, token_ms=1000 / rate)
        else:
            with Floor(18_950) as quick:
                own_ms = 1000 / quick.rate(connections, 3)
            floor = Floor(18_950, model_ms=max(0.0, 1000 / rate - own_ms))
        with floor:
            floor.rate(connections, 2, unit)  # warm-up
            runs = []
            for _ in range(rounds):
                before = floor.cpu()
                units = floor.rate(connections, seconds, unit) * seconds
                runs.append(((floor.cpu() - before) * 1000 / units, units / seconds))
        found[load] = (statistics.median(c for c, _ in runs), 0.0, statistics.median(r for _, r in runs))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-served", dest="served", action="store_false", help="the pieces only")
    parser.add_argument("--baseline", type=Path, help="another checkout's src, served beside this tree")
    parser.add_argument("--seconds", type=int, default=8, help="each served load, each round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bare, wrapped = request_path(args.repeat)
    limited = rate_limits(args.repeat)
    one_key, many_keys = fair_queuing(args.repeat)
    announce = started(args.repeat)
    rows = [
        ["request ID, its header, the request counter and latency histogram (`RequestPath`)",
         f"{wrapped - bare:.1f} per request"],
        ["rate limits: admission and release of a limited key and its account (`RateLimiter`)",
         f"{limited:.1f} per request"],
        [f"fair queuing: a batch of {BATCH} from {BATCH} keys, less from 1 key (`ReplicaHost`)",
         f"{many_keys - one_key:.1f} per batch ({one_key:.1f} for the batch from one key)"],
        [f"`Started` of a batch of {BATCH}, built and encoded", f"{announce:.1f} per batch"],
    ]  # fmt: skip
    report = f"""## Path costs: what each piece of a request's path costs

Machine: {machine()}. One run of `python -m bench.path_costs`: each piece alone in one process, in a tight
loop, CPU microseconds (`time.process_time`) per request or per batch, to weigh against the gateway
benchmark's CPU per request (about 150 µs of gateway CPU and 55 µs of replica CPU for the 1-layer BERT).

{table(["piece", "µs of CPU"], rows)}
"""
    figures = Figures("path_costs")
    if args.served:
        sources: dict[str, Path | None] = {"this tree": None}
        if args.baseline is not None:
            sources = {"baseline": args.baseline, **sources}
        costs = served_costs(sources, args.seconds, args.rounds)
        floor = floor_costs(costs["this tree"], args.seconds, args.rounds)
        served_rows = [
            [name, *(f"{costs[name][load][side]:.3f}" for load, _, _, _ in LOADS for side in (0, 1))]
            for name in costs
        ]
        served_rows.append(
            [FLOOR, *(cell for load, _, _, _ in LOADS for cell in (f"{floor[load][0]:.3f}", "–"))]
        )
        for name, loads in {**costs, "floor": floor}.items():
            for load, unit, _, _ in LOADS:
                key = f"{name}.{load}".replace(" ", "_").replace("'", "").replace(",", "")
                figures.add(f"{key}.gateway_ms_per_{unit.replace(' ', '_')}", loads[load][0])
                figures.add(f"{key}.{unit.replace(' ', '_')}s_per_second", loads[load][2])
                if name != "floor":
                    figures.add(f"{key}.replica_ms_per_{unit.replace(' ', '_')}", loads[load][1])
        above = "; ".join(
            f"{load} {costs['this tree'][load][0] / floor[load][0]:.2f} "
            f"({costs['this tree'][load][2]:.0f} against {floor[load][2]:.0f} {unit}s/s)"
            for load, unit, _, _ in LOADS
        )
        lines = f"\n- **The gateway over the floor at the same rate (CPU):** {above}."
        if "baseline" in costs:
            now, before = costs["this tree"], costs["baseline"]
            parts = []
            for load, unit, _, _ in LOADS:
                for side, role in ((0, "gateway"), (1, "replica")):
                    ratio = now[load][side] / before[load][side]
                    key = f"{load} {role}".replace(" ", "_").replace("'", "").replace(",", "")
                    figures.ratio(f"after_over_before.{key}", ratio)
                    parts.append(f"{load}, {role} per {unit} {ratio:.2f}")
            lines += f"\n- **After / before (CPU), baseline `{args.baseline}`:** " + "; ".join(parts) + "."
        header = ["server"] + [
            f"{load}: {role} / {unit}" for load, unit, _, _ in LOADS for role in ("gateway", "replica")
        ]
        report += f"""
The whole path, served: CPU ms of the gateway processes and of the replica per embeddings request
(MiniLM, a distinct sentence each, at 1 and 64 connections) and per output token (the 33 M Llama, 1
stream of 64 tokens), the median of {args.rounds} rounds of {args.seconds} s, the servers measured in turn.
The floor's row: `bench.relay_floor` (uvicorn, a Unix socket, a stand-in replica that spends on a
core what the served model took, so that its server wakes as often as the gateway did), its server
process's CPU per request or token: the least a Python server of modelhost's shape spends at that rate.

{table(header, served_rows)}
{lines}
"""
    print(report)
    figures.add("request_path_us", wrapped - bare)
    figures.add("rate_limits_us", limited)
    figures.add("fair_queuing_us_per_batch", many_keys - one_key)
    figures.add("started_us_per_batch", announce)
    write_section(args.out, "## Path costs:", report, figures)


if __name__ == "__main__":
    main()
