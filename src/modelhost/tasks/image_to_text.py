"""Image to text (§4.9): captions with `generate` on the artifact's own class, one call per group of
items with equal options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.tasks.base import generate_groups
from modelhost.tasks.image_batches import decoded_images, image_warmup_item, spread_results

# generate() options a caller may set; anything else (streamers, processors, …) is refused.
GENERATE_KWARGS = (
    "max_new_tokens", "min_new_tokens", "num_beams", "do_sample", "temperature", "top_k", "top_p",
    "repetition_penalty", "no_repeat_ngram_size", "length_penalty", "early_stopping", "seed",
)  # fmt: skip


@dataclass
class Captioner:
    model: Any
    image_processor: Any
    tokenizer: Any
    device: str


class ImageToText:
    """Captioning with `generate` on the artifact's own class: VisionEncoderDecoder and BLIP-style.

    transformers 5 routes the `image-to-text` pipeline to `image-text-to-text`, which needs a prompt
    and a processor that VisionEncoderDecoder artifacts lack, so we call the model directly."""

    def load(self, model_dir: Path, device: str) -> Captioner:
        return Captioner(
            loader.load_architecture(model_dir, device),
            loader.load_image_processor(model_dir),
            loader.load_tokenizer(model_dir),
            device,
        )

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item(max_new_tokens=2, generate_kwargs=None)

    @torch.inference_mode()
    def run(self, model: Captioner, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs)
        for indices in generate_groups(batch, ("max_new_tokens", "generate_kwargs")):
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            options = dict(batch[ready[0]].get("generate_kwargs") or {})
            if batch[ready[0]].get("max_new_tokens") is not None:
                options["max_new_tokens"] = batch[ready[0]]["max_new_tokens"]
            seed = options.pop("seed", None)
            if seed is not None:
                torch.manual_seed(seed)
            pictures = [p for i in ready for p in decoded[i]]
            pixels = model.image_processor(images=pictures, return_tensors="pt")["pixel_values"].to(
                model.device
            )
            tokens = model.model.generate(pixel_values=pixels, **options)
            texts = model.tokenizer.batch_decode(tokens, skip_special_tokens=True)
            spread_results([[{"generated_text": t.strip()}] for t in texts], ready, decoded, outputs)
        return outputs
