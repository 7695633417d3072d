"""Text models on one tiny BERT shape: token classification (t01), fill-mask (t02), and feature
extraction (t03), both as a plain transformers folder (``hf``) and as a sentence-transformers model
(``st``: that BERT + mean pooling + normalisation) built from the plain one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import modules as st_modules
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from tests.tiny_models.common import label_maps, reseed, save
from tests.tiny_models.vocab import bert_tokenizer

CONTEXT = 64  # positions, and the tokenizers' model_max_length
ENTITY_LABELS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
SENTIMENT_LABELS: tuple[str, ...] = ("negative", "neutral", "positive")
NLI_LABELS: tuple[str, ...] = ("contradiction", "neutral", "entailment")


def bert_config(vocab_size: int, **extra: Any) -> BertConfig:
    """Two layers of width 32 (37 in the MLP, a size no real model has, so shape bugs show)."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=CONTEXT,
        **extra,
    )


def build_token_classification(folder: Path) -> None:
    """t01: BIO person / location tags, so `aggregation_strategy` has entities to group."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    model = BertForTokenClassification(bert_config(len(tokenizer), **label_maps(ENTITY_LABELS)))
    save(folder, model, tokenizer)


def build_fill_mask(folder: Path) -> None:
    """t02: a masked-LM head; the tokenizer's mask token is ``[MASK]``."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    save(folder, BertForMaskedLM(bert_config(len(tokenizer))), tokenizer)


def build_feature_extraction(folder: Path) -> None:
    """t03: ``hf`` (BertModel without a pooler: token vectors) and ``st`` (one normalised 32-d vector per
    text), the second loading its encoder from the first, so both give the same token vectors."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    plain = save(folder / "hf", BertModel(bert_config(len(tokenizer)), add_pooling_layer=False), tokenizer)

    encoder = st_modules.Transformer(str(plain), max_seq_length=CONTEXT)
    pooling = st_modules.Pooling(encoder.get_embedding_dimension(), pooling_mode="mean")
    sentence_model = SentenceTransformer(modules=[encoder, pooling, st_modules.Normalize()], device="cpu")
    sentence_model.save(str(folder / "st"))


def build_text_classification(folder: Path) -> None:
    """t15: three sentiment labels, so `top_k` and `function_to_apply` have something to choose."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    config = bert_config(len(tokenizer), **label_maps(SENTIMENT_LABELS))
    save(folder, BertForSequenceClassification(config), tokenizer)


def build_text_ranking(folder: Path) -> None:
    """t16: a cross-encoder as sentence-transformers saves one: a sequence classifier with one output,
    read over (query, document) pairs."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    config = bert_config(len(tokenizer), num_labels=1)
    save(folder, BertForSequenceClassification(config), tokenizer)


def build_zero_shot_classification(folder: Path) -> None:
    """t17: an NLI classifier (contradiction / neutral / entailment, as MNLI models name them), which is
    what the zero-shot pipeline reads its `entailment` score from."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    config = bert_config(len(tokenizer), **label_maps(NLI_LABELS))
    save(folder, BertForSequenceClassification(config), tokenizer)


def build_question_answering(folder: Path) -> None:
    """t21: a span head (start and end logits per token), read over (question, context) pairs."""
    reseed()
    tokenizer = bert_tokenizer(CONTEXT)
    save(folder, BertForQuestionAnswering(bert_config(len(tokenizer))), tokenizer)
