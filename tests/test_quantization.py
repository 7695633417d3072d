"""Quantized artifacts without a server: the bounded GGUF parser (`artifacts.gguf_check`), the quantization
configs of safetensors checkpoints and where each can be served (`artifacts.quantization`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelhost.artifacts import quantization as quant
from modelhost.artifacts.gguf_check import InvalidGguf, read_gguf, read_gguf_set
from modelhost.artifacts.quantization import (
    InvalidQuantization,
    Quantization,
    gguf_quantization,
    read_quantization,
    serving,
)
from tests import crafted_gguf as crafted
from tests.recipes import GGUF_FOLDER

# --- GGUF ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3-F16", "qwen3-Q8_0", "qwen3-Q4_0", "llama3-Q8_0", "qwq-Q8_0"])
def test_the_tiny_ggufs_read_as_the_gguf_package_reads_them(recipes: Path, family: str) -> None:
    import gguf

    path = recipes / GGUF_FOLDER / family / f"{family}.gguf"
    info = read_gguf(path)
    reference = gguf.GGUFReader(path)  # the package's reader, trusted here: our own fixture
    assert info.tensor_count == len(reference.tensors)
    assert info.tensor_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    assert info.file_type == family.split("-")[1]
    assert info.architecture == {"llama3": "llama", "qwq": "qwen2"}.get(family.split("-")[0], "qwen3")
    assert (info.context_length, info.block_count, info.embedding_length) == (2048, 2, 64)
    assert info.chat_template and info.tokenizer_model == "gpt2" and not info.embedding


def test_a_crafted_model_says_its_sizes_types_and_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(crafted.small_model())
    info = read_gguf(tmp_path / "m.gguf")
    assert info.tensor_types == {"Q8_0": 1, "F32": 1}
    assert info.tensor_bytes == crafted.MATRIX_BYTES + crafted.NORM_BYTES
    assert (info.head_count, info.head_count_kv, info.vocab_size) == (2, 1, 3)
    assert gguf_quantization(info) == Quantization("gguf", 8, 32, "Q8_0")


@pytest.mark.parametrize("name", list(crafted.HOSTILE))
def test_hostile_ggufs_are_refused_with_a_reason_at_once(tmp_path: Path, name: str) -> None:
    data, reason = crafted.HOSTILE[name]
    (tmp_path / "bad.gguf").write_bytes(data)
    began = time.monotonic()
    with pytest.raises(InvalidGguf, match=reason):
        read_gguf(tmp_path / "bad.gguf")
    assert time.monotonic() - began < 1  # a hang check, not a benchmark


def test_a_split_set_is_one_model_of_all_its_parts(tmp_path: Path) -> None:
    crafted.split_set(tmp_path, parts=3)
    (tmp_path / "mmproj-model-f16.gguf").write_bytes(crafted.small_model())
    found, info = read_gguf_set(tmp_path)
    assert found.model.name == "model-00001-of-00003.gguf" and len(found.parts) == 3
    assert found.mmproj is not None and found.mmproj.name == "mmproj-model-f16.gguf"
    assert info.tensor_count == 3 and info.tensor_bytes == 3 * crafted.MATRIX_BYTES
    assert info.architecture == "llama"


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"model-00001-of-00003.gguf": 1, "model-00003-of-00003.gguf": 3}, "part 00002 of 00003 is missing"),
        ({"a.gguf": 0, "b.gguf": 0}, "more than one model file"),
        ({"mmproj-a.gguf": 0}, "model's .gguf file is missing"),
    ],
)
def test_an_incomplete_or_ambiguous_set_is_refused(
    tmp_path: Path, files: dict[str, int], reason: str
) -> None:
    for name in files:
        (tmp_path / name).write_bytes(crafted.small_model())
    with pytest.raises(InvalidGguf, match=reason):
        read_gguf_set(tmp_path)


def test_a_split_part_whose_keys_disagree_with_its_name_is_refused(tmp_path: Path) -> None:
    crafted.split_set(tmp_path, parts=2)
    (tmp_path / "model-00002-of-00002.gguf").rename(tmp_path / "keep")
    crafted.split_set(tmp_path, name="other", parts=2)
    (tmp_path / "other-00001-of-00002.gguf").rename(tmp_path / "model-00002-of-00002.gguf")
    (tmp_path / "other-00002-of-00002.gguf").unlink()
    (tmp_path / "keep").unlink()
    with pytest.raises(InvalidGguf, match=r"split\.no"):
        read_gguf_set(tmp_path)


def test_an_embedding_gguf_is_recognised_by_its_pooling(tmp_path: Path) -> None:
    (tmp_path / "e.gguf").write_bytes(crafted.small_model(pooling_type=1))
    assert read_gguf(tmp_path / "e.gguf").embedding


# --- safetensors quantization --------------------------------------------------------------------------

IN, OUT, GROUP = 64, 96, 32


def gptq_folder(folder: Path, bits: int = 4, scales_rows: int = IN // GROUP, method: str = "gptq") -> Path:
    """A GPTQ- (or AWQ-) shaped checkpoint of one packed layer; values mean nothing, shapes are the test."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "quantization_config": {"quant_method": method, "bits": bits,
              "group_size": GROUP, "desc_act": False, "sym": True}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    pack = 32 // bits
    qweight = (IN // pack, OUT) if method == "gptq" else (IN, OUT // pack)
    save_file(
        {
            "model.layers.0.mlp.up_proj.qweight": np.zeros(qweight, np.int32),
            "model.layers.0.mlp.up_proj.scales": np.zeros((scales_rows, OUT), np.float16),
            "model.layers.0.mlp.up_proj.qzeros": np.zeros((IN // GROUP, OUT // pack), np.int32),
            "model.norm.weight": np.zeros((IN,), np.float16),
        },
        str(folder / "model.safetensors"),
    )
    return folder


def compressed_folder(folder: Path, config_groups: dict[str, Any], tensors: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": config_groups,
    }
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": config}))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


W4A16 = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
         "group_size": GROUP, "symmetric": True}, "input_activations": None}}  # fmt: skip


