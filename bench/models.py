"""Models the benchmarks build themselves: random weights, tokenizers trained offline in seconds."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "A quick brown fox jumps over the lazy dog.",
    "Serving models over HTTP is mostly about batching requests together.",
    "The gateway parses, authenticates and routes; the replica runs the model.",
    "Embeddings map sentences to vectors that can be compared by cosine similarity.",
]


def tiny_bert(folder: Path) -> Path:
    """A BERT encoder with 1 layer and hidden size 32, so small that serving it costs more than running
    it: what the gateway's own throughput is measured with."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(
        CORPUS * 10, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=128)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def same_shape(source: Path, folder: Path) -> Path:
    """A copy of a sentence-transformers BERT folder with random weights of the same shape: what a GPU
    machine without the real weights (too large to carry there) runs instead."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    BertModel(BertConfig.from_pretrained(source), add_pooling_layer=False).eval().save_pretrained(folder)
    return folder
