"""Formats whose argument values are text in tags, typed by the tool's schema: Qwen3-Coder, GLM-4.5."""

from __future__ import annotations

import re

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    Tools,
    content_without,
    make_call,
    skip_ws,
    typed_arguments,
)

_QWEN_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
# A parameter ends at `</parameter>`, or where the next one starts (models drop the closing tag).
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Qwen3XmlParser:
    """Qwen3-Coder: ``<tool_call>\\n<function=name>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n
    </tool_call>`` blocks anywhere (also a bare ``<function=...>`` block, as vLLM reads it).

    A value is the text between the tags less one leading and one trailing newline (the template's
    framing), typed by the tool's schema (:func:`typed_arguments`). ``</tool_call>`` may be missing when
    nothing follows. Anything but blanks between the tags makes the block text.
    """

    name = "qwen3_xml"
    start_markers: tuple[str, ...] = ("<tool_call>", "<function=")
    _open = "<tool_call>"
    _close = "</tool_call>"

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        calls: list[ToolCall] = []
        removed: list[tuple[int, int]] = []
        pos = 0
        while (match := _QWEN_FUNCTION.search(text, pos)) is not None:
            pos = match.end()
            call = self._call(match, tools)
            if call is None:
                continue
            start, end = match.start(), match.end()
            opened = text.rfind(self._open, removed[-1][1] if removed else 0, start)
            if opened != -1 and not text[opened + len(self._open) : start].strip():
                after = skip_ws(text, end)
                if text.startswith(self._close, after):
                    end = after + len(self._close)
                elif after < len(text):
                    continue  # an unclosed block followed by text
                start = opened
            calls.append(call)
            removed.append((start, end))
            pos = end
        return ParsedOutput(content_without(text, removed), calls)

    @staticmethod
    def _call(match: re.Match[str], tools: Tools) -> ToolCall | None:
        name, body = match.group(1).strip(), match.group(2)
        values: dict[str, str] = {}
        for parameter in _QWEN_PARAMETER.finditer(body):
            value = parameter.group(2)
            value = value.removeprefix("\n").removesuffix("\n")
            values[parameter.group(1).strip()] = value
        if _QWEN_PARAMETER.sub("", body).strip() or name not in tools:
            return None
        return make_call(name, typed_arguments(values, tools[name]), tools)


class Glm45Parser:
    """GLM-4.5 / 4.6: ``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``
    blocks anywhere; values typed by the tool's schema (:func:`typed_arguments`), keys stripped, values
    as written. ``</tool_call>`` may be missing when nothing follows."""

    name = "glm45"
    start_markers: tuple[str, ...] = ("<tool_call>",)
    _open = "<tool_call>"
    _close = "</tool_call>"

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        calls: list[ToolCall] = []
        removed: list[tuple[int, int]] = []
        pos = 0
        while (start := text.find(self._open, pos)) != -1:
            pos = start + len(self._open)
            close = text.find(self._close, pos)
            following = text.find(self._open, pos)
            if close == -1 or (following != -1 and following < close):
                if following != -1:
                    continue  # unclosed, and another block follows
                body, end = text[pos:], len(text)
            else:
                body, end = text[pos:close], close + len(self._close)
            call = self._call(body, tools)
            if call is not None:
                calls.append(call)
                removed.append((start, end))
                pos = end
        return ParsedOutput(content_without(text, removed), calls)

    @staticmethod
    def _call(body: str, tools: Tools) -> ToolCall | None:
        first = body.find("<arg_key>")
        name = (body if first == -1 else body[:first]).strip()
        if name not in tools or "\n" in name or "<" in name:
            return None
        arguments = body[len(body) if first == -1 else first :]
        values = {match.group(1).strip(): match.group(2) for match in _GLM_ARGUMENT.finditer(arguments)}
        if _GLM_ARGUMENT.sub("", arguments).strip():
            return None  # text between the pairs, or an unfinished pair
        return make_call(name, typed_arguments(values, tools[name]), tools)


QWEN3_XML = Qwen3XmlParser()
GLM45 = Glm45Parser()
