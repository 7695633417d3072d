"""LoRA adapters made the way customers make them: PEFT on a base's folder, `save_pretrained`, and the
same adapter merged into the base's weights (`merge_and_unload`: W + alpha / r · B A) and saved as a
full model, for the test that an adapter deployment answers exactly as its merged model does.

PEFT initialises `lora_B` to zeros (an untrained adapter changes nothing); these draw it from a seeded
normal distribution instead, so each adapter changes the base's greedy answers, differently per seed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj"]
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "generation_config")


def build_adapter(
    base: Path,
    out: Path,
    seed: int,
    rank: int = 8,
    targets: list[str] = TARGETS,
    alpha: float | None = None,
    scale: float = 0.5,
) -> Path:
    """A LoRA adapter of `base` (PEFT's folder: adapter_config.json, adapter_model.safetensors), alpha
    2 x rank unless given, `lora_B` drawn with standard deviation `scale` (bench/adapters.py's too)."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets, lora_dropout=0.0)
    adapted = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    adapted.save_pretrained(out)
    # PEFT records the path it loaded the base from; the base's name is what a customer's would say
    edit_config(out, out, base_model_name_or_path=base.name)
    return out


def build_merged(base: Path, adapter: Path, out: Path) -> Path:
    """The adapter merged into the base's weights, saved as a full model with the base's tokenizer."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(out)
    for file in base.iterdir():  # the tokenizer, its template and the generation config
        if file.name.startswith(TOKENIZER_FILES):
            shutil.copy(file, out / file.name)
    return out


def edit_config(adapter: Path, out: Path, **changes: Any) -> Path:
    """A copy of `adapter` (or itself, where `out` is it) whose adapter_config.json says otherwise (DoRA,
    a bias, another rank...)."""
    if out != adapter:
        shutil.copytree(adapter, out)
    path = out / "adapter_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **changes}))
    return out


def edit_tensors(
    adapter: Path,
    out: Path,
    rename: dict[str, str] | None = None,
    reshape: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A copy of `adapter` with tensors renamed, or replaced by zeros of another shape."""
    shutil.copytree(adapter, out)
    path = out / "adapter_model.safetensors"
    tensors = load_file(path)
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    for name, shape in (reshape or {}).items():
        tensors[name] = torch.zeros(shape)
    save_file(tensors, path)
    return out
