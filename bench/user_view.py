"""Embeddings as a new user measures them (issue 59): modelhost's default deployment of all-MiniLM-L6-v2
against the model a user runs in one process, one distinct sentence per request, one connection.

    python -m bench.user_view [--seconds 10] [--rounds 3] [--baseline SRC] [--out FILE]

- **Raw, as a user builds it**: the model's transformer exported by torch's exporter (`dynamo=True`),
  run by ONNX Runtime with the machine's cores as threads and the library's defaults otherwise (its
  threads spin between calls), and each sentence through the tokenizer, the session, mean pooling and
  normalization in NumPy: sentences/s, one at a time.
- **Served, as a user deploys it**: `POST /v1/deployments` with nothing but the artifact (engine `auto`,
  the server's defaults), then wrk at 1 connection, every request its own sentence (`wrk(distinct=True)`).
- **The floor** (`bench.relay_floor`): the least a Python server of modelhost's shape spends between
  the client and another process (uvicorn, a Unix socket, a process that answers at once; no model, no
  platform), measured as the served: the best ratio to raw any such server reaches here is
  raw / (raw + floor).
- `--baseline SRC`: the same served measure on another checkout's `src` (a commit before a change),
  on its own server, in the same rounds.

They run in turn, `--rounds` times, the median kept: the machine's other load hits both alike.

Where the served request's time goes (the issue's question: "a batching wait, thread contention, the
tokenization?"), from the server's own accounting over the served run: the model call in the replica
(`modelhost_inference_seconds`: tokenization, the runtime, pooling), the rest of a request's time
(gateway, the replica protocol, the replica's loop, HTTP), and the CPU each process spent per request.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch

from bench.common import (
    COUNTER,
    Figures,
    Served,
    WrkResult,
    deploy,
    machine,
    minilm_dir,
    serve,
    table,
    write_section,
    wrk,
)
from bench.relay_floor import Floor

TEMPLATE = f"Sentence {COUNTER}: a quick brown fox jumps over the lazy dog."


def sentence(number: int) -> str:
    return TEMPLATE.replace(COUNTER, str(number))


class UserModel:
    """MiniLM exported and run as a user would, in this process."""

    def __init__(self, model_dir: Path, folder: Path) -> None:
        import onnxruntime
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cpu")
        self.tokenizer = st.tokenizer
        path = folder / "model.onnx"
        names = ["input_ids", "attention_mask", "token_type_ids"]
        pair = ["a first sentence", "and a second one"]
        sample = dict(self.tokenizer(pair, padding=True, return_tensors="pt"))
        batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence", max=512)
        with torch.no_grad():
            torch.onnx.export(
                _LastHidden(st[0].auto_model).eval(),
                (),
                str(path),
                kwargs={name: sample[name] for name in names},
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_shapes={name: {0: batch, 1: length} for name in names},
                dynamo=True,
                optimize=True,
                verbose=False,
            )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def embed(self, text: str) -> np.ndarray:
        encoded = self.tokenizer([text], return_tensors="np")
        names = ("input_ids", "attention_mask", "token_type_ids")
        feeds = {name: encoded[name].astype(np.int64) for name in names}
        hidden = self.session.run(["last_hidden_state"], feeds)[0]
        mask = encoded["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
        vector: np.ndarray = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return vector[0]

    def rate(self, seconds: float, first: int) -> float:
        """Sentences/s, one distinct sentence at a time, numbered from `first`."""
        for number in range(first, first + 20):
            self.embed(sentence(number))
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.embed(sentence(first + 20 + count))
            count += 1
        return count / (time.perf_counter() - started)


class _LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        hidden: torch.Tensor = output.last_hidden_state
        return hidden


@dataclass
class ServedRun:
    """One served round: wrk's figures and the server's own accounting of it."""

    wrk: WrkResult
    model_call_ms: float  # the replica's mean model call (tokenization, runtime, pooling)
    gateway_cpu_ms: float  # CPU of the gateway processes per request
    replica_cpu_ms: float  # CPU of the replica per request (the runtime's threads included)

    @property
    def mean_ms(self) -> float:
        """At one connection a request's mean time, as its client sees it."""
        return 1000 / self.wrk.requests_per_second


def model_calls(served: Served) -> tuple[float, float]:
    """(seconds, calls) of the replica's model calls so far, from /metrics."""
    text = httpx.get(f"{served.url}/metrics", timeout=30).text
    total = {"sum": 0.0, "count": 0.0}
    for kind in total:
        for match in re.finditer(rf"^modelhost_inference_seconds_{kind}{{[^}}]*}} ([\d.e+-]+)$", text, re.M):
            total[kind] += float(match.group(1))
    return total["sum"], total["count"]


def served_round(served: Served, body: dict[str, str], seconds: int) -> ServedRun:
    before_cpu, (before_time, before_calls) = served.cpu(), model_calls(served)
    run = wrk(served.url, "/v1/embeddings", body, served.key, 1, seconds, distinct=True)
    used, (after_time, after_calls) = served.cpu() - before_cpu, model_calls(served)
    calls = after_calls - before_calls
    requests = max(1.0, calls)
    return ServedRun(
        run,
        (after_time - before_time) / requests * 1000,
        used.gateway / requests * 1000,
        used.engine / requests * 1000,
    )


