"""Soak benchmark: does any process of the server grow under a steady load? One run.

    python -m bench.soak [--minutes 10] [--clients 4] [--sample-seconds 5] [--out docs/benchmarks.md]

Two soaks, each on a fresh `modelhost serve --workers 2` for `--minutes`: streamed chat completions on
the text-generation benchmark's random-weight Llama (`bench.generation`), then embeddings on
all-MiniLM-L6-v2; `--clients` asyncio clients send requests back to back. Every `--sample-seconds` the
resident memory (RSS) of every process of the server is read from /proc and added up per kind: the
supervisor, the other gateway processes, the worker template and the replica workers. A leak shows as
growth over the second half of the run (the first half holds the warm-up: caches, allocator pools);
the target is under 5 % for every kind. The CPU per request of the gateway processes and of the replicas
over each whole soak is read from the server's process tree (`bench.common.server_cpu`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import (
    SENTENCE,
    Figures,
    Served,
    ServerCpu,
    deploy,
    minilm_dir,
    serve,
    table,
    write_section,
)
from bench.generation import Load, build_model, drive, modelhost_body
from modelhost.runtime.memory import descendants, parents, rss_bytes

KINDS = {  # what a process's command line runs → its kind in the report
    "modelhost.server.gateway": "gateway processes",
    "modelhost.runtime.worker.template": "worker template",
    "modelhost.runtime.worker.sync_worker": "replica workers",
}
SUPERVISOR = "supervisor"
TARGET_GROWTH = 5.0  # % over the second half
CHAT_TOKENS = 64


@dataclass
class Sample:
    seconds: float  # since the load started
    rss: dict[str, int]  # kind → bytes, summed over its processes
    processes: dict[str, int]  # kind → how many


@dataclass
class Soak:
    name: str
    load: Load
    samples: list[Sample] = field(default_factory=list)
    cpu: ServerCpu = field(default_factory=ServerCpu)  # over the whole soak, ms per request served

    def at(self, seconds: float) -> Sample:
        """The sample taken nearest to `seconds` into the run."""
        return min(self.samples, key=lambda s: abs(s.seconds - seconds))

    def rows(self, figures: Figures | None = None) -> list[list[str]]:
        """The table's rows, one per process kind; with `figures`, their figures too."""
        half, end = self.at(self.samples[-1].seconds / 2), self.samples[-1]
        rows = []
        for kind in [SUPERVISOR, *KINDS.values()]:
            if kind not in end.rss:
                continue
            before, after = half.rss.get(kind, 0), end.rss[kind]
            growth = (after - before) / before * 100 if before else float("nan")
            if figures is not None:
                prefix = f"{_slug(self.name)}.{_slug(kind)}"
                figures.add(f"{prefix}.processes", end.processes[kind])
                figures.add(f"{prefix}.rss_half_mb", before / 1e6)
                figures.add(f"{prefix}.rss_end_mb", after / 1e6)
                figures.ratio(f"{prefix}.rss_end_over_half", after / before if before else float("nan"))
            rows.append(
                [self.name, kind, str(end.processes[kind]), f"{before / 1e6:.1f}", f"{after / 1e6:.1f}",
                 f"{growth:+.2f}", "yes" if growth < TARGET_GROWTH else "**no**"]
            )  # fmt: skip
        return rows


def _slug(name: str) -> str:
    """A soak's or process kind's name in figure names: `streamed_chat`, `worker_template`."""
    return name.replace(" ", "_")


def sample(supervisor: int, started: float) -> Sample:
    """RSS of each process of the server (the supervisor and everything it started), by kind."""
    rss: dict[str, int] = {SUPERVISOR: rss_bytes(supervisor)}
    counts = {SUPERVISOR: 1}
    for pid in descendants(supervisor, parents()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        kind = next((k for module, k in KINDS.items() if f"-m {module} " in f"{command} "), "other")
        rss[kind] = rss.get(kind, 0) + rss_bytes(pid)
        counts[kind] = counts.get(kind, 0) + 1
    return Sample(time.monotonic() - started, rss, counts)


async def sampled(name: str, served: Served, load: Awaitable[Load], every: float) -> Soak:
    """Run `load` while sampling the server's memory every `every` seconds (and once at the end); the
    server's CPU per request over the whole load."""
    started, cpu = time.monotonic(), served.cpu()
    samples: list[Sample] = []

    async def sampler() -> None:
        while True:
            samples.append(await asyncio.to_thread(sample, served.process.pid, started))
            mb = ", ".join(f"{kind} {rss / 1e6:.1f}" for kind, rss in samples[-1].rss.items())
            print(f"  {name} {samples[-1].seconds:.0f} s: RSS MB {mb}", flush=True)
            await asyncio.sleep(every)

    task = asyncio.create_task(sampler())
    try:
        result = await load
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    samples.append(sample(served.process.pid, started))
    return Soak(name, result, samples, (served.cpu() - cpu).ms_per(result.completed))


async def embed_back_to_back(served: Served, clients: int, seconds: float) -> Load:
    """`clients` workers posting one sentence to `/v1/embeddings` until the deadline."""
    load = Load()
    headers = {"Authorization": f"Bearer {served.key}"}
    body = {"model": "minilm", "input": SENTENCE}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60, limits=limits) as client:

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    answer = await client.post("/v1/embeddings", json=body)
                except httpx.HTTPError as exc:
                    load.error(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.1)  # a server gone refuses at once: do not spin
                    continue
                if answer.status_code == 200:
                    load.completed += 1
                else:
                    load.error(f"HTTP {answer.status_code}: {answer.text}")

        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker() for _ in range(clients)))
    return load


