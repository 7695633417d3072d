"""Tenancy benchmark (issue 31): fairness between keys, and what rate limits cost, one run.

    python -m bench.tenancy [--seconds 15] [--workers 1,2] [--out FILE]

all-MiniLM-L6-v2 on torch, served, one short sentence per request (wrk):
- **Fairness**: key A at 64 connections and key B at 1, each alone and then both at once (A alone and
  both at once twice, alternated). Issue 31's targets: B's p50 with A ≤ 2 × B's p50 alone; A's
  requests/s with B ≥ 0.9 × A's alone. With them, the most A could keep were B served at 2 × its p50
  alone (`fairness_bound`).
- **Overhead**: 64 connections of one key without limits, then of a key whose limits are far above
  what it uses (every request admitted and counted), twice each, alternated. Target: gateway CPU per
  request with limits within 10 % of without. The replicas' CPU per request is reported beside it (both
  from the server's whole process tree, `bench.common.server_cpu`).
"""

from __future__ import annotations

import argparse
import statistics
import threading
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Figures,
    Served,
    ServerCpu,
    WrkResult,
    deploy_minilm,
    machine,
    serve,
    table,
    write_section,
    wrk,
)

MANY, ONE = 64, 1
HIGH_LIMITS = {"requests_per_minute": 10**12, "tokens_per_minute": 10**12, "concurrent_requests": 10**6}


def new_key(served: Served, **body: Any) -> str:
    created = httpx.post(
        f"{served.url}/v1/keys", json=body, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    )
    created.raise_for_status()
    secret: str = created.json()["api_key"]
    return secret


def together(
    served: Served, body: dict[str, str], many: str, one: str, seconds: int
) -> tuple[WrkResult, WrkResult]:
    """Key `many` at 64 connections and key `one` at 1, over the same seconds."""
    results: dict[str, WrkResult] = {}

    def run_many() -> None:
        results["many"] = wrk(served.url, "/v1/embeddings", body, many, MANY, seconds)

    thread = threading.Thread(target=run_many)
    thread.start()
    results["one"] = wrk(served.url, "/v1/embeddings", body, one, ONE, seconds)
    thread.join()
    return results["many"], results["one"]


def cpu_ms(served: Served, body: dict[str, str], key: str, seconds: int) -> tuple[ServerCpu, WrkResult]:
    """CPU milliseconds per request, by role, at 64 connections of `key`."""
    before = served.cpu()
    run = wrk(served.url, "/v1/embeddings", body, key, MANY, seconds)
    return (served.cpu() - before).ms_per(run.requests_per_second * seconds), run


def mean_of(runs: list[WrkResult]) -> WrkResult:
    """The runs' figures averaged (errors summed)."""
    return WrkResult(
        statistics.mean(r.requests_per_second for r in runs),
        statistics.mean(r.p50_ms for r in runs),
        statistics.mean(r.p99_ms for r in runs),
        sum(r.errors for r in runs),
        statistics.mean(r.cpu_share for r in runs),
    )


def fairness_bound(a_alone: WrkResult, b_alone: WrkResult) -> float:
    """The most of its throughput alone that A can keep beside a B served at 2 × its p50 alone.

    B is one connection that sends its next request when the last is answered, so at a latency of
    2 × p50 it sends 1 / (2 × p50) requests a second, and each of them takes the replica's time that one
    request of A's takes (at best: a place in A's full batch, no smaller one). A's 64 connections keep
    the replica busy, so what B is given, A loses, whatever the queuing: A keeps at most
    1 − B's rate / A's rate alone. Where this is below 0.9, the two fairness targets cannot both hold on
    the machine measured (docs/limits.md, "Fair queuing")."""
    b_rate = 1000 / (2 * b_alone.p50_ms)
    return 1 - b_rate / a_alone.requests_per_second


