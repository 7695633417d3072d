"""Batch API benchmark (issue 41): a batch of embeddings against the same requests sent interactively,
and what a running batch costs an interactive caller, one run.

    python -m bench.batch [--lines 10000] [--rounds 2] [--seconds 15] [--connections 64] [--out FILE]

all-MiniLM-L6-v2 (the real weights) on torch, one modelhost server, one short sentence per request
(`--lines` different sentences, `sentences`):
- **Throughput**: the sentences sent as `--lines` interactive requests by `--connections` connections
  at once (`drive`: asyncio over raw HTTP/1.1 keep-alive connections, the requests encoded beforehand,
  the answers' bodies read but not parsed, so that the client costs a 2-core machine little), and as
  the lines of one batch through the unchanged openai SDK: the JSONL uploaded (`files.create`, purpose
  batch), the batch created and polled every POLL_SECONDS until `completed`, its output downloaded and
  checked (one 200 answer per line). `--rounds` rounds, their order alternated (I B, B I, ...: a
  machine that slows down meanwhile hits both alike). Batch throughput: lines / (created → seen
  `completed`). Target: batch / interactive ≥ 1.0.
- **Interactive latency beside a batch**: one sequential client (`sequential`: one connection, one
  request at a time, every latency counted) alone for half of `--seconds`, then for `--seconds` while
  a batch runs that is sized from the batch throughput just measured to outlast the window (it is
  cancelled after it), then alone again for the other half. Target: p50 beside the batch / p50 alone
  ≤ 1.5.

Every row reports the CPU of the server's whole process tree (`Served.cpu`: gateway processes, the
batch runner among them, and the replica), the client's own, and the mean size of the replica's model
calls (its `modelhost_batch_size` metric): how full its batches were.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import openai
from openai.types import Batch

from bench.common import (
    Figures,
    Served,
    ServerCpu,
    deploy_minilm,
    machine,
    serve,
    table,
    write_section,
)

T = TypeVar("T")
ENDPOINT = "/v1/embeddings"
MODEL = "minilm"
POLL_SECONDS = 0.1  # how often a batch's status is read: the batch's timing is this fine
WARMUP_LINES = 256  # a first batch and a first interactive round, untimed
# The batch beside the sequential client: enough lines for this many times the seconds it must outlast
# (the window, and the time the batch takes to be validated and start), at the throughput just measured
OUTLAST_MARGIN = 1.5
START_SECONDS = 10.0

# Short sentences (about as long as bench.common.SENTENCE), 20 × 20 × 25 × 4 = 40,000 of them, all different
SUBJECTS = [
    "The old farmer", "A young doctor", "My neighbour", "The tired pilot", "A curious child",
    "The night nurse", "Our new teacher", "A quiet student", "The city mayor", "A local baker",
    "The ship captain", "An eager intern", "The lead singer", "A retired judge", "The head chef",
    "A street artist", "The team coach", "A park ranger", "The bus driver", "A famous author",
]  # fmt: skip
VERBS = [
    "carries", "paints", "repairs", "finds", "sells", "borrows", "describes", "photographs", "cleans",
    "loses", "builds", "orders", "hides", "measures", "delivers", "studies", "returns", "chooses",
    "washes", "opens",
]  # fmt: skip
OBJECTS = [
    "a red umbrella", "the broken clock", "a wooden chair", "an old map", "the blue bicycle",
    "a heavy suitcase", "the tall ladder", "a paper lantern", "the silver key", "a green notebook",
    "the kitchen table", "a small boat", "the garden gate", "a leather bag", "the winter coat",
    "a glass vase", "the front door", "a music box", "the stone wall", "a flower pot",
    "the train ticket", "a warm blanket", "the office printer", "a toy rocket", "the apple basket",
]  # fmt: skip
WHEN = ["this morning.", "before dinner.", "near the river.", "after the storm."]


def sentences(count: int, seed: int = 41) -> list[str]:
    """`count` short sentences, all different while `count` ≤ 40,000 (then repeated), shuffled."""
    total = len(SUBJECTS) * len(VERBS) * len(OBJECTS) * len(WHEN)
    picks = random.Random(seed).sample(range(total), min(count, total))
    picks = [picks[i % len(picks)] for i in range(count)]
    made = []
    for pick in picks:
        pick, when = divmod(pick, len(WHEN))
        pick, obj = divmod(pick, len(OBJECTS))
        subject, verb = divmod(pick, len(VERBS))
        made.append(f"{SUBJECTS[subject]} {VERBS[verb]} {OBJECTS[obj]} {WHEN[when]}")
    return made


def body_of(sentence: str) -> dict[str, str]:
    return {"model": MODEL, "input": sentence}


SEQUENTIAL = [body_of(s) for s in sentences(1000, seed=44)]  # the sequential client's, in turn


# ---------------------------------------------------------------- the interactive client


@dataclass
class Driven:
    """What a client measured: `requests` answered in `wall` seconds, each one's latency."""

    requests: int
    wall: float
    latencies_ms: list[float]
    errors: int  # answers other than 200
    client_cores: float  # this process's CPU seconds / wall seconds

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.wall

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)] if ordered else math.nan

    @property
    def p50_ms(self) -> float:
        return self.percentile(0.5)

    @property
    def p99_ms(self) -> float:
        return self.percentile(0.99)

    @staticmethod
    def pooled(runs: list[Driven]) -> Driven:
        """Several runs as one: their requests, seconds and latencies together."""
        wall = sum(r.wall for r in runs)
        return Driven(
            sum(r.requests for r in runs),
            wall,
            [ms for r in runs for ms in r.latencies_ms],
            sum(r.errors for r in runs),
            sum(r.client_cores * r.wall for r in runs) / wall,
        )


