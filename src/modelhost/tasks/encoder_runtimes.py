"""Encoders on ONNX Runtime, chosen by measurement when a replica loads (docs/runtime.md, "Encoder
runtimes").

An encoder task's handler (feature extraction, text classification) loads its model in torch, then
offers it here as an `EncoderSlot`: the transformers model, the output its handler reads
(`last_hidden_state`, `logits`) and how to put another model in its place. With `engine: auto` the
first load of an artifact on a machine:

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

log = logging.getLogger("modelhost.tasks.encoder_runtimes")

TOLERANCE = 1e-4  # the largest absolute difference from torch's output a runtime may show
FULL_BATCH = 32  # the "full batch" of the timing (the replica batches up to MODELHOST_MAX_BATCH_SIZE)
TIMING_SECONDS = 0.25  # per candidate and case: enough repetitions to rank, little load time
CACHE_FORMAT = 1  # bump when the cached files change meaning
# Texts for the equality probe (mixed lengths: padding on all but the longest) and the timing.
PROBE_TEXTS = (
    "Hi.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A third sentence, of middling length, about runtimes.",
    "Short one",
)
SHORT_TEXT = "What is the capital of France?"
LONG_TEXT = " ".join(["Serving models well means measuring them on the machine they run on."] * 12)


@dataclass
class EncoderSlot:
    """What an encoder handler offers: its transformers model, the outputs it reads, its tokenizer, and
    how to put a runtime's model (called like the transformers model) in its place."""

    model: torch.nn.Module
    outputs: tuple[str, ...]  # a key of OUTPUT_TYPES: what the handler reads of the model's output
    tokenizer: Any
    replace: Callable[[torch.nn.Module], None]
    max_tokens: int = 512
    per_token: bool = False  # `logits` hold a row per token (fill-mask, token classification)


@dataclass(frozen=True)
class RuntimeChoice:
    engine: str  # `onnxruntime` or `transformers`
    reason: str


class RuntimeUnusable(Exception):
    """`engine: onnxruntime` was asked for and the model cannot run there; the message says why."""


# The transformers output type of each set of outputs a handler reads (handlers and pipelines read a
# field by name, whichever model's output type holds it)
OUTPUT_TYPES = {
    ("last_hidden_state",): "BaseModelOutput",
    ("logits",): "SequenceClassifierOutput",
    ("start_logits", "end_logits"): "QuestionAnsweringModelOutput",
}
PER_TOKEN = {"last_hidden_state", "start_logits", "end_logits"}  # outputs with a value per token


def pipeline_slot(pipe: Any, per_token: bool) -> EncoderSlot:
    """The model of a transformers pipeline whose postprocessing reads `logits` (fill-mask, token and
    zero-shot classification): a runtime's model takes `pipe.model`'s place, and the pipeline's
    tokenizing, batching and postprocessing stay the library's."""

    def replace(model: torch.nn.Module) -> None:
        pipe.model = model

    limit = max_tokens(pipe.tokenizer)
    return EncoderSlot(pipe.model, ("logits",), pipe.tokenizer, replace, limit, per_token)


def max_tokens(tokenizer: Any, ceiling: int = 512) -> int:
    """The longest sequence the tokenizer lets through (its `model_max_length`, often a huge number
    meaning "unset"), at most `ceiling`: the export's sequence axis bound."""
    length = getattr(tokenizer, "model_max_length", None)
    return min(int(length), ceiling) if isinstance(length, int) and length > 0 else ceiling


