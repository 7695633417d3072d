"""A tenant's grammars, regexes and JSON schemas: the bounded pass before anything compiles them
(`generation.grammar_bounds`) and the compile processes they are then compiled in
(`generation.compile_sandbox`). The servers' answers are tested over HTTP in tests/test_gateway_processes.py
and tests/test_generation_engine.py (the replica's own check); the fuzzer sends the same shapes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from modelhost.errors import InvalidRequest
from modelhost.generation.compile_sandbox import CompileLimits, GrammarChecker
from modelhost.generation.grammar import json_schema_grammar, regex_grammar
from modelhost.generation.grammar_bounds import GrammarBounds, check_grammar_text, deepest
from tests.hostile import (
    BEYOND,
    BOUNDS,
    WITHIN,
    Hostile,
    gbnf_chain,
    gbnf_wide,
    json_grammar,
    lark_chain,
    lark_cycle,
    nested_schema,
    ref_chain,
)

PARAMS = {"grammar": "structured_outputs.grammar", "json": "response_format", "regex": "guided_regex"}
LOOSE = GrammarBounds(max_depth=10**6, max_rules=10**6, max_schema_values=10**7, max_repeat=10**9)


def checked(drawn: Hostile, bounds: GrammarBounds = BOUNDS) -> str:
    """What the gateway makes of a hostile field and then checks: the grammar an engine would get."""
    kind, value = drawn
    param = PARAMS[kind]
    if kind == "json":
        grammar = json_schema_grammar(value, 16, False, param)
    else:
        grammar = regex_grammar(value) if kind == "regex" else value
    check_grammar_text(grammar, param, bounds)
    return grammar


@given(drawn=BEYOND)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_hostile_shape_past_a_bound_is_a_400_naming_its_field_and_the_bound(drawn: Hostile) -> None:
    with pytest.raises(InvalidRequest) as refused:
        checked(drawn)
    error, param = refused.value, PARAMS[drawn[0]]
    assert error.param == param and error.code == "grammar_too_complex", error.message
    assert error.message.startswith(f"{param}: ") and "; the limit is " in error.message


@given(drawn=WITHIN)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_same_shapes_within_the_bounds_pass_them(drawn: Hostile) -> None:
    checked(drawn)


def largest_passing(make: Any, start: int = 1) -> str:
    """`make(n)` for the largest `n` the default bounds pass."""
    n = start
    while True:
        try:
            checked(make(n + 1))
        except InvalidRequest:
            return str(checked(make(n)))
        n += 1


def test_what_the_bounds_pass_compiles_on_a_quarter_of_a_replicas_stack() -> None:
    """The worst shapes measured, each as large as the default bounds let it be, compile with llguidance
    on a 2 MiB stack: a quarter of the 8 MiB a replica compiles on (each needed 8 MiB at about 1,000 to
    2,700 levels; grammar_bounds's table)."""
    worst = [
        largest_passing(lambda n: ("grammar", lark_chain(n))),
        largest_passing(lambda n: ("grammar", lark_cycle(n))),
        largest_passing(lambda n: ("grammar", lark_chain(n, '("a" {next})*'))),
        largest_passing(lambda n: ("grammar", lark_chain(n, "(" * 25 + '"a" {next}' + ")" * 25))),
        *(
            largest_passing(lambda n, via=via: ("json", ref_chain(n, via)))
            for via in ("ref", "properties", "items", "anyOf")
        ),
        largest_passing(lambda n: ("json", nested_schema(n))),
    ]
    script = textwrap.dedent(
        """
        import json, sys, threading, llguidance
        grammars, errors = json.load(sys.stdin), []
        threading.stack_size(2 << 20)
        validate = llguidance.LLMatcher.validate_grammar
        thread = threading.Thread(target=lambda: errors.extend(map(validate, grammars)))
        thread.start()
        thread.join()
        print(json.dumps(errors))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(worst), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert json.loads(done.stdout) == [""] * len(worst)


def test_a_recursive_group_weighs_its_whole_size_and_ordinary_recursion_passes() -> None:
    json_lark = (
        'start: value\nvalue: object | array | STRING | NUMBER\nobject: "{" (pair ("," pair)*)? "}"\n'
        'pair: STRING ":" value\narray: "[" (value ("," value)*)? "]"\nSTRING: /"[^"]*"/\nNUMBER: /[0-9]+/\n'
    )
    check_grammar_text(json_lark, "guided_grammar", BOUNDS)
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    check_grammar_text(json_grammar(tree), "response_format", BOUNDS)
    with pytest.raises(InvalidRequest, match=r"nests 30[0-9] deep"):
        check_grammar_text(lark_cycle(300), "guided_grammar", BOUNDS)  # each rule reaches all the others
    assert deepest([1, 1, 1, 5], [[1], [2], [1, 3], []]) == 1 + 2 + 5  # {1, 2} a cycle: weighed whole
    assert deepest([2, 3], [[], []]) == 3


@pytest.mark.parametrize(
    "text",
    [
        "root ::= " + "(" * 200_000,  # GBNF groups
        "start: " + "(" * 200_000,  # Lark groups
        "start: %json " + "[" * 200_000,  # JSON nested past anything a parser would take
        "start: /" + "(" * 100_000 + "/\n",  # a regex's groups (llguidance's parser refuses them)
        "start: " + "r " * 50_000 + "\nr: " + '"x" ' * 50_000,
    ],
)
def test_the_checks_read_hostile_text_in_one_pass_without_recursion(text: str) -> None:
    try:
        check_grammar_text(text, "guided_grammar", BOUNDS)
    except InvalidRequest as refused:
        assert refused.param == "guided_grammar"


def test_a_ref_outside_the_schema_is_refused_and_one_inside_is_followed() -> None:
    outside = {"$ref": "https://example.com/schema.json#/$defs/a"}
    with pytest.raises(InvalidRequest, match="points outside the schema"):
        check_grammar_text(json_grammar(outside), "response_format", BOUNDS)
    deep = ref_chain(BOUNDS.max_depth, "ref")
    deep["$defs"]["d0"] = {"$anchor": "first", **deep["$defs"]["d0"]}
    with pytest.raises(InvalidRequest, match="nests"):
        check_grammar_text(json_grammar({**deep, "$ref": "#first"}), "response_format", BOUNDS)


def test_a_schema_longer_than_its_byte_limit_is_refused_before_the_gateway_walks_it() -> None:
    """The walk that shapes a schema into a grammar runs on the event loop: a schema whose JSON passes
    `MAX_SCHEMA_BYTES` is a 400 naming its field before any of it is walked."""
    from modelhost.generation.grammar import MAX_SCHEMA_BYTES, json_schema_grammar, tool_call_grammar

    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(80_000)}}
    with pytest.raises(InvalidRequest) as refused:
        json_schema_grammar(wide, 16, strict=False)
    assert refused.value.param == "response_format" and refused.value.code == "grammar_too_complex"
    assert f"the limit is {MAX_SCHEMA_BYTES}" in refused.value.message
    with pytest.raises(InvalidRequest) as refused:
        tool_call_grammar([("f", {**wide, "description": 2**70})], 16)  # past orjson's integers too
    assert refused.value.param == "tools"
    assert "%json" in json_schema_grammar(
        {"type": "object", "properties": {"a": {"type": "string"}}}, 16, False
    )


def test_a_deeply_nested_schema_is_made_into_a_grammar_in_one_pass() -> None:
    """Each level used to copy the one below it twice (2^levels copies: 20 levels 6 s, 60 levels never
    ending, on the gateway's event loop)."""
    script = (
        "from modelhost.generation.grammar import json_schema_grammar\n"
        "from tests.hostile import nested_schema\n"
        "print(len(json_schema_grammar(nested_schema(60), 16, False)))\n"
    )
    root = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
    )  # fmt: skip
    assert done.returncode == 0 and int(done.stdout) > 60 * 40, done.stderr[-2000:]


# ---------------------------------------------------------------- compile processes


async def test_compile_processes_start_on_first_use_and_a_grammar_seen_before_costs_one_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grammars = GrammarChecker(16, BOUNDS, CompileLimits())
    try:
        assert grammars.pool.processes() == []  # none before a grammar comes
        gbnf = 'root ::= "yes" | "no"'
        lark = await grammars.compiled(gbnf, "structured_outputs.grammar")
        assert "start" in lark and '"yes"' in lark
        (process,) = grammars.pool.processes()
        calls: list[Any] = []
        monkeypatch.setattr(grammars.pool, "run", lambda job: calls.append(job))
        assert await grammars.compiled(gbnf, "structured_outputs.grammar") == lark
        assert calls == [] and grammars.pool.processes() == [process]
    finally:
        grammars.close()
    assert not _alive(process)


async def test_a_deployments_chat_template_is_compiled_in_a_compile_process_and_a_bad_one_is_a_400() -> None:
    """A tenant's Jinja goes through Jinja's parser and Python's compiler in a compile process, never in
    the gateway's own interpreter: a template that does not compile is a 400 naming `chat_template`."""
    grammars = GrammarChecker(16, BOUNDS, CompileLimits())
    try:
        await grammars.check_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        (process,) = grammars.pool.processes()
        with pytest.raises(InvalidRequest) as refused:
            await grammars.check_chat_template("{% for m in messages %}")
        assert refused.value.param == "chat_template" and "line 1" in refused.value.message
        with pytest.raises(InvalidRequest):  # a constant bomb is compiled, never folded into memory
            await grammars.check_chat_template("{{ 'x' * 2000000000 }}{% if %}")
        assert grammars.pool.processes() == [process]  # the same process: none of it crashed
    finally:
        grammars.close()


async def test_a_grammar_that_crashes_llguidance_is_a_400_naming_the_stack_and_its_process_is_replaced() -> (
    None
):
    """With the bounds loosened, a 3,000-$ref schema reaches llguidance, which overflows the compile
    process's stack (SIGSEGV): a 400, and the next compile gets a new process."""
    grammars = GrammarChecker(16, LOOSE, CompileLimits())
    try:
        await grammars.compiled('start: "x"\n', "guided_grammar")
        (first,) = grammars.pool.processes()
        with pytest.raises(InvalidRequest) as refused:
            await grammars.compiled(json_grammar(ref_chain(3_000)), "structured_outputs.json")
        assert (
            refused.value.param == "structured_outputs.json" and refused.value.code == "grammar_too_complex"
        )
        assert "4 MiB stack" in refused.value.message and "SIGSEGV" in refused.value.message
        assert await grammars.compiled('start: "y"\n', "guided_grammar") == 'start: "y"\n'
        assert grammars.pool.processes() not in ([], [first])
    finally:
        grammars.close()


async def test_a_compile_past_its_cpu_time_is_a_400_naming_it() -> None:
    """A GBNF chain llguidance's quadratic converter takes seconds over, the bounds loosened."""
    grammars = GrammarChecker(16, LOOSE, CompileLimits(cpu_seconds=1, timeout_seconds=300))  # CPU time only
    slow = "root ::= r0\n" + "".join(f'r{i} ::= "a" "b" r{i + 1}\n' for i in range(4_000)) + 'r4000 ::= "x"\n'
    try:
        with pytest.raises(InvalidRequest, match="took more than 1 s of CPU time") as refused:
            await grammars.compiled(slow, "guided_grammar")
        assert refused.value.code == "grammar_too_complex"
    finally:
        grammars.close()


async def test_a_compile_process_that_does_not_answer_in_time_is_killed_and_replaced() -> None:
    grammars = GrammarChecker(16, BOUNDS, CompileLimits())
    try:
        await grammars.compiled(gbnf_chain(3), "guided_grammar")
        (stuck,) = grammars.pool.processes()
        grammars.pool.limits = CompileLimits(timeout_seconds=0.5)
        os.kill(stuck, signal.SIGSTOP)
        with pytest.raises(InvalidRequest, match=r"took longer than 0\.5 s"):
            await grammars.compiled(gbnf_wide(32_000), "guided_grammar")
        assert not _alive(stuck)
        await grammars.compiled(gbnf_chain(4), "guided_grammar")  # not remembered: it may pass another time
    finally:
        grammars.close()


def test_compile_processes_die_with_the_process_that_started_them() -> None:
    script = (
        "import asyncio, sys, time\n"
        "from modelhost.generation.compile_sandbox import GrammarChecker, CompileLimits\n"
        "from modelhost.generation.grammar_bounds import GrammarBounds\n"
        "grammars = GrammarChecker(16, GrammarBounds(), CompileLimits())\n"
        "asyncio.run(grammars.compiled('start: \"x\"\\n', 'guided_grammar'))\n"
        "print(*grammars.pool.processes(), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill()  # SIGKILL: no cleanup of its own runs
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the compile process outlived its parent"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_the_checker_answers_concurrent_compiles_each_with_its_own_outcome() -> None:
    grammars = GrammarChecker(16, BOUNDS, CompileLimits(processes=2))
    try:
        texts = [gbnf_chain(n) for n in range(1, 6)] + ["start: nowhere\n"]
        outcomes = await asyncio.gather(
            *(grammars.compiled(t, "guided_grammar") for t in texts), return_exceptions=True
        )
        assert all(isinstance(o, str) and "start" in o for o in outcomes[:-1])
        assert isinstance(outcomes[-1], InvalidRequest) and len(grammars.pool.processes()) <= 2
    finally:
        grammars.close()
