"""Offline vocabularies and tokenizers for the tiny models: nothing comes from the Hugging Face Hub.

Three kinds are enough for every model family:

* WordPiece (BERT, ViLT, BLIP): a hand-written vocabulary of the special tokens, single characters,
  ``##`` continuation characters and the whole words of `SENTENCES`, so any lower-case ASCII text
  tokenizes without ``[UNK]`` and the pipelines' offsets (and with them `aggregation_strategy`) work.
* Byte-level BPE (GPT-2, Whisper, the Qwen2 chat model): merges learnt by the `tokenizers` trainer from
  `SENTENCES`, which is deterministic, so the vocabulary (and so every embedding row) is the same on
  every run; byte-level means no text is ever out of vocabulary.
* Character vocabularies written as ``vocab.json`` (Wav2Vec2 CTC, VITS), and the CLIP / T5 ones that the
  diffusion text encoders take, spelt out token by token.

The sentences and the token lists fix the vocabulary sizes, which fix the shapes of the embedding
matrices and with them the random weights drawn after the seed: change them and every model changes.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import BertTokenizer, CLIPTokenizer, T5Tokenizer

# The text the BPE merges are learnt from and the whole words the WordPiece and T5 vocabularies hold:
# the phrases the tests and the pipelines' own checks send (greetings, captions, a question, a person and
# a place for the entity tagger, a tool call).
SENTENCES: tuple[str, ...] = (
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "a photo of a cat",
    "a photo of a dog",
    "what is in the picture?",
    "paris is the capital of france",
    "my name is sarah and i live in london",
    "the weather is nice today",
    "please call the function get_weather for berlin",
    "you are a helpful assistant",
)

BERT_SPECIALS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
T5_WORD_START = "\u2581"  # sentencepiece's "▁": the piece starts a word


def corpus_words() -> list[str]:
    """The distinct words of `SENTENCES` (trailing `?` / `,` dropped), sorted."""
    return sorted({word.strip("?,") for sentence in SENTENCES for word in sentence.split()})


def indexed(tokens: Iterable[str]) -> dict[str, int]:
    """A token → index vocabulary; a token listed twice keeps its first index."""
    vocabulary: dict[str, int] = {}
    for token in tokens:
        vocabulary.setdefault(token, len(vocabulary))
    return vocabulary


def write_vocab_json(folder: Path, tokens: Sequence[str]) -> Path:
    """Write ``folder/vocab.json`` (token → index) for the tokenizers that load only from a file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vocab.json"
    path.write_text(json.dumps(indexed(tokens)))
    return path


# ---------------------------------------------------------------- WordPiece


def wordpiece_vocabulary() -> dict[str, int]:
    """BERT's specials first (so [PAD] is 0), then characters, ``##`` characters and whole words."""
    characters = string.ascii_lowercase + string.digits + string.punctuation
    continuations = ["##" + c for c in string.ascii_lowercase + string.digits]
    return indexed([*BERT_SPECIALS, *characters, *continuations, *corpus_words()])


def bert_tokenizer(max_length: int) -> BertTokenizer:
    """A WordPiece tokenizer (tokenizers-backed in transformers 5) over `wordpiece_vocabulary`."""
    return BertTokenizer(vocab=wordpiece_vocabulary(), model_max_length=max_length)


# ---------------------------------------------------------------- byte-level BPE


def train_byte_level_bpe(
    vocab_size: int, specials: Sequence[str], texts: Iterable[str] = SENTENCES
) -> Tokenizer:
    """GPT-2 / Qwen2-style byte-level BPE learnt from `texts` (`SENTENCES` unless told); the specials take
    the first IDs.

    The whole byte alphabet is seeded into the vocabulary, so merges only add whole-word pieces and every
    string round-trips. Offsets are kept untrimmed, as GPT-2's own tokenizer does.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def bpe_vocab_and_merges(
    vocab_size: int, specials: Sequence[str]
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The learnt vocabulary and merges, as the slow-style constructors (GPT2Tokenizer, WhisperTokenizer)
    take them: transformers 5 wants each merge as a pair, `tokenizers` may store it as one string."""
    model = json.loads(train_byte_level_bpe(vocab_size, specials).to_str())["model"]
    merges: list[tuple[str, str]] = []
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        merges.append((left, right))
    return dict(model["vocab"]), merges


# ---------------------------------------------------------------- CLIP and T5 (diffusion text encoders)


def clip_tokenizer(max_length: int) -> CLIPTokenizer:
    """CLIP's BPE with no merges: every byte character, alone and word-final (``</w>``), then its specials.

    Without merges each word is spelt character by character, which is all a random text encoder needs.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, *(character + "</w>" for character in alphabet), CLIP_BOS, CLIP_EOS]
    return CLIPTokenizer(vocab=indexed(tokens), merges=[], model_max_length=max_length)


def t5_tokenizer(max_length: int) -> T5Tokenizer:
    """A Unigram (sentencepiece-style) T5 tokenizer from scored pieces: specials, the word marker, whole
    words (likelier than spelling), then single characters as the fallback."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), (T5_WORD_START, -2.0)]
    pieces += [(T5_WORD_START + word, -5.0) for word in corpus_words()]
    pieces += [(c, -8.0) for c in string.ascii_lowercase + string.digits + string.punctuation]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=max_length)
