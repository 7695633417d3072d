"""Image task handlers: zero-shot classification (§4.5), feature extraction (§4.11),
segmentation (§4.4), image-to-text (§4.9) and visual question answering (§4.7).

Each `run` decodes every item's images (a bad image fails only its item), groups items whose
options are equal, and makes one model call per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.tasks import loader, media_items
from modelhost.tasks.base import grouped, item_error
from modelhost.tasks.classify import top_labels
from modelhost.tasks.media_items import ItemError
from modelhost.tasks.outputs import plain, png_base64

DEFAULT_HYPOTHESIS = "This is a photo of {}."


def _decoded(
    batch: list[dict[str, Any]], outputs: list[dict[str, Any]], name: str = "inputs"
) -> dict[int, Any]:
    """Index → decoded images, for the items whose images decode; the others get their error."""
    decoded: dict[int, Any] = {}
    for i, item in enumerate(batch):
        try:
            decoded[i] = media_items.images(item, name=name)
        except ItemError as exc:
            outputs[i] = exc.output
    return decoded


def _warmup(**options: Any) -> dict[str, Any]:
    return {"images": [media_items.warmup_png()], "limits": media_items.WARMUP_LIMITS, **options}


class ZeroShotImageClassification:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("zero-shot-image-classification", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return _warmup(candidate_labels=["a", "b"], hypothesis_template=None)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = _decoded(batch, outputs, name="image")
        fields = ("candidate_labels", "hypothesis_template")
        for indices in grouped(batch, fields).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            first = batch[ready[0]]
            pictures = [p for i in ready for p in decoded[i]]
            results = model(
                pictures,
                candidate_labels=first["candidate_labels"],
                hypothesis_template=first.get("hypothesis_template") or DEFAULT_HYPOTHESIS,
                batch_size=len(pictures),
            )
            _spread(results, ready, decoded, outputs)
        return outputs


def _spread(
    results: list[Any], indices: list[int], decoded: dict[int, Any], outputs: list[dict[str, Any]]
) -> None:
    """Give each item its slice of a group's results (one result per image)."""
    start = 0
    for i in indices:
        count = len(decoded[i])
        outputs[i] = {"results": plain(results[start : start + count])}
        start += count


@dataclass
class Vision:
    model: Any
    processor: Any
    device: str


class ImageFeatureExtraction:
    """One vector per image: the model's pooled output, or the mean of its last hidden state."""

    def load(self, model_dir: Path, device: str) -> Vision:
        return Vision(loader.load_auto(model_dir, device), loader.load_image_processor(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return _warmup()

    @torch.inference_mode()
    def run(self, model: Vision, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = _decoded(batch, outputs)
        ready = list(decoded)
        if not ready:
            return outputs
        pictures = [p for i in ready for p in decoded[i]]
        pixels = model.processor(images=pictures, return_tensors="pt")["pixel_values"].to(model.device)
        result = model.model(pixel_values=pixels)
        pooled = getattr(result, "pooler_output", None)
        vectors = pooled if pooled is not None else result.last_hidden_state.mean(dim=1)
        _spread(vectors.float().cpu().tolist(), ready, decoded, outputs)
        return outputs


SEGMENTATION_OPTIONS = ("subtask", "threshold", "mask_threshold", "overlap_mask_area_threshold")


class ImageSegmentation:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("image-segmentation", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return _warmup()

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = _decoded(batch, outputs)
        for indices in grouped(batch, SEGMENTATION_OPTIONS).values():
            ready = [i for i in indices if i in decoded]
            if not ready:
                continue
            options = {
                k: batch[ready[0]][k] for k in SEGMENTATION_OPTIONS if batch[ready[0]].get(k) is not None
            }
            pictures = [p for i in ready for p in decoded[i]]
            try:
                segments = model(pictures, **options)
            except ValueError as exc:  # e.g. a subtask this model cannot do
                for i in ready:
                    outputs[i] = item_error(f"This model cannot segment that way: {exc}", "subtask")
                continue
            if segments and isinstance(segments[0], dict):  # one image: one list of segments
                segments = [segments]
            _spread([_masks(s) for s in segments], ready, decoded, outputs)
        return outputs


def _masks(segments: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "masks": [png_base64(s["mask"]) for s in segments],
        "scores": [None if s.get("score") is None else float(s["score"]) for s in segments],
        "labels": [s.get("label") for s in segments],
    }


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
        return _warmup(max_new_tokens=2, generate_kwargs=None)

    @torch.inference_mode()
    def run(self, model: Captioner, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = _decoded(batch, outputs)
        for indices in grouped(batch, ("max_new_tokens", "generate_kwargs")).values():
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
            _spread([[{"generated_text": t.strip()}] for t in texts], ready, decoded, outputs)
        return outputs


@dataclass
class Answerer:
    model: Any
    processor: Any
    device: str
    generative: bool


class VisualQuestionAnswering:
    """transformers 5.23 removed the VQA pipeline, so both kinds of model are run here:

    - answer classifiers (`*ForQuestionAnswering`, ViLT-style): sigmoid scores over the answer
      vocabulary, best `top_k` as `{label, score}`;
    - generative vision-language models (`image-text-to-text`): greedy answer to a chat message with
      the image and the question; `label` is the answer, `score` its sequence probability (one answer).
    """

    def load(self, model_dir: Path, device: str) -> Answerer:
        model = loader.load_architecture(model_dir, device)
        generative = not type(model).__name__.endswith("ForQuestionAnswering")
        return Answerer(model, loader.load_processor(model_dir), device, generative)

    def warmup_item(self) -> dict[str, Any]:
        return _warmup(questions=["what is this?"], pairs=[[0, 0]], top_k=1)

    @torch.inference_mode()
    def run(self, model: Answerer, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = _decoded(batch, outputs, name="image")
        for i in decoded:
            item = batch[i]
            pairs = [(decoded[i][a], item["questions"][q]) for a, q in item["pairs"]]
            if model.generative:
                results = [[self._generate(model, image, question)] for image, question in pairs]
            else:
                results = self._classify(model, pairs, item.get("top_k"))
            outputs[i] = {"results": results}
        return outputs

    def _classify(self, model: Answerer, pairs: list[tuple[Any, str]], top_k: int | None) -> list[Any]:
        encoded = model.processor(
            images=[p[0] for p in pairs], text=[p[1] for p in pairs], return_tensors="pt", padding=True
        ).to(model.device)
        scores = model.model(**encoded).logits.float().sigmoid()
        return [top_labels(row, model.model.config.id2label, top_k) for row in scores]

    def _generate(self, model: Answerer, image: Any, question: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        prompt = model.processor.apply_chat_template(messages, add_generation_prompt=True)
        encoded = model.processor(images=[image], text=prompt, return_tensors="pt").to(model.device)
        result = model.model.generate(
            **encoded, max_new_tokens=32, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
        steps = model.model.compute_transition_scores(result.sequences, result.scores, normalize_logits=True)
        answer_tokens = result.sequences[0, encoded["input_ids"].shape[1] :]
        answer = model.processor.tokenizer.decode(answer_tokens, skip_special_tokens=True).strip()
        return {"label": answer, "score": float(steps[0].sum().exp())}
