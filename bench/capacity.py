"""Capacity benchmark (issue 38): many cold deployments under a memory budget of a few footprints.

    python -m bench.capacity [--deployments 20] [--footprints 3] [--requests 1000] [--clients 4]

all-MiniLM-L6-v2 on torch, 20 `cold` deployments, each of its own artifact (as customers' own models
are: replicas of one artifact would share its mapped weights). 4 clients send 1,000
embeddings requests between them (250 each, one after another), the model of each drawn from a Zipf-like
mix (the k-th most popular with weight 1/k), the same draw in both runs:
- **with a budget** of 3 footprints (one footprint: the largest a replica measured in the first run;
  `MODELHOST_MIN_RESIDENCY_SECONDS` 2, so that a mix this fast turns over): errors, evictions, and the
  p50 / p99 latency of the requests that found their deployment unloaded (each of them loaded it, and
  under the budget evicted another to make room: the price of density) against those that found it
  loaded;
- **without a budget** (the default: 80 % of the machine): the same mix, for the memory it takes.

Memory is sampled every 0.25 s: the replicas' own pages in memory as the bench measures them itself
from /proc (`runtime.memory.tree_footprint_bytes` of every replica worker, without naming the model's
files: only their pages read so far count), and the server's whole process tree by PSS (proportional set
size: every page counted once across the tree) less the same before any replica loaded. Target: the
replicas' memory never above the budget by more than 10 %. CPU per request, of the gateway processes and
of the replicas, is read from the server's whole process tree over the clients' requests
(`bench.common.server_cpu`): the replicas' includes the loads the requests caused, and the CPU of
replicas evicted meanwhile (through the worker template, which reaps them).
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    ADMIN_KEY,
    SENTENCE,
    Figures,
    Served,
    machine,
    minilm_dir,
    serve,
    table,
    write_section,
)
from modelhost.runtime.memory import parents, tree, tree_footprint_bytes

MiB = 1 << 20


@dataclass
class Run:
    latencies: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})  # by cold
    errors: int = 0
    replicas_peak: int = 0  # the replicas' footprints, summed, at their highest
    tree_peak: int = 0  # the server tree's PSS above its idle PSS, at its highest
    loaded_peak: int = 0  # replica workers alive at once, at most
    evictions: float = 0.0
    largest_footprint: int = 0
    budget: int = 0
    gateway_ms: float = math.nan  # CPU per request, over the clients' requests
    replica_ms: float = math.nan


def mix(deployments: int, requests: int, seed: int = 38) -> list[str]:
    """The models of `requests` requests, the k-th most popular with weight 1/k."""
    draw = random.Random(seed)
    names = [f"m{k:02d}" for k in range(deployments)]
    return draw.choices(names, weights=[1 / (k + 1) for k in range(deployments)], k=requests)


def pss_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def workers(root: int, table: dict[int, int]) -> list[int]:
    """The replica workers below the server's process."""
    found = []
    for pid in tree(root, table):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"modelhost.runtime.worker.sync_worker" in command:
            found.append(pid)
    return found


def sample(served: Served, run: Run, idle_pss: int, stop: threading.Event) -> None:
    while not stop.is_set():
        table = parents()
        replicas = workers(served.process.pid, table)
        run.replicas_peak = max(run.replicas_peak, sum(tree_footprint_bytes(p, table) for p in replicas))
        run.loaded_peak = max(run.loaded_peak, len(replicas))
        total = sum(pss_bytes(p) for p in tree(served.process.pid, table))
        run.tree_peak = max(run.tree_peak, total - idle_pss)
        stop.wait(0.25)


def loaded(served: Served, deployment_id: str) -> bool:
    table = parents()
    for pid in workers(served.process.pid, table):
        if deployment_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return True
    return False


