"""Cheap, bounded checks of a tenant's grammar, regex or JSON schema, made before anything compiles it.

llguidance compiles a grammar recursively, in Rust: a grammar deep enough overflows the thread's stack and
the process dies of SIGSEGV (no exception to catch). Measured (llguidance 1.9.1, the gateway's, and 1.7.6,
vLLM's, alike; `LLMatcher.validate_grammar` and a matcher over a real tokenizer, as a replica compiles,
within 1 % of each other), in a child process on the main thread's default 8 MiB stack:

| shape                                                        | crashes at                          |
|--------------------------------------------------------------|-------------------------------------|
| chained Lark rules `r0: r1`, `r1: r2`... (or a cycle of them)| ~2,690 rules                        |
| chained `r_i: ("a" r_{i+1})*`                                | ~1,700 rules                        |
| chained rules each nesting 25 groups                         | ~170 rules (~4,400 nested levels)   |
| JSON Schema `$ref` chain `d_i: {"$ref": "#/$defs/d_{i+1}"}`  | ~2,480 refs                         |
| `$ref` chain through `items` / `properties` / `anyOf`        | ~1,090 / ~920 / ~1,030 refs         |
|                                                              | (2,170 / 2,740 / 3,080 JSON levels) |

Inline nesting alone cannot crash it: its JSON reader stops at 127 levels (`JSON_NESTING_LIMIT`), its Lark
reader at 30 nested groups or `%lark` grammars, its regex reader at 250 groups, each a clean error.
Counted repetitions (`(a{1000}){1000}`) cost a replica up to ~1.2 s and +250 MB when it compiles them
against its tokenizer (then llguidance's own lexer limits stop the growth).

So the one quantity that decides the stack a compile needs is its **depth**: the heaviest chain of
things it descends into. A Lark or GBNF rule weighs 1 + the groups nested at its deepest point (+ the
depth of a `%json` schema there); a JSON schema's every nested object or array weighs 1, and a `$ref`
leads on to its target. A recursive group (rules or schemas that reach each other) weighs its whole
size, since a depth-first compile may walk all of it before it meets one it has seen. With the default
bound of 256 the worst unit measured (~3.7 KiB of stack) leaves a grammar that passes under 1 MiB: 8x
below a replica's 8 MiB, 4x below the 4 MiB the compile process judges it on (`compile_sandbox`).

Every check here is linear in the text, stops at its bound, and never recurses in Python (explicit
stacks), so a hostile input costs no more than reading it. Standard library only: the vLLM worker runs
it in vLLM's environment before its engine compiles a grammar, as every replica does
(`check_engine_grammar`), so that a replica never compiles what the gateway would not have passed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from modelhost.errors import InvalidRequest
from modelhost.generation.contract import GenerationRequest

if TYPE_CHECKING:
    from modelhost.config import Settings

CODE = "grammar_too_complex"
JSON_NESTING_LIMIT = 127  # llguidance's JSON reader (serde_json) refuses deeper values


@dataclass(frozen=True)
class GrammarBounds:
    """The operator's bounds (`MODELHOST_GRAMMAR_MAX_*`, docs/operations.md, "Hostile input")."""

    max_depth: int = 256
    max_rules: int = 1_000
    max_schema_values: int = 50_000
    max_repeat: int = 10_000

    @classmethod
    def from_settings(cls, settings: Settings) -> GrammarBounds:
        return cls(
            settings.grammar_max_depth,
            settings.grammar_max_rules,
            settings.grammar_max_schema_values,
            settings.grammar_max_repeat,
        )


def too_complex(param: str, what: str, limit: int) -> InvalidRequest:
    return InvalidRequest(f"{param}: {what}; the limit is {limit}.", param=param, code=CODE)


def too_nested(param: str) -> InvalidRequest:
    what = f"the JSON schema nests objects and arrays more than {JSON_NESTING_LIMIT} levels deep"
    return too_complex(param, what, JSON_NESTING_LIMIT)


