"""vLLM's structured outputs (`structured_outputs`, and its older `guided_*` fields) as grammars.

Every constraint becomes a Lark grammar of llguidance's dialect, the one grammar language both engines
run (`generation.grammar`): a regex is a rule of one regex terminal, a choice the alternatives of its
strings, a JSON Schema what `response_format` makes of one, and a client's grammar is read as vLLM's
guidance backend reads it (Lark, or GBNF converted to Lark). The grammar is checked in the gateway before
the request is dispatched (`compile_sandbox.GrammarChecker.check`: bounds, then llguidance in a compile
process), so a regex or grammar that llguidance rejects, or that is too deep or large to compile safely,
is a 400 naming its field before an engine sees it, alike on every engine.
"""

from __future__ import annotations

import json
from typing import Any

from modelhost.errors import InvalidRequest
from modelhost.generation.grammar import choice_grammar, json_schema_grammar, regex_grammar
from modelhost.protocol.chat import SamplingFields

KINDS = ("json", "regex", "choice", "grammar")  # each also a deprecated `guided_<kind>` field


def structured_grammar(body: SamplingFields, max_string_length: int) -> tuple[str, str] | None:
    """The grammar of the request's structured output and the field its errors name; None without one."""
    found = _constraint(body)
    if found is None:
        return None
    kind, value, param = found
    if kind == "regex":
        grammar = regex_grammar(value)
    elif kind == "choice":
        grammar = choice_grammar(value)
    elif kind == "grammar":
        grammar = value  # Lark, or GBNF that the compile process converts (`compile_sandbox`)
    else:  # json, json_object
        spec = body.structured_outputs
        strict = kind == "json" and bool(spec and spec.disable_additional_properties)
        grammar = json_schema_grammar(_schema(value, param), max_string_length, strict, param)
    return grammar, param


def _constraint(body: SamplingFields) -> tuple[str, Any, str] | None:
    """(kind, value, field) of the one constraint the request sets; two are a 400 naming the second."""
    given = [
        (kind, getattr(body, f"guided_{kind}"), f"guided_{kind}")
        for kind in KINDS
        if getattr(body, f"guided_{kind}") is not None
    ]
    spec = body.structured_outputs
    if spec is not None:
        values = {kind: getattr(spec, "json_" if kind == "json" else kind) for kind in KINDS}
        kind = next((k for k, v in values.items() if v is not None), "json_object")
        value = values.get(kind, {"type": "object"})
        given.insert(0, (kind, value, f"structured_outputs.{kind}"))
    if len(given) > 1:
        raise InvalidRequest(
            f"{given[1][2]}: send one of structured_outputs and the guided_ fields, not several.",
            param=given[1][2],
        )
    return given[0] if given else None


def _schema(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """A JSON Schema given as an object or as its JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidRequest(f"{param}: not valid JSON.", param=param) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{param}: a JSON Schema is an object.", param=param)
    return value