def measure(workers: int, port: int, seconds: int) -> dict[str, Any]:
    served = serve(port, MODELHOST_WORKERS=str(workers))
    try:
        body = deploy_minilm(served)
        a, b, limited = (
            new_key(served, name="a"),
            new_key(served, name="b"),
            new_key(served, limits=HIGH_LIMITS),
        )
        b_alone = wrk(served.url, "/v1/embeddings", body, b, ONE, seconds)
        alone: list[WrkResult] = []
        beside: list[tuple[WrkResult, WrkResult]] = []
        for _ in range(2):  # A alone and A beside B, alternated: this machine's throughput drifts
            alone.append(wrk(served.url, "/v1/embeddings", body, a, MANY, seconds))
            beside.append(together(served, body, a, b, seconds))
        a_alone, a_with, b_with = (
            mean_of(alone),
            mean_of([m for m, _ in beside]),
            mean_of([o for _, o in beside]),
        )
        costs: dict[str, list[ServerCpu]] = {"without": [], "with": []}
        runs: dict[str, list[WrkResult]] = {"without": [], "with": []}
        for _ in range(2):
            for name, key in (("without", a), ("with", limited)):
                ms, run = cpu_ms(served, body, key, seconds)
                costs[name].append(ms)
                runs[name].append(run)
    finally:
        served.stop()
    return {
        "a_alone": a_alone,
        "b_alone": b_alone,
        "a_with": a_with,
        "b_with": b_with,
        "cost": {name: statistics.mean(c.gateway for c in values) for name, values in costs.items()},
        "replica_cost": {name: statistics.mean(c.replicas for c in values) for name, values in costs.items()},
        "rate": {
            name: statistics.mean(r.requests_per_second for r in values) for name, values in runs.items()
        },
        "errors": sum(r.errors for r in (a_alone, b_alone, a_with, b_with, *runs["without"], *runs["with"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--port", type=int, default=18865)
    parser.add_argument("--workers", default="1,2", help="gateway process counts to serve with")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    measured = {w: measure(w, args.port + i, args.seconds) for i, w in enumerate(workers)}

    rows, lines = [], []
    figures = Figures("tenancy")
    for w, m in measured.items():
        rows += [
            [f"--workers {w}, key A alone, {MANY} connections", f"{m['a_alone'].requests_per_second:.0f}",
             f"{m['a_alone'].p50_ms:.1f}", f"{m['a_alone'].p99_ms:.1f}", "-", "-"],
            [f"--workers {w}, key B alone, {ONE} connection", f"{m['b_alone'].requests_per_second:.0f}",
             f"{m['b_alone'].p50_ms:.1f}", f"{m['b_alone'].p99_ms:.1f}", "-", "-"],
            [f"--workers {w}, key A beside B", f"{m['a_with'].requests_per_second:.0f}",
             f"{m['a_with'].p50_ms:.1f}", f"{m['a_with'].p99_ms:.1f}", "-", "-"],
            [f"--workers {w}, key B beside A", f"{m['b_with'].requests_per_second:.0f}",
             f"{m['b_with'].p50_ms:.1f}", f"{m['b_with'].p99_ms:.1f}", "-", "-"],
            [f"--workers {w}, {MANY} connections, no limits", f"{m['rate']['without']:.0f}", "-", "-",
             f"{m['cost']['without']:.3f}", f"{m['replica_cost']['without']:.3f}"],
            [f"--workers {w}, {MANY} connections, limited key", f"{m['rate']['with']:.0f}", "-", "-",
             f"{m['cost']['with']:.3f}", f"{m['replica_cost']['with']:.3f}"],
        ]  # fmt: skip
        b_ratio = m["b_with"].p50_ms / m["b_alone"].p50_ms
        a_ratio = m["a_with"].requests_per_second / m["a_alone"].requests_per_second
        cost = m["cost"]["with"] / m["cost"]["without"]
        for run in ("a_alone", "b_alone", "a_with", "b_with"):
            figures.add(f"workers_{w}.{run}.requests_per_second", m[run].requests_per_second)
            figures.add(f"workers_{w}.{run}.p50_ms", m[run].p50_ms)
            figures.add(f"workers_{w}.{run}.p99_ms", m[run].p99_ms)
        for limits, name in (("without", "no_limits"), ("with", "limited")):
            figures.add(f"workers_{w}.{name}.requests_per_second", m["rate"][limits])
            figures.add(f"workers_{w}.{name}.gateway_ms_per_request", m["cost"][limits])
            figures.add(f"workers_{w}.{name}.replica_ms_per_request", m["replica_cost"][limits])
        figures.add(f"workers_{w}.errors", m["errors"])
        figures.add(f"workers_{w}.fairness_bound", fairness_bound(m["a_alone"], m["b_alone"]))
        figures.ratio(f"workers_{w}.b_p50_beside_a_over_alone", b_ratio)
        figures.ratio(f"workers_{w}.a_rate_beside_b_over_alone", a_ratio)
        figures.ratio(f"workers_{w}.gateway_ms_per_request_limited_over_not", cost)
        lines.append(
            f"- **--workers {w}: B's p50 beside A / alone: {b_ratio:.2f}** (target ≤ 2); **A's req/s "
            f"beside B / alone: {a_ratio:.2f}** (target ≥ 0.9); **gateway CPU per request, limited / not: "
            f"{cost:.2f}** "
            f"({m['cost']['with']:.3f} against {m['cost']['without']:.3f} ms; target ≤ 1.10). Errors: "
            f"{m['errors']}. Best A could keep were B at 2 × its p50 alone: "
            f"{fairness_bound(m['a_alone'], m['b_alone']):.2f} (`fairness_bound`)."
        )
    report = f"""## Tenancy: fairness between keys, and the cost of rate limits

Machine: {machine()}. One run of `python -m bench.tenancy` (all-MiniLM-L6-v2 on torch, one short
sentence per request, {args.seconds} s per wrk run; A alone and A beside B run twice each, alternated, and
are averaged; the limited key's limits are far above what it uses, so every request is admitted and
counted; its two runs alternate with two unlimited ones, averaged).

{table(["what", "req/s", "p50 ms", "p99 ms", "gateway ms CPU / request", "replica ms CPU / request"], rows)}

{chr(10).join(lines)}
"""
    print(report)
    write_section(args.out, "## Tenancy:", report, figures)


if __name__ == "__main__":
    main()
