"""Models the benchmarks build themselves: random weights, tokenizers trained offline in seconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CORPUS = [
    "A quick brown fox jumps over the lazy dog.",
    "Serving models over HTTP is mostly about batching requests together.",
    "The gateway parses, authenticates and routes; the replica runs the model.",
    "Embeddings map sentences to vectors that can be compared by cosine similarity.",
]


def tiny_bert(folder: Path) -> Path:
    """A BERT encoder with 1 layer and hidden size 32, so small that serving it costs more than running
    it: what the gateway's own throughput is measured with."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(
        CORPUS * 10, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=128)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def same_shape(source: Path, folder: Path) -> Path:
    """A copy of a sentence-transformers BERT folder with random weights of the same shape: what a GPU
    machine without the real weights (too large to carry there) runs instead."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    BertModel(BertConfig.from_pretrained(source), add_pooling_layer=False).eval().save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- LoRA adapters (bench/adapters.py, tests)

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
    """A LoRA adapter of `base` made as customers make them (PEFT's `save_pretrained`: adapter_config.json,
    adapter_model.safetensors), alpha 2 x rank unless given. PEFT starts `lora_B` at zeros (an untrained
    adapter changes nothing); here it is drawn from a seeded normal distribution of deviation `scale`, so
    that each adapter changes the base's answers, differently per seed."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

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
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": base.name}))
    return out


def build_merged(base: Path, adapter: Path, out: Path) -> Path:
    """The adapter merged into the base's weights (`merge_and_unload`: W + alpha / r · B A), saved as a full
    model with the base's tokenizer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(out)
    for file in base.iterdir():  # the tokenizer, its template and the generation config
        if file.name.startswith(TOKENIZER_FILES):
            shutil.copy(file, out / file.name)
    return out
