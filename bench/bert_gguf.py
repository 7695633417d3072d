"""A sentence-transformers BERT folder (all-MiniLM-L6-v2) as a float32 GGUF of llama.cpp's `bert`
architecture, written by llama.cpp's own writer (`gguf.GGUFWriter`), as its `convert_hf_to_gguf.py` would.

Used by `bench.llamacpp` (llama-cpp-python's server beside ours, the conversion run in `.venv-llamacpp`)
and by the tests' model builder (`tests/tiny_models/gguf.py`: the embedding GGUF the `llamacpp` engine
serves as feature-extraction). Only the standard library is imported at the top: `.venv-llamacpp` has
numpy and `gguf`, nothing of modelhost's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ARCH = "bert"  # llama.cpp's architecture for BERT encoders (src/models/bert.cpp)

# Hugging Face BertModel's tensor names -> llama.cpp's (src/llama-arch.cpp's LLM_TENSOR names, as
# src/models/bert.cpp loads them). Per layer, the suffix after `encoder.layer.N.`.
EMBEDDING_TENSORS = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
LAYER_TENSORS = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
# Not used for embeddings: the position ids buffer and BERT's pooler (sentence-transformers pools itself)
SKIPPED_TENSORS = re.compile(r"^(embeddings\.position_ids|pooler\..*)$")
# gguf's TokenType and PoolingType values (gguf-py/gguf/constants.py)
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2}  # MEAN, CLS


def gguf_tensor_name(name: str) -> str | None:
    """llama.cpp's name for one of BertModel's tensors (`None`: not written); unknown names fail, so a
    model of another layout is refused rather than converted half."""
    name = name.removeprefix("bert.")
    if SKIPPED_TENSORS.match(name):
        return None
    stem, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        raise ValueError(f"unexpected tensor {name!r}")
    if stem in EMBEDDING_TENSORS:
        return f"{EMBEDDING_TENSORS[stem]}.{kind}"
    layer = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", stem)
    if layer and layer.group(2) in LAYER_TENSORS:
        return f"blk.{layer.group(1)}.{LAYER_TENSORS[layer.group(2)]}.{kind}"
    raise ValueError(f"unexpected tensor {name!r}")


def read_safetensors(path: Path) -> dict[str, Any]:
    """The tensors of a safetensors file as numpy arrays (the format: an 8-byte little-endian header
    length, a JSON header of dtype, shape and byte offsets, then the data), read directly so that the
    llama.cpp environment needs no safetensors or torch."""
    import numpy as np

    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header.pop("__metadata__", None)
    tensors: dict[str, Any] = {}
    for name, entry in header.items():
        dtype = dtypes.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{name}: dtype {entry['dtype']} is not read here")
        start, end = entry["data_offsets"]
        buffer = data[8 + size + start : 8 + size + end]
        tensors[name] = np.frombuffer(buffer, dtype=dtype).reshape(entry["shape"])
    return tensors


def pooling_type(model_dir: Path) -> int:
    """gguf's pooling type for the model's sentence-transformers Pooling module (mean for MiniLM), so
    that llama.cpp pools as sentence-transformers does; the server reads it from the GGUF."""
    modules = json.loads((model_dir / "modules.json").read_text())
    pooling = next(m for m in modules if m["type"].endswith("Pooling"))
    config = json.loads((model_dir / pooling["path"] / "config.json").read_text())
    chosen = [kind for key, kind in POOLING.items() if config.get(key)]
    if len(chosen) != 1:
        raise ValueError(f"pooling {config} is not one of mean or CLS")
    return chosen[0]


def write_gguf(model_dir: Path, out: Path) -> None:
    """Write a sentence-transformers BERT folder as a float32 GGUF that llama.cpp's `bert` architecture
    loads. Runs in `.venv-llamacpp` (it imports `gguf`).

    Metadata: the architecture's shape keys (`bert.*`), non-causal attention and the pooling type; the
    WordPiece vocabulary (`tokenizer.ggml.model = bert`) in llama.cpp's spelling, where a token that
    starts a word carries a leading U+2581 and a continuation (`##ing`) loses its `##`; special tokens
    keep their text and are typed CONTROL; [CLS] is also the BOS token, which llama.cpp's WordPiece
    tokenizer puts first. Tensors: every weight in float32, as stored (llama.cpp's CPU path multiplies
    float32 weights directly: nothing is lost to float16)."""
    import gguf
    import numpy as np

    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only BERT with absolute position embeddings is converted here")
    tokenizer = json.loads((model_dir / "tokenizer_config.json").read_text())
    specials = json.loads((model_dir / "special_tokens_map.json").read_text())
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[: config["vocab_size"]]
    if len(vocab) != config["vocab_size"]:
        raise ValueError(f"vocab.txt has {len(vocab)} tokens, the model {config['vocab_size']}")
    ids = {token: i for i, token in enumerate(vocab)}
    control = {specials[key] for key in specials}

    writer = gguf.GGUFWriter(str(out), ARCH)  # writes general.architecture
    writer.add_string("general.name", model_dir.name)
    writer.add_uint32("general.file_type", 0)  # LLAMA_FTYPE_ALL_F32
    writer.add_uint32(f"{ARCH}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{ARCH}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{ARCH}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{ARCH}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{ARCH}.attention.head_count", config["num_attention_heads"])
    writer.add_float32(f"{ARCH}.attention.layer_norm_epsilon", config["layer_norm_eps"])
    writer.add_bool(f"{ARCH}.attention.causal", False)
    writer.add_uint32(f"{ARCH}.pooling_type", pooling_type(model_dir))

    writer.add_string("tokenizer.ggml.model", "bert")
    writer.add_array(
        "tokenizer.ggml.tokens",
        [t if t in control else t[2:] if t.startswith("##") else "\u2581" + t for t in vocab],
    )
    types = [TOKEN_CONTROL if t in control else TOKEN_NORMAL for t in vocab]
    writer.add_array("tokenizer.ggml.token_type", types)
    writer.add_uint32("tokenizer.ggml.token_type_count", config.get("type_vocab_size", 2))
    writer.add_uint32("tokenizer.ggml.bos_token_id", ids[specials["cls_token"]])
    writer.add_uint32("tokenizer.ggml.seperator_token_id", ids[specials["sep_token"]])  # llama.cpp's spelling
    writer.add_uint32("tokenizer.ggml.unknown_token_id", ids[specials["unk_token"]])
    writer.add_uint32("tokenizer.ggml.padding_token_id", ids[specials["pad_token"]])
    writer.add_uint32("tokenizer.ggml.mask_token_id", ids[specials["mask_token"]])
    lowercase = bool(tokenizer.get("do_lower_case", False))
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    strip = tokenizer.get("strip_accents")  # BertTokenizer: None follows lowercase
    writer.add_bool("tokenizer.ggml.normalizer.strip_accents", lowercase if strip is None else bool(strip))

    for name, array in read_safetensors(model_dir / "model.safetensors").items():
        target = gguf_tensor_name(name)
        if target is not None:
            writer.add_tensor(target, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
