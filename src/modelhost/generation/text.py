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
REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete or invalid UTF-8 sequence to
CHARACTER_WAIT = 3  # a UTF-8 character has at most 4 bytes: at most 3 can wait for the rest


@dataclass
class IncrementalDecoder:
    """Feeds token IDs, answers the new text each time (empty while a character is split).

    A decoded U+FFFD is either bytes that no continuation can complete (final) or the start of a
    character still arriving (held). `decode` answers text, not bytes, so which one is told by what
    follows: everything up to a real character is final (a character cannot span one), and a U+FFFD that
    is still one after `CHARACTER_WAIT` more tokens with bytes is final too, as its character could only
    have waited for that many more bytes (a skipped special token has none: it does not count). So
    invalid bytes are released as U+FFFD as soon as that is known, never only at the end (issue 59).
    """

    decode: Decode
    tokens: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    released: int = 0  # characters released beyond the text of tokens[prefix_offset:read_offset]

    def push(self, token: int) -> str:
        self.tokens.append(token)
        before = self.decode(self.tokens[self.prefix_offset : self.read_offset])
        after = self.decode(self.tokens[self.prefix_offset :])
        start = len(before) + self.released
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            self.released = 0
            return after[start:]
        final = self._final(after)
        if final <= start:
            return ""
        self.released = final - len(before)
        return after[start:final]

    def flush(self) -> str:
        """What is left at the end (a trailing incomplete character as the replacement character)."""
        before = self.decode(self.tokens[self.prefix_offset : self.read_offset])
        after = self.decode(self.tokens[self.prefix_offset :])
        start = len(before) + self.released
        self.prefix_offset = self.read_offset = len(self.tokens)
        self.released = 0
        return after[start:] if len(after) > start else ""

    def _final(self, after: str) -> int:
        """How much of `after` (the text of tokens[prefix_offset:], ending in U+FFFD) no later token
        can change: up to its last real character, and the U+FFFDs that the text without its last
        `CHARACTER_WAIT` tokens with bytes shows too (the bytes after them are too many to be theirs)."""
        final = len(after.rstrip(REPLACEMENT))
        waiting, end = 0, len(self.tokens)
        while end > self.prefix_offset and waiting < CHARACTER_WAIT:
            end -= 1
            waiting += self.decode(self.tokens[end : end + 1]) != ""
        if waiting < CHARACTER_WAIT or end <= self.prefix_offset:
            return final
        settled = self.decode(self.tokens[self.prefix_offset : end])
        same = next((i for i, (a, b) in enumerate(zip(settled, after, strict=False)) if a != b), None)
        return max(final, min(len(settled), len(after)) if same is None else same)


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
