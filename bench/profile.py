"""Where a served request's time goes: sampling profiles of the gateway and the replica under load.

    python -m bench.profile [--model tiny|minilm] [--connections 64] [--seconds 10] [--workers 1]
                            [--engine auto] [--out docs/profiles]

Serves the model (the gateway benchmark's 1-layer BERT, `tiny`, or all-MiniLM-L6-v2), drives
`POST /v1/embeddings` with wrk at the given connections and records every process of the server's
tree at once with py-spy (a sampling profiler: it reads the processes' stacks from outside, at 100 Hz,
without slowing them down): one flame graph per process (`<model>-<connections>-<role>.svg`: gateway
processes and replica workers), and a text summary of each process's hottest functions, their own and
inclusive share of samples (`<model>-<connections>.txt`). The summaries are what docs/benchmarks.md quotes.
Under uvloop an awaited coroutine's stack starts where the event loop (C) resumed it, so inclusive
shares above the request's own coroutines are partial; own shares are exact.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.common import SENTENCE, Served, deploy, minilm_dir, process_table, serve, subtree, wrk
from bench.models import tiny_bert

# A model this small gains nothing from more torch threads or from waiting for fuller batches.
TINY_SETTINGS = {"MODELHOST_WORKER_THREADS": "1", "MODELHOST_MAX_BATCH_WAIT_MS": "0"}


def roles(served: Served) -> dict[int, str]:
    """The server's processes by role: `gateway-0` (the supervisor), `gateway-N`, `replica-N`."""
    processes = process_table()
    found: dict[int, str] = {}
    gateways = replicas = 0
    for pid in subtree(processes, served.process.pid):
        command = processes[pid].command
        if b"modelhost.runtime.worker.sync_worker" in command:
            found[pid] = f"replica-{replicas}"
            replicas += 1
        elif pid == served.process.pid or b"modelhost.server.gateway" in command:
            found[pid] = f"gateway-{gateways}"
            gateways += 1
    return found


def record(pid: int, seconds: int, stacks: Path, pictures: Path, name: str) -> None:
    """py-spy's samples of `pid`: `seconds` of collapsed stacks (`stacks/<name>.collapsed`, for the
    summary), then `seconds` more drawn as a flame graph (`pictures/<name>.svg`); the load is steady,
    so both see the same."""
    spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate", "100"]
    spy += ["--duration", str(seconds), "--nonblocking"]
    for form, output in (("raw", stacks / f"{name}.collapsed"), ("flamegraph", pictures / f"{name}.svg")):
        subprocess.run([*spy, "--format", form, "--output", str(output)], check=True, capture_output=True)


def summary(collapsed: Path, top: int = 18) -> str:
    """The functions with the most samples: their own share, and their share with what they called."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += count
    if not total:
        return "no samples\n"
    lines = [f"{total} samples", f"{'own':>6} {'incl.':>6}  function"]
    for frame, count in own.most_common(top):
        lines.append(f"{count / total:6.1%} {inclusive[frame] / total:6.1%}  {frame}")
    lines.append("inclusive, the widest:")
    for frame, count in inclusive.most_common(top):
        lines.append(f"{count / total:6.1%}  {frame}")
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    """`function (path/to/module.py:123)` → `function (module.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').split(':')[0]).name})" if where else name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--port", type=int, default=18890)
    parser.add_argument("--out", type=Path, default=Path("docs/profiles"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"MODELHOST_WORKERS": str(args.workers), **(TINY_SETTINGS if args.model == "tiny" else {})}
    served = serve(args.port, **env)
    try:
        folder = (
            tiny_bert(Path(tempfile.mkdtemp(prefix="mh-tiny-")) / "model") if args.model == "tiny" else None
        )
        deploy(served, folder or minilm_dir(), "feature-extraction", args.model, engine=args.engine)
        body = {"model": args.model, "input": SENTENCE}
        wrk(served.url, "/v1/embeddings", body, served.key, 8, 3)  # warm-up
        name = f"{args.model}-{args.connections}"
        load = threading.Thread(
            target=wrk,
            args=(served.url, "/v1/embeddings", body, served.key, args.connections, 2 * args.seconds + 6),
        )
        load.start()
        threading.Event().wait(2)  # wrk is at full speed
        processes = roles(served)
        stacks = Path(tempfile.mkdtemp(prefix="mh-profile-"))
        recorders = [
            threading.Thread(target=record, args=(pid, args.seconds, stacks, args.out, f"{name}-{role}"))
            for pid, role in processes.items()
        ]
        for recorder in recorders:
            recorder.start()
        for recorder in recorders:
            recorder.join()
        load.join()
        text = [f"# {name}: {args.connections} connections, {args.seconds} s, --workers {args.workers}\n"]
        for role in sorted(processes.values()):
            text.append(f"\n## {role}\n{summary(stacks / f'{name}-{role}.collapsed')}")
        (args.out / f"{name}.txt").write_text("".join(text))
        print("".join(text))
    finally:
        served.stop()


if __name__ == "__main__":
    main()