def is_lark(text: str) -> bool:
    """llguidance's own test (`gbnf_to_lark.is_lark_syntax`): Lark has a `start` rule or `%llguidance`."""
    return re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", text) is not None


def check_grammar_text(text: str, param: str, bounds: GrammarBounds) -> None:
    """A grammar as a client may send it (Lark, or GBNF before its conversion), or as an engine gets it."""
    (check_lark if is_lark(text) else check_gbnf)(text, param, bounds)


_PASSED: OrderedDict[bytes, None] = OrderedDict()  # hashes of grammars a replica passed (its requests repeat)


def check_engine_grammar(request: GenerationRequest) -> None:
    """A replica's check of a request's grammar before its engine compiles it, with the bounds of its own
    settings (the server's environment): the gateway ran the same check on the same text, so only a
    request that bypassed it fails here, as a 400 naming its field, never a crashed replica."""
    if grammar := request.grammar:
        from modelhost.config import get_settings  # the base layer: in vLLM's environment too

        bounds = GrammarBounds.from_settings(get_settings())
        key = hashlib.sha256(f"{bounds}\0{grammar}".encode()).digest()
        if key not in _PASSED:
            check_grammar_text(grammar, request.grammar_param or "grammar", bounds)
            _PASSED[key] = None
            if len(_PASSED) > 256:
                _PASSED.popitem(last=False)


# ---------------------------------------------------------------- graphs


def deepest(weights: list[int], edges: list[list[int]]) -> int:
    """The heaviest path's weight in a directed graph, each strongly connected component counted at its
    whole weight. Tarjan's algorithm, iterative: it closes each component after every component it
    reaches, so one pass also sums the depths."""
    count = len(weights)
    index, low, component = [-1] * count, [0] * count, [-1] * count
    on_stack, stack, depths = [False] * count, list[int](), list[int]()
    counter = 0
    for root in range(count):
        if index[root] != -1:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        work = [(root, 0)]
        while work:
            node, position = work[-1]
            if position < len(edges[node]):
                work[-1] = (node, position + 1)
                target = edges[node][position]
                if index[target] == -1:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack[target] = True
                    work.append((target, 0))
                elif on_stack[target]:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] != index[node]:
                continue
            members = []
            while True:
                member = stack.pop()
                on_stack[member] = False
                component[member] = len(depths)
                members.append(member)
                if member == node:
                    break
            below = max(
                (depths[component[t]] for m in members for t in edges[m] if component[t] != len(depths)),
                default=0,
            )
            depths.append(sum(weights[m] for m in members) + below)
    return max(depths, default=0)


# ---------------------------------------------------------------- regexes


_REPEAT = re.compile(r"\{[ \t]*([0-9]+)[ \t]*(?:,[ \t]*([0-9]*)[ \t]*)?\}")
_CLASS_ESCAPE = re.compile(r"\\[pPxu]\{[^}]*\}|\\.", re.S)


def regex_repeats(pattern: str, param: str, bounds: GrammarBounds) -> int:
    """How many times a regex's counted repetitions (`{n}`, `{n,m}`) repeat its innermost atom at most,
    nested ones multiplied; beyond `bounds.max_repeat`, a 400."""
    products, last, at = [1], 1, 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            escape = _CLASS_ESCAPE.match(pattern, at)
            at, last = (escape.end() if escape else at + 1), 1
        elif char == "[":
            at, last = _class_end(pattern, at), 1
        elif char == "(":
            products.append(1)
            at += 1
            continue
        elif char == ")":
            last = products.pop() if len(products) > 1 else 1
            at += 1
        elif char == "{" and (repeat := _REPEAT.match(pattern, at)):
            last *= int(repeat.group(2) or repeat.group(1))
            at = repeat.end()
        elif char in "*+?|":
            at += 1
            continue
        else:
            at, last = at + 1, 1
        products[-1] = max(products[-1], last)
        if last > bounds.max_repeat:
            shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
            raise too_complex(param, f"the regex /{shown}/ repeats {last} times", bounds.max_repeat)
    return max(products)


