"""Encoders on ONNX Runtime, chosen by measurement when a replica loads (docs/runtime.md, "Encoder
runtimes").

An encoder task's handler (feature extraction, text classification) loads its model in torch, then
offers it here as an `EncoderSlot` (an `engines.interface.EncoderHandler`): the transformers model, the
output its handler reads (`last_hidden_state`, `logits`) and how to put another model in its place. Each
runtime is an `engines.interface.Runner` (`OnnxRuntimeRunner`, `OpenVinoRunner`), called as the torch
model through `RuntimeModel`. With `engine: auto` the first load of an artifact on a machine:

1. exports the model once with torch's maintained exporter (`torch.onnx.export(..., dynamo=True)`,
   dynamic batch and sequence axes; the older TorchScript exporter was measured 0.05 off);
2. checks that ONNX Runtime's output equals torch's within `TOLERANCE` (max absolute, over the real
   tokens of a padded batch of mixed lengths);
3. times both on short and long inputs at batch 1 and a full batch, and keeps the faster overall.

The export and the decision are kept under the data folder, keyed by the artifact's folder, the
runtime's version and the machine, so that later loads and other replicas export nothing and measure
nothing. A model that fails to export or to match stays on torch, and the reason says why.
`engine: onnxruntime` skips the timing (and fails the load if the model cannot run there);
`engine: transformers` never comes here.

Why ONNX Runtime: on the 2-core test machine all-MiniLM-L6-v2 ran 2.67 x torch eager's sentences/s at
batch 1 and 1.37 x at 32, with vectors equal to 1.4e-7 (issue 30); TEI (on CPU), Infinity and
fastembed serve encoders on it. The pooling and normalization of a sentence-transformers model stay
in torch: they are cheap, and stay the model's own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelhost.engine_table import FALLBACK
from modelhost.engines.interface import Runner

log = logging.getLogger("modelhost.tasks.encoder_runtimes")

TOLERANCE = 1e-4  # the largest absolute difference from torch's output a runtime may show
FULL_BATCH = 32  # the "full batch" of the timing (the replica batches up to MODELHOST_MAX_BATCH_SIZE)
TIMING_SECONDS = 0.25  # per candidate and case: enough repetitions to rank, little load time
CACHE_FORMAT = (
    3  # bump when the cached files change meaning (2: `torch_above`; 3: OpenVINO, a decision per engine)
)
# Texts for the equality probe (mixed lengths: padding on all but the longest) and the timing.
PROBE_TEXTS = (
    "Hi.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A third sentence, of middling length, about runtimes.",
    "Short one",
)
# The int8 quality probe: more inputs, of every length, so that one flipped label is under 2 %
QUALITY_TEXTS = (
    tuple(
        f"{subject} {verb} {tail}"
        for subject in ("The service", "A small model", "Our team", "This sentence")
        for verb in ("serves", "measures", "explains")
        for tail in ("requests.", "every answer it gives, quickly and well.", "the weather in Paris today")
    )
    + PROBE_TEXTS
)
COSINE_FLOOR = 0.99  # int8 embeddings: the lowest cosine to float32 accepted on any probe sentence
AGREEMENT_FLOOR = 0.98  # int8 classifiers: the least share of probe inputs with float32's top label
SHORT_TEXT = "What is the capital of France?"
LONG_TEXT = " ".join(["Serving models well means measuring them on the machine they run on."] * 12)


class TextInputs:
    """A text encoder's inputs, made by its tokenizer: padded batches of mixed lengths for the checks,
    short and long text for the timing, batch and sequence axes dynamic in the export."""

    noun = "sentences"
    unit = "tokens"

    def __init__(self, tokenizer: Any, max_tokens: int = 512) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        wanted = ("input_ids", "attention_mask", "token_type_ids")
        self.names = [n for n in wanted if n in tokenizer.model_input_names or n == "input_ids"]

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        )
        return {name: encoded[name] for name in self.names}

    def probe(self) -> dict[str, torch.Tensor]:
        return self.encode(PROBE_TEXTS)

    def quality_probe(self) -> dict[str, torch.Tensor]:
        return self.encode(QUALITY_TEXTS)

    def cases(self) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        for text, kind in ((SHORT_TEXT, "short"), (LONG_TEXT, "long")):
            for size in (1, FULL_BATCH):
                yield f"{kind} batch {size}", self.encode([text] * size)

    def mask(self, features: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return features["attention_mask"].bool() if "attention_mask" in features else None

    @staticmethod
    def size(features: dict[str, Any]) -> int:
        """A call's size, as the choice between runtimes counts it: its tokens, padding included."""
        return int(np.prod(features["input_ids"].shape))

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=self.max_tokens)
        return {name: {0: batch, 1: sequence} for name in self.names}

    def exportable(self, model: torch.nn.Module, outputs: tuple[str, ...]) -> torch.nn.Module:
        return _TextModel(model, outputs)


