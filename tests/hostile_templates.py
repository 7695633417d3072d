"""Chat templates a hostile tenant would write (issue 58, "Chat templates"): each a small Jinja text that
costs a replica far more than its size, for the tests of the render's budget (`generation.chat_templates`)
and for anyone else who needs one (the OpenAPI fuzzer's `chat_template`, a deployment's settings).

Every builder returns a template that renders the messages as a plain template would when it is not
triggered, so that one deployment can serve ordinary requests and bombs alike: `triggered` wraps a bomb
in `{% if bomb == '<name>' %}`, the request's `chat_template_kwargs` choosing which to set off.
"""

from __future__ import annotations

from hypothesis import strategies as st

PLAIN = "{%- for m in messages %}{{ m.content }}\n{% endfor %}"


def nested_loops(outer: int = 100_000, inner: int = 100_000) -> str:
    """Loops with empty bodies: CPU and nothing else (12,000 × 12,000 held a replica 19.6 s)."""
    return f"{{% for i in range({outer}) %}}{{% for j in range({inner}) %}}{{% endfor %}}{{% endfor %}}"


def repeated_string(characters: int = 150_000_000) -> str:
    """One `*` that makes a string of `characters` (150 M took a replica from 396 MB to 968 MB)."""
    return f"{{{{ 'x' * {characters} }}}}"


def doubling(times: int = 40) -> str:
    """A string doubled `times` times with `~`: each step small, the last 2^times characters."""
    return (
        "{% set ns = namespace(s='x') %}"
        f"{{% for i in range({times}) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}{{{{ ns.s }}}}"
    )


def shared_nesting(depth: int = 40) -> str:
    """A list nested into itself `depth` times: a few items, 2^depth strings once written out."""
    return (
        "{% set ns = namespace(a=['x' * 1000]) %}"
        f"{{% for i in range({depth}) %}}{{% set ns.a = [ns.a, ns.a] %}}{{% endfor %}}{{{{ ns.a }}}}"
    )


def kept_copies(copies: int = 100_000, characters: int = 900_000) -> str:
    """Distinct large strings kept in a list: each one within any single bound, together gigabytes."""
    return (
        f"{{% set s = 'x' * {characters} %}}{{% set ns = namespace(kept=[]) %}}"
        f"{{% for i in range({copies}) %}}{{% set ns.kept = ns.kept + [s ~ i] %}}{{% endfor %}}"
    )


def branching_macro(depth: int = 40) -> str:
    """A macro that calls itself twice: 2^depth calls, no loop."""
    return (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        f"{{{{ f({depth}) }}}}"
    )


def markup_doubling(times: int = 40) -> str:
    """`doubling` with `+` on a `Markup` string (`|safe`), which is not a plain `str`."""
    return (
        "{% set ns = namespace(s='x'|safe) %}"
        f"{{% for i in range({times}) %}}{{% set ns.s = ns.s + ns.s %}}{{% endfor %}}{{{{ ns.s }}}}"
    )


def summed_lists(copies: int = 1000, items: int = 100_000) -> str:
    """One filter call (`sum` from an empty list) that makes a list of `copies` × `items` items."""
    return f"{{% set x = [1] * {items} %}}{{{{ ([x] * {copies})|sum(start=[])|length }}}}"


def wide_padding(width: int = 1_000_000_000) -> str:
    """A filter, a method and a format that pad to `width`."""
    return f"{{{{ 'x'|center({width}) }}}}{{{{ 'x'.ljust({width}) }}}}{{{{ '%{width}s' % 'x' }}}}"


BOMBS = {
    "loops": nested_loops(),
    "string": repeated_string(),
    "doubling": doubling(),
    "nesting": shared_nesting(),
    "copies": kept_copies(),
    "macro": branching_macro(),
    "padding": wide_padding(),
    "markup": markup_doubling(),
    "summed": summed_lists(),
}
TIME_BOMBS = ("loops", "macro")  # stopped by the time budget (`chat_template_timeout`); the others by size


def triggered(bombs: dict[str, str] = BOMBS, rest: str = PLAIN) -> str:
    """A template that renders `rest` unless the request's `bomb` argument names one of `bombs`."""
    armed = "".join(f"{{%- if bomb == {name!r} %}}{text}{{% endif %}}" for name, text in bombs.items())
    return "{%- set bomb = bomb | default('') %}" + armed + rest


def bombs() -> st.SearchStrategy[str]:
    """Hypothesis: one of the bombs, at a size well past any budget."""
    return st.one_of(
        st.builds(nested_loops, st.integers(20_000, 100_000), st.integers(20_000, 100_000)),
        st.builds(repeated_string, st.integers(10_000_000, 10**9)),
        st.builds(doubling, st.integers(25, 60)),
        st.builds(shared_nesting, st.integers(25, 60)),
        st.builds(branching_macro, st.integers(30, 60)),
        st.builds(wide_padding, st.integers(10_000_000, 10**9)),
    )