def soak_chat(port: int, minutes: float, clients: int, every: float) -> Soak:
    folder = Path(tempfile.mkdtemp(prefix="mh-soak-llama-"))
    served = serve(port, MODELHOST_WORKERS="2")
    try:
        build_model(folder)
        deploy(served, folder, "text-generation", "llama", readiness="hot")
        load = drive(served.url, served.key, modelhost_body(CHAT_TOKENS), clients, minutes * 60)
        return asyncio.run(sampled("streamed chat", served, load, every))
    finally:
        served.stop()
        shutil.rmtree(folder, ignore_errors=True)


def soak_embeddings(port: int, minutes: float, clients: int, every: float) -> Soak:
    served = serve(port, MODELHOST_WORKERS="2")
    try:
        deploy(served, minilm_dir(), "feature-extraction", "minilm")
        load = embed_back_to_back(served, clients, minutes * 60)
        return asyncio.run(sampled("embeddings", served, load, every))
    finally:
        served.stop()


def report(soaks: list[Soak], minutes: float, clients: int, every: float, figures: Figures) -> str:
    """The section; each soak's figures in `figures`."""
    header = ["soak", "process kind", "processes", "RSS at half (MB)", "RSS at end (MB)", "growth %",
              f"< {TARGET_GROWTH:g} %"]  # fmt: skip
    rows = [row for soak in soaks for row in soak.rows(figures)]
    cpu_rows = []
    for soak in soaks:
        cpu_rows.append(
            [soak.name, str(soak.load.completed), str(soak.load.errors), f"{soak.cpu.gateway:.3f}",
             f"{soak.cpu.replicas:.3f}"]
        )  # fmt: skip
        figures.add(f"{_slug(soak.name)}.requests", soak.load.completed)
        figures.add(f"{_slug(soak.name)}.errors", soak.load.errors)
        figures.add(f"{_slug(soak.name)}.gateway_ms_per_request", soak.cpu.gateway)
        figures.add(f"{_slug(soak.name)}.replica_ms_per_request", soak.cpu.replicas)
    cpu_header = ["soak", "requests served", "errors", "gateway ms CPU / request", "replica ms CPU / request"]
    served = "; ".join(
        f"{s.name}: {s.load.completed} requests served, {s.load.errors} errors"
        + (f" (first: `{s.load.first_error}`)" if s.load.errors else "")
        for s in soaks
    )
    return f"""## Soak: memory of every server process under a steady load

One run of `python -m bench.soak {" ".join(sys.argv[1:])}` (`make bench-soak`) on a 2-core machine
shared with other work (tests of other engineers ran at the same time). Each soak: a fresh `modelhost
serve --workers 2`, {clients} clients sending requests back to back for {minutes:g} min; streamed chat
completions of {CHAT_TOKENS} tokens on the text-generation benchmark's random-weight 33 M Llama, then
one-sentence embeddings on all-MiniLM-L6-v2. The RSS of every process of the server is read from /proc
every {every:g} s and added up per kind; growth is from the sample nearest the middle of the run to the
last one (the first half holds the warm-up), with a target of less than {TARGET_GROWTH:g} %.

{table(header, rows)}

{table(cpu_header, cpu_rows)}

- {served}.
- The chat replica's RSS is mostly its KV cache, allocated whole when it loads (on CPU at most an eighth
  of the machine's memory, `MODELHOST_KV_CACHE_MB` unset): a generation does not grow it. Processes
  forked from the worker template count the pages they share with it in their own RSS too.
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10, help="load time of each soak")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients, back to back")
    parser.add_argument("--sample-seconds", type=float, default=5)
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    soaks = []
    for i, run in enumerate((soak_chat, soak_embeddings)):
        soak = run(args.port + i, args.minutes, args.clients, args.sample_seconds)
        print(table(["soak", "kind", "n", "half MB", "end MB", "growth %", "ok"], soak.rows()), flush=True)
        soaks.append(soak)
    figures = Figures("soak")
    section = report(soaks, args.minutes, args.clients, args.sample_seconds, figures)
    print(section)
    write_section(args.out, "## Soak:", section, figures)


if __name__ == "__main__":
    main()
