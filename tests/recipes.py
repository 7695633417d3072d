"""The test suite's tiny random-weight models (built by `tests/tiny_models`), built once per session.

The names (`recipes`, `RECIPE_MODELS`, `build_recipes`) are the ones the tests use; the models are the
repository's own, built from configs and offline tokenizers, with nothing downloaded.
"""

from __future__ import annotations

from pathlib import Path

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
    """Build every tiny model into `out/<folder>[/<sub>]` in this process and return `out`.

    Imported here, not at the top: collecting the tests needs `RECIPE_MODELS` only, not torch.
    One intra-op thread: tiny models build and run far faster so on a small, shared machine.
    """
    import torch

    from tests.tiny_models import BUILDERS

    torch.set_num_threads(1)
    for folder in sorted({module for module, _, _ in RECIPE_MODELS}):
        BUILDERS[folder](out / folder)
    return out
