"""An embedding request's inputs checked as token IDs, by every engine that embeds text: the encoder
handler on torch / ONNX Runtime / OpenVINO (`tasks.feature_extraction`) and llama.cpp
(`engines.llamacpp_embeddings`), so that both refuse the same inputs with the same words.

An input is a text (the engine tokenizes it) or a client's token IDs. Too long is a 400 naming the input;
so are IDs that are not this model's own: LangChain's OpenAIEmbeddings sends OpenAI's tiktoken IDs unless
told not to, and they are often in range, so they would embed as nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelhost.errors import item_error

# What a client sending another tokenizer's IDs should do instead.
OTHER_TOKENIZER = (
    "Token-ID inputs must be this model's own token IDs, as its tokenizer makes them{framing}. "
    "Send the text instead; with LangChain's OpenAIEmbeddings, set check_embedding_ctx_length=False "
    "(it otherwise sends OpenAI's tiktoken IDs)."
)


@dataclass(frozen=True, slots=True)
class TokenRules:
    """What a model's inputs must be: at most `max_tokens` each, and a client's IDs framed as its
    tokenizer frames a text (`framing`: the special tokens before and after, BERT's `[CLS]` … `[SEP]`),
    each in its vocabulary."""

    max_tokens: int
    vocab_size: int
    framing: tuple[list[int], list[int]] = ([], [])


def framing_of(bare: list[int], framed: list[int]) -> tuple[list[int], list[int]]:
    """The special tokens a tokenizer puts before and after a text, from one text's IDs without them
    (`bare`) and with them (`framed`)."""
    for start in range(len(framed) - len(bare) + 1):
        if bare and framed[start : start + len(bare)] == bare:
            return framed[:start], framed[start + len(bare) :]
    return [], []


def checked(rules: TokenRules, inputs: list[Any], ids: list[list[int]]) -> list[list[int]] | dict[str, Any]:
    """`ids` (one list per input, the client's own where it sent IDs), or the item's error output (the
    first bad input's, with `param` naming it)."""
    for index, seq in enumerate(ids):
        param = "input" if len(ids) == 1 else f"input[{index}]"
        if len(seq) > rules.max_tokens:
            message = f"Input is {len(seq)} tokens long; this model accepts at most {rules.max_tokens}."
            return item_error(message, param)
        given = inputs[index]
        if isinstance(given, list) and not _own_ids(rules, given):
            return item_error(_other_tokenizer(rules), param)
    return ids


def _own_ids(rules: TokenRules, ids: list[int]) -> bool:
    """IDs in the vocabulary, framed as the tokenizer frames a text: other tokenizers' IDs (tiktoken's
    `[9906, 1917]` for "Hello world") are often in range too, and would embed as nonsense."""
    before, after = rules.framing
    framed = ids[: len(before)] == before and (not after or ids[-len(after) :] == after)
    return framed and len(ids) >= len(before) + len(after) and all(0 <= t < rules.vocab_size for t in ids)


def _other_tokenizer(rules: TokenRules) -> str:
    before, after = rules.framing
    parts = [f"starting with {before}"] if before else []
    parts += [f"ending with {after}"] if after else []
    parts.append(f"each between 0 and {rules.vocab_size - 1}")
    return OTHER_TOKENIZER.format(framing=f" ({', '.join(parts)})")
