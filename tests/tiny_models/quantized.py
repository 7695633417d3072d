"""Tiny 4-bit checkpoints of a trained family model (`families`), packed by our own code following each
format's specification (`bench.quantizer`: GPTQ, AWQ and compressed-tensors W4A16, round-to-nearest,
symmetric, groups of 32, which divide the width 64 and the feed-forward 128 of `families.family_config`).

`build_quantized` writes the cached t26 folders: the checkpoints, the full-precision model's
log-probabilities of a fixed text beside them (`full_precision_logprobs`), for the tests' distance bound,
and a LoRA adapter of the full-precision model, to serve on the 4-bit one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from bench.models import build_adapter
from bench.quantizer import quantize_folder

from tests.tiny_models.common import reseed

# (family model, formats): Qwen3, whose trained answers carry reasoning and tool calls
QUANTIZED = (("qwen3", ("gptq", "awq", "w4a16")),)
# `<family>-lora/`: a LoRA adapter made by PEFT on the full-precision model, served on the 4-bit one
ADAPTER_SEED = 1
# `<family>-reference.json` beside the checkpoints: a fixed text's log-probabilities at full precision
REFERENCE = "reference.json"


def build_quantized(folder: Path) -> None:
    """t26: `folder/<family>-<format>/`, one artifact folder each, from t24's trained models (built before
    this folder: `tests.recipes` builds in name order)."""
    families = folder.parent / "t24_families"
    outputs = json.loads((families / "outputs.json").read_text())
    for family, formats in QUANTIZED:
        for form in formats:
            quantize_folder(families / family, folder / f"{family}-{form}", form)
        reseed()  # PEFT draws `lora_A` from torch's global generator
        build_adapter(families / family, folder / f"{family}-lora", seed=ADAPTER_SEED)
        conversation = outputs[family]["conversations"]["weather"]
        reference = full_precision_logprobs(families / family, conversation["prompt"] + conversation["text"])
        (folder / f"{family}-{REFERENCE}").write_text(json.dumps(reference) + "\n")


def full_precision_logprobs(source: Path, text: str) -> dict[str, Any]:
    """`text`'s token IDs and each token's log-probability after those before it (the first has none), on
    the float32 model in `source` run by transformers: what a quantized deployment's are compared with."""
    import transformers

    ids = transformers.AutoTokenizer.from_pretrained(source)(text, add_special_tokens=False)["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    logprobs = logits.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return {"text": text, "ids": ids, "logprobs": logprobs.tolist()}