def measure(port: int, models: list[str], deployments: int, clients: int, **env: str) -> Run:
    served = serve(port, None, MODELHOST_MEMORY_CHECK_SECONDS="1", **env)
    run = Run()
    try:
        ids = deploy_all(served, deployments)
        time.sleep(2)  # the gateway and the template settle
        idle_pss = sum(pss_bytes(p) for p in tree(served.process.pid, parents()))
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(served, run, idle_pss, stop))
        sampler.start()
        lock = threading.Lock()

        def client(share: list[str]) -> None:
            with httpx.Client(base_url=served.url, timeout=120) as http:
                for model in share:
                    cold = not loaded(served, ids[model])
                    started = time.perf_counter()
                    answer = http.post(
                        "/v1/embeddings",
                        json={"model": model, "input": SENTENCE},
                        headers={"Authorization": f"Bearer {served.key}"},
                    )
                    took = (time.perf_counter() - started) * 1000
                    with lock:
                        if answer.status_code != 200:
                            run.errors += 1
                            print("error", answer.status_code, answer.text[:300])
                        run.latencies[cold].append(took)

        threads = [threading.Thread(target=client, args=(models[i::clients],)) for i in range(clients)]
        cpu_before = served.cpu()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cost = (served.cpu() - cpu_before).ms_per(len(models))
        run.gateway_ms, run.replica_ms = cost.gateway, cost.replicas
        stop.set()
        sampler.join()
        state = httpx.get(f"{served.url}/v1/admin/capacity", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        run.budget = state.json()["memory"]["budget_bytes"]
        run.largest_footprint = max((d["footprint_bytes"] for d in state.json()["deployments"]), default=0)
        run.evictions = evictions(httpx.get(f"{served.url}/metrics").text)
    finally:
        served.stop()
    return run


def deploy_all(served: Served, deployments: int) -> dict[str, str]:
    """all-MiniLM-L6-v2 pushed once per deployment (each customer's model is its own artifact: replicas of
    one artifact would share its mapped weights) and deployed cold on torch as m00, m01, ..."""
    from modelhost.cli.client import ApiClient
    from modelhost.cli.push import push

    api = ApiClient(served.url, served.key, timeout=600)
    ids = {}
    for k in range(deployments):
        model = f"m{k:02d}"
        artifact = push(api, minilm_dir(), model, "feature-extraction")["artifact"]
        body: dict[str, Any] = {"model": model, "artifact_id": artifact["id"], "engine": "transformers"}
        ids[model] = api.call("POST", "/v1/deployments", json=body)["id"]
    return ids


def evictions(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("modelhost_evictions_total{")
    )


def spread(latencies: list[float]) -> str:
    """`n: p50 / p99` in milliseconds."""
    return f"{len(latencies)}: {percentile(latencies, 0.5):.0f} / {percentile(latencies, 0.99):.0f}"


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--footprints", type=float, default=3.0)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=18875)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    models = mix(args.deployments, args.requests)
    free = measure(args.port, models, args.deployments, args.clients)
    budget_mb = int(free.largest_footprint * args.footprints / MiB)
    env = {"MODELHOST_MEMORY_BUDGET_MB": str(budget_mb), "MODELHOST_MIN_RESIDENCY_SECONDS": "2"}
    held = measure(args.port + 1, models, args.deployments, args.clients, **env)

    def row(name: str, run: Run) -> list[str]:
        cold, warm = run.latencies[True], run.latencies[False]
        return [
            name,
            f"{run.budget / MiB:,.0f}",
            str(run.errors),
            f"{run.evictions:.0f}",
            str(run.loaded_peak),
            f"{run.replicas_peak / MiB:,.0f}",
            f"{run.tree_peak / MiB:,.0f}",
            spread(cold),
            spread(warm),
            f"{run.gateway_ms:.2f}",
            f"{run.replica_ms:.2f}",
        ]

    header = [
        "run", "budget MiB", "errors", "evictions", "replicas at once (most)",
        "replicas' own pages in memory, peak MiB",
        "server tree PSS above idle, peak MiB", "requests to an unloaded deployment: n: p50 / p99 ms",
        "requests to a loaded one: n: p50 / p99 ms", "gateway ms CPU / request", "replica ms CPU / request",
    ]  # fmt: skip
    rows = [row("no budget (default)", free), row(f"budget of {args.footprints:g} footprints", held)]
    over, tree_over = held.replicas_peak / held.budget, held.tree_peak / held.budget
    held_cold, free_cold = percentile(held.latencies[True], 0.5), percentile(free.latencies[True], 0.5)
    figures = Figures("capacity")
    for name, run in (("no_budget", free), ("budget", held)):
        figures.add(f"{name}.budget_mib", run.budget / MiB)
        figures.add(f"{name}.errors", run.errors)
        figures.add(f"{name}.evictions", run.evictions)
        figures.add(f"{name}.replicas_at_once", run.loaded_peak)
        figures.add(f"{name}.replicas_peak_mib", run.replicas_peak / MiB)
        figures.add(f"{name}.tree_peak_mib", run.tree_peak / MiB)
        for cold, which in ((True, "unloaded"), (False, "loaded")):
            figures.add(f"{name}.{which}.requests", len(run.latencies[cold]))
            figures.add(f"{name}.{which}.p50_ms", percentile(run.latencies[cold], 0.5))
            figures.add(f"{name}.{which}.p99_ms", percentile(run.latencies[cold], 0.99))
        figures.add(f"{name}.gateway_ms_per_request", run.gateway_ms)
        figures.add(f"{name}.replica_ms_per_request", run.replica_ms)
    figures.add("footprint_mib", free.largest_footprint / MiB)
    figures.ratio("budget.replicas_peak_over_budget", over)
    figures.ratio("budget.tree_peak_over_budget", tree_over)
    figures.ratio("unloaded_p50_budget_over_no_budget", held_cold / free_cold)
    title = f"{args.deployments} cold deployments under a budget of {args.footprints:g} footprints"
    report = f"""## Capacity: {title}

Machine: {machine()}. One run of `python -m bench.capacity`: all-MiniLM-L6-v2 on torch,
{args.deployments} cold deployments, each of its own artifact (replicas of one artifact would share its
mapped weights); {args.clients} clients send {args.requests} embeddings requests between them (one after
another each), the model drawn from a Zipf-like mix (the k-th most popular with weight 1/k; the same
draw in both runs). One footprint: the largest a replica measured in the run without a budget
({free.largest_footprint / MiB:,.0f} MiB); the budgeted run has `MODELHOST_MEMORY_BUDGET_MB={budget_mb}`
and `MODELHOST_MIN_RESIDENCY_SECONDS=2`. Memory sampled every 0.25 s by the bench from /proc: the
replicas' own pages in memory (their footprint as the server measures it, but counting only the pages of
the model's files read so far, where the server counts them whole: one sentence reads few rows of the
embedding table), and the server's process tree by PSS above its idle PSS.

{table(header, rows)}

- **With the budget: {held.errors} errors; the replicas' memory peaked at {over:.2f} × the budget**
  (target ≤ 1.10; the whole server tree, by PSS above its idle PSS: {tree_over:.2f} ×);
  {held.loaded_peak} replicas at most at once against {free.loaded_peak} without it; {held.evictions:.0f}
  evictions. A request that found its deployment unloaded (a cold start that, under the budget, evicted
  another first) took {held_cold:.0f} ms at the median against
  {free_cold:.0f} ms without the budget (where only the first request to each
  deployment loads it; {held_cold / free_cold:.2f} ×): the price of density.
"""
    print(report)
    write_section(args.out, "## Capacity:", report, figures)


if __name__ == "__main__":
    main()
