"""Tiny random-weight models for the test suite, built from configs in a few seconds with nothing
downloaded (`tests.recipes.build_recipes` builds them all once per test session).

One module per family: `text` (BERT), `vision` (CLIP, ViT, segmenters), `multimodal` (Llava, ViLT,
BLIP, ViT-GPT2), `audio` (Wav2Vec2, Whisper, VITS), `video` (VideoMAE), `chat` (Qwen2 with a ChatML
template), `families` (a model of each model family, trained to answer in its format), `seq2seq` (T5,
M2M100), `diffusion` (Stable Diffusion, text-to-video SD, Wan), `gguf` (the family models as GGUF
files), `quantized` (4-bit GPTQ and compressed-tensors checkpoints of one, packed by our code); `vocab`
makes their tokenizers offline and `common` holds the seed and the saving helpers.

`BUILDERS` maps each output folder name (the tests address models as ``recipes / "t12_speech" /
"vits"``) to the function that fills it (`builder(folder)`); a folder holding several models gets one
sub-folder each. These modules import torch, transformers and diffusers at import time: import them only
to build. This package imports none of them itself: a test module that imports one of them for its
constants (`families.MODELS`, `gguf.EMBEDDING`) at collection would otherwise import every builder in
every pytest-xdist process (about 9 s of CPU each, VITS's and diffusers' modelling code among them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

# folder -> "module.function" in this package, imported by `builder` when that folder is built
BUILDERS: dict[str, str] = {
    "t01_token_classification": "text.build_token_classification",
    "t02_fill_mask": "text.build_fill_mask",
    "t03_feature_extraction": "text.build_feature_extraction",
    "t04_zero_shot_image_classification": "vision.build_zero_shot_image_classification",
    "t05_image_feature_extraction": "vision.build_image_feature_extraction",
    "t06_image_segmentation": "vision.build_image_segmentation",
    "t07_visual_question_answering": "multimodal.build_visual_question_answering",
    "t08_image_to_text": "multimodal.build_image_to_text",
    "t09_audio_classification": "audio.build_audio_classification",
    "t10_video_classification": "video.build_video_classification",
    "t11_text_generation_chat": "chat.build_chat",
    "t12_speech": "audio.build_speech",
    "t13_diffusers_sd": "diffusion.build_stable_diffusion",
    "t14_diffusers_text_to_video": "diffusion.build_text_to_video",
    "t15_text_classification": "text.build_text_classification",
    "t16_text_ranking": "text.build_text_ranking",
    "t17_zero_shot_classification": "text.build_zero_shot_classification",
    "t18_image_classification": "vision.build_image_classification",
    "t19_object_detection": "vision.build_object_detection",
    "t20_depth_estimation": "vision.build_depth_estimation",
    "t21_question_answering": "text.build_question_answering",
    "t22_text2text": "seq2seq.build_text2text",
    "t23_translation": "seq2seq.build_translation",
    "t24_families": "families.build_families",
    "t25_gguf": "gguf.build_gguf",
    "t26_quantized": "quantized.build_quantized",
}


def builder(folder: str) -> Callable[[Path], None]:
    """The function that builds `folder`, its module imported now."""
    module, function = BUILDERS[folder].split(".")
    built: Callable[[Path], None] = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return built
