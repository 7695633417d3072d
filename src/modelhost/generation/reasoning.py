"""Reasoning apart from the answer: a reasoning model's text split into its reasoning and the rest.

A reasoning family writes its thinking first, between markers its chat template taught it: `<think>` …
`</think>` (Qwen3, QwQ, DeepSeek-R1, DeepSeek-V3.1, GLM-4.5), `Here is my thought process:` … `Here is
my response:` (Granite), or a harmony `analysis` channel (gpt-oss). Each parser here reads one answer as
it is generated (`feed`, then `finish`): what can already be sent as reasoning, what as the rest, holding
back only a possible partial marker (and whitespace that may turn out to lead into one). The whole text
and any chunking of it give the same split. The rest is what the tool parser then reads (`ChatChoice`):
tool calls after reasoning are parsed from it alone.

Whether the answer starts inside its reasoning is the prompt's business: a template whose generation
prompt already opens a thought (`<think>\\n`: DeepSeek-R1's, Qwen3's thinking models', DeepSeek-V3.1's with
`thinking`) leaves the marker out of the output. The replica decides it from the rendered prompt's last
tokens (`prompt_opens`) and says so on the request's `started` event (`reasoning_open`); DeepSeek-R1's
parser starts inside its reasoning whatever the prompt, as its distills always think. Standard library
only: the gateway imports it without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from modelhost.errors import InvalidRequest
from modelhost.generation.families import Family

# OpenAI's `reasoning_effort` values → whether a model with an on/off switch thinks.
THINKS = {
    "none": False,
    "minimal": False,
    "low": True,
    "medium": True,
    "high": True,
    "xhigh": True,
    "max": True,
}
HARMONY_EFFORTS = ("low", "medium", "high")  # gpt-oss's template's `reasoning_effort`


class ReasoningParser(Protocol):
    """One answer's reader. ``feed`` and ``finish`` answer (reasoning, rest) ready to send;
    ``in_reasoning``: the text fed so far ends inside the reasoning (its markers included), which is
    how `ChatChoice` counts reasoning tokens."""

    in_reasoning: bool

    def feed(self, text: str) -> tuple[str, str]: ...

    def finish(self) -> tuple[str, str]: ...


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Where the longest end of ``text`` that is a proper prefix of a marker starts (``len(text)``: none)."""
    for start in range(max(0, len(text) - max(len(m) for m in markers) + 1), len(text)):
        tail = text[start:]
        if any(m.startswith(tail) and m != tail for m in markers):
            return start
    return len(text)


def _find(text: str, markers: tuple[str, ...]) -> tuple[int, int]:
    """The first marker in ``text``: (where it starts, where it ends), or (-1, -1)."""
    found = [(i, i + len(m)) for m in markers if (i := text.find(m)) != -1]
    return min(found) if found else (-1, -1)