class ImageInputs:
    """An image encoder's inputs (ViT-style): pixel values from its image processor, over synthetic
    pictures of several sizes and contents (the processor resizes them all to the model's size);
    the batch axis dynamic in the export."""

    noun = "images"
    unit = "images"

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.names = ["pixel_values"]

    def encode(self, count: int, seed: int = 0) -> dict[str, torch.Tensor]:
        from PIL import Image

        generator = np.random.default_rng(seed)
        pictures = [
            Image.fromarray(generator.integers(0, 256, (24 + 8 * (i % 5), 32 + 4 * (i % 3), 3), np.uint8))
            for i in range(count)
        ]
        return {"pixel_values": self.processor(images=pictures, return_tensors="pt")["pixel_values"]}

    def probe(self) -> dict[str, torch.Tensor]:
        return self.encode(len(PROBE_TEXTS))

    def quality_probe(self) -> dict[str, torch.Tensor]:
        return self.encode(len(QUALITY_TEXTS), seed=1)

    def cases(self) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        for size in (1, FULL_BATCH):
            yield f"batch {size}", self.encode(size)

    def mask(self, features: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return None

    @staticmethod
    def size(features: dict[str, Any]) -> int:
        """A call's size, as the choice between runtimes counts it: its pictures."""
        return int(features["pixel_values"].shape[0])

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        return {"pixel_values": {0: torch.export.Dim("batch")}}

    def exportable(self, model: torch.nn.Module, outputs: tuple[str, ...]) -> torch.nn.Module:
        return _ImageModel(model, outputs)


@dataclass
class EncoderSlot:
    """What an encoder handler offers: its transformers model, the outputs it reads, how its inputs are
    made (text or images), and how to put a runtime's model (called like the transformers model) in
    its place."""

    model: torch.nn.Module
    outputs: tuple[str, ...]  # a key of OUTPUT_TYPES: what the handler reads of the model's output
    inputs: TextInputs | ImageInputs
    replace: Callable[[torch.nn.Module], None]
    per_token: bool = False  # `logits` hold a row per token (fill-mask, token classification)


@dataclass(frozen=True)
class RuntimeChoice:
    engine: str  # `onnxruntime` or `transformers`
    reason: str
    exported: bool = False  # the export ran on ONNX Runtime equal to torch (kept even when torch won)
    quality: str | None = None  # int8: its measured quality against float32
    torch_above: int | None = None  # calls larger than this (`inputs.size`) measured faster on torch


class RuntimeUnusable(Exception):
    """`engine: onnxruntime` was asked for and the model cannot run there; the message says why."""


class PrecisionRefused(RuntimeUnusable):
    """`precision: int8` was asked for and its quality probe failed (or it cannot run); the message
    gives the figures."""


# The transformers output type of each set of outputs a handler reads (handlers and pipelines read a
# field by name, whichever model's output type holds it)
OUTPUT_TYPES = {
    ("last_hidden_state",): "BaseModelOutput",
    ("logits",): "SequenceClassifierOutput",
    ("start_logits", "end_logits"): "QuestionAnsweringModelOutput",
    ("pooler_output",): "BaseModelOutputWithPooling",
}
PER_TOKEN = {"last_hidden_state", "start_logits", "end_logits"}  # outputs with a value per token


def pipeline_slot(pipe: Any, per_token: bool) -> EncoderSlot:
    """The model of a transformers pipeline whose postprocessing reads `logits` (fill-mask, token,
    zero-shot and image classification): a runtime's model takes `pipe.model`'s place, and the
    pipeline's tokenizing (or image processing), batching and postprocessing stay the library's."""

    def replace(model: torch.nn.Module) -> None:
        pipe.model = model

    if pipe.tokenizer is None:
        return EncoderSlot(pipe.model, ("logits",), ImageInputs(pipe.image_processor), replace)
    inputs = TextInputs(pipe.tokenizer, max_tokens(pipe.tokenizer, pipe.model.config))
    return EncoderSlot(pipe.model, ("logits",), inputs, replace, per_token)


def max_tokens(tokenizer: Any, config: Any, ceiling: int = 512) -> int:
    """The longest sequence both the tokenizer lets through (its `model_max_length`, often a huge number
    meaning "unset") and the model has positions for, at most `ceiling`: the export's sequence bound,
    and where the timing's long text is cut."""
    limits = [
        ceiling,
        getattr(tokenizer, "model_max_length", None),
        getattr(config, "max_position_embeddings", None),
    ]
    return min(int(n) for n in limits if isinstance(n, int) and n > 0)


class OnnxRuntimeRunner(Runner):
    """The export in an ONNX Runtime session (CPU provider, all graph optimizations, the replica's
    threads). Its threads do not spin waiting for the next call: a replica shares its cores with the
    gateway and, for calls over the torch bound, with torch, and spinning threads took their time (on
    the 2-core test machine, a short call on ONNX Runtime then a long one on torch ran 2.3 pairs/s
    spinning against 2.8 not; ONNX Runtime alone lost 4 to 8 % at batch 1)."""

    input_names: list[str]

    def __init__(self, path: Path) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = max(1, torch.get_num_threads())  # the replica's --threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        self.session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results: list[np.ndarray] = self.session.run(outputs, feeds)
        return results


class OpenVinoRunner(Runner):
    """The same export compiled by OpenVINO for the CPU, in float32 (on CPUs with bfloat16 units its
    default precision is bfloat16, which the equality check would refuse), with the replica's
    threads. A new infer request per call: a request is not to be shared between threads, and making
    one costs nothing measurable (MiniLM, batch 1: 156 calls/s either way). The inputs are shared, not
    copied into the request's tensors: the call is synchronous and the arrays are the call's own
    (`RuntimeModel.forward` makes them), and the copy was 8 % of a short sentence's call (MiniLM,
    batch 1: 2.03 → 1.87 ms)."""

    input_names: list[str]

    def __init__(self, path: Path) -> None:
        import openvino

        config = {
            "INFERENCE_NUM_THREADS": max(1, torch.get_num_threads()),
            "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY",
        }
        self.compiled = openvino.Core().compile_model(str(path), "CPU", config)
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.compiled.create_infer_request().infer(feeds, share_inputs=True)
        return [results[name] for name in outputs]


@dataclass(frozen=True)
class Runtime:
    """A runtime an export can run on: the `engine` name of the API, and its library's."""

    engine: str
    name: str
    module: str  # the library to import (its `__version__` keys the cache and names the decision)
    runner: Callable[[Path], Runner]

    def version(self) -> str | None:
        """The installed library's version; None where it is not installed (then not a candidate)."""
        try:
            return str(importlib.import_module(self.module).__version__)
        except ImportError:
            return None

    def label(self) -> str:
        """Its name and release, e.g. "OpenVINO 2026.4.1" (its full version adds the build)."""
        return f"{self.name} {(self.version() or '').split('-')[0]}"


RUNTIMES = {  # in the order `auto` prefers on a tie
    "onnxruntime": Runtime("onnxruntime", "ONNX Runtime", "onnxruntime", OnnxRuntimeRunner),
    "openvino": Runtime("openvino", "OpenVINO", "openvino", OpenVinoRunner),
}


class RuntimeModel(torch.nn.Module):
    """An exported model in a runtime, called as the transformers model it replaces: keyword tensors
    in, the transformers `ModelOutput` with the outputs the handler reads out, the model's `config`
    kept (handlers and sentence-transformers read it). A module, so that it can take the place of a
    registered submodule."""

    def __init__(
        self,
        runner: Runner,
        config: Any,
        outputs: tuple[str, ...],
        larger_on: tuple[torch.nn.Module, int, Callable[[dict[str, Any]], int]] | None = None,
    ) -> None:
        super().__init__()
        self.runner = runner
        self.config = config
        self.outputs = outputs
        self.input_names = runner.input_names
        # (torch's model, above, size of a call): calls larger than `above` run on torch, where the
        # load-time timing found torch faster (long texts in full batches, on some CPUs)
        self.larger_on = larger_on

    @property
    def dtype(self) -> torch.dtype:
        """What the export takes and gives: pipelines cast their inputs to their model's `dtype`."""
        return torch.float32

    def forward(self, **features: Any) -> Any:
        from transformers import modeling_outputs

        if self.larger_on is not None:
            model, above, size = self.larger_on
            if size(features) > above:
                return model(**features)
        device = next((v.device for v in features.values() if isinstance(v, torch.Tensor)), None)
        feeds = {name: _numpy(features[name]) for name in self.input_names if name in features}
        if "token_type_ids" in self.input_names and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
        results = self.runner.run(list(self.outputs), feeds)
        tensors = [
            torch.from_numpy(r).to(device) if device is not None else torch.from_numpy(r) for r in results
        ]
        output_type = getattr(modeling_outputs, OUTPUT_TYPES[self.outputs])
        return output_type(**dict(zip(self.outputs, tensors, strict=True)))


def runtime_model(slot: EncoderSlot, engine: str, path: Path, torch_above: int | None = None) -> RuntimeModel:
    """The exported (or quantized) model at `path` on `engine`'s runtime, called as `slot`'s
    transformers model is; calls larger than `torch_above` go to the transformers model itself."""
    larger_on = (slot.model, torch_above, slot.inputs.size) if torch_above is not None else None
    return RuntimeModel(RUNTIMES[engine].runner(path), slot.model.config, slot.outputs, larger_on)


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def prepare(
    slot: EncoderSlot, model_dir: Path, asked: str, cache_root: Path, precision: str = "float32"
) -> RuntimeChoice:
    """Choose the runtime for `slot` (`asked`: `auto`, or a runtime of `RUNTIMES`) and put it in place;
    the export and the decisions are kept under `cache_root` (the server's `<data>/encoder-runtimes`),
    one decision per engine asked for, one export for all. `precision` `int8` runs the export
    quantized on ONNX Runtime, when its quality probe holds (else `PrecisionRefused`)."""
    folder = cache_folder(cache_root, model_dir, slot.outputs)
    decision = _read_decision(folder, asked)
    exported = folder / "model.onnx"
    if decision is not None and (decision["engine"] == FALLBACK or exported.is_file()):
        log.info("encoder runtime for %s from the cache: %s", model_dir, decision["engine"])
        cached = f"{decision['reason']} (cached decision, {decision['at']})"
        above = decision.get("torch_above")
        choice = RuntimeChoice(decision["engine"], cached, exported.is_file(), torch_above=above)
        why = decision["reason"]
    elif exported.is_file():  # exported for another engine's decision: chosen without exporting again
        choice = _choose(slot, exported, asked)
        _write_decision(folder, asked, choice, None)
        why = choice.reason
    else:
        with tempfile.TemporaryDirectory(prefix="modelhost-onnx-") as scratch:
            choice = _measure(slot, Path(scratch) / "model.onnx", asked)
            _write_decision(folder, asked, choice, Path(scratch) if choice.exported else None)
        why = choice.reason
    if precision == "int8":
        return _int8(slot, folder, choice)
    if choice.engine == FALLBACK and asked in RUNTIMES:
        raise RuntimeUnusable(why)
    if choice.engine in RUNTIMES:
        slot.replace(runtime_model(slot, choice.engine, exported, choice.torch_above))
    return choice


def _int8(slot: EncoderSlot, folder: Path, choice: RuntimeChoice) -> RuntimeChoice:
    """The export quantized (ONNX Runtime's dynamic quantization: int8 weights, activations quantized
    as they come), kept only when its quality probe holds against torch's float32 outputs; quantized
    once per cache folder, with the verdict beside it."""
    if not choice.exported:
        raise PrecisionRefused(f"precision int8 runs on ONNX Runtime, and here {choice.reason}")
    quantized = folder / "model.int8.onnx"
    verdict_file = folder / "int8.json"
    verdict = _read_json(verdict_file)
    if verdict is None or (verdict["accepted"] and not quantized.is_file()):
        verdict = _quantize_and_probe(slot, folder / "model.onnx", quantized)
        verdict_file.write_text(json.dumps(verdict))
    if not verdict["accepted"]:
        raise PrecisionRefused(f"precision int8 refused: {verdict['quality']}")
    slot.replace(runtime_model(slot, "onnxruntime", quantized))
    label = RUNTIMES["onnxruntime"].label()
    reason = f"precision int8 on {label} (dynamic quantization): {verdict['quality']}"
    return RuntimeChoice("onnxruntime", reason, True, verdict["quality"])


def quantize(exported: Path, quantized: Path) -> None:
    """ONNX Runtime's dynamic quantization of the export: the matrix products only, per channel,
    unsigned weights. On the 2-core AVX2 test machine (no VNNI) these kept all-MiniLM-L6-v2 closest to
    float32 (lowest cosine 0.980 against 0.915 for the defaults, which also quantize the embeddings'
    lookups; docs/runtime.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_exporter(logging.getLogger()):  # its advice to preprocess goes to the root logger
        quantize_dynamic(
            exported,
            quantized,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QUInt8,
        )


def _quantize_and_probe(slot: EncoderSlot, exported: Path, quantized: Path) -> dict[str, Any]:
    staging = quantized.with_name(f".{quantized.name}.{os.getpid()}")
    quantize(exported, staging)
    candidate = runtime_model(slot, "onnxruntime", staging)
    accepted, quality = _quality(slot, candidate)
    if accepted:
        staging.replace(quantized)
    else:
        staging.unlink(missing_ok=True)
    log.info("int8 of %s: %s (%s)", exported.parent.name, "accepted" if accepted else "refused", quality)
    return {"accepted": accepted, "quality": quality}


@torch.inference_mode()
def _quality(slot: EncoderSlot, candidate: RuntimeModel) -> tuple[bool, str]:
    """Whether the quantized model keeps the answers (issue 30's bar): embeddings (`last_hidden_state`,
    pooled over the real tokens) at cosine >= `COSINE_FLOOR` to float32 on every probe sentence;
    classifiers the same top label (per text, per token, or answer start and end) on at least
    `AGREEMENT_FLOOR` of the probe inputs. The figures say how it went either way."""
    features = slot.inputs.quality_probe()
    expected, found = slot.model(**features), candidate(**features)
    mask = slot.inputs.mask(features)
    count = len(QUALITY_TEXTS)
    if slot.outputs in (("last_hidden_state",), ("pooler_output",)):
        ours, theirs = (_pooled(o, slot.outputs[0], mask) for o in (expected, found))
        cosine = float(torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min())
        noun = slot.inputs.noun
        figures = f"lowest cosine to float32 {cosine:.4f} over {count} probe {noun} (needs >= {COSINE_FLOOR})"
        return cosine >= COSINE_FLOOR, figures
    agree: list[torch.Tensor] = []
    for name in slot.outputs:
        ours, theirs = getattr(expected, name).float().argmax(-1), getattr(found, name).float().argmax(-1)
        same = ours == theirs
        agree.append(same[mask] if slot.per_token and mask is not None else same)
    matches = torch.stack(agree).all(0) if len(agree) > 1 else agree[0]
    share = float(matches.float().mean())
    what = "probe tokens" if slot.per_token else "probe inputs"
    figures = (
        f"the same top label as float32 on {share:.1%} of {matches.numel()} {what} "
        f"(needs >= {AGREEMENT_FLOOR:.0%})"
    )
    return share >= AGREEMENT_FLOOR, figures


def _pooled(output: Any, name: str, mask: torch.Tensor | None) -> torch.Tensor:
    """One vector per input: the pooled output as it is, or the hidden states' mean over real tokens."""
    values: torch.Tensor = getattr(output, name).float()
    if name == "pooler_output":
        return values
    weights = mask.unsqueeze(-1).float() if mask is not None else torch.ones_like(values[..., :1])
    pooled: torch.Tensor = (values * weights).sum(1) / weights.sum(1)
    return pooled


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def cache_folder(cache_root: Path, model_dir: Path, outputs: tuple[str, ...]) -> Path:
    """Where one artifact's export and decision live on this machine: under the data folder (the
    artifact's own files stay untouched), keyed by its folder, the output read, the runtimes' and
    torch's versions and the machine (the decision is a timing: another CPU may decide otherwise)."""
    versions = [runtime.version() for runtime in RUNTIMES.values()]
    key = json.dumps(
        [CACHE_FORMAT, str(model_dir.resolve()), *outputs, *versions, torch.__version__, _machine()]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_root / digest


def _machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()} {model} {os.cpu_count()} cores"


def _decision_file(asked: str) -> str:
    """`auto`'s measured decision, or the check behind an explicit runtime: one file each, so that
    asking for one runtime never reads another's choice."""
    return "decision.json" if asked == "auto" else f"decision-{asked}.json"


def _read_decision(folder: Path, asked: str) -> dict[str, Any] | None:
    decision = _read_json(folder / _decision_file(asked))
    return decision if decision is not None and decision.get("engine") else None


def _write_decision(folder: Path, asked: str, choice: RuntimeChoice, exported: Path | None) -> None:
    """The decision, with the exported files (`model.onnx` and, as the exporter writes them, its
    weights beside it in `model.onnx.data`) from the folder `exported`. Atomically: a new folder
    appears whole or not at all (two replicas loading at once both measure; the first to finish keeps
    its), and a decision added to an existing folder appears whole."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    decision = {"engine": choice.engine, "reason": choice.reason, "at": at, "torch_above": choice.torch_above}
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
    try:
        for file in exported.iterdir() if exported is not None else ():
            shutil.move(str(file), staging / file.name)
        (staging / _decision_file(asked)).write_text(json.dumps(decision))
        try:
            staging.rename(folder)
        except OSError:  # the folder is there (another engine's decision, or another replica's)
            if not (folder / _decision_file(asked)).exists():
                (staging / _decision_file(asked)).replace(folder / _decision_file(asked))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _measure(slot: EncoderSlot, path: Path, asked: str) -> RuntimeChoice:
    """Export to `path`, then choose (`_choose`); a model the exporter cannot take stays on torch."""
    started = time.perf_counter()
    try:
        _export(slot, path)
    except Exception as exc:  # the exporter's many failure types
        reason = f"the model did not export ({type(exc).__name__}: {_first_line(exc)})"
        return RuntimeChoice(FALLBACK, f"auto chose {FALLBACK}: {reason}")
    log.info("encoder exported in %.1f s", time.perf_counter() - started)
    return _choose(slot, path, asked)


def _choose(slot: EncoderSlot, path: Path, asked: str) -> RuntimeChoice:
    """Check each runtime asked for (all under `auto`) on the export at `path`: its output must equal
    torch's within `TOLERANCE`. An explicit runtime that passes is the choice; under `auto` those that
    pass are timed against torch and the fastest overall (geometric mean over the cases) is kept when
    it beats torch."""
    started = time.perf_counter()
    passed: dict[str, tuple[RuntimeModel, float]] = {}
    failures: list[str] = []
    for engine in [asked] if asked in RUNTIMES else list(RUNTIMES):
        runtime = RUNTIMES[engine]
        if runtime.version() is None:
            failures.append(f"{runtime.name} is not installed")
            continue
        try:
            candidate = runtime_model(slot, engine, path)
            difference = _difference(slot, candidate)
        except Exception as exc:  # the runtime's many failure types
            failures.append(
                f"{runtime.label()} cannot run the export ({type(exc).__name__}: {_first_line(exc)})"
            )
            continue
        if difference <= TOLERANCE:
            passed[engine] = (candidate, difference)
        else:
            failures.append(
                f"{runtime.label()}'s output differs from torch's by {difference:.2g} (> {TOLERANCE:g})"
            )
    if not passed:
        return RuntimeChoice(FALLBACK, f"auto chose {FALLBACK}: " + "; ".join(failures))
    if asked in RUNTIMES:
        return RuntimeChoice(
            asked, f"{RUNTIMES[asked].label()}, equal to torch within {passed[asked][1]:.1g}", True
        )
    timed = _speedups(slot, {engine: candidate for engine, (candidate, _) in passed.items()})
    overall = {
        engine: float(np.exp(np.mean(np.log([r for r, _ in cases.values()]))))
        for engine, cases in timed.items()
    }
    best = max(overall, key=lambda engine: overall[engine])  # the first of equals: `RUNTIMES`' order
    engine = best if overall[best] > 1.0 else FALLBACK
    above = _torch_above(list(timed[best].values())) if engine != FALLBACK else None
    summaries = []
    for name in sorted(timed, key=lambda name: name != best):  # the chosen (or best) runtime first
        figures = ", ".join(f"{ratio:.2f} x at {case}" for case, (ratio, _) in timed[name].items())
        within = f"equal within {passed[name][1]:.1g}"
        summary = f"{RUNTIMES[name].label()} ran {figures} (overall {overall[name]:.2f} x, {within})"
        if name == engine and above is not None:
            summary += f"; calls over {above} {slot.inputs.unit} run on torch, measured faster there"
        summaries.append(summary)
    reason = f"auto chose {engine}: " + "; ".join(summaries + failures)
    log.info("encoder runtime measured in %.1f s: %s", time.perf_counter() - started, reason)
    return RuntimeChoice(engine, reason, True, torch_above=above)


def _torch_above(timed: list[tuple[float, int]]) -> int | None:
    """Where ONNX Runtime won overall but lost on the largest calls (long texts in a full batch, on
    CPUs where torch's kernels catch up): the size between the largest case it won and the smallest
    it lost (their geometric mean), when every case above that size lost; None otherwise."""
    ordered = sorted(timed, key=lambda case: case[1])
    lost = [size for ratio, size in ordered if ratio < 1.0]
    won = [size for ratio, size in ordered if ratio >= 1.0]
    if not lost or not won or min(lost) <= max(won):
        return None
    return int((max(won) * min(lost)) ** 0.5)


def _export(slot: EncoderSlot, path: Path) -> None:
    """The model exported with torch's dynamo-based exporter, batch (and sequence) axes dynamic."""
    sample = slot.inputs.probe()
    sample = {name: value[:2] for name, value in sample.items()}
    with _quiet_exporter(), torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            slot.inputs.exportable(slot.model, slot.outputs).eval(),
            (),
            str(path),
            kwargs=sample,
            input_names=slot.inputs.names,
            output_names=list(slot.outputs),
            dynamic_shapes=slot.inputs.dynamic_shapes(),
            dynamo=True,
            optimize=True,
            verbose=False,
        )


class _TextModel(torch.nn.Module):
    """A text encoder with plain tensor arguments and the outputs its handler reads (the exporter's
    preferred shape of a model)."""

    def __init__(self, model: torch.nn.Module, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
        features = {"input_ids": input_ids, **{k: v for k, v in given.items() if v is not None}}
        output = self.model(**features)
        return tuple(getattr(output, name) for name in self.outputs)


class _ImageModel(torch.nn.Module):
    """An image encoder with its pixel values as the one argument, and the outputs its handler reads."""

    def __init__(self, model: torch.nn.Module, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output = self.model(pixel_values=pixel_values)
        return tuple(getattr(output, name) for name in self.outputs)


@contextlib.contextmanager
def _quiet_exporter(exporter_log: logging.Logger | None = None) -> Iterator[None]:
    """The exporter's own notes (axis renames, deprecations, the torchvision operators it skips) are
    not the operator's business: its warnings and its log (`exporter_log`, torch.onnx's unless named)
    below ERROR are dropped while it runs."""
    exporter_log = exporter_log or logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        exporter_log.setLevel(level)


@torch.inference_mode()
def _difference(slot: EncoderSlot, candidate: RuntimeModel) -> float:
    """The largest absolute difference over the real tokens (or rows) of a padded mixed-length batch."""
    features = slot.inputs.probe()
    expected, found = slot.model(**features), candidate(**features)
    given = slot.inputs.mask(features)
    mask = given.numpy() if given is not None else None
    largest = 0.0
    for name in slot.outputs:
        ours, theirs = getattr(expected, name).float().numpy(), getattr(found, name).float().numpy()
        if ours.shape != theirs.shape:
            return float("inf")
        if mask is not None and (name in PER_TOKEN or slot.per_token):  # padding's positions mean nothing
            token_mask = mask.reshape(mask.shape + (1,) * (ours.ndim - 2))
            ours, theirs = np.where(token_mask, ours, 0.0), np.where(token_mask, theirs, 0.0)
        largest = max(largest, float(np.abs(ours - theirs).max()))
    return largest


@torch.inference_mode()
def _speedups(
    slot: EncoderSlot, candidates: dict[str, RuntimeModel]
) -> dict[str, dict[str, tuple[float, int]]]:
    """Each candidate's calls per second over torch's, with the call's size, per case (short or long
    text, batch 1 or full): torch timed once per case, each candidate right after it."""
    timed: dict[str, dict[str, tuple[float, int]]] = {engine: {} for engine in candidates}
    for case, features in slot.inputs.cases():
        on_torch = _rate(functools.partial(slot.model, **features))
        for engine, candidate in candidates.items():
            ratio = _rate(functools.partial(candidate, **features)) / on_torch
            timed[engine][case] = (ratio, slot.inputs.size(features))
    return timed


def _rate(call: Callable[[], Any]) -> float:
    call()  # the first call sets up what later ones reuse
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < TIMING_SECONDS or count < 2:
        call()
        count += 1
    return count / elapsed


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
