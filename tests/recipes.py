"""The test suite's tiny random-weight models (built by `tests/tiny_models`), built once per content.

The names (`recipes`, `RECIPE_MODELS`, `build_recipes`) are the ones the tests use; the models are the
repository's own, built from configs and offline tokenizers, with nothing downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock

from tests import suite_cache

# what the built files depend on besides the builders' code
LIBRARIES = (
    "torch", "transformers", "diffusers", "sentence-transformers", "tokenizers", "safetensors", "gguf"
)  # fmt: skip
MANIFEST = "MANIFEST"
# the benchmarks' model builders that tests/tiny_models builds with too: PEFT adapters, 4-bit packing, the
# MiniLM GGUF
BENCH_BUILDERS = ("models.py", "quantizer.py", "bert_gguf.py", "llama_gguf.py")

# (folder, sub-folder or "", pipeline task) for every tiny model: its files are in `<out>/<folder>/<sub>`.
RECIPE_MODELS: list[tuple[str, str, str]] = [
    ("t01_token_classification", "", "token-classification"),
    ("t02_fill_mask", "", "fill-mask"),
    ("t03_feature_extraction", "hf", "feature-extraction"),
    ("t03_feature_extraction", "st", "feature-extraction"),
    ("t04_zero_shot_image_classification", "", "zero-shot-image-classification"),
    ("t05_image_feature_extraction", "", "image-feature-extraction"),
    ("t06_image_segmentation", "segformer", "image-segmentation"),
    ("t06_image_segmentation", "detr", "image-segmentation"),
    ("t06_image_segmentation", "mask2former", "image-segmentation"),
    ("t07_visual_question_answering", "vilt", "visual-question-answering"),
    ("t07_visual_question_answering", "llava", "visual-question-answering"),
    ("t07_visual_question_answering", "llava", "image-text-to-text"),
    ("t08_image_to_text", "blip", "image-to-text"),
    ("t08_image_to_text", "vit_gpt2", "image-to-text"),
    ("t09_audio_classification", "", "audio-classification"),
    ("t10_video_classification", "", "video-classification"),
    ("t11_text_generation_chat", "", "text-generation"),
    ("t12_speech", "whisper", "automatic-speech-recognition"),
    ("t12_speech", "wav2vec2_ctc", "automatic-speech-recognition"),
    ("t12_speech", "vits", "text-to-speech"),
    ("t13_diffusers_sd", "", "text-to-image"),
    ("t13_diffusers_sd", "", "image-to-image"),
    ("t13_diffusers_sd", "", "inpainting"),
    ("t14_diffusers_text_to_video", "text_to_video_sd", "text-to-video"),
    ("t14_diffusers_text_to_video", "wan", "text-to-video"),
    ("t15_text_classification", "", "text-classification"),
    ("t16_text_ranking", "", "text-ranking"),
    ("t17_zero_shot_classification", "", "zero-shot-classification"),
    ("t18_image_classification", "", "image-classification"),
    ("t19_object_detection", "", "object-detection"),
    ("t20_depth_estimation", "", "depth-estimation"),
    ("t21_question_answering", "", "question-answering"),
    ("t22_text2text", "", "text2text-generation"),
    ("t22_text2text", "", "summarization"),
    ("t22_text2text", "", "translation"),
    ("t23_translation", "", "translation"),
]
# The trained model of each model family (tests/tiny_models/families.py), in `<out>/t24_families/<family>`,
# and what each answers in `<out>/t24_families/outputs.json` (tests/data/family_outputs.json is a copy).
# Apart from RECIPE_MODELS, whose every entry tests/test_artifacts.py pushes: tests/test_families.py pushes
# and serves each of them.
FAMILIES_FOLDER = "t24_families"
# t24's Qwen3, Llama 3 and QwQ as GGUF files (tests/tiny_models/gguf.py): `<out>/t25_gguf/<family>-<type>/`,
# and the real all-MiniLM-L6-v2 as an embedding GGUF: `<out>/t25_gguf/minilm-F32/`
GGUF_FOLDER = "t25_gguf"
# t24's Qwen3 packed 4-bit by our code (tests/tiny_models/quantized.py): `<out>/t26_quantized/qwen3-<format>/`
QUANTIZED_FOLDER = "t26_quantized"


def build_recipes(out: Path) -> Path:
    """Build every tiny model into `out/<folder>[/<sub>]` in this process and return `out`.

    Imported here, not at the top: collecting the tests needs `RECIPE_MODELS` only, not torch.
    One intra-op thread: tiny models build and run far faster so on a small, shared machine.
    """
    import torch

    from tests.tiny_models import builder

    torch.set_num_threads(1)
    for folder in sorted(
        {module for module, _, _ in RECIPE_MODELS} | {FAMILIES_FOLDER, GGUF_FOLDER, QUANTIZED_FOLDER}
    ):
        builder(folder)(out / folder)
    return out


def cache_root() -> Path:
    """Where built models are kept between runs: MODELHOST_TEST_MODEL_CACHE, else the user's cache."""
    configured = os.environ.get("MODELHOST_TEST_MODEL_CACHE")
    if configured:
        return Path(configured)
    return Path(suite_cache()) / "test-models"


def content_key() -> str:
    """A hash of everything the built files depend on: the builders' code (`BENCH_BUILDERS` too), this file,
    the families table (the family builder checks each template is recognised by it), the libraries'
    versions and Python's.
    Changing any of them builds afresh; nothing else does."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for library in LIBRARIES:
        digest.update(f"{library}=={importlib.metadata.version(library)}".encode())
    here = Path(__file__).parent
    for source in [Path(__file__), *sorted((here / "tiny_models").glob("*.py"))]:
        digest.update(source.relative_to(here).as_posix().encode() + source.read_bytes())
    import bench  # an empty package: cheap to import

    for name in BENCH_BUILDERS:  # the benchmarks' builders the tests use too
        digest.update(f"bench/{name}".encode() + (Path(bench.__file__).parent / name).read_bytes())
    from modelhost.generation import families  # standard library only: cheap to import

    digest.update(b"families.py" + Path(families.__file__).read_bytes())
    return digest.hexdigest()[:16]


def _manifest(folder: Path) -> str:
    """Every built file with the hash of its bytes: a model changed in place (by a test that should have
    copied it) no longer matches, and the next session builds afresh."""
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        lines.append(f"{path.relative_to(folder).as_posix()} {hashlib.sha256(path.read_bytes()).hexdigest()}")
    return "\n".join(lines)


def cached_recipes(root: Path | None = None) -> Path:
    """Every tiny model, built once per content key and reused by later sessions (a session that finds
    another one building waits on a file lock)."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / content_key()
    with FileLock(f"{target}.lock"):
        manifest = target / MANIFEST
        if manifest.is_file() and manifest.read_text() == _manifest(target):
            return target
        partial = root / f"{target.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        build_recipes(partial)
        (partial / MANIFEST).write_text(_manifest(partial))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target
