"""What a supervisor that serves no HTTP costs: memory, and requests/s at 1 and 64 connections.

    python -m bench.supervisor [--baseline SRC | --baseline-ref REF] [--rounds 5] [--seconds 5] [--out FILE]

`modelhost serve --workers 1` used to be one process that served HTTP and supervised; it is now a
supervisor and one gateway process (docs/operations.md, "Gateway processes"). This runs both at once,
the one before from another checkout's `src` (`--baseline`; by default a `git worktree` of
`--baseline-ref`, the last commit before the change, made and removed here), on the gateway benchmark's
tiny model (a 1-layer BERT, so small that serving it costs more
than running it), and alternates wrk between them for `--rounds` rounds at 1 connection and at 64: the
table gives medians and the ratios now / before of one run. Memory is the PSS of the server's own
processes (the supervisor and its gateways: not the worker template nor the replica, which are the same
either way), read after the rounds. Last, the gateway is killed with SIGSEGV and the time until a new one
serves is measured (the supervisor starts it again).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    SENTENCE,
    Figures,
    Served,
    deploy,
    machine,
    process_table,
    serve,
    subtree,
    table,
    write_section,
    wrk,
)
from bench.models import tiny_bert

BEFORE = "a240a4c"  # the last commit whose `modelhost serve --workers 1` was one process
SETTINGS = {"MODELHOST_WORKER_THREADS": "1", "MODELHOST_MAX_BATCH_WAIT_MS": "0", "MODELHOST_WORKERS": "1"}
CONNECTIONS = (1, 64)
HEADER = [
    "server",
    "processes",
    "memory (PSS)",
    "req/s, 1 connection",
    "req/s, 64 connections",
    "p50 ms at 64",
]


@dataclass
class Server:
    label: str
    source: Path | None
    served: Served | None = None
    rates: dict[int, list[float]] = field(default_factory=lambda: {c: [] for c in CONNECTIONS})
    p50: list[float] = field(default_factory=list)
    memory_mb: float = 0.0
    processes: int = 0

    def rate(self, connections: int) -> float:
        return statistics.median(self.rates[connections])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, help="the checkout before the change: its src")
    parser.add_argument("--baseline-ref", default=BEFORE, help="else this commit, checked out for the run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="wrk time per round, server and connections")
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    folder = tiny_bert(Path(tempfile.mkdtemp(prefix="mh-tiny-")) / "model")
    with baseline_source(args.baseline, args.baseline_ref) as source:
        servers = [Server("before: one process serves and supervises", source), Server("now", None)]
        restart = measure(servers, folder, args)
    section = report(servers, restart, args)
    print(section)
    figures = Figures("supervisor")
    before, after = servers
    for connections in CONNECTIONS:
        figures.ratio(
            f"now_over_before.requests_per_second_{connections}",
            after.rate(connections) / before.rate(connections),
        )
    figures.ratio("now_over_before.memory", after.memory_mb / before.memory_mb)
    figures.add("now.memory_mb", after.memory_mb)
    figures.add("before.memory_mb", before.memory_mb)
    figures.add("gateway_restart_seconds", restart)
    write_section(args.out, "## Supervisor:", section, figures)


def measure(servers: list[Server], folder: Path, args: argparse.Namespace) -> float:
    """Serve both, alternate wrk between them, read their memory; the gateway's restart time."""
    body = {"model": "tiny", "input": SENTENCE}
    try:
        for index, server in enumerate(servers):
            server.served = serve(args.port + index, server.source, **SETTINGS)
            deploy(server.served, folder, "feature-extraction", "tiny")
            wrk(server.served.url, "/v1/embeddings", body, server.served.key, 8, 2)  # warm-up
        for _ in range(args.rounds):
            for connections in CONNECTIONS:
                for server in servers:
                    assert server.served is not None
                    url, key = server.served.url, server.served.key
                    run = wrk(url, "/v1/embeddings", body, key, connections, args.seconds)
                    server.rates[connections].append(run.requests_per_second)
                    if connections == CONNECTIONS[-1]:
                        server.p50.append(run.p50_ms)
        for server in servers:
            assert server.served is not None
            server.memory_mb, server.processes = own_memory_mb(server.served.process.pid)
        now = servers[-1].served
        assert now is not None
        return gateway_restart_seconds(now)
    finally:
        for server in servers:
            if server.served is not None:
                server.served.stop()


@contextlib.contextmanager
def baseline_source(given: Path | None, ref: str) -> Iterator[Path]:
    """`given`, else the `src` of a worktree of `ref` made for the run (removed after it)."""
    if given is not None:
        yield given.resolve()
        return
    root = Path(__file__).resolve().parent.parent
    folder = Path(tempfile.mkdtemp(prefix="mh-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=root, check=True)
    try:
        yield folder / "src"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=root, check=False)


def own_memory_mb(root: int) -> tuple[float, int]:
    """PSS (MB) and count of the server's own processes: the supervisor and its gateways, not the worker
    template nor the replicas it forks (the same in both servers)."""
    processes = process_table()
    total, count = 0.0, 0
    for pid in subtree(processes, root):
        command = processes[pid].command
        if pid != root and b"modelhost.server.gateway" not in command:
            continue
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) / 1024
        count += 1
    return total, count


def gateway_restart_seconds(served: Served) -> float:
    """SIGSEGV to the gateway process; seconds until its replacement answers `/health`."""
    processes = process_table()
    [gateway] = [
        p
        for p in subtree(processes, served.process.pid)
        if b"modelhost.server.gateway" in processes[p].command
    ]
    os.kill(gateway, signal.SIGSEGV)
    killed = time.monotonic()
    port = int(served.url.rsplit(":", 1)[1])
    while time.monotonic() - killed < 60:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return time.monotonic() - killed
        except OSError:
            pass
        time.sleep(0.02)
    return float("nan")


def report(servers: list[Server], restart: float, args: argparse.Namespace) -> str:
    before, now = servers
    rows = [
        [
            s.label,
            str(s.processes),
            f"{s.memory_mb:.0f} MB",
            f"{s.rate(1):.0f}",
            f"{s.rate(64):.0f}",
            f"{statistics.median(s.p50):.2f}",
        ]
        for s in servers
    ]
    ratios = ", ".join(
        f"{now.rate(c) / before.rate(c):.2f}× at {c} connection{'s' if c > 1 else ''}" for c in CONNECTIONS
    )
    return f"""## Supervisor: what a supervisor that serves no HTTP costs (`--workers 1`)

Machine: {machine()}. One run of `python -m bench.supervisor --rounds {args.rounds} --seconds {args.seconds}`:
both servers up at once, wrk alternating between them, medians of {args.rounds} rounds; the 1-layer BERT of
the gateway benchmark. Memory: PSS of the supervisor and its gateway processes (the worker template and
the replica, the same in both, left out).

{table(HEADER, rows)}

- **Requests/s now / before: {ratios}.**
- **Memory now / before: {now.memory_mb / before.memory_mb:.2f}×** ({now.memory_mb - before.memory_mb:+.0f} MB
  for the second process).
- A gateway killed with SIGSEGV served again {restart:.1f} s later (the supervisor starts a new one).
"""


if __name__ == "__main__":
    main()