def test_a_gptq_checkpoint_says_its_method_bits_and_group(tmp_path: Path) -> None:
    found = read_quantization(gptq_folder(tmp_path / "m"))
    assert found is not None and found.as_dict() == {
        "method": "gptq",
        "bits": 4,
        "group_size": 32,
        "scheme": None,
    }


def test_an_awq_checkpoint_packs_along_its_outputs(tmp_path: Path) -> None:
    found = read_quantization(gptq_folder(tmp_path / "m", method="awq"))
    assert found is not None and (found.method, found.bits) == ("awq", 4)


def test_packed_tensors_that_do_not_match_the_config_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    with pytest.raises(InvalidQuantization, match=r"model\.layers\.0\.mlp\.up_proj\.scales is \[3, 96\]"):
        read_quantization(gptq_folder(tmp_path / "m", scales_rows=3))


def test_a_compressed_tensors_w4a16_checkpoint_is_read_and_checked(tmp_path: Path) -> None:
    good = {
        "layer.weight_packed": np.zeros((OUT, IN // 8), np.int32),
        "layer.weight_scale": np.zeros((OUT, IN // GROUP), np.float16),
        "layer.weight_shape": np.array([OUT, IN], np.int64),
    }
    found = read_quantization(compressed_folder(tmp_path / "ok", W4A16, good))
    assert found == Quantization("compressed-tensors", 4, 32, "W4A16")
    bad = {**good, "layer.weight_scale": np.zeros((OUT, 1), np.float16)}
    with pytest.raises(InvalidQuantization, match=r"layer\.weight_scale is"):
        read_quantization(compressed_folder(tmp_path / "bad", W4A16, bad))


def test_a_compressed_tensors_int8_w8a8_scheme_is_named(tmp_path: Path) -> None:
    groups = {"g": {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
              "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}  # fmt: skip
    folder = compressed_folder(tmp_path / "m", groups, {"l.weight": np.zeros((32, 32), np.int8),
                               "l.weight_scale": np.zeros((32, 1), np.float16)})  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["format"] = "int-quantized"
    (folder / "config.json").write_text(json.dumps(config))
    assert read_quantization(folder) == Quantization("compressed-tensors", 8, None, "W8A8")


def test_a_model_without_quantization_config_is_not_quantized(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_quantization(tmp_path) is None


@pytest.mark.parametrize(
    ("quantization", "flags", "reason"),
    [
        (Quantization("gptq", 4, 128, None), {"avx512f"}, None),
        (Quantization("gptq", 4, 128, None), {"avx2"}, "needs AVX-512"),
        (Quantization("gptq", 8, 128, None), {"avx512f"}, "8-bit GPTQ is not served on CPU by vLLM"),
        (Quantization("compressed-tensors", 4, 128, "W4A16"), {"avx512f"}, None),
        (Quantization("compressed-tensors", 8, None, "W8A16"), {"avx512f"}, "not served on CPU"),
        (Quantization("compressed-tensors", 8, None, "W8A8"), {"avx2"}, None),
        (Quantization("fp8", 8, 128, "FP8"), {"avx512f"}, "FP8 on CPU needs AMX"),
        (Quantization("fp8", 8, 128, "FP8"), {"avx512f", "amx_tile"}, None),
        (Quantization("awq", 4, 128, None, cpu_misfit="x.qweight is 48×64"), {"avx512f"}, "multiples of 32"),
    ],
)
def test_vllm_on_cpu_serves_what_its_kernels_and_this_cpu_allow(
    monkeypatch: pytest.MonkeyPatch, quantization: Quantization, flags: set[str], reason: str | None
) -> None:
    monkeypatch.setattr(quant, "cpu_flags", lambda: frozenset(flags))
    answer = serving(quantization, "vllm", "cpu")
    assert answer is None if reason is None else reason in (answer or "")


def test_each_format_goes_to_its_engine() -> None:
    gptq, q4 = Quantization("gptq", 4, 128, None), Quantization("gguf", 4, 32, "Q4_0")
    assert serving(gptq, "vllm", "cuda") is None
    assert "GGUF" in (serving(gptq, "llamacpp", "cpu") or "")
    assert "no quantized safetensors" in (serving(gptq, "transformers", "cuda") or "")
    assert serving(q4, "llamacpp", "cpu") is None and serving(q4, "vllm", "cpu")
    assert "bitsandbytes" in (serving(Quantization("bitsandbytes", 4, None, "nf4"), "vllm", "cuda") or "")


def test_this_cpu_flags_are_read_from_proc_cpuinfo() -> None:
    assert quant.cpu_flags() == frozenset(
        next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        .partition(":")[2]
        .split()
    )


# --- inspection -----------------------------------------------------------------------------------------


def test_an_embedding_gguf_is_a_feature_extraction_artifact_not_a_generation_one(tmp_path: Path) -> None:
    from modelhost.artifacts.inspection import inspect_artifact

    (tmp_path / "embedder.gguf").write_bytes(crafted.small_model(pooling_type=1))
    found = inspect_artifact(tmp_path, "feature-extraction")
    assert found.ok and found.gguf is not None and found.gguf["embedding"]
    refused = inspect_artifact(tmp_path, "text-generation")
    assert (refused.ok, refused.code) == (False, "unsupported_architecture")
    assert "feature-extraction" in (refused.message or "")


def test_a_gguf_beside_safetensors_weights_is_refused(tmp_path: Path) -> None:
    from modelhost.artifacts.inspection import inspect_artifact

    (tmp_path / "model.gguf").write_bytes(crafted.small_model())
    save_file({"w": np.zeros((2,), np.float32)}, str(tmp_path / "model.safetensors"))
    refused = inspect_artifact(tmp_path, "text-generation")
    assert refused.code == "invalid_weights" and "one format" in (refused.message or "")
