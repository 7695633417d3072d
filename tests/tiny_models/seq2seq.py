"""Encoder-decoder text models: a tiny T5 (t22) for summarization and text2text generation (and
translation through its prompt), and a tiny NLLB-style M2M100 (t23) whose tokenizer holds three language
codes, so translation's `src_lang` / `tgt_lang` rules have codes to check."""

from __future__ import annotations

import string
from pathlib import Path

from transformers import (
    M2M100Config,
    M2M100ForConditionalGeneration,
    NllbTokenizer,
    T5Config,
    T5ForConditionalGeneration,
)

from tests.tiny_models.common import reseed, save
from tests.tiny_models.vocab import T5_WORD_START, indexed, t5_tokenizer

CONTEXT = 64  # positions, and the tokenizers' model_max_length
LANGUAGES: tuple[str, ...] = ("eng_Latn", "fra_Latn", "deu_Latn")


def build_text2text(folder: Path) -> None:
    """t22: T5 with T5's own task prompts in its config (`summarize: `, `translate English to German: `)."""
    reseed()
    tokenizer = t5_tokenizer(CONTEXT)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_ff=37,
        d_kv=16,
        num_layers=2,
        num_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        task_specific_params={
            "summarization": {"prefix": "summarize: ", "num_beams": 2, "no_repeat_ngram_size": 2},
            "translation_en_to_de": {"prefix": "translate English to German: "},
        },
    )
    save(folder, T5ForConditionalGeneration(config), tokenizer)


def nllb_tokenizer() -> NllbTokenizer:
    """NLLB's tokenizer over a character vocabulary (sentencepiece-style `▁` word starts, no merges) with
    three language codes as its special tokens."""
    characters = string.ascii_lowercase + string.digits + string.punctuation
    pieces = ["<s>", "<pad>", "</s>", "<unk>", T5_WORD_START, *characters]
    pieces += [T5_WORD_START + c for c in characters]
    return NllbTokenizer(
        vocab=indexed(pieces),
        merges=[],
        extra_special_tokens=list(LANGUAGES),
        src_lang=LANGUAGES[0],
        model_max_length=CONTEXT,
    )


def build_translation(folder: Path) -> None:
    """t23: an M2M100 encoder-decoder (NLLB-200's architecture) with `nllb_tokenizer`."""
    reseed()
    tokenizer = nllb_tokenizer()
    config = M2M100Config(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=CONTEXT,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    save(folder, M2M100ForConditionalGeneration(config), tokenizer)
