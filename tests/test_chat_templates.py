"""A chat template's render under its budget (`generation.chat_templates`): every bomb of
tests/hostile_templates.py stopped with a 400 naming `chat_template` and its bound, the families' templates
rendered exactly as transformers' own sandbox renders them, a render in a thread stopped when its task is
cancelled, and the gateway's compile check never folding a bomb into memory. No model, no server: the
HTTP side is in tests/test_chat.py ("Chat templates under a budget")."""

from __future__ import annotations

import asyncio
import copy
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils

from modelhost.config import get_settings
from modelhost.errors import ClientClosedRequest, InvalidRequest, ModelhostError
from modelhost.generation import chat_templates
from modelhost.generation.deployment_settings import check_chat_template
from tests.hostile_templates import BOMBS, PLAIN, TIME_BOMBS, bombs, nested_loops, triggered
from tests.tiny_models.families import MODELS

HELLO = [{"role": "user", "content": "hello"}]
# transformers' assistant-token masks render through `Template.generate`, piece by piece
MASKED = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{% generation %}{{ m.content }}{% endgeneration %}"
    "{%- else %}{{ m.role ~ ': ' ~ m.content }}\n{% endif %}{%- endfor %}"
)


def render(template: str, messages: list[dict[str, Any]] = HELLO, **options: Any) -> Any:
    """transformers' own render of a chat template (what `apply_chat_template` calls), after `install`."""
    chat_templates.install()
    rendered, masks = chat_template_utils.render_jinja_template(
        conversations=[copy.deepcopy(messages)], chat_template=template, **options
    )
    return (rendered[0], masks) if options.get("return_assistant_tokens_mask") else rendered[0]


@contextmanager
def transformers_own_sandbox() -> Iterator[None]:
    """Templates compiled in jinja2's `ImmutableSandboxedEnvironment`, as transformers does unpatched."""
    chat_template_utils.ImmutableSandboxedEnvironment = ImmutableSandboxedEnvironment
    chat_template_utils._compile_jinja_template.cache_clear()
    try:
        yield
    finally:
        chat_template_utils.ImmutableSandboxedEnvironment = chat_templates.BudgetedSandbox
        chat_template_utils._compile_jinja_template.cache_clear()


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_template_bomb_is_a_400_naming_chat_template_and_the_bound_it_passed(name: str) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with chat_templates.limits(seconds=0.05), pytest.raises(InvalidRequest) as refused:
        render(BOMBS[name])
    error = refused.value
    assert error.param == "chat_template", error.message
    if name in TIME_BOMBS:
        assert error.code == "chat_template_timeout" and "0.05 CPU seconds" in error.message
    else:
        assert error.code == "chat_template_too_large" and "1,000,000" in error.message, error.message
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mb < 200, grown_mb  # a coarse bound: what it may build is 16 M characters


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bombs())
def test_any_bomb_compiles_at_the_gateway_and_is_a_400_in_the_replica(template: str) -> None:
    check_chat_template(template)  # compiled, not run: nothing folded into memory
    with chat_templates.limits(seconds=0.05), pytest.raises(InvalidRequest) as refused:
        render(template)
    assert refused.value.param == "chat_template"
    assert refused.value.code in ("chat_template_timeout", "chat_template_too_large")


def test_a_triggered_template_renders_its_messages_until_a_request_sets_a_bomb_off() -> None:
    template = triggered()
    assert len(template) < 32_768  # a deployment takes it
    assert render(template) == "hello\n"
    with chat_templates.limits(seconds=0.05), pytest.raises(InvalidRequest):
        render(template, bomb="loops")


def test_a_loop_with_an_empty_body_is_stopped_at_its_deadline_not_at_its_end() -> None:
    with chat_templates.limits(seconds=0.2), pytest.raises(InvalidRequest, match=r"0\.2 CPU seconds"):
        render(nested_loops(100_000, 100_000))  # 10^10 iterations: hours, were it not stopped


@pytest.mark.parametrize("family", MODELS, ids=[model.family for model in MODELS])
def test_the_families_templates_render_exactly_as_in_transformers_own_sandbox(family: Any) -> None:
    def renders() -> list[Any]:
        out: list[Any] = []
        for conversation in family.conversations:
            for generation_prompt in (True, False):
                out.append(
                    render(
                        family.template,
                        conversation.messages,
                        tools=conversation.tools,
                        add_generation_prompt=generation_prompt,
                        bos_token=family.bos or "",  # as apply_chat_template gives them
                        eos_token=family.eos[0],
                        **conversation.kwargs,
                    )
                )
        return out

    budgeted = renders()
    with transformers_own_sandbox():
        assert renders() == budgeted


