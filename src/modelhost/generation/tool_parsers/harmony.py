"""gpt-oss's harmony format, read from the decoded text with its special tokens kept.

An output is a run of messages, each ``[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>
TYPE]<|message|>TEXT`` ended by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (or the end of the text); the
first has no ``<|start|>assistant`` (the prompt ends with it), and ``to=`` may also come before
``<|channel|>``. A call is a message to ``functions.NAME`` whose text is the arguments' JSON. The reasoning
(``analysis``) is the reasoning parser's: here it is neither a call nor content, so this parser reads the
whole output and the output less its analysis alike. The ``final`` channel's text, and ``commentary``
written to no one (a preamble before calls), is the content.
"""

from __future__ import annotations

import re

from modelhost.generation.tool_parsers.base import ParsedOutput, ToolCall, Tools, find_first, make_call

_MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER_STARTS = ("<|start|>", "<|channel|>", "to=")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


class HarmonyParser:
    """Calls to ``functions.NAME`` (or to an offered tool's bare name), as described in the module.

    A call whose recipient is not an offered tool, or whose text is not a JSON object (cut short), stays
    in the content as written. ``"to="`` is a start marker because the output may begin with it.
    """

    name = "harmony"
    start_markers: tuple[str, ...] = _HEADER_STARTS

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        calls: list[ToolCall] = []
        pieces: list[str] = []
        pos = 0
        while (found := text.find(_MESSAGE, pos)) != -1:
            header_at = find_first(text[:found], _HEADER_STARTS, pos)
            header_start = found if header_at is None else header_at[0]
            pieces.append(text[pos:header_start])  # loose text before the message: content
            body_start = found + len(_MESSAGE)
            end = find_first(text, (*_ENDS, "<|start|>"), body_start)
            body_end = len(text) if end is None else end[0]
            pos = body_end if end is None or end[1] == "<|start|>" else body_end + len(end[1])
            header, body = text[header_start:found], text[body_start:body_end]
            recipient = _RECIPIENT.search(header)
            channel = _CHANNEL.search(header)
            if recipient is not None:
                call = self._call(recipient.group(1), body, tools)
                if call is None:
                    pieces.append(text[header_start:pos])
                else:
                    calls.append(call)
            elif channel is None or channel.group(1) != "analysis":
                pieces.append(body)
        pieces.append(text[pos:])
        content = "\n".join(piece.strip() for piece in pieces if piece.strip())
        return ParsedOutput(content or None, calls)

    @staticmethod
    def _call(recipient: str, body: str, tools: Tools) -> ToolCall | None:
        name = recipient.removeprefix("functions.")
        if not recipient.startswith("functions.") and recipient not in tools:
            return None  # a built-in tool's recipient (browser.search, python): not a function call
        return make_call(name, body, tools)


HARMONY = HarmonyParser()
