"""Turning generated token IDs into text as they arrive: incremental decoding and stop strings.

Decoding each new token alone breaks multi-byte characters and tokenizers that merge spaces, so
text is decoded over a short window of recent tokens and only the part that is final is released
(the approach of text-generation-inference and vLLM). Stop strings are found in the released text;
text that could still become a stop string is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Decode = Callable[[list[int]], str]
REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


@dataclass
class IncrementalDecoder:
    """Feeds token IDs, answers the new text each time (possibly empty while a character is split)."""

    decode: Decode
    tokens: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def push(self, token: int) -> str:
        self.tokens.append(token)
        before = self.decode(self.tokens[self.prefix_offset : self.read_offset])
        after = self.decode(self.tokens[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """What is left at the end (a trailing incomplete character as the replacement character)."""
        before = self.decode(self.tokens[self.prefix_offset : self.read_offset])
        after = self.decode(self.tokens[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.tokens)
        return after[len(before) :] if len(after) > len(before) else ""


@dataclass
class StopStrings:
    """Finds the first stop string in streamed text; the stop string itself is released only with
    `include` (vLLM's `include_stop_str_in_output`), never what follows it."""

    stops: Sequence[str]
    include: bool = False
    held: str = ""
    stopped: bool = False

    def feed(self, text: str) -> str:
        """The text that is safe to release now; sets `stopped` when a stop string completes."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.held += text
        found = [(i, len(s)) for i, s in ((self.held.find(s), s) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            start, length = min(found)
            released, self.held = self.held[: start + (length if self.include else 0)], ""
            return released
        keep = _longest_partial_stop(self.held, self.stops)
        released = self.held[: len(self.held) - keep]
        self.held = self.held[len(self.held) - keep :]
        return released

    def flush(self) -> str:
        released, self.held = ("" if self.stopped else self.held), ""
        return released


def _longest_partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the beginning of a stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best