def test_assistant_masks_streamed_by_generate_are_the_same_and_capped_too() -> None:
    chat = [*HELLO, {"role": "assistant", "content": "hi there"}]
    budgeted = render(MASKED, chat, return_assistant_tokens_mask=True)
    with transformers_own_sandbox():
        assert render(MASKED, chat, return_assistant_tokens_mask=True) == budgeted
    long = [{"role": "user", "content": "x" * 600_000}, {"role": "assistant", "content": "y" * 600_000}]
    with pytest.raises(InvalidRequest, match="wrote more than its cap of 1,000,000"):
        render(MASKED, long, return_assistant_tokens_mask=True)


def test_ordinary_operations_keep_their_results() -> None:
    template = (
        "{{ messages[0].content|upper }}|{{ messages[1:]|length }}|{{ '%s-%03d' % ('a', 7) }}|"
        "{{ '{}!{:>4}'.format('hi', 'x') }}|{{ messages|map(attribute='role')|join(',') }}|"
        "{{ ['a', 'b'] * 2 }}|{{ 2 ** 10 }}|{{ 'ab'.replace('a', 'c') }}|{{ 'x'|center(5) }}|"
        "{{ {'k': [1, 2]}|tojson(indent=2) }}|{{ ('%s' * 3) % (1, 2, 3) }}|{{ 'a,b'.split(',') }}"
    )
    chat = [*HELLO, {"role": "assistant", "content": "hi"}]
    budgeted = render(template, chat)
    with transformers_own_sandbox():
        assert render(template, chat) == budgeted
    assert budgeted.startswith("HELLO|1|a-007|hi!   x|user,assistant|['a', 'b', 'a', 'b']|1024|cb|  x  |")


async def test_a_render_in_a_thread_stops_when_its_task_is_cancelled() -> None:
    """What the vLLM and llama.cpp replicas do with a chat whose caller left: the render stops at its
    next check, long before its time budget (60 s here) would have stopped it."""
    ended: list[BaseException] = []

    def bomb() -> None:
        try:
            render(nested_loops())
        except BaseException as exc:
            ended.append(exc)
            raise

    with chat_templates.limits(seconds=60):
        task = asyncio.ensure_future(chat_templates.in_thread(bomb))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for _ in range(300):  # the thread ends on its own; its render's deadline is a minute away
        if ended:
            break
        await asyncio.sleep(0.1)
    assert [type(exc) for exc in ended] == [ClientClosedRequest]


def test_a_stop_callable_is_asked_and_ends_the_render_as_client_closed() -> None:
    asked: list[bool] = []

    def gone() -> bool:
        asked.append(True)
        return len(asked) >= 3

    with chat_templates.limits(seconds=60, stop=gone), pytest.raises(ClientClosedRequest):
        render(nested_loops())
    assert len(asked) == 3


def test_the_output_cap_is_what_a_whole_context_can_hold_and_at_least_a_million(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Tokenizer:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "=" * 64: 1}

    tokenizer = Tokenizer()
    assert chat_templates.output_cap(2048, tokenizer) == 1_000_000
    assert chat_templates.output_cap(131_072, tokenizer) == 131_072 * 64
    monkeypatch.setenv("MODELHOST_CHAT_TEMPLATE_MAX_CHARS", "50000")
    get_settings.cache_clear()
    try:
        assert chat_templates.output_cap(131_072, tokenizer) == 50_000
        with pytest.raises(InvalidRequest, match="over its cap of 50,000"):
            render("{{ 'x' * 60000 }}")
    finally:
        get_settings.cache_clear()


def test_the_gateways_compile_check_folds_no_bomb_into_memory() -> None:
    """Jinja folds constant expressions when it compiles: `'x'|center(2000000000)` would be 2 GB
    allocated by the PATCH that sets it, before any replica saw it."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    check_chat_template("{{ 'x'|center(2000000000) }}{{ '%2000000000s' % 'x' }}{{ 'y' * 2000000000 }}")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024 < 200
    with pytest.raises(ModelhostError):
        check_chat_template("{% for m in messages %}")
    assert render(PLAIN) == "hello\n"