def _class_end(pattern: str, at: int) -> int:
    """Past the character class opening at `at` (Rust's classes nest: `[a-z&&[^aeiou]]`)."""
    depth, at = 1, at + 1
    if pattern.startswith("^", at):
        at += 1
    if pattern.startswith("]", at):  # a leading `]` is a literal
        at += 1
    while at < len(pattern) and depth:
        if pattern[at] == "\\":
            escape = _CLASS_ESCAPE.match(pattern, at)
            at = escape.end() if escape else at + 1
            continue
        depth += {"[": 1, "]": -1}.get(pattern[at], 0)
        at += 1
    return at


# ---------------------------------------------------------------- JSON schemas


def check_schema(schema: Any, param: str, bounds: GrammarBounds, seen: int = 0) -> tuple[int, int]:
    """A JSON schema's depth (its nested objects and arrays, `$ref`s leading on to their targets), after
    its size, nesting, references and regexes are checked, and the values read so far (`seen` before it:
    the bound is on a grammar's schemas together); a 400 naming `param` past a bound."""
    graph = _SchemaGraph(param, bounds)
    seen = graph.read(schema, seen)
    graph.link()
    depth = deepest([1] * len(graph.edges), graph.edges)
    if depth > bounds.max_depth:
        what = f"the JSON schema nests {depth} deep (objects, arrays and $ref hops along its deepest chain)"
        raise too_complex(param, what, bounds.max_depth)
    return depth, seen


class _SchemaGraph:
    """Every object and array of a schema as a node, linked to those it contains and to the targets of
    its `$ref`s (local JSON pointers, against the root and against the nearest `$id` resource; anchors)."""

    def __init__(self, param: str, bounds: GrammarBounds) -> None:
        self.param, self.bounds = param, bounds
        self.edges: list[list[int]] = []
        self.node_of: dict[int, int] = {}  # id() of a container → its node
        self.refs: list[tuple[int, str, Any]] = []  # (node, reference, its resource)
        self.anchors: dict[str, list[Any]] = {}
        self.resources: dict[str, Any] = {}  # `$id` → its object
        self.root: Any = None

    def read(self, schema: Any, values: int) -> int:
        self.root = schema
        todo: list[tuple[Any, int, Any, int]] = [(schema, -1, schema, 1)]
        while todo:
            value, parent, resource, level = todo.pop()
            values += 1
            if values > self.bounds.max_schema_values:
                what = f"the JSON schema has more than {self.bounds.max_schema_values} values"
                raise too_complex(self.param, what, self.bounds.max_schema_values)
            if not isinstance(value, dict | list):
                continue
            if level > JSON_NESTING_LIMIT:
                raise too_nested(self.param)
            node = len(self.edges)
            self.edges.append([])
            self.node_of[id(value)] = node
            if parent >= 0:
                self.edges[parent].append(node)
            children = value if isinstance(value, list) else self._keywords(value, node, resource)
            if isinstance(value, dict) and isinstance(value.get("$id"), str) and value is not schema:
                resource = value
            todo += [(child, node, resource, level + 1) for child in children]
        return values

    def _keywords(self, value: dict[str, Any], node: int, resource: Any) -> list[Any]:
        if isinstance(value.get("$id"), str):
            self.resources[value["$id"]] = value
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(value.get(key), str):
                self.anchors.setdefault(value[key], []).append(value)
        for key in ("$ref", "$dynamicRef"):
            if isinstance(value.get(key), str):
                self.refs.append((node, value[key], value if "$id" in value else resource))
        if "$recursiveRef" in value:
            self.refs.append((node, "#", self.root))
        if isinstance(value.get("pattern"), str):
            regex_repeats(value["pattern"], self.param, self.bounds)
        if isinstance(value.get("patternProperties"), dict):
            for pattern in value["patternProperties"]:
                regex_repeats(pattern, self.param, self.bounds)
        return list(value.values())

    def link(self) -> None:
        for node, reference, resource in self.refs:
            for target in self._targets(reference, resource):
                if id(target) in self.node_of:
                    self.edges[node].append(self.node_of[id(target)])

    def _targets(self, reference: str, resource: Any) -> list[Any]:
        base, _, fragment = reference.partition("#")
        if base:
            if base not in self.resources:
                raise InvalidRequest(
                    f"{self.param}: the JSON schema's $ref {reference[:80]!r} points outside the schema; "
                    "only references within it (#, #/..., #anchor, or an $id it declares) are taken.",
                    param=self.param,
                )
            resource = self.resources[base]
        if not fragment:
            return [resource]
        if not fragment.startswith("/"):
            return self.anchors.get(fragment, [])
        starts = [resource] if resource is self.root else [resource, self.root]
        return [t for start in starts if (t := _pointed(start, fragment)) is not None]