class OrtModel(torch.nn.Module):
    """An ONNX Runtime session called as the transformers model it replaces: keyword tensors in, the
    transformers `ModelOutput` with the outputs the handler reads out, the model's `config` kept
    (handlers and sentence-transformers read it). A module, so that it can take the place of a
    registered submodule."""

    def __init__(self, session: Any, config: Any, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.outputs = outputs
        self.input_names = [i.name for i in session.get_inputs()]

    def forward(self, **features: Any) -> Any:
        from transformers import modeling_outputs

        device = next((v.device for v in features.values() if isinstance(v, torch.Tensor)), None)
        feeds = {name: _numpy(features[name]) for name in self.input_names if name in features}
        if "token_type_ids" in self.input_names and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
        results = self.session.run(list(self.outputs), feeds)
        tensors = [
            torch.from_numpy(r).to(device) if device is not None else torch.from_numpy(r) for r in results
        ]
        output_type = getattr(modeling_outputs, OUTPUT_TYPES[self.outputs])
        return output_type(**dict(zip(self.outputs, tensors, strict=True)))


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def prepare(slot: EncoderSlot, model_dir: Path, asked: str, cache_root: Path) -> RuntimeChoice:
    """Choose the runtime for `slot` (`asked`: `auto` or `onnxruntime`) and put it in place; exports
    and decisions are kept under `cache_root` (the server's `<data>/encoder-runtimes`)."""
    import onnxruntime

    folder = cache_folder(cache_root, model_dir, slot.outputs)
    decision = _read_decision(folder)
    exported = folder / "model.onnx"
    if decision is not None and (decision["engine"] == "transformers" or exported.is_file()):
        log.info("encoder runtime for %s from the cache: %s", model_dir, decision["engine"])
        cached = f"{decision['reason']} (cached decision, {decision['at']})"
        choice = RuntimeChoice(decision["engine"], cached)
        if choice.engine == "transformers" and asked == "onnxruntime":
            raise RuntimeUnusable(decision["reason"])
    else:
        with tempfile.TemporaryDirectory(prefix="modelhost-onnx-") as scratch:
            path = Path(scratch) / "model.onnx"
            choice = _measure(slot, path, asked, onnxruntime.__version__)
            _write_decision(folder, choice, Path(scratch) if choice.engine == "onnxruntime" else None)
        if choice.engine == "transformers" and asked == "onnxruntime":
            raise RuntimeUnusable(choice.reason)
    if choice.engine == "onnxruntime":
        slot.replace(OrtModel(_session(exported), slot.model.config, slot.outputs))
    return choice


def cache_folder(cache_root: Path, model_dir: Path, outputs: tuple[str, ...]) -> Path:
    """Where one artifact's export and decision live on this machine: under the data folder (the
    artifact's own files stay untouched), keyed by its folder, the output read, the runtime's and
    torch's versions and the machine (the decision is a timing: another CPU may decide otherwise)."""
    import onnxruntime

    key = json.dumps(
        [
            CACHE_FORMAT,
            str(model_dir.resolve()),
            *outputs,
            onnxruntime.__version__,
            torch.__version__,
            _machine(),
        ]
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


def _read_decision(folder: Path) -> dict[str, Any] | None:
    try:
        decision = json.loads((folder / "decision.json").read_text())
    except (OSError, ValueError):
        return None
    return decision if isinstance(decision, dict) and decision.get("engine") else None


def _write_decision(folder: Path, choice: RuntimeChoice, exported: Path | None) -> None:
    """The decision, with the exported files (`model.onnx` and, as the exporter writes them, its
    weights beside it in `model.onnx.data`) from the folder `exported`. Atomically: the folder appears
    whole or not at all (two replicas loading at once both measure; the first to finish keeps its)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
    try:
        for file in exported.iterdir() if exported is not None else ():
            shutil.move(str(file), staging / file.name)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        (staging / "decision.json").write_text(
            json.dumps({"engine": choice.engine, "reason": choice.reason, "at": at})
        )
        with contextlib.suppress(OSError):  # already there: another replica's, equally good
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = max(1, torch.get_num_threads())  # the replica's --threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _measure(slot: EncoderSlot, path: Path, asked: str, version: str) -> RuntimeChoice:
    """Export to `path`, check, time: the choice."""
    started = time.perf_counter()
    try:
        _export(slot, path)
        session = _session(path)
    except Exception as exc:  # the exporter's and the runtime's many failure types
        failure = f"{type(exc).__name__}: {_first_line(exc)}"
        reason = f"ONNX Runtime {version}: the model did not export ({failure})"
        return RuntimeChoice("transformers", f"auto chose transformers: {reason}")
    exported = time.perf_counter() - started
    candidate = OrtModel(session, slot.model.config, slot.outputs)
    difference = _difference(slot, candidate)
    if not difference <= TOLERANCE:
        reason = f"ONNX Runtime {version}'s output differs from torch's by {difference:.2g} (> {TOLERANCE:g})"
        return RuntimeChoice("transformers", f"auto chose transformers: {reason}")
    if asked == "onnxruntime":
        return RuntimeChoice("onnxruntime", f"ONNX Runtime {version}, equal to torch within {difference:.1g}")
    ratios = _speedups(slot, candidate)
    overall = float(np.exp(np.mean(np.log(list(ratios.values())))))
    figures = ", ".join(f"{ratio:.2f} x at {case}" for case, ratio in ratios.items())
    summary = f"ONNX Runtime {version} ran {figures} (overall {overall:.2f} x, equal within {difference:.1g})"
    log.info(
        "encoder runtime measured in %.1f s (export %.1f s): %s",
        time.perf_counter() - started,
        exported,
        summary,
    )
    engine = "onnxruntime" if overall > 1.0 else "transformers"
    return RuntimeChoice(engine, f"auto chose {engine}: {summary}")


def _export(slot: EncoderSlot, path: Path) -> None:
    """The model exported with torch's dynamo-based exporter, batch and sequence axes dynamic."""
    names = _input_names(slot)
    encoded = slot.tokenizer(list(PROBE_TEXTS[:2]), padding=True, return_tensors="pt")
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=slot.max_tokens)

    class Exported(torch.nn.Module):
        """The transformers model with plain tensor arguments and the outputs the handler reads (the
        exporter's preferred shape of a model)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None = None,
            token_type_ids: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, ...]:
            given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
            features = {"input_ids": input_ids, **{k: v for k, v in given.items() if v is not None}}
            output = self.model(**features)
            return tuple(getattr(output, name) for name in slot.outputs)

    with _quiet_exporter(), torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            Exported(slot.model).eval(),
            (),
            str(path),
            kwargs={name: encoded[name] for name in names},
            input_names=names,
            output_names=list(slot.outputs),
            dynamic_shapes={name: {0: batch, 1: sequence} for name in names},
            dynamo=True,
            optimize=True,
            verbose=False,
        )


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's own notes (axis renames, deprecations, the torchvision operators it skips) are
    not the operator's business: its warnings and its log below ERROR are dropped while it runs."""
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        exporter_log.setLevel(level)


def _input_names(slot: EncoderSlot) -> list[str]:
    wanted = ("input_ids", "attention_mask", "token_type_ids")
    return [name for name in wanted if name in slot.tokenizer.model_input_names or name == "input_ids"]


def _features(slot: EncoderSlot, texts: Sequence[str]) -> dict[str, torch.Tensor]:
    encoded = slot.tokenizer(
        list(texts), padding=True, truncation=True, max_length=slot.max_tokens, return_tensors="pt"
    )
    return {name: encoded[name] for name in _input_names(slot)}


@torch.inference_mode()
def _difference(slot: EncoderSlot, candidate: OrtModel) -> float:
    """The largest absolute difference over the real tokens (or rows) of a padded mixed-length batch."""
    features = _features(slot, PROBE_TEXTS)
    expected, found = slot.model(**features), candidate(**features)
    mask = features["attention_mask"].numpy().astype(bool)
    largest = 0.0
    for name in slot.outputs:
        ours, theirs = getattr(expected, name).float().numpy(), getattr(found, name).float().numpy()
        if ours.shape != theirs.shape:
            return float("inf")
        if name in PER_TOKEN or slot.per_token:  # a value per token: the padding's positions mean nothing
            token_mask = mask.reshape(mask.shape + (1,) * (ours.ndim - 2))
            ours, theirs = np.where(token_mask, ours, 0.0), np.where(token_mask, theirs, 0.0)
        largest = max(largest, float(np.abs(ours - theirs).max()))
    return largest


@torch.inference_mode()
def _speedups(slot: EncoderSlot, candidate: OrtModel) -> dict[str, float]:
    """ONNX Runtime's calls per second over torch's, per case (short or long text, batch 1 or full)."""
    ratios = {}
    for text, kind in ((SHORT_TEXT, "short"), (LONG_TEXT, "long")):
        for size in (1, FULL_BATCH):
            features = _features(slot, [text] * size)
            rates = [_rate(functools.partial(model, **features)) for model in (slot.model, candidate)]
            ratios[f"{kind} batch {size}"] = rates[1] / rates[0]
    return ratios


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
