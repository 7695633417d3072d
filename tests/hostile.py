"""Hostile grammars, regexes and JSON schemas, as builders and hypothesis strategies, for the tests of the
bounds (`generation.grammar_bounds`), the compile processes (`generation.compile_sandbox`), the servers'
answers to them and the OpenAPI fuzz.

Each shape is one that crashed or stalled llguidance, or the gateway, before the bounds: chained rules
(Lark and GBNF), `$ref` chains (plain and through `properties`, `items`, `anyOf`), deep nesting, counted
repetitions multiplied. `beyond` draws only what the default bounds refuse; `within` only what they pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from modelhost.generation.grammar_bounds import JSON_NESTING_LIMIT, GrammarBounds

BOUNDS = GrammarBounds()
Schema = dict[str, Any]


def lark_chain(rules: int, body: str = "{next}") -> str:
    """`start: r0`, `r0: r1`, ... `r<rules>: "x"` (names in hex: 2,886 rules in 32,741 characters, as
    the issue's): each rule's body is `body` around the next rule."""
    lines = [f"r{i:x}: " + body.format(next=f"r{i + 1:x}") for i in range(rules)]
    return "start: r0\n" + "\n".join(lines) + f'\nr{rules:x}: "x"\n'


def lark_cycle(rules: int) -> str:
    """Rules that reach each other in one cycle (a recursive group as deep as all of them)."""
    lines = [f'r{i}: r{(i + 1) % rules} | "y"' for i in range(rules)]
    return "start: r0\n" + "\n".join(lines) + "\n"


def gbnf_chain(rules: int) -> str:
    lines = [f'r{i} ::= "a" r{i + 1}' for i in range(rules)]
    return "root ::= r0\n" + "\n".join(lines) + f'\nr{rules} ::= "x"\n'


def gbnf_wide(size: int) -> str:
    """A GBNF grammar of at most `size` characters that the bounds pass (flat: many short rules), which
    llguidance's converter takes a while to read."""
    rules: list[str] = []
    while True:
        rule = f'w{len(rules)} ::= "word {len(rules)} of a long list" [a-z]{{1,4}} ("!" | "?")\n'
        root = "root ::= " + " | ".join(f"w{i}" for i in range(len(rules) + 1)) + "\n"
        if len(root) + sum(map(len, rules)) + len(rule) > size:
            return "root ::= " + " | ".join(f"w{i}" for i in range(len(rules))) + "\n" + "".join(rules)
        rules.append(rule)


VIA: dict[str, Callable[[Schema], Schema]] = {
    "ref": lambda ref: ref,
    "properties": lambda ref: {"type": "object", "properties": {"a": ref}, "required": ["a"]},
    "items": lambda ref: {"type": "array", "items": ref},
    "anyOf": lambda ref: {"anyOf": [ref, {"type": "integer"}]},
}


def ref_chain(refs: int, via: str = "ref") -> Schema:
    """`$defs` d0 → d1 → ... → d<refs> (a string), each link through `via`."""
    defs = {f"d{i}": VIA[via]({"$ref": f"#/$defs/d{i + 1}"}) for i in range(refs)}
    return {"$defs": {**defs, f"d{refs}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def nested_schema(levels: int) -> Schema:
    """Objects within objects, inline, `levels` deep (two JSON levels each: the object, `properties`)."""
    schema: Schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def repetition_bomb(times: list[int]) -> str:
    """`(((a{n1}){n2}){n3})`: nested counted repetitions, multiplied."""
    pattern = "a"
    for count in times:
        pattern = f"({pattern}){{{count}}}"
    return pattern


def json_grammar(schema: Schema) -> str:
    return "start: %json " + json.dumps(schema) + "\n"


# ---------------------------------------------------------------- strategies

Hostile = tuple[str, Any]  # ("grammar", Lark or GBNF text) | ("json", a schema) | ("regex", a pattern)

# past each default bound, each drawn as the field it is sent in
# the issue's two, which killed the gateway (SIGSEGV) on their own
CRASHERS: st.SearchStrategy[Hostile] = st.sampled_from(
    [("grammar", lark_chain(2_886)), ("json", ref_chain(3_000))]
)
BEYOND: st.SearchStrategy[Hostile] = st.one_of(
    CRASHERS,
    st.integers(BOUNDS.max_depth, BOUNDS.max_rules - 2).map(lambda n: ("grammar", lark_chain(n))),
    st.integers(BOUNDS.max_rules, 2_886).map(lambda n: ("grammar", lark_chain(n))),  # 2,886: 32,741 chars
    st.integers(BOUNDS.max_depth, BOUNDS.max_rules - 1).map(lambda n: ("grammar", lark_cycle(n))),
    st.integers(10, 60).map(lambda n: ("grammar", lark_chain(n, "(" * 25 + '"a" {next}' + ")" * 25))),
    st.integers(BOUNDS.max_depth, 2_800).map(lambda n: ("grammar", gbnf_chain(n))),
    st.tuples(st.integers(BOUNDS.max_depth, 3_000), st.sampled_from(sorted(VIA))).map(
        lambda drawn: ("json", ref_chain(*drawn))
    ),
    st.integers(JSON_NESTING_LIMIT // 2 + 1, 400).map(lambda n: ("json", nested_schema(n))),
    st.lists(st.integers(2, 2_000), min_size=2, max_size=4)
    .filter(lambda times: _product(times) > BOUNDS.max_repeat)
    .map(lambda times: ("regex", repetition_bomb(times))),
)

# the same shapes, within every default bound
WITHIN: st.SearchStrategy[Hostile] = st.one_of(
    st.integers(1, BOUNDS.max_depth - 2).map(lambda n: ("grammar", lark_chain(n))),
    st.integers(1, BOUNDS.max_depth - 2).map(lambda n: ("grammar", gbnf_chain(n))),
    st.tuples(st.integers(1, BOUNDS.max_depth // 3 - 2), st.sampled_from(sorted(VIA))).map(
        lambda drawn: ("json", ref_chain(*drawn))
    ),
    st.integers(1, JSON_NESTING_LIMIT // 2 - 1).map(lambda n: ("json", nested_schema(n))),
    st.lists(st.integers(1, 100), min_size=1, max_size=2).map(
        lambda times: ("regex", repetition_bomb(times))
    ),
)


def _product(times: list[int]) -> int:
    product = 1
    for count in times:
        product *= count
    return product