def drive(url: str, key: str, bodies: list[dict[str, str]], connections: int) -> Driven:
    """POST each body once to ENDPOINT, `connections` at a time, each connection sending the next body
    left as soon as its last is answered."""
    requests = _encoded(url, key, bodies)
    pending = iter(requests)  # shared: each connection takes the next request left
    return _clients(url, [pending] * min(connections, len(requests)), None)


def sequential(url: str, key: str, bodies: list[dict[str, str]], seconds: float) -> Driven:
    """One connection POSTing the bodies in turn to ENDPOINT, one at a time, for `seconds`: unlike wrk,
    no request is dropped for being slow (wrk leaves out of its latencies those over its 2 s timeout)."""
    return _clients(url, [itertools.cycle(_encoded(url, key, bodies))], seconds)


def _encoded(url: str, key: str, bodies: list[dict[str, str]]) -> list[bytes]:
    """Each body as a whole HTTP/1.1 request, encoded before any clock starts."""
    parts = urlsplit(url)
    requests = []
    for body in bodies:
        payload = json.dumps(body).encode()
        head = (
            f"POST {ENDPOINT} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        requests.append(head.encode() + payload)
    return requests


def _clients(url: str, connections: list[Iterator[bytes]], seconds: float | None) -> Driven:
    """One keep-alive connection per iterator, each sending its requests one after another (until the
    iterator ends, or `seconds` have passed); asyncio over raw sockets, the answers' bodies read but not
    parsed: a client that costs the machine little."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    latencies: list[float] = []
    errors = 0

    async def connection(pending: Iterator[bytes], deadline: float) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for request in pending:
                sent = time.perf_counter()
                if sent >= deadline:
                    break
                writer.write(request)
                status = await _answer(reader)
                latencies.append((time.perf_counter() - sent) * 1000)
                errors += status != 200
        finally:
            writer.close()

    async def run() -> None:
        deadline = time.perf_counter() + seconds if seconds is not None else math.inf
        await asyncio.gather(*(connection(pending, deadline) for pending in connections))

    cpu, started = time.process_time(), time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - started
    return Driven(len(latencies), wall, latencies, errors, (time.process_time() - cpu) / wall)


async def _answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 answer off a keep-alive connection; its status (the body is skipped)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in lines[1:])
    }
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                break
    return status


# ---------------------------------------------------------------- what the server spent


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment: the CPU of its process tree, and its model calls."""

    cpu: ServerCpu
    calls: float  # model calls of the replicas so far (`modelhost_batch_size_count`)
    items: float  # requests and lines in them (`modelhost_batch_size_sum`)
    at: float  # time.monotonic()

    @staticmethod
    def of(served: Served) -> Reading:
        calls = items = 0.0
        for line in httpx.get(f"{served.url}/metrics", timeout=30).text.splitlines():
            if line.startswith("modelhost_batch_size_count"):
                calls += float(line.rsplit(" ", 1)[1])
            elif line.startswith("modelhost_batch_size_sum"):
                items += float(line.rsplit(" ", 1)[1])
        return Reading(served.cpu(), calls, items, time.monotonic())


@dataclass
class Cost:
    """What the server spent over one row: CPU (cores: CPU seconds / wall second) by role, and its model
    calls, for `count` requests or lines served."""

    used: ServerCpu
    wall: float
    count: float
    calls: float
    items: float

    @staticmethod
    def between(before: Reading, after: Reading, count: float) -> Cost:
        return Cost(
            after.cpu - before.cpu, after.at - before.at, count, after.calls - before.calls,
            after.items - before.items,
        )  # fmt: skip

    @property
    def gateway_cores(self) -> float:
        return self.used.gateway / self.wall

    @property
    def replica_cores(self) -> float:
        return self.used.replicas / self.wall

    def gateway_ms(self) -> float:
        return self.used.ms_per(self.count).gateway

    def replica_ms(self) -> float:
        return self.used.ms_per(self.count).replicas

    @property
    def model_batch(self) -> float:
        """The mean number of requests and lines in one model call of the replica."""
        return self.items / self.calls if self.calls else math.nan

    @staticmethod
    def pooled(costs: list[Cost]) -> Cost:
        used = ServerCpu(*(sum(seconds) for seconds in zip(*(c.used.astuple() for c in costs), strict=True)))
        return Cost(
            used, sum(c.wall for c in costs), sum(c.count for c in costs), sum(c.calls for c in costs),
            sum(c.items for c in costs),
        )  # fmt: skip


def costed(served: Served, work: Callable[[], T], count: Callable[[T], float]) -> tuple[T, Cost]:
    """`work()` with what the server spent over it; `count(result)` is what it served."""
    before = Reading.of(served)
    result = work()
    return result, Cost.between(before, Reading.of(served), count(result))


# ---------------------------------------------------------------- batches through the openai SDK


def sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=served.key, max_retries=0, timeout=600)


