"""Chat with images (vision-language models: LLaVA-style `image-text-to-text`) on the same engine as
text chat. The gateway fetches each `image_url` part's image; here the model's processor builds the
prompt (every image expanded into its image tokens) and its image tensors, which enter the model at
prefill; the decoding steps then run as for text (`tasks.text_generation`, `engines.native.engine`)."""

from __future__ import annotations

from pathlib import Path

from modelhost.engines import loader
from modelhost.generation.requests import generation_defaults
from modelhost.tasks.text_generation import ChatModel, TextGeneration, chat_model


class ImageTextToText(TextGeneration):
    def load(self, model_dir: Path, device: str) -> ChatModel:
        model = loader.load_auto(model_dir, device, "AutoModelForImageTextToText")
        processor = loader.load_processor(model_dir)
        state = chat_model(model, processor.tokenizer, device, generation_defaults(model_dir))
        state.settings.use_template(processor)  # the deployment's chat template, where it sets one
        state.processor = processor
        return state
