"""Llama's formats: JSON calls (Llama 3.x, and Llama 4 with its published template) and pythonic calls
(``[get_weather(city="Paris")]``: Meta's zero-shot format for Llama 3.2 and 4, and other models')."""

from __future__ import annotations

import ast

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    Tools,
    call_from_object,
    content_without,
    decode_at,
    find_first,
    make_call,
    skip_ws,
)


class Llama3JsonParser:
    """Llama 3.1/3.2: ``<|python_tag|>`` then JSON objects joined by ``;``, or an output of only such objects;
    Llama 4 writes its calls after ``<|python_start|>...<|python_end|>`` (its template's framing).

    ``"{"`` is a start marker because an untagged call begins with it: streaming holds back content from its
    first ``{`` (latency) rather than ever sending a call as content. Each object is its own block.
    """

    name = "llama3_json"
    start_markers: tuple[str, ...] = ("<|python_tag|>", "<|python_start|>", "{")
    _tags = ("<|python_tag|>", "<|python_end|>")

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        tagged = find_first(text, self._tags)
        if tagged is not None:
            prefix, pos = text[: tagged[0]].replace("<|python_start|>", ""), tagged[0] + len(tagged[1])
        else:
            prefix, pos = "", skip_ws(text, 0)
            if not text.startswith("{", pos):
                return ParsedOutput(content_without(text, []), [])
        items, stop = _scan_sequence(text, pos, ";")
        if tagged is None and skip_ws(text, stop) < len(text):
            # Untagged, the output is calls only if it is nothing but JSON objects; otherwise it is prose.
            return ParsedOutput(content_without(text, []), [])
        calls: list[ToolCall] = []
        invalid: list[str] = []
        for start, end, value in items:
            call = call_from_object(value, tools)
            if call is None:
                invalid.append(text[start:end])
            else:
                calls.append(call)
        if not calls:
            return ParsedOutput(content_without(text, []), [])
        pieces = (prefix.strip(), "; ".join(invalid), text[stop:].strip())
        return ParsedOutput(" ".join(piece for piece in pieces if piece) or None, calls)


def _scan_sequence(text: str, pos: int, sep: str) -> tuple[list[tuple[int, int, object]], int]:
    """JSON values joined by ``sep`` from ``pos``: each (start, end, value), and where decoding stopped."""
    items: list[tuple[int, int, object]] = []
    while True:
        pos = skip_ws(text, pos)
        decoded = decode_at(text, pos)
        if decoded is None:
            return items, pos
        value, end = decoded
        items.append((pos, end, value))
        pos = skip_ws(text, end)
        if not text.startswith(sep, pos):
            return items, end
        pos += len(sep)


class PythonicParser:
    """A Python list of calls with keyword arguments as the output's last thing, optionally in Llama 4's
    ``<|python_start|>...<|python_end|>``: ``[get_weather(city="Paris"), search(q="x")]``.

    Read with ``ast`` and never run: only literals (strings, numbers, booleans, None and JSON's
    true/false/null, lists, tuples, dicts, negative numbers) are arguments; anything else (a variable,
    an expression, a positional argument) makes the list text. The list is one block, taken only if
    every call in it is valid. Text before it is content (the list starts the output, a line, or follows
    a blank). ``"["`` is a start marker, as ``"{"`` is Llama 3's.
    """

    name = "pythonic"
    start_markers: tuple[str, ...] = ("<|python_start|>", "[")
    _max_tries = 8  # candidate list starts tried, from the first: a list's text is parsed whole each time

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        body = text.rstrip()
        body = body.removesuffix("<|python_end|>").rstrip()
        if not body.endswith("]"):
            return ParsedOutput(content_without(text, []), [])
        tries = 0
        pos = 0
        while (start := body.find("[", pos)) != -1 and tries < self._max_tries:
            pos = start + 1
            before = body[:start]
            if before and not before[-1].isspace() and not before.endswith("<|python_start|>"):
                continue
            tries += 1
            calls = _pythonic_calls(body[start:], tools)
            if calls is not None:
                return ParsedOutput(content_without(before.removesuffix("<|python_start|>"), []), calls)
        return ParsedOutput(content_without(text, []), [])


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _pythonic_calls(source: str, tools: Tools) -> list[ToolCall] | None:
    """The calls of a whole ``[f(a=1), g(b="x")]`` source, or None if it is not one or any call is invalid."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls: list[ToolCall] = []
    for node in tree.body.elts:
        call = _pythonic_call(node, tools)
        if call is None:
            return None
        calls.append(call)
    return calls


def _pythonic_call(node: ast.expr, tools: Tools) -> ToolCall | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted_name(node.func)
    arguments: dict[str, object] = {}
    try:
        for keyword in node.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            arguments[keyword.arg] = _literal(keyword.value)
    except (ValueError, RecursionError):
        return None
    return make_call(name, arguments, tools)


def _dotted_name(node: ast.expr) -> str | None:
    """``f`` or ``a.b.f`` as written; None for any other callee."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _literal(node: ast.expr) -> object:
    """The JSON value of a literal argument; ValueError for anything that is not a literal."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str | int | float)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):  # {**other}
            raise ValueError("not a literal")
        keys = [_literal(key) for key in node.keys if key is not None]
        if not all(isinstance(key, str) for key in keys):
            raise ValueError("JSON object keys are strings")
        return {key: _literal(value) for key, value in zip(keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise ValueError("not a literal")


PYTHONIC = PythonicParser()
LLAMA3_JSON = Llama3JsonParser()