def upload(client: openai.OpenAI, bodies: list[dict[str, str]]) -> str:
    """The bodies as a batch's JSONL input file, uploaded: its ID."""
    data = b"".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": ENDPOINT, "body": body}).encode()
        + b"\n"
        for i, body in enumerate(bodies)
    )
    return client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch").id


def create(client: openai.OpenAI, file_id: str) -> Batch:
    return client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")


def wait(
    client: openai.OpenAI,
    batch_id: str,
    until: Callable[[Batch], bool],
    timeout: float = 1800,
    seen: dict[str, float] | None = None,
) -> Batch:
    """The batch, polled every POLL_SECONDS until `until(batch)`; a batch that failed or expired raises.
    `seen` gets the time (`time.monotonic`) each status was first seen at."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if seen is not None:
            seen.setdefault(batch.status, time.monotonic())
        if until(batch):
            return batch
        if batch.status in ("failed", "expired"):
            raise RuntimeError(f"batch {batch_id} {batch.status}: {batch.errors}")
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"batch {batch_id} not done within {timeout:g} s")


def finished(batch: Batch) -> bool:
    return batch.status in ("completed", "cancelled")


def answered(batch: Batch) -> int:
    """Lines the batch has answered so far (its output and error files' lines)."""
    counts = batch.request_counts
    return counts.completed + counts.failed if counts is not None else 0


@dataclass
class BatchRun:
    lines: int
    wall: float  # created → seen completed
    answering: float  # seen in_progress → seen finalizing (or completed): its lines answered
    failed: int  # lines in the error file, or not 200 in the output file
    client_cores: float  # this process (the polling SDK) while the batch ran

    @property
    def lines_per_second(self) -> float:
        return self.lines / self.wall

    @property
    def answering_lines_per_second(self) -> float:
        return self.lines / self.answering if self.answering > 0 else math.nan

    @staticmethod
    def pooled(runs: list[BatchRun]) -> BatchRun:
        wall = sum(r.wall for r in runs)
        client = sum(r.client_cores * r.wall for r in runs) / wall
        answering = sum(r.answering for r in runs)
        return BatchRun(sum(r.lines for r in runs), wall, answering, sum(r.failed for r in runs), client)


def run_batch(served: Served, client: openai.OpenAI, bodies: list[dict[str, str]]) -> tuple[BatchRun, Cost]:
    """The bodies as one batch: uploaded, created, polled until completed (timed, and the server's cost
    taken, from just before it is created to when it is seen completed); then its output downloaded and
    checked: one answer per line, each a 200."""
    file_id = upload(client, bodies)
    cpu, before = time.process_time(), Reading.of(served)
    seen = {"validating": time.monotonic()}
    batch = create(client, file_id)
    done = wait(client, batch.id, finished, seen=seen)
    after = Reading.of(served)
    assert done.status == "completed" and done.output_file_id is not None, done
    answering = seen.get("finalizing", seen["completed"]) - seen.get("in_progress", seen["validating"])
    wall = after.at - before.at
    client_cores = (time.process_time() - cpu) / wall
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    ids = {line["custom_id"] for line in output}
    assert len(ids) == len(output) and ids <= {f"line-{i}" for i in range(len(bodies))}, "odd answers"
    failed = len(bodies) - sum(line["response"]["status_code"] == 200 for line in output)
    run = BatchRun(len(bodies), wall, answering, failed, client_cores)
    return run, Cost.between(before, after, len(bodies))


# ---------------------------------------------------------------- the measurements


@dataclass
class Beside:
    """The sequential client beside a running batch."""

    run: Driven
    cost: Cost
    batch_lines: int  # the batch's size
    batch_answered: int  # lines the batch answered during the window
    outlasted: bool  # the batch was still running when the window closed


def beside_batch(served: Served, client: openai.OpenAI, lines: int, seconds: int) -> Beside:
    """The sequential client for `seconds` while a batch of `lines` lines runs (started and answering
    before the window opens); the batch is cancelled after it."""
    file_id = upload(client, [body_of(s) for s in sentences(lines, seed=42)])
    batch = create(client, file_id)
    wait(client, batch.id, lambda b: b.status == "in_progress" and answered(b) > 0)
    before, reading = answered(client.batches.retrieve(batch.id)), Reading.of(served)
    run = sequential(served.url, served.key, SEQUENTIAL, seconds)
    ended, after = Reading.of(served), client.batches.retrieve(batch.id)
    lines_done = answered(after) - before
    cost = Cost.between(reading, ended, run.requests + lines_done)
    outlasted = after.status == "in_progress"
    if outlasted:
        client.batches.cancel(batch.id)
    wait(client, batch.id, finished)
    return Beside(run, cost, lines, lines_done, outlasted)


@dataclass
class Measured:
    interactive: list[tuple[Driven, Cost]]  # per round
    batches: list[tuple[BatchRun, Cost]]  # per round
    alone: list[tuple[Driven, Cost]]  # before and after the batch beside it
    beside: Beside

    def pooled_interactive(self) -> tuple[Driven, Cost]:
        return Driven.pooled([d for d, _ in self.interactive]), Cost.pooled([c for _, c in self.interactive])

    def pooled_batches(self) -> tuple[BatchRun, Cost]:
        return BatchRun.pooled([b for b, _ in self.batches]), Cost.pooled([c for _, c in self.batches])

    def pooled_alone(self) -> tuple[Driven, Cost]:
        return Driven.pooled([d for d, _ in self.alone]), Cost.pooled([c for _, c in self.alone])


def measure(
    port: int, lines: int, seconds: int, connections: int, rounds: int, env: dict[str, str]
) -> Measured:
    """On one server: `rounds` rounds of the lines sent interactively and as a batch, in turn (I B, B I,
    I B, ...: a machine that slows down hits both alike); then the sequential client alone for half of
    `seconds`, beside a batch for `seconds`, alone again for the other half."""
    served = serve(port, **env)
    try:
        deploy_minilm(served)
        client = sdk(served)
        bodies = [body_of(s) for s in sentences(lines)]
        warm = [body_of(s) for s in sentences(WARMUP_LINES, seed=43)]
        drive(served.url, served.key, warm, connections)
        run_batch(served, client, warm)

        interactive: list[tuple[Driven, Cost]] = []
        batches: list[tuple[BatchRun, Cost]] = []
        alone: list[tuple[Driven, Cost]] = []

        def send_interactive() -> None:
            work = lambda: drive(served.url, served.key, bodies, connections)  # noqa: E731
            interactive.append(costed(served, work, lambda d: d.requests))

        def send_batch() -> None:
            batches.append(run_batch(served, client, bodies))

        def sequential_alone() -> None:
            work = lambda: sequential(served.url, served.key, SEQUENTIAL, seconds / 2)  # noqa: E731
            alone.append(costed(served, work, lambda d: d.requests))

        for round in range(rounds):
            for step in (send_interactive, send_batch) if round % 2 == 0 else (send_batch, send_interactive):
                step()
        sequential_alone()
        rate = BatchRun.pooled([b for b, _ in batches]).lines_per_second
        big = max(lines, math.ceil(rate * (seconds + START_SECONDS) * OUTLAST_MARGIN))
        beside = beside_batch(served, client, big, seconds)
        sequential_alone()
    finally:
        served.stop()
    return Measured(interactive, batches, alone, beside)


# ---------------------------------------------------------------- the report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=10_000, help="lines of the batch (and requests sent)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of interactive and batch, their order alternated"
    )
    parser.add_argument("--seconds", type=int, default=15, help="the sequential client's window, each")
    parser.add_argument("--connections", type=int, default=64, help="the interactive client's connections")
    parser.add_argument(
        "--lines-in-flight", type=int, help="the server's MODELHOST_BATCH_LINES_IN_FLIGHT (default: its own)"
    )
    parser.add_argument("--port", type=int, default=18880)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    if min(args.lines, args.rounds, args.seconds, args.connections) < 1:
        parser.error("--lines, --rounds, --seconds and --connections must be at least 1")
    env: dict[str, str] = {}
    if args.lines_in_flight is not None:
        env["MODELHOST_BATCH_LINES_IN_FLIGHT"] = str(args.lines_in_flight)
    m = measure(args.port, args.lines, args.seconds, args.connections, args.rounds, env)
    figures = Figures("batch")
    section = report(m, args, figures)
    print(section)
    write_section(args.out, "## Batch API:", section, figures)