def _pointed(document: Any, pointer: str) -> Any:
    """The value a JSON pointer (`/a/0/b`, URI-escaped) names in `document`, or None."""
    value = document
    for token in pointer.split("/")[1:]:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(token)
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return None
    return value


# ---------------------------------------------------------------- grammars


_LARK = re.compile(
    r"""(?P<nl>(?:\r?\n)+[ \t]*)|(?P<ws>[ \t]+)|(?P<comment>(?:\#|//)[^\n]*)
    |(?P<string>"(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2})|[^"\\\x00-\x1f\x7f])*"i?)
    |(?P<regex>/(?:\\.|[^/\\])+/[imslux]*)|(?P<keyword>%[a-z_]+)
    |(?P<name>[!?]?_?[a-z][_a-z0-9\-]*|_?[A-Z][_A-Z0-9\-]*)|(?P<other>::|\.\.|->|.)""",
    re.X | re.S,
)
_LARK_DEFINES = re.compile(r"[ \t]*(?:\.[ \t]*-?[0-9]+[ \t]*)?:(?!:)")
_TILDE = re.compile(r"[ \t]*([0-9]+)(?:[ \t]*\.\.[ \t]*([0-9]+))?")
_GBNF = re.compile(
    r"""(?P<nl>\r?\n)|(?P<ws>[ \t]+)|(?P<comment>\#[^\n]*)|(?P<defines>::=)
    |(?P<string>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<name>[a-zA-Z0-9_-]+)|(?P<other>.)""",
    re.X | re.S,
)
_GBNF_DEFINES = re.compile(r"[ \t]*::=")
_JSON = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
_JSON_PAYLOADS = ("%json", "%regex", "%llguidance")


class _Rules:
    """A grammar's rules as they are read: each one's weight (1 + what it nests at its deepest), the
    names it refers to, and its counted repetitions multiplied (bounded as they are read)."""

    def __init__(self, param: str, bounds: GrammarBounds) -> None:
        self.param, self.bounds = param, bounds
        self.node_of: dict[str, int] = {}
        self.weights: list[int] = []
        self.refers: list[set[str]] = []
        self.current = -1
        self.nesting = 0
        self.products, self.last = [1], 1
        self.values = 0  # of the grammar's JSON schemas, together

    def define(self, name: str) -> None:
        if name not in self.node_of:
            if len(self.node_of) >= self.bounds.max_rules:
                what = f"the grammar has more than {self.bounds.max_rules} rules"
                raise too_complex(self.param, what, self.bounds.max_rules)
            self.node_of[name] = len(self.weights)
            self.weights.append(1)
            self.refers.append(set())
        self.current = self.node_of[name]
        self.products, self.last = [1], 1

    def refer(self, name: str) -> None:
        if self.current >= 0:
            self.refers[self.current].add(name)
        self.atom(1)

    def reach(self, extra: int = 0) -> None:
        """Something `extra` deep at the current nesting."""
        if self.current >= 0:
            self.weights[self.current] = max(self.weights[self.current], 1 + self.nesting + extra)

    def atom(self, product: int) -> None:
        self.last = product
        self.products[-1] = max(self.products[-1], product)

    def open(self) -> None:
        self.nesting += 1
        self.reach()
        self.products.append(1)

    def close(self) -> None:
        self.nesting = max(0, self.nesting - 1)
        self.atom(self.products.pop() if len(self.products) > 1 else 1)

    def repeat(self, times: int) -> None:
        self.atom(self.last * times)
        if self.last > self.bounds.max_repeat:
            what = f"the grammar repeats an item {self.last} times (counted repetitions multiplied)"
            raise too_complex(self.param, what, self.bounds.max_repeat)

    def check_depth(self) -> None:
        edges = [[self.node_of[n] for n in names if n in self.node_of] for names in self.refers]
        depth = deepest(self.weights, edges)
        if depth > self.bounds.max_depth:
            what = (
                f"the grammar nests {depth} deep (rules within rules, groups and JSON schemas along its "
                "deepest chain; a recursive group of rules counts whole)"
            )
            raise too_complex(self.param, what, self.bounds.max_depth)