def start(port: int, source: Path | None) -> tuple[Served, dict[str, str], str]:
    """A server with MiniLM deployed as a user deploys it (no engine named), warmed up: the server, the
    request body, the engine it runs on with its reason."""
    served = serve(port, source)
    deploy(served, minilm_dir(), "feature-extraction", "minilm")
    body = {"model": "minilm", "input": TEMPLATE}
    wrk(served.url, "/v1/embeddings", body, served.key, 1, 2, distinct=True)
    headers = {"Authorization": f"Bearer {served.key}"}
    listed = httpx.get(f"{served.url}/v1/deployments", headers=headers, timeout=30).json()["data"][0]
    return served, body, f"{listed['engine_in_use']} ({listed['engine_reason'] or 'asked for'})"


def median_run(runs: list[ServedRun]) -> ServedRun:
    return sorted(runs, key=lambda r: r.wrk.requests_per_second)[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=18795)
    parser.add_argument("--baseline", type=Path, help="another checkout's src, served beside this one")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()

    user = UserModel(minilm_dir(), Path(tempfile.mkdtemp(prefix="mh-user-view-")))
    servers = {"this tree": start(args.port, None)}
    if args.baseline is not None:
        servers["baseline"] = start(args.port + 1, args.baseline)
    floor = Floor(args.port + 2)
    raw: list[float] = []
    floors: list[float] = []
    served: dict[str, list[ServedRun]] = {name: [] for name in servers}
    try:
        for round_number in range(args.rounds):
            raw.append(user.rate(args.seconds, round_number * 1_000_000))
            for name, (server, body, _) in servers.items():
                served[name].append(served_round(server, body, args.seconds))
            floors.append(floor.rate(1, args.seconds, body={"model": "minilm", "input": TEMPLATE}))
    finally:
        for server, _, _ in servers.values():
            server.stop()
        floor.stop()

    raw_rate = statistics.median(raw)
    raw_ms = 1000 / raw_rate
    figures = Figures("user_view")
    figures.add("raw_onnxruntime.sentences_per_second", raw_rate)
    floor_ms = 1000 / statistics.median(floors)
    best = raw_ms / (raw_ms + floor_ms)
    figures.add("floor_ms", floor_ms)
    figures.ratio("best_served_over_raw", best)
    rows = [["raw: torch's export on ONNX Runtime, in one process", f"{raw_rate:.0f} sentences/s",
             f"{raw_ms:.2f}", "-", "-", "-", "-", "-"],
            ["the floor: uvicorn → a Unix socket → a process that answers at once, no model",
             f"{1000 / floor_ms:.0f} req/s", f"{floor_ms:.2f}", "-", "-", f"{floor_ms:.2f}", "-",
             "-"]]  # fmt: skip
    notes = [
        f"- **The best served / raw any server of this shape reaches here: {best:.2f}** (raw {raw_ms:.2f} ms "
        f"+ the floor's {floor_ms:.2f} ms, with a model call as fast as raw's and nothing else on the path)."
    ]
    for name, runs in served.items():
        run = median_run(runs)
        key = name.replace(" ", "_")
        figures.ratio(f"{key}.served_over_raw", run.wrk.requests_per_second / raw_rate)
        figures.add(f"{key}.model_call_ms", run.model_call_ms)
        figures.add(f"{key}.gateway_cpu_ms", run.gateway_cpu_ms)
        rows.append(
            [f"modelhost ({name}), default deployment, 1 connection",
             f"{run.wrk.requests_per_second:.0f} req/s", f"{run.mean_ms:.2f}", f"{run.wrk.p50_ms:.2f}",
             f"{run.model_call_ms:.2f}", f"{run.mean_ms - run.model_call_ms:.2f}",
             f"{run.gateway_cpu_ms:.3f}", f"{run.replica_cpu_ms:.3f}"]
        )  # fmt: skip
        engine = servers[name][2]
        notes.append(
            f"- **modelhost ({name}) / raw: {run.wrk.requests_per_second / raw_rate:.2f}** (target ≥ 0.9). "
            f"Its requests ran on {engine}. Of a request's {run.mean_ms:.2f} ms, the model call took "
            f"{run.model_call_ms:.2f} ms ({raw_ms:.2f} ms raw) and the rest of the path "
            f"{run.mean_ms - run.model_call_ms:.2f} ms "
            f"({run.mean_ms - run.model_call_ms - floor_ms:.2f} ms above the floor)."
        )
    if "baseline" in served:
        now, before = median_run(served["this tree"]), median_run(served["baseline"])
        figures.ratio("this_tree_over_baseline", now.wrk.requests_per_second / before.wrk.requests_per_second)
        notes.append(
            f"- **this tree / baseline ({args.baseline}): "
            f"{now.wrk.requests_per_second / before.wrk.requests_per_second:.2f}** in req/s."
        )
    rounds = "; ".join(
        f"raw {r:.0f}, "
        + ", ".join(f"{name} {runs[i].wrk.requests_per_second:.0f}" for name, runs in served.items())
        + f", floor {floors[i]:.0f}"
        for i, r in enumerate(raw)
    )
    report = f"""## Embeddings as a new user measures them: MiniLM, one distinct sentence per request

Machine: {machine()}. One run of `python -m bench.user_view` ({args.rounds} rounds of {args.seconds} s, each
the raw model then the served; the median round kept). Sentences: "{TEMPLATE}" with a new number each
request. Mean ms at one connection is 1000 / req/s; the model call is the replica's mean
(`modelhost_inference_seconds`), the rest of the path the difference; CPU is per request.

{
        table(
            [
                "what",
                "throughput",
                "mean ms",
                "p50 ms",
                "model call ms",
                "rest of path ms",
                "gateway CPU ms",
                "replica CPU ms",
            ],
            rows,
        )
    }

{chr(10).join(notes)}
- Rounds (sentences/s or req/s): {rounds}.
"""
    write_section(args.out, "## Embeddings as a new user measures them", report, figures)
    print(report)


if __name__ == "__main__":
    main()