def _cost_figures(figures: Figures, prefix: str, cost: Cost) -> None:
    figures.add(f"{prefix}.gateway_cores", cost.gateway_cores)
    figures.add(f"{prefix}.replica_cores", cost.replica_cores)
    figures.add(f"{prefix}.gateway_ms_per_request", cost.gateway_ms())
    figures.add(f"{prefix}.replica_ms_per_request", cost.replica_ms())
    figures.add(f"{prefix}.model_batch", cost.model_batch)


def _driven_figures(figures: Figures, prefix: str, run: Driven, cost: Cost) -> None:
    figures.add(f"{prefix}.requests_per_second", run.requests_per_second)
    figures.add(f"{prefix}.p50_ms", run.p50_ms)
    figures.add(f"{prefix}.p99_ms", run.p99_ms)
    figures.add(f"{prefix}.errors", run.errors)
    figures.add(f"{prefix}.client_cores", run.client_cores)
    _cost_figures(figures, prefix, cost)


def _cells(cost: Cost, client_cores: float, errors: int) -> list[str]:
    return [f"{cost.gateway_cores:.2f}", f"{cost.gateway_ms():.3f}", f"{cost.replica_cores:.2f}",
            f"{cost.replica_ms():.3f}", f"{cost.model_batch:.1f}", f"{client_cores:.2f}",
            str(errors)]  # fmt: skip