def check_lark(text: str, param: str, bounds: GrammarBounds) -> None:
    """A grammar in llguidance's Lark: its rules, depth, repetitions, regexes and embedded JSON (`%json`
    schemas, `%regex` and `%llguidance` options) within `bounds`."""
    rules, at, line_start = _Rules(param, bounds), 0, True
    while at < len(text):
        token = _LARK.match(text, at)
        assert token is not None  # `other` matches any character
        kind, value, at = token.lastgroup, token.group(), token.end()
        if kind == "nl":
            line_start = True
            continue
        if kind in ("ws", "comment"):
            continue
        starts, line_start = line_start, False
        if kind == "name" and starts and (defines := _LARK_DEFINES.match(text, at)):
            rules.define(value.lstrip("!?"))
            at = defines.end()
        elif kind == "name":
            rules.refer(value.lstrip("!?"))
        elif kind == "keyword" and value in _JSON_PAYLOADS:
            at, payload = _json_payload(text, at, param)
            depth, rules.values = check_schema(payload, param, bounds, rules.values)
            rules.reach(depth)
        elif kind == "string":
            rules.atom(1)
        elif kind == "regex":
            rules.atom(regex_repeats(value[1 : value.rindex("/")], param, bounds))
        elif value == "{" and (repeat := _REPEAT.match(text, at - 1)):
            rules.repeat(int(repeat.group(2) or repeat.group(1)))
            at = repeat.end()
        elif value == "~" and (tilde := _TILDE.match(text, at)):
            rules.repeat(int(tilde.group(2) or tilde.group(1)))
            at = tilde.end()
        elif value in "([{":
            rules.open()
        elif value in ")]}":
            rules.close()
    rules.check_depth()


def check_gbnf(text: str, param: str, bounds: GrammarBounds) -> None:
    """A GBNF grammar (llama.cpp's), before llguidance converts it (its converter is quadratic in the
    rules a chain of them spans: the bounds come first)."""
    rules, at = _Rules(param, bounds), 0
    while at < len(text):
        token = _GBNF.match(text, at)
        assert token is not None
        kind, value, at = token.lastgroup, token.group(), token.end()
        if kind == "name" and (defines := _GBNF_DEFINES.match(text, at)):
            rules.define(value)
            at = defines.end()
        elif kind == "name":
            rules.refer(value)
        elif kind in ("string", "cls") or value == ".":
            rules.atom(1)
        elif value == "{" and (repeat := _REPEAT.match(text, at - 1)):
            rules.repeat(int(repeat.group(2) or repeat.group(1)))
            at = repeat.end()
        elif value == "(":
            rules.open()
        elif value == ")":
            rules.close()
    rules.check_depth()


def _json_payload(text: str, at: int, param: str) -> tuple[int, Any]:
    """The JSON value after a `%json`-like keyword, and where it ends. Python's reader is C: a value
    nested past its recursion limit is a RecursionError, refused like any nested past ours."""
    space = _SPACE.match(text, at)
    start = space.end() if space else at
    try:
        value, end = _JSON.raw_decode(text, start)
    except RecursionError:
        raise too_nested(param) from None
    except ValueError:
        raise InvalidRequest(f"{param}: a JSON value that cannot be read.", param=param) from None
    return end, value
