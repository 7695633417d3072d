"""Eval templates: `{{item.x}}` and `{{sample.output_text}}` replaced by their values, and nothing else.

A template is a tenant's text. It is rendered by a bounded plain substitution, never evaluated: a
reference is `item` or `sample` followed by up to MAX_DEPTH names or list indexes (`{{item.a.b}}`,
`{{item.choices.0}}`); any other `{{...}}` stays as it was written. A value that is not a string is
written as JSON. What one rendering may produce is bounded (MAX_RENDERED), so that a template repeating
a large item cannot make the gateway build gigabytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from modelhost.errors import InvalidRequest

MAX_DEPTH = 8
MAX_RENDERED = 1024 * 1024  # characters of one rendered template
REFERENCE = re.compile(r"\{\{\s*(item|sample)((?:\.[A-Za-z0-9_\-]{1,128}){1,8})\s*\}\}")  # MAX_DEPTH
NAMESPACES = ("item", "sample")


def render(template: str, values: Mapping[str, Any]) -> str:
    """`template` with each reference to `values` (`item`, `sample`) replaced; a missing one is empty."""
    size = 0

    def value(match: re.Match[str]) -> str:
        nonlocal size
        text = _text(lookup(values.get(match.group(1)), match.group(2)[1:].split(".")))
        size += len(text)
        if size > MAX_RENDERED:
            raise InvalidRequest(f"A rendered template would be longer than {MAX_RENDERED} characters.")
        return text

    return REFERENCE.sub(value, template)


def references(template: str) -> list[tuple[str, list[str]]]:
    """The references of a template: (namespace, path), for checks before a run."""
    return [(m.group(1), m.group(2)[1:].split(".")) for m in REFERENCE.finditer(template)]


def lookup(value: Any, path: list[str]) -> Any:
    for name in path:
        if isinstance(value, Mapping):
            value = value.get(name)
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        else:
            return None
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
