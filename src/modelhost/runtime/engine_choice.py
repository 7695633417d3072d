"""Which engine runs a deployment's model inside its replicas (docs/generation.md, "Engines").

- `transformers`: modelhost's own engines on torch and transformers (the task handlers, and the
  continuous-batching generation engine): every task, and the fallback.
- `vllm`: vLLM's async engine, for text generation and chat with images, in its own Python
  environment (`.venv-vllm`, made by scripts/setup.sh: vLLM pins its own torch and transformers, so it
  cannot share ours). Its replica worker is `runtime.worker.vllm_worker`, started under that Python.
- `llamacpp`: llama.cpp's server (`xllamacpp`, in our environment), for text generation from a GGUF
  artifact and embeddings from an embedding GGUF, and the only engine that reads GGUF
  (docs/engines-llamacpp.md). Its replica worker is
  `runtime.worker.llamacpp_worker`.

A deployment asks for one (`engine`, default `auto`); the choice is made when the deployment is created
or its engine is changed, and stored with it (`engine_in_use`, and `engine_reason` where `auto` or a
fallback chose), so that every gateway process and every restart runs the same engine. `auto` takes vLLM
for a task vLLM serves when vLLM is installed, lists the artifact's architecture in its model registry
and can import its implementation there (`runtime.worker.vllm_registry`; vLLM can run other architectures
through its transformers fallback, more slowly: those stay on ours); anything else runs on
`transformers`. An artifact whose files are GGUF runs on `llamacpp`, whatever the task's other engines.

What each engine is (its worker, environment, tasks, formats, how `auto` ranks it) is its row in
`engine_table`: this module decides with those rows (`GGUF_ENGINE`, `REGISTRY_ENGINE`, `FALLBACK` are
read from them), and names no engine itself.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import modelhost
from modelhost.artifacts.gguf_check import InvalidGguf, gguf_set, read_gguf_set
from modelhost.artifacts.quantization import InvalidQuantization, Quantization, read_quantization, serving
from modelhost.config import Settings, get_settings
from modelhost.engine_table import AUTO, ENGINE_TABLE, FALLBACK, engines_where, reader_of, sole_reader, spec
from modelhost.errors import InvalidRequest
from modelhost.pipelines import BY_NAME
from modelhost.runtime.memory import gpu_totals

log = logging.getLogger("modelhost.runtime")

ENGINES = (AUTO, *ENGINE_TABLE)  # what a deployment may ask for (`engine`)
# Engines a replica chooses between when it loads, by measuring them (`engines.encoders`)
MEASURED_AT_LOAD = engines_where("measured_at_load")  # engines.encoders.RUNTIMES
GGUF_ENGINE = reader_of("gguf")  # the one engine that reads GGUF (llama.cpp)
# the engine `auto` takes where its own model registry lists the architecture, and for a quantized
# checkpoint where it has the kernels (vLLM)
REGISTRY_ENGINE = engines_where("lists_architectures")[0]
MARKER = ".modelhost-vllm"  # written by setup.sh once the environment imports vLLM
# what vLLM's environment can run (`runtime.worker.vllm_registry`), written beside it by setup.sh
ARCHITECTURES_FILE = ".modelhost-vllm-architectures.json"
CHECKOUT_ENVIRONMENT = Path(modelhost.__file__).resolve().parents[2] / ".venv-vllm"
# llama.cpp's server compiled for this CPU (scripts/build-llama-server.sh): the marker's second line names
# the program, written once it runs
LLAMA_SERVER_MARKER = CHECKOUT_ENVIRONMENT.parent / ".venv-llama-server" / ".modelhost-llama-server"


@dataclass(frozen=True, slots=True)
class EngineChoice:
    engine: str  # the engine that runs the deployment: `vllm`, `llamacpp`, `transformers`...
    reason: str | None = None  # why, where `auto` or a fallback chose


@dataclass(frozen=True, slots=True)
class VllmEnvironment:
    python: Path
    architectures: frozenset[str]  # those its registry lists and whose implementation imports there
    unavailable: Mapping[str, str] = field(default_factory=dict)  # listed, failing to import: why


class VllmUnavailable(Exception):
    """No usable vLLM environment; the message says why, for `engine_reason` and 400s."""


def choose(asked: str, pipeline: str, model_dir: Path | None) -> EngineChoice:
    """The engine for a deployment of `pipeline` whose artifact's files are in `model_dir`; InvalidRequest
    (400, param `engine`) when the engine asked for cannot serve it."""
    engines = BY_NAME[pipeline].engines
    if asked != AUTO and asked not in engines:
        raise InvalidRequest(
            f"The {asked} engine does not serve {pipeline}; engines for it: auto, {', '.join(engines)}.",
            param="engine",
            code="engine_not_supported",
        )
    gguf = _gguf_choice(asked, pipeline, model_dir)
    if gguf is not None:
        return gguf
    quantization = quantization_of(model_dir)
    if quantization is not None:
        return _choose_for_quantized(asked, pipeline, quantization, model_dir)
    if asked == FALLBACK or engines == (FALLBACK,):
        return EngineChoice(FALLBACK)
    if REGISTRY_ENGINE not in engines:
        return _choose_at_load(asked)
    try:
        architecture = _supported_architecture(model_dir)
    except VllmUnavailable as exc:
        if asked == REGISTRY_ENGINE:
            raise InvalidRequest(
                f"The {asked} engine cannot serve this artifact: {exc}",
                param="engine",
                code="engine_not_supported",
            ) from None
        return EngineChoice(FALLBACK, f"auto chose {FALLBACK}: {exc}")
    if asked == REGISTRY_ENGINE:
        return EngineChoice(asked)
    label = spec(REGISTRY_ENGINE).label
    return EngineChoice(
        REGISTRY_ENGINE, f"auto chose {label}: installed, and its registry has {architecture}"
    )


def reads_artifact(pipeline: str) -> bool:
    """Whether `choose` reads the artifact's files for a task: where an engine of it is chosen by the
    checkpoint (its registry's architectures, its quantized kernels: vLLM's tasks)."""
    return REGISTRY_ENGINE in BY_NAME[pipeline].engines


def _gguf_choice(asked: str, pipeline: str, model_dir: Path | None) -> EngineChoice | None:
    """llama.cpp for a GGUF artifact (the only engine that reads one), None for any other artifact;
    InvalidRequest where the engine asked for cannot serve the artifact's format, or llama.cpp the task
    (feature-extraction from a GGUF that is no embedding model)."""
    is_gguf = model_dir is not None and is_gguf_artifact(model_dir)
    if is_gguf and GGUF_ENGINE not in BY_NAME[pipeline].engines:
        tasks = " and ".join(spec(GGUF_ENGINE).tasks or ())
        raise InvalidRequest(
            f"This artifact's files are GGUF, which only the {GGUF_ENGINE} engine serves, and it does not "
            f"serve {pipeline} ({tasks} only).",
            param="engine",
            code="engine_not_supported",
        )
    if is_gguf and asked in (AUTO, GGUF_ENGINE):
        embeds = pipeline == "feature-extraction"
        assert model_dir is not None
        if embeds and not _embedding_gguf(model_dir):
            raise InvalidRequest(
                "llama.cpp serves feature-extraction from an embedding GGUF (an encoder, or a model whose "
                "header names its pooling), and this GGUF is none (a text-generation model, or a reranker).",
                param="engine",
                code="engine_not_supported",
            )
        what = "GGUF, an embedding model: llama.cpp's embedding mode" if embeds else "GGUF"
        label = spec(GGUF_ENGINE).label
        reason = f"auto chose {label}: the artifact's files are {what}" if asked == AUTO else None
        return EngineChoice(GGUF_ENGINE, reason)
    if is_gguf:
        why = (
            f"the artifact's files are GGUF, which only the {GGUF_ENGINE} engine serves "
            f"(ask for auto or {GGUF_ENGINE})"
        )
    elif asked == GGUF_ENGINE:
        why = f"the {GGUF_ENGINE} engine serves GGUF files, and this artifact has none"
    else:
        return None
    raise InvalidRequest(
        f"The {asked} engine cannot serve this artifact: {why}.", param="engine", code="engine_not_supported"
    )


def _embedding_gguf(model_dir: Path) -> bool:
    """Whether an artifact's GGUF is an embedding model (a bad set counts as one: its load says what is
    wrong)."""
    try:
        return read_gguf_set(model_dir)[1].embedding
    except InvalidGguf:
        return True


def is_gguf_artifact(model_dir: Path) -> bool:
    """Whether an artifact's model is a GGUF file (or a split set of them; a bad set is GGUF too, which
    only llama.cpp would read, and its load says what is wrong)."""
    try:
        return gguf_set(model_dir) is not None
    except InvalidGguf:
        return True


def falls_back(asked: str, in_use: str, model_dir: Path) -> bool:
    """Whether a deployment whose vLLM replica fails to load runs on transformers instead: where `auto`
    chose vLLM for a checkpoint transformers can run too, so not a quantized one (transformers has no
    kernels for it: the deployment fails with vLLM's reason instead)."""
    return asked == AUTO and spec(in_use).lists_architectures and quantization_of(model_dir) is None


def quantization_of(model_dir: Path | None) -> Quantization | None:
    """The quantization the artifact's config.json declares (None: none, or no folder to read); a
    malformed one is inspection's to refuse, and counts as none here."""
    if model_dir is None:
        return None
    try:
        return read_quantization(model_dir)
    except InvalidQuantization:
        return None


def _choose_for_quantized(
    asked: str, pipeline: str, quantization: Quantization, model_dir: Path | None
) -> EngineChoice:
    """A quantized checkpoint runs where its kernels are: on vLLM, where `serving` says vLLM has them on
    this server's device kind (for 4-bit on a CPU, AVX-512: the CPU's flags are read, never assumed), and
    never on transformers, which has no kernels for it, so neither asked nor as a fallback.
    InvalidRequest (400 `engine_not_supported`) with the reason otherwise."""
    device = device_kind()
    engine = REGISTRY_ENGINE if asked == AUTO else asked
    why = serving(quantization, engine, device)
    if why is None and engine not in BY_NAME[pipeline].engines:
        label = spec(engine).label
        why = f"{label} does not serve {pipeline}, and no other engine here serves quantized safetensors."
    if why is None:
        try:
            _supported_architecture(model_dir)
        except VllmUnavailable as exc:
            why = f"{exc}."
    if why is not None:
        raise InvalidRequest(
            f"The {engine} engine cannot serve this {describe(quantization)} checkpoint: {why}",
            param="engine",
            code="engine_not_supported",
        )
    if asked == engine:
        return EngineChoice(engine)
    label = spec(engine).label
    return EngineChoice(
        engine, f"auto chose {label}: a {describe(quantization)} checkpoint, which {label} serves on {device}"
    )


def describe(quantization: Quantization) -> str:
    """`4-bit GPTQ`, `4-bit compressed-tensors W4A16`: how reasons name a checkpoint's quantization."""
    method = {"gptq": "GPTQ", "awq": "AWQ", "fp8": "FP8"}.get(quantization.method, quantization.method)
    named = " ".join(part for part in (method, quantization.scheme) if part)
    return f"{quantization.bits}-bit {named}" if quantization.bits else named


def device_kind(settings: Settings | None = None) -> str:
    """`cuda` or `cpu`: the kind of device this server's replicas run on (MODELHOST_DEVICE; `auto` is CUDA
    where `nvidia-smi` lists a GPU), for what a quantized checkpoint's kernels need."""
    setting = (settings or get_settings()).device
    if setting == "auto":
        return "cuda" if gpu_totals() else "cpu"
    return "cuda" if setting.startswith("cuda") else "cpu"


def check_precision(precision: str, asked: str, pipeline: str) -> None:
    """InvalidRequest (400, param `precision`) where int8 cannot apply: it quantizes an encoder's ONNX
    Runtime export, so it needs a task ONNX Runtime serves, an engine that lets the replica use it
    (`auto`, `onnxruntime`), and ONNX Runtime on this server; never a GGUF (`asked` is then the engine
    chosen, `llamacpp`)."""
    if precision == "float32":
        return
    why = None
    at_precision = [name for name, row in ENGINE_TABLE.items() if precision in row.precisions]
    runs_it = [engine for engine in BY_NAME[pipeline].engines if engine in at_precision]
    if not runs_it:
        why = f"{pipeline} does not run on {' or '.join(spec(engine).label for engine in at_precision)}"
    elif asked == GGUF_ENGINE:
        label = spec(GGUF_ENGINE).label
        why = f"the artifact is a GGUF, which {label} runs at its own tensor types (quantize the GGUF)"
    elif asked not in (AUTO, *runs_it):
        why = f"the {asked} engine runs float32 only; ask for auto or {' or '.join(runs_it)}"
    else:
        why = _encoder_runtimes_off()
    if why is not None:
        raise InvalidRequest(
            f"precision {precision} is an encoder's ONNX Runtime export quantized, and here {why}.",
            param="precision",
            code="precision_not_supported",
        )


def _choose_at_load(asked: str) -> EngineChoice:
    """An encoder's runtime is chosen by its replica, which measures it on the machine it loads on: until
    then the deployment shows torch (`transformers`) with that reason."""
    off = _encoder_runtimes_off()
    if off is not None:
        if asked != AUTO:
            raise InvalidRequest(off.capitalize() + ".", param="engine", code="engine_not_supported")
        return EngineChoice(FALLBACK, f"auto chose {FALLBACK}: {off}")
    if asked == AUTO:
        measured = ", ".join(spec(engine).label for engine in MEASURED_AT_LOAD)
        reason = f"auto: {measured} and torch are measured when a replica first loads the model"
        return EngineChoice(FALLBACK, reason)
    return EngineChoice(asked)


def _encoder_runtimes_off() -> str | None:
    """Why no replica of this server may run an encoder on ONNX Runtime or OpenVINO, or None when it
    may."""
    settings = get_settings()
    if not settings.encoder_runtimes:
        return "ONNX Runtime and OpenVINO are turned off on this server (MODELHOST_ENCODER_RUNTIMES=false)"
    return None


def replica_engine(asked: str, in_use: str, pipeline: str) -> str:
    """The engine a replica is started with: the one in use, except where the replica itself chooses
    (an encoder's runtime under `auto`, `onnxruntime` or `openvino`: measured, or its decision read
    from the cache, at every load, so that each machine keeps its own; never for a GGUF's embeddings,
    which llama.cpp alone reads)."""
    if sole_reader(in_use):  # a GGUF: nothing else reads it
        return in_use
    chooses = spec(asked).measured_at_load and any(
        spec(engine).measured_at_load for engine in BY_NAME[pipeline].engines
    )
    return asked if chooses and _encoder_runtimes_off() is None else in_use


def _supported_architecture(model_dir: Path | None) -> str:
    environment = vllm_environment()
    architectures = _architectures_of(model_dir)
    for architecture in architectures:
        if architecture in environment.architectures:
            return architecture
    for architecture in architectures:
        if architecture in environment.unavailable:
            reason = environment.unavailable[architecture]
            raise VllmUnavailable(
                f"vLLM's environment cannot import its implementation of {architecture} ({reason})"
            )
    named = ", ".join(architectures) or "(config.json names none)"
    raise VllmUnavailable(f"vLLM does not support the architecture {named}")


def _architectures_of(model_dir: Path | None) -> list[str]:
    try:
        config = json.loads((model_dir / "config.json").read_text()) if model_dir else {}
    except (OSError, ValueError):
        config = {}
    found = config.get("architectures") if isinstance(config, dict) else None
    return [a for a in found if isinstance(a, str)] if isinstance(found, list) else []


def llama_server_program(settings: Settings | None = None) -> str | None:
    """The `llama-server` program llamacpp replicas run, or None for the `xllamacpp` wheel's server (also
    the replica's child: `engines.llamacpp_server`): MODELHOST_LLAMA_SERVER where set ("" keeps the
    wheel's), else the checkout's native build once scripts/build-llama-server.sh has finished it
    (docs/engines-llamacpp.md, "The build": 1.2 to 1.8 x the wheel's tokens/s here). Read at each
    replica start: a build that finishes while the server runs serves the replicas started after it."""
    configured = (settings or get_settings()).llama_server
    if configured is not None:
        return configured or None
    try:
        program = LLAMA_SERVER_MARKER.read_text().splitlines()[1]
    except (OSError, IndexError):
        return None
    return program if Path(program).is_file() else None


def vllm_environment() -> VllmEnvironment:
    """The vLLM environment replicas run under, or VllmUnavailable with the reason."""
    settings = get_settings()
    configured = settings.vllm_python
    if configured == "":
        raise VllmUnavailable("vLLM is turned off (MODELHOST_VLLM_PYTHON is empty)")
    if configured is None:
        root = CHECKOUT_ENVIRONMENT
        if not (root / MARKER).is_file() or not (root / "bin" / "python").exists():
            raise VllmUnavailable(
                "vLLM is not installed (scripts/setup.sh installs it in .venv-vllm; "
                "MODELHOST_VLLM_PYTHON names another environment)"
            )
        return _environment(str(root / "bin" / "python"))
    if not Path(configured).exists():
        raise VllmUnavailable(f"MODELHOST_VLLM_PYTHON={configured} does not exist")
    return _environment(configured)


@functools.cache
def _environment(python: str) -> VllmEnvironment:
    """Asked once per process and Python: the survey setup.sh wrote beside the environment, else the
    survey itself (`runtime.worker.vllm_registry` under that Python: an `import vllm` and every model module,
    about 20 s)."""
    listing = Path(python).parent.parent / ARCHITECTURES_FILE
    try:
        survey = json.loads(listing.read_text())
    except (OSError, ValueError):
        survey = _survey(python)
    if isinstance(survey, list):  # written by a setup.sh from before the survey: the registry alone
        survey = {"architectures": survey}
    return VllmEnvironment(
        Path(python), frozenset(survey.get("architectures", ())), dict(survey.get("unavailable", {}))
    )


def worker_source_path(scratch: Path) -> Path:
    """The one folder a vLLM worker gets on its `PYTHONPATH`: it must import our package and nothing else
    of our environment. From a checkout (`pip install -e`), our package's parent is `src`, which holds
    only modelhost. From an installed package it is our site-packages, whose transformers, torch and
    tokenizers would shadow the versions vLLM pins (vLLM imported our transformers 5.24 instead of its
    5.19): there the answer is a folder in `scratch` holding one link, `modelhost`, to our package."""
    package = Path(modelhost.__file__).resolve().parent
    if all(entry.name.startswith(("modelhost", "__pycache__")) for entry in package.parent.iterdir()):
        return package.parent
    folder = scratch / "worker-path"
    link = folder / "modelhost"
    if link.is_symlink() and link.resolve() == package:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f".modelhost-{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(package, target_is_directory=True)
    staged.replace(link)  # atomic: a worker starting now sees the old link or the new one
    return folder


def _survey(python: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="modelhost-survey-") as scratch:
        return _survey_with(python, str(worker_source_path(Path(scratch))))


def _survey_with(python: str, source: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [python, "-m", "modelhost.runtime.worker.vllm_registry"],
            capture_output=True,
            text=True,
            timeout=300,
            env={
                "VLLM_NO_USAGE_STATS": "1",
                "HF_HUB_OFFLINE": "1",
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": source,
            },
            check=True,
        )
        survey = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise VllmUnavailable(
            f"{python} could not list vLLM's architectures ({type(exc).__name__})"
        ) from None
    log.info("vLLM at %s can run %d architectures", python, len(survey.get("architectures", ())))
    return dict(survey)


def vllm_launch(data_dir: Path, cache_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The command that starts a vLLM replica worker (its row's `worker`), and what its environment adds
    to the server's: our package on its path and nothing else of our environment (it runs our worker
    module under vLLM's Python, whichever environment that is: `worker_source_path`), no usage reports
    (self-hosted, often offline), vLLM's cache in `cache_dir` (default: our data folder), and the
    die-with-parent switch that setup.sh's hook reads in every process vLLM starts."""
    environment = vllm_environment()
    env = {
        "PYTHONPATH": str(worker_source_path(data_dir)),
        "MODELHOST_REPLICA": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache_dir or data_dir / "vllm-cache"),
    }
    return [str(environment.python), "-m", str(spec(REGISTRY_ENGINE).worker)], env
