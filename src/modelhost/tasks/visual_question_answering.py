"""Visual question answering (§4.7): answer classifiers and generative vision-language models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.tasks.classify import top_labels
from modelhost.tasks.image_batches import decoded_images, image_warmup_item


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
        return image_warmup_item(questions=["what is this?"], pairs=[[0, 0]], top_k=1)

    @torch.inference_mode()
    def run(self, model: Answerer, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        decoded = decoded_images(batch, outputs, name="image")
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