@dataclass
class Delimited:
    """Reasoning between a start and an end marker at the beginning of the answer.

    The start marker counts only where the answer begins (after whitespace); without it the answer is
    all rest, unless it started inside its reasoning (``opened``), when everything up to the end marker
    is reasoning, all of it if none comes. Whitespace around the reasoning and before the rest that
    follows it is dropped, as the templates write a newline on each side of the markers."""

    starts: tuple[str, ...]
    ends: tuple[str, ...]
    opened: bool = False
    state: str = "start"  # start → reasoning → after (skipping whitespace) → rest
    held: str = ""
    in_reasoning: bool = False

    def __post_init__(self) -> None:
        self.in_reasoning = self.opened

    def feed(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning, rest = "", ""
        while True:
            if self.state == "start":
                stripped = self.held.lstrip()
                start, end = _find(stripped, self.starts)
                if start == 0:
                    self.held, self.state, self.in_reasoning = stripped[end:], "lead", True
                    continue
                if not stripped or any(m.startswith(stripped) for m in self.starts):
                    break  # a start marker may still come
                self.state = "lead" if self.opened else "rest"
                continue
            if self.state == "lead":  # whitespace before the reasoning's first word
                self.held = self.held.lstrip()
                if not self.held:
                    break
                self.state = "reasoning"
                continue
            if self.state == "reasoning":
                start, end = _find(self.held, self.ends)
                if start != -1:
                    reasoning += self.held[:start].rstrip()
                    self.held, self.state, self.in_reasoning = self.held[end:], "after", False
                    continue
                keep = len(self.held[: _partial_suffix(self.held, self.ends)].rstrip())
                reasoning, self.held = reasoning + self.held[:keep], self.held[keep:]
                break
            if self.state == "after":
                self.held = self.held.lstrip()
                if not self.held:
                    break
                self.state = "rest"
                continue
            rest, self.held = rest + self.held, ""
            break
        return reasoning, rest

    def finish(self) -> tuple[str, str]:
        """The held text at the end: a start that never completed is the rest, unless the answer was
        open; a reasoning's trailing whitespace is dropped."""
        held, self.held = self.held, ""
        if self.state == "start" and self.opened:
            return held.strip(), ""
        if self.state in ("reasoning", "lead"):
            return held.rstrip(), ""
        return "", "" if self.state == "after" else held


# gpt-oss's harmony format: each message a header (`<|start|>assistant`, then `<|channel|>NAME`, perhaps a
# recipient and a content type) up to `<|message|>`, then its text up to a terminator. The prompt ends
# with `<|start|>assistant`, so the answer's first header starts at `<|channel|>`.
H_START, H_CHANNEL, H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
HARMONY_TOKENS = (H_START, H_CHANNEL, H_MESSAGE, "<|constrain|>", *H_ENDS)


@dataclass
class Harmony:
    """gpt-oss's channels: `analysis` messages are the reasoning, `final` messages' text is the rest
    (their control tokens stripped), and every other message (a `commentary` tool call, a preamble)
    stays in the rest exactly as written, for the harmony tool parser. An answer that does not start
    with a harmony header (its special tokens were not kept) is all rest."""

    state: str = "start"  # start → header → body → header ...; or plain (not harmony)
    held: str = ""
    channel: str = ""
    raw: bool = False  # this message is passed through as written
    analysed: bool = False  # an analysis message came before (the next one is joined by a newline)
    in_reasoning: bool = False

    def feed(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning, rest = "", ""
        while self.held:
            if self.state == "start":
                if self.held.startswith((H_CHANNEL, H_START)):
                    self.state = "header"
                elif any(m.startswith(self.held) for m in (H_CHANNEL, H_START)):
                    break
                else:
                    self.state = "plain"
                continue
            if self.state == "plain":
                rest, self.held = rest + self.held, ""
                break
            if self.state == "header":
                opened = self._header()
                if opened is None:
                    break
                thought, passed = opened
            else:
                thought, passed, ended = self._body()
                if not ended:
                    reasoning, rest = reasoning + thought, rest + passed
                    break
            reasoning, rest = reasoning + thought, rest + passed
        return reasoning, rest

    def _header(self) -> tuple[str, str] | None:
        """A complete header read off `held`: (reasoning, rest) it adds; None while it is incomplete."""
        at = self.held.find(H_MESSAGE)
        if at == -1:
            return None
        header, self.held = self.held[: at + len(H_MESSAGE)], self.held[at + len(H_MESSAGE) :]
        self.channel, self.state = _channel(header), "body"
        self.raw = self.channel not in ("analysis", "final")
        if self.raw:
            return "", header
        if self.channel != "analysis":
            return "", ""
        self.in_reasoning = True
        joined, self.analysed = ("\n" if self.analysed else ""), True
        return joined, ""

    def _body(self) -> tuple[str, str, bool]:
        """The message text read off `held` up to its terminator (kept only in a passed-through
        message) or a possible partial one: (reasoning, rest, whether the message ended)."""
        start, end = _find(self.held, (*H_ENDS, H_START, H_CHANNEL))
        if start == -1:
            keep = _partial_suffix(self.held, HARMONY_TOKENS)
            piece, self.held = self.held[:keep], self.held[keep:]
        else:
            closing = self.held[start:end] if self.held.startswith(H_ENDS, start) else ""
            piece = self.held[:start] + (closing if self.raw else "")
            self.held = self.held[start + len(closing) :]
            self.state, self.in_reasoning = "header", False
        if self.channel == "analysis":
            return piece, "", start != -1
        return "", piece, start != -1

    def finish(self) -> tuple[str, str]:
        """A message cut off (`max_tokens`) keeps the text it has; a header never finished is dropped
        (its channel is unknown), and text that is no harmony at all is the rest."""
        held, self.held = self.held, ""
        if self.state == "body" and self.channel == "analysis":
            return held, ""
        if self.state in ("body", "plain", "start"):
            return "", held
        return "", "" if held.startswith((H_CHANNEL, H_START)) else held


def _channel(header: str) -> str:
    """The channel a harmony header names (`<|channel|>analysis<|message|>` → `analysis`)."""
    after = header.split(H_CHANNEL, 1)[1] if H_CHANNEL in header else ""
    name = after.split("<|", 1)[0].strip()
    return name.split()[0] if name else ""


_THINK = (("<think>",), ("</think>",))
_GRANITE = (
    ("Here is my thought process:", "Here's my thought process:"),
    ("Here is my response:", "Here's my response:"),
)

# Each reasoning parser by name (`families.REASONING_PARSER_NAMES`): a new parser for an answer, told
# whether the prompt opened its reasoning; and the markers that must reach it as text (`MARKERS`).
REASONING_PARSERS: dict[str, Callable[[bool], ReasoningParser]] = {
    "qwen3": lambda opened: Delimited(*_THINK, opened=opened),
    "glm45": lambda opened: Delimited(*_THINK, opened=opened),
    "deepseek_v3": lambda opened: Delimited(*_THINK, opened=opened),
    "deepseek_r1": lambda opened: Delimited(*_THINK, opened=True),
    "granite": lambda opened: Delimited(*_GRANITE, opened=opened),
    "harmony": lambda opened: Harmony(),
}
MARKERS: dict[str, tuple[str, ...]] = {
    "qwen3": _THINK[0] + _THINK[1],
    "glm45": _THINK[0] + _THINK[1],
    "deepseek_v3": _THINK[0] + _THINK[1],
    "deepseek_r1": _THINK[0] + _THINK[1],
    "granite": (),
    "harmony": HARMONY_TOKENS,
}


def split(name: str, text: str, opened: bool = False) -> tuple[str, str]:
    """A whole answer's (reasoning, rest) with the parser `name`."""
    parser = REASONING_PARSERS[name](opened)
    reasoning, rest = parser.feed(text)
    more_reasoning, more_rest = parser.finish()
    return reasoning + more_reasoning, rest + more_rest


def prompt_opens(name: str | None, prompt_tail: str) -> bool:
    """Whether a rendered prompt ending in `prompt_tail` leaves the answer inside its reasoning: its last
    start marker comes after its last end marker (Qwen3's and DeepSeek's `<think>\\n` generation prompt;
    not `<think>\\n\\n</think>\\n\\n`, thinking switched off)."""
    if name not in ("qwen3", "glm45", "deepseek_v3", "deepseek_r1", "granite"):
        return False
    starts, ends = _GRANITE if name == "granite" else _THINK
    last_start = max(prompt_tail.rfind(m) for m in starts)
    return last_start != -1 and last_start > max(prompt_tail.rfind(m) for m in ends)


def effort_kwargs(family: Family, effort: str, param: str) -> dict[str, object]:
    """The chat-template variables that carry a reasoning effort to a family's template: its on/off
    switch (`enable_thinking`, `thinking`: `none`/`minimal` off, `low` and above on), or gpt-oss's
    `reasoning_effort` levels. A family without a switch cannot honour it: a 400 naming `param`."""
    switch = family.thinking_switch
    if switch is None:
        why = (
            "always reasons; its reasoning cannot be switched"
            if family.reasoning_parser
            else "does not reason apart from its answer"
        )
        raise InvalidRequest(
            f"{param} is not available for this model: its family ({family.name}) {why}.", param=param
        )
    if switch == "reasoning_effort":
        if effort not in HARMONY_EFFORTS:
            raise InvalidRequest(
                f"{param} {effort!r} is not one of this model's effort levels (low, medium, high).",
                param=param,
            )
        return {"reasoning_effort": effort}
    return {switch: THINKS[effort]}
