"""A Hugging Face decoder (Llama, Qwen2, Qwen3) as one GGUF file, written by llama.cpp's own writer and
quantizers (`gguf.GGUFWriter`, `gguf.quants`), as its `convert_hf_to_gguf.py` + `llama-quantize` would: F16,
Q8_0 or Q4_0 (K-quants need llama.cpp's `llama-quantize`: `bench.gguf` runs it where the native build is).

Each file carries what llama.cpp reads from a real one: the architecture's hyper-parameters, the byte-level
BPE vocabulary (`tokenizer.ggml.model = gpt2`, pre-tokenizer `gpt-2`: the tiny tokenizers and the
benchmarks' split as GPT-2 does), its merges and token types (added tokens: specials as control tokens,
the rest user-defined), the end-of-sequence token and the chat template. Norms and biases stay float32.

Used by the tests' model builder (`tests/tiny_models/gguf.py`: the family models as GGUF files) and by
`bench.gguf` (its 0.35 B Llama); under bench/, not tests/, because importing the `tests` package empties
the caller's `MODELHOST_*` settings (tests/__init__.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file

_PER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def convert(source: Path, target: Path, architecture: str, quantization: str) -> None:
    """The safetensors model in `source` as one GGUF file at `target`."""
    import gguf

    config = json.loads((source / "config.json").read_text())
    writer = gguf.GGUFWriter(str(target), architecture)
    writer.add_name(f"tiny-{source.name}")
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{quantization}"))
    _hyper_parameters(writer, config)
    _tokenizer(writer, source, config)
    qtype = getattr(gguf.GGMLQuantizationType, quantization)
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        values = tensor.float().numpy()  # bfloat16 checkpoints too (numpy has no bfloat16)
        if architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            values = _rotary_rows(values, heads)
        _add_tensor(writer, _gguf_tensor_name(name), values, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _hyper_parameters(writer: Any, config: dict[str, Any]) -> None:
    rope = config.get("rope_parameters") or {}
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head)
    writer.add_value_length(head)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])


def _tokenizer(writer: Any, source: Path, config: dict[str, Any]) -> None:
    import gguf

    described = json.loads((source / "tokenizer.json").read_text())
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for token, index in described["model"]["vocab"].items():
        tokens[index], types[index] = token, gguf.TokenType.NORMAL
    for added in described["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    merges = described["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    eos = config["eos_token_id"]
    writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_pad_token_id(config.get("pad_token_id") or 0)
    writer.add_add_bos_token(False)  # the templates write the BOS themselves
    writer.add_chat_template((source / "chat_template.jinja").read_text())


def _gguf_tensor_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{_PER_LAYER[rest]}"


def _rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection's rows reordered from transformers' rotary layout (halves) to
    llama.cpp's `llama` one (interleaved pairs), as convert_hf_to_gguf.py does."""
    rows = weight.shape[0]
    paired = weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2)
    return paired.reshape(weight.shape)


def _add_tensor(writer: Any, name: str, values: np.ndarray, qtype: Any) -> None:
    """Norms and biases stay float32 (as llama.cpp's converter keeps them); matrices take the file's
    type."""
    import gguf

    if values.ndim == 1:
        writer.add_tensor(name, values)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, values.astype(np.float16))
    else:
        packed = gguf.quants.quantize(values, qtype)
        writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)
