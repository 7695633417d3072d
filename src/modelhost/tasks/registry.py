"""Pipeline task → handler. Adding a task means adding a handler here, nothing else.

Handlers are named, not imported: they pull in torch and the model libraries, which only worker
processes should load.
"""

from __future__ import annotations

import importlib

from modelhost.tasks.base import AnyTaskHandler

HANDLERS: dict[str, str] = {
    "feature-extraction": "modelhost.tasks.feature_extraction:FeatureExtraction",
    "token-classification": "modelhost.tasks.text:TokenClassification",
    "fill-mask": "modelhost.tasks.text:FillMask",
    "zero-shot-image-classification": "modelhost.tasks.vision:ZeroShotImageClassification",
    "image-feature-extraction": "modelhost.tasks.vision:ImageFeatureExtraction",
    "image-segmentation": "modelhost.tasks.vision:ImageSegmentation",
    "image-to-text": "modelhost.tasks.vision:ImageToText",
    "visual-question-answering": "modelhost.tasks.vision:VisualQuestionAnswering",
    "audio-classification": "modelhost.tasks.signals:AudioClassification",
    "video-classification": "modelhost.tasks.signals:VideoClassification",
    "text-generation": "modelhost.tasks.generation:TextGeneration",
    "text-to-speech": "modelhost.tasks.audio:TextToSpeech",
    "automatic-speech-recognition": "modelhost.tasks.audio:SpeechRecognition",
    "text-to-image": "modelhost.tasks.images:TextToImage",
    "image-to-image": "modelhost.tasks.images:ImageToImage",
    "inpainting": "modelhost.tasks.images:Inpainting",
    "text-to-video": "modelhost.tasks.video_generation:TextToVideo",
}


def served(pipeline: str) -> bool:
    return pipeline in HANDLERS


def handler_for(pipeline: str) -> AnyTaskHandler:
    module_name, _, class_name = HANDLERS[pipeline].partition(":")
    handler: AnyTaskHandler = getattr(importlib.import_module(module_name), class_name)()
    return handler
