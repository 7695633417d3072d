"""A tenant's JSON values checked against a tenant's JSON schema (an eval's `item_schema`,
docs/evals.md): the schema vetted when it is given (`check_value_schema`), the values checked where a
runaway check costs only the request (`first_mismatch`, run in a compile process: `compile_sandbox`).

**The schema** is untrusted. `grammar_bounds.check_schema` reads it first, within the operator's bounds
(`MODELHOST_GRAMMAR_MAX_*`: its values, its depth, its regexes' counted repetitions) and refusing every
`$ref` that points outside it; only then is it checked against its dialect's meta-schema (`$schema`:
Draft 2020-12 when absent, as OpenAI's evals take it; 2019-09 and draft-07 too).

**References never fetch.** The `jsonschema` library's default registry downloads an http(s) `$ref` it
does not know (with a warning). Here the validator's registry is an empty `referencing.Registry`, which
has no retriever: a reference resolves within the schema (`#/$defs/...`, an anchor, an `$id` it
declares) or is an error, and none that escapes passes the bound check anyway.

**Checking values is not bounded by the schema's size.** A `pattern` (or a `patternProperties` key) is
a backtracking Python regex (`(a+)+$` against a long string runs for ages, holding the interpreter);
`anyOf` branches under a recursive `$ref` multiply with the value's depth; `uniqueItems` compares
pairs. So values are checked in a compile process, under its CPU, memory and time limits
(`MODELHOST_GRAMMAR_COMPILE_*`), never in a gateway's or supervisor's own interpreter: overrunning them
is the request's 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

from modelhost.errors import InvalidRequest
from modelhost.generation.grammar_bounds import GrammarBounds, check_schema

Dialect = Any  # a `jsonschema` validator class (the library ships no type information)
DIALECTS: dict[str, Dialect] = {
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
    "https://json-schema.org/draft/2019-09/schema": Draft201909Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
}
SHOWN = 300  # characters of a validation message kept (jsonschema's quote the value, whatever its size)


def dialect_of(schema: Mapping[str, Any], param: str) -> Dialect:
    """The validator of the schema's `$schema` (Draft 2020-12 when it has none); a 400 for another."""
    given = schema.get("$schema")
    if given is None:
        return Draft202012Validator
    found = DIALECTS.get(given.rstrip("#")) if isinstance(given, str) else None
    if found is None:
        known = ", ".join(DIALECTS)
        raise InvalidRequest(
            f"{param}.$schema must be one of {known} (or absent: Draft 2020-12).", param=param
        )
    return found


def check_value_schema(schema: Any, param: str, bounds: GrammarBounds) -> None:
    """A tenant's JSON schema, checked within `bounds` and then against its dialect's meta-schema; a 400
    naming `param` (and, for a meta-schema failure, where in the schema) if it is not one."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON schema (an object).", param=param)
    check_schema(schema, param, bounds)
    dialect = dialect_of(schema, param)
    try:
        dialect.check_schema(schema)
    except SchemaError as exc:
        raise InvalidRequest(
            f"{param} is not a valid JSON schema: {_short(exc.message)} (at {exc.json_path}).", param=param
        ) from None


def first_mismatch(
    schema: Mapping[str, Any], values: Sequence[Any], names: Sequence[str], what: str
) -> str | None:
    """Why the first of `values` that does not conform to `schema` does not (named by its entry of
    `names`), or None when all do. Run where a runaway check is bounded (module docstring)."""
    dialect = dialect_of(schema, what)
    validator = dialect(schema, registry=Registry())  # nothing is ever retrieved
    for value, name in zip(values, names, strict=True):
        try:
            error = best_match(validator.iter_errors(value))
        except RecursionError:
            return f"{name} nests too deep to be checked against {what}."
        except Unresolvable as exc:
            return f"{what} has a $ref that does not resolve within it: {_short(str(exc))}."
        if error is not None:
            return f"{name} does not match {what}: {_short(error.message)} (at {error.json_path})."
    return None


def _short(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."
