"""Tiny random-weight models from `../shared/recipes`, built once per test session."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

# The workplace's shared recipes sit beside the checkout; a clone elsewhere names them in the variable.
RECIPES_DIR = Path(
    os.environ.get("MODELHOST_TEST_RECIPES") or Path(__file__).resolve().parents[2] / "shared" / "recipes"
)

# (recipe module, sub-folder or "", pipeline task) for every model the recipes build.
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
]


def build_recipes(out: Path) -> Path:
    """Build every recipe into `out/<module>` (one process, as the recipes README suggests)."""
    import torch

    torch.set_num_threads(1)
    if not RECIPES_DIR.is_dir():
        raise FileNotFoundError(
            f"the model recipes are not at {RECIPES_DIR}: "
            "clone beside ../shared, or set MODELHOST_TEST_RECIPES"
        )
    if str(RECIPES_DIR) not in sys.path:
        sys.path.insert(0, str(RECIPES_DIR))
    for module_name in sorted({m for m, _, _ in RECIPE_MODELS}):
        target = out / module_name
        target.mkdir(parents=True, exist_ok=True)
        importlib.import_module(module_name).build(str(target))
    return out
