"""Summarization, translation and text2text generation: an encoder-decoder model's `generate`, as
transformers' former `Text2TextGenerationPipeline` and its two subclasses ran it (transformers 5 ships
none of them, so the model runs here).

The three differ only in the prompt and the answer's key:
- text2text: the text as given, behind the config's `prefix` (if any);
- summarization: behind the prefix of the config's `task_specific_params["summarization"]` (T5's
  `summarize: `), whose generation settings (BART's beams and lengths) are the defaults;
- translation: a multilingual tokenizer (NLLB, M2M100, mBART: language codes as special tokens) needs
  `src_lang` and `tgt_lang` among its codes; the source code goes in front of the text and the target
  code's token is forced as the first generated token (M2M100's `fr` is the token `__fr__`). Other
  models (T5, Marian) take the languages in the prompt: `task_specific_params["translation_<src>_to_
  <tgt>"]` when the config has one (T5's `en` → `de`), else `translate <src> to <tgt>: `; with no
  languages the text goes in as it is (a Marian model translates one pair).

Items with equal options share one padded `generate` call, but a seeded item gets a call of its own:
sampled tokens depend on the batch's size and on its neighbours, and a seed promises the same answer
whatever else the worker is running (as diffusion's seeded items).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelhost.engines import loader
from modelhost.errors import InvalidRequest, error_of
from modelhost.tasks.base import generate_groups

OPTIONS = ("max_new_tokens", "generate_kwargs", "src_lang", "tgt_lang")
# the settings a config's task_specific_params may give `generate` as defaults (the caller's win)
TASK_DEFAULTS = (
    "max_length", "min_length", "max_new_tokens", "min_new_tokens", "num_beams", "length_penalty",
    "no_repeat_ngram_size", "early_stopping",
)  # fmt: skip


@dataclass
class Seq2Seq:
    model: Any
    tokenizer: Any
    device: str


@dataclass(frozen=True)
class Prompt:
    """How one group's texts go into the model: a prefix, the tokenizer's source language, and what
    `generate` gets beside the caller's options."""

    prefix: str = ""
    src_lang: str | None = None
    generate: tuple[tuple[str, Any], ...] = ()


class Text2TextGeneration:
    output_key = "generated_text"
    task = ""  # the key of the config's task_specific_params this task reads ("" for none)

    def load(self, model_dir: Path, device: str) -> Seq2Seq:
        model = loader.load_auto(model_dir, device, "AutoModelForSeq2SeqLM")
        return Seq2Seq(model, loader.load_tokenizer(model_dir), device)

    def warmup_item(self) -> dict[str, Any]:
        return {"inputs": ["modelhost warm-up"], "max_new_tokens": 2}

    def prompt(self, model: Seq2Seq, item: dict[str, Any]) -> Prompt:
        """The prompt of an item's group; raises `InvalidRequest` for options the model cannot take."""
        return _task_prompt(model, self.task, getattr(model.model.config, "prefix", None) or "")

    @torch.inference_mode()
    def run(self, model: Seq2Seq, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = [{} for _ in batch]
        for indices in generate_groups(batch, OPTIONS):
            first = batch[indices[0]]
            try:
                prompt = self.prompt(model, first)
            except InvalidRequest as exc:
                for index in indices:
                    outputs[index] = error_of(exc)
                continue
            texts = [prompt.prefix + text for index in indices for text in batch[index]["inputs"]]
            generated = iter(_generate(model, texts, prompt, first))
            for index in indices:
                results = [{self.output_key: next(generated)} for _ in batch[index]["inputs"]]
                outputs[index] = {"results": results}
        return outputs


class Summarization(Text2TextGeneration):
    output_key = "summary_text"
    task = "summarization"


class Translation(Text2TextGeneration):
    output_key = "translation_text"

    def prompt(self, model: Seq2Seq, item: dict[str, Any]) -> Prompt:
        source, target = item.get("src_lang"), item.get("tgt_lang")
        codes = language_codes(model.tokenizer)
        if codes:
            for param, language in (("src_lang", source), ("tgt_lang", target)):
                if language is None:
                    message = f"This model translates between language codes: give `{param}`."
                    raise InvalidRequest(message, param=param)
                if language not in codes:
                    known = ", ".join(sorted(codes)[:8])
                    raise InvalidRequest(
                        f"{language!r} is not a language code of this model (it knows {len(codes)}: {known}"
                        f"{', ...' if len(codes) > 8 else ''}).",
                        param=param,
                    )
            forced = language_token_id(model.tokenizer, str(target))  # checked above
            return Prompt(src_lang=source, generate=(("forced_bos_token_id", forced),))
        if (source is None) != (target is None):
            missing = "src_lang" if source is None else "tgt_lang"
            raise InvalidRequest("Give both `src_lang` and `tgt_lang`, or neither.", param=missing)
        if source is None:
            return super().prompt(model, item)
        return _task_prompt(model, f"translation_{source}_to_{target}", f"translate {source} to {target}: ")


def language_codes(tokenizer: Any) -> frozenset[str]:
    """A multilingual tokenizer's language codes: M2M100's table, or the special tokens that are not
    the named ones (NLLB's `eng_Latn`, mBART's `en_XX`). Empty for a tokenizer without them."""
    table = getattr(tokenizer, "lang_code_to_id", None)
    if isinstance(table, dict) and table:
        return frozenset(table)
    if not hasattr(tokenizer, "_build_translation_inputs"):
        return frozenset()
    named = {str(token) for token in tokenizer.special_tokens_map.values() if isinstance(token, str)}
    return frozenset(str(token) for token in tokenizer.all_special_tokens) - named


def language_token_id(tokenizer: Any, code: str) -> int:
    """The id of a language code's token: M2M100's table maps its codes (`fr`) to the ids of their
    tokens (`__fr__`), which the vocabulary does not hold under the code; NLLB's codes are the tokens."""
    table = getattr(tokenizer, "lang_code_to_id", None)
    if isinstance(table, dict) and code in table:
        return int(table[code])
    return int(tokenizer.convert_tokens_to_ids(code))


def _task_prompt(model: Seq2Seq, task: str, default_prefix: str) -> Prompt:
    """The prompt of the config's `task_specific_params[task]` (its prefix, its generation defaults), or
    `default_prefix` where the config has none for `task` ("": none)."""
    params = getattr(model.model.config, "task_specific_params", None) or {}
    found = params.get(task) if task else None
    given: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    prefix = given.get("prefix", default_prefix)
    return Prompt(prefix, generate=tuple((k, v) for k, v in given.items() if k in TASK_DEFAULTS))


def _generate(model: Seq2Seq, texts: list[str], prompt: Prompt, item: dict[str, Any]) -> list[str]:
    options = dict(prompt.generate)
    options.update(item.get("generate_kwargs") or {})
    if item.get("max_new_tokens") is not None:
        options["max_new_tokens"] = item["max_new_tokens"]
    if "max_new_tokens" in options:
        options.pop("max_length", None)  # a task default must not override the caller's budget
    seed = options.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    tokenizer = model.tokenizer
    if prompt.src_lang is not None:
        tokenizer.src_lang = prompt.src_lang
    encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(model.device)
    tokens = model.model.generate(**encoded, **options)
    return [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]