def report(m: Measured, args: argparse.Namespace, figures: Figures) -> str:
    """The section, with its figures and ratios in `figures`."""
    i, i_cost = m.pooled_interactive()
    b, b_cost = m.pooled_batches()
    alone, alone_cost = m.pooled_alone()
    beside = m.beside
    throughput = b.lines_per_second / i.requests_per_second
    latency = beside.run.p50_ms / alone.p50_ms
    beside_rate = beside.batch_answered / beside.cost.wall
    per_round = ", ".join(
        f"{batch.lines_per_second / run.requests_per_second:.2f}"
        for (run, _), (batch, _) in zip(m.interactive, m.batches, strict=True)
    )

    _driven_figures(figures, "interactive", i, i_cost)
    figures.add("batch.lines_per_second", b.lines_per_second)
    figures.add("batch.answering_lines_per_second", b.answering_lines_per_second)
    figures.add("batch.answering_seconds", b.answering / len(m.batches))
    figures.add("batch.seconds", b.wall / len(m.batches))
    figures.add("batch.failed", b.failed)
    figures.add("batch.client_cores", b.client_cores)
    _cost_figures(figures, "batch", b_cost)
    _driven_figures(figures, "alone", alone, alone_cost)
    _driven_figures(figures, "beside_batch", beside.run, beside.cost)
    figures.add("beside_batch.batch_lines_per_second", beside_rate)
    figures.add("beside_batch.batch_outlasted", beside.outlasted)
    figures.ratio("batch_over_interactive", throughput)
    figures.ratio("p50_beside_batch_over_alone", latency)

    header = ["what", "throughput", "p50 ms", "p99 ms", "gateway cores", "gateway ms CPU / request",
              "replica cores", "replica ms CPU / request", "model batch", "client cores",
              "errors"]  # fmt: skip
    rows = [
        [f"{args.lines:,} requests, {args.connections} connections, × {len(m.interactive)}",
         f"{i.requests_per_second:.0f} req/s", f"{i.p50_ms:.2f}", f"{i.p99_ms:.2f}",
         *_cells(i_cost, i.client_cores, i.errors)],
        [f"the same {args.lines:,} as one batch, × {len(m.batches)}", f"{b.lines_per_second:.0f} lines/s",
         "-", "-", *_cells(b_cost, b.client_cores, b.failed)],
        ["1 sequential connection, alone", f"{alone.requests_per_second:.0f} req/s", f"{alone.p50_ms:.2f}",
         f"{alone.p99_ms:.2f}", *_cells(alone_cost, alone.client_cores, alone.errors)],
        [f"1 sequential connection, beside a batch of {beside.batch_lines:,} lines",
         f"{beside.run.requests_per_second:.0f} req/s + {beside_rate:.0f} lines/s",
         f"{beside.run.p50_ms:.2f}", f"{beside.run.p99_ms:.2f}",
         *_cells(beside.cost, beside.run.client_cores, beside.run.errors)],
    ]  # fmt: skip
    outlasted = (
        "it was still running when the window closed (then cancelled)"
        if beside.outlasted
        else "**it ended before the window closed**: the ratio understates its effect"
    )
    in_flight = args.lines_in_flight or "the server's default, 64"
    argv = " ".join(_argv())
    return f"""## Batch API: all-MiniLM-L6-v2 embeddings as a batch and as interactive requests

Machine: {machine()}. One run of `python -m bench.batch{" " + argv if argv else ""}`:
one server (`modelhost serve`, defaults; batch lines in flight: {in_flight}), all-MiniLM-L6-v2 on
torch, one short sentence per request, {args.lines:,} different sentences, sent {len(m.interactive)}
time(s) as interactive requests and {len(m.batches)} time(s) as one batch, in turn (I B, B I, ...), the
rows pooling them. The interactive client is asyncio over raw HTTP/1.1 connections (requests encoded
beforehand, answers read but not parsed); the batch goes through the openai SDK (upload, create, poll
every {POLL_SECONDS:g} s, download; timed from its creation to its completion seen, its output then
checked line by line); the sequential client is the same asyncio client with 1 connection, one request
at a time (every latency counted), alone for {args.seconds / 2:g} s before and {args.seconds / 2:g} s
after {args.seconds} s beside a batch answering since before that window.

Cores are CPU seconds per wall second of the server's whole process tree (the batch runner is in the
gateway; for the batch, over the time it is timed) and of this client's process (the batch row's: the
polling SDK). The last row's CPU per request is per request or line answered in the window. Model
batch: the mean number of requests and lines in one model call of the replica (`modelhost_batch_size`).

{table(header, rows)}

- **Batch / interactive throughput: {throughput:.2f}** ({b.lines_per_second:.0f} lines/s vs
  {i.requests_per_second:.0f} req/s; per round: {per_round}; target ≥ 1.0). Of a batch's
  {b.wall / len(m.batches):.1f} s, {b.answering / len(m.batches):.1f} s went to answering its lines
  (seen `in_progress` → seen `finalizing`: {b.answering_lines_per_second:.0f} lines/s, /
  interactive {b.answering_lines_per_second / i.requests_per_second:.2f}), the rest to validating it
  and writing its files.
- **Sequential p50 beside a batch / alone: {latency:.2f}** ({beside.run.p50_ms:.2f} ms vs
  {alone.p50_ms:.2f} ms; target ≤ 1.5). The batch answered {beside.batch_answered:,} lines in the
  window; {outlasted}.
"""


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


if __name__ == "__main__":
    main()
