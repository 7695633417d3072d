"""Chat completions and completions through the official `openai` SDK against a live server, on the tiny
recipe chat model (Qwen2 with a ChatML template that renders tools) pushed through the artifact path."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.chat_model import (
    TIME,
    WEATHER,
    greedy_reference,
    long_context_copy,
    served_chat_model,
    thinking_copy,
)
from tests.helpers import (
    ADMIN_KEY,
    assert_error,
    bearer,
    busiest_replica,
    deploy_folder_sync,
    deployment_metric,
    push_folder_sync,
    read_stream_killing,
    read_while_generating,
)
from tests.hostile_templates import BOMBS, TIME_BOMBS, triggered
from tests.server_process import processes
from tests.test_clients import litellm, outside_lookups  # noqa: F401 (LiteLLM, offline, for its test)

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "what is the weather in berlin?"},
]


@dataclass
class Chat:
    url: str
    key: str
    http: httpx.Client
    deployment_id: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)

    def anthropic(self, **options: Any) -> anthropic.Anthropic:
        """The Anthropic SDK, unchanged but its base URL and key (sent as `x-api-key`)."""
        return anthropic.Anthropic(**{"base_url": self.url, "api_key": self.key, "max_retries": 0, **options})

    def post(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=bearer(self.key), timeout=120)


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Chat]:
    with served_chat_model(
        tmp_path_factory.mktemp("chat"), recipes, constrained_max_string_length=16
    ) as server:
        yield Chat(server.url, server.key, server.http, server.deployment_id)


# ---------------------------------------------------------------- chat completions


def test_chat_completion_answers_openai_shape_with_exact_usage(chat: Chat) -> None:
    answer = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"min_tokens": 6}
    )
    assert answer.object == "chat.completion" and answer.model == "chat" and answer.id.startswith("chatcmpl-")
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    prompt = chat.post("/v1/completions", model="chat", prompt="x", max_tokens=1).json()  # 1 prompt token
    assert prompt["usage"]["prompt_tokens"] == 1
    assert answer.usage.prompt_tokens > 10 and answer.usage.total_tokens == answer.usage.prompt_tokens + 6


def test_chat_takes_content_parts_developer_messages_and_max_completion_tokens(chat: Chat) -> None:
    messages: list[Any] = [
        {"role": "developer", "content": "You are a helpful assistant"},
        {"role": "user", "content": [{"type": "text", "text": "what is the weather in berlin?"}]},
    ]
    parts = chat.client().chat.completions.create(
        model="chat", messages=messages, max_completion_tokens=5, temperature=0
    )
    plain = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=5, temperature=0
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content  # developer renders as system
    assert parts.usage is not None and parts.usage.completion_tokens <= 5


def test_greedy_output_equals_the_model_generating_in_process(chat: Chat, recipes: Path) -> None:
    expected = greedy_reference(recipes, MESSAGES, 12)
    answer = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"min_tokens": 12}
    )
    assert answer.choices[0].message.content == expected


def test_seed_reproduces_sampled_output_and_n_gives_that_many_choices(chat: Chat) -> None:
    client = chat.client()
    create = lambda seed: client.chat.completions.create(  # noqa: E731
        model="chat",
        messages=MESSAGES,
        max_tokens=10,
        temperature=1.5,
        seed=seed,
        n=2,
        extra_body={"min_tokens": 10},
    )
    first, again, other = create(7), create(7), create(8)
    texts = lambda a: [c.message.content for c in a.choices]  # noqa: E731
    assert len(first.choices) == 2 and [c.index for c in first.choices] == [0, 1]
    assert texts(first) == texts(again)
    assert texts(first) != texts(other)
    assert first.choices[0].message.content != first.choices[1].message.content
    assert first.usage is not None and first.usage.completion_tokens == 20


def test_stop_strings_end_generation_and_are_not_in_the_output(chat: Chat) -> None:
    client = chat.client()
    full = (
        client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"min_tokens": 20}
        )
        .choices[0]
        .message.content
    )
    assert full and len(full) > 6
    stop = full[4:7]
    cut = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=20, temperature=0, stop=[stop, "zzz"]
    )
    text = cut.choices[0].message.content or ""
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in text and full.startswith(text) and len(text) <= full.index(stop)


def test_penalties_and_top_p_change_the_output(chat: Chat) -> None:
    client = chat.client()
    base = dict(model="chat", messages=MESSAGES, max_tokens=12, extra_body={"min_tokens": 12})
    greedy = client.chat.completions.create(**base, temperature=0).choices[0].message.content
    penalised = (
        client.chat.completions.create(**base, temperature=0, frequency_penalty=2.0)
        .choices[0]
        .message.content
    )
    assert greedy != penalised
    narrow = [
        client.chat.completions.create(**base, temperature=1, top_p=0.0, seed=s).choices[0].message.content
        for s in (1, 2)
    ]
    assert narrow[0] == narrow[1] == greedy  # top_p 0 keeps only the most likely token


def test_top_k_min_p_and_repetition_penalty_are_honoured_on_chat_completions_and_responses(
    chat: Chat,
) -> None:
    """The open-model fields, as the openai SDK sends them (`extra_body`)."""
    client = chat.client()

    def answer(**fields: Any) -> str | None:
        extra = {"min_tokens": 10, **fields.pop("extra", {})}
        created = client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=10, extra_body=extra, **fields
        )
        return created.choices[0].message.content

    greedy = answer(temperature=0)
    assert [answer(temperature=1.8, seed=s, extra={"top_k": 1}) for s in (1, 2)] == [greedy, greedy]
    assert answer(temperature=1.8, seed=1, extra={"min_p": 1.0}) == greedy
    assert answer(temperature=1.8, seed=1, extra={"top_k": 0}) != greedy  # 0: every token
    assert answer(temperature=0, extra={"repetition_penalty": 1.8}) != greedy
    response = client.responses.create(
        model="chat",
        input=MESSAGES,
        max_output_tokens=10,
        temperature=1.8,
        extra_body={"top_k": 1, "min_tokens": 10},
    )
    assert response.output_text == greedy


def test_completions_take_the_open_model_fields_too(chat: Chat) -> None:
    client = chat.client()
    base: dict[str, Any] = dict(model="chat", prompt="hello hello hello", max_tokens=8)
    greedy = client.completions.create(**base, temperature=0, extra_body={"min_tokens": 8})
    top_k = client.completions.create(
        **base, temperature=1.8, seed=3, extra_body={"min_tokens": 8, "top_k": 1}
    )
    assert top_k.choices[0].text == greedy.choices[0].text
    penalised = client.completions.create(
        **base, temperature=0, extra_body={"min_tokens": 8, "repetition_penalty": 5.0}
    )
    assert penalised.choices[0].text != greedy.choices[0].text


@pytest.mark.parametrize(
    ("field", "value"), [("top_k", -2), ("min_p", 1.5), ("repetition_penalty", 0), ("top_k", 1.5)]
)
def test_open_model_fields_out_of_range_are_400_naming_them(chat: Chat, field: str, value: Any) -> None:
    body = {"model": "chat", "max_tokens": 2, field: value}
    for error in (
        assert_error(chat.post("/v1/chat/completions", messages=MESSAGES, **body), 400, param=field),
        assert_error(
            chat.post("/v1/responses", model="chat", input="hi", **{field: value}), 400, param=field
        ),
    ):
        assert "Extra inputs" not in error["message"]  # a known field, out of its range


@pytest.fixture(scope="module")
def top_k_1_deployment(chat: Chat, recipes: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The chat model again, its generation_config.json asking for `top_k: 1` (always the most likely
    token: what the model answers greedily, whatever the temperature)."""
    folder = long_context_copy(recipes, tmp_path_factory.mktemp("top-k-1"))
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "top_k": 1}))
    return deploy_folder_sync(
        chat.http, chat.key, folder, "text-generation", "chat-top-k-1", readiness="warm"
    )


@pytest.fixture(scope="module")
def top_k_1_model(top_k_1_deployment: dict[str, Any]) -> str:
    return str(top_k_1_deployment["model"])


def test_a_request_without_sampling_fields_samples_with_the_models_generation_config(
    chat: Chat, top_k_1_model: str
) -> None:
    client = chat.client()

    def answer(model: str, extra: dict[str, Any] | None = None, **fields: Any) -> str | None:
        created = client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=10,
            extra_body={"min_tokens": 10, **(extra or {})},
            **fields,
        )
        return created.choices[0].message.content

    greedy = answer("chat", temperature=0)
    assert [answer(top_k_1_model, seed=s) for s in (1, 2, 3)] == [greedy] * 3
    assert [answer("chat", seed=s) for s in (1, 2, 3)] != [greedy] * 3  # the model without it samples
    assert answer(top_k_1_model, {"top_k": 0}, seed=1) != greedy  # the request's own value wins
    response = client.responses.create(
        model=top_k_1_model, input=MESSAGES, max_output_tokens=10, extra_body={"min_tokens": 10}
    )
    assert response.output_text == greedy


def test_a_deployments_generation_defaults_come_between_the_request_and_the_model(
    chat: Chat, top_k_1_deployment: dict[str, Any]
) -> None:
    client, model = chat.client(), top_k_1_deployment["model"]
    path, headers = f"/v1/deployments/{top_k_1_deployment['id']}", bearer(chat.key)

    def answer(seed: int, **fields: Any) -> tuple[str | None, int]:
        created = client.chat.completions.create(
            model=model, messages=MESSAGES, seed=seed, extra_body={"min_tokens": 4}, **fields
        )
        assert created.usage is not None
        return created.choices[0].message.content, created.usage.completion_tokens

    greedy = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"min_tokens": 4}
    )
    expected = (greedy.choices[0].message.content, 4)
    patched = chat.http.patch(
        path, json={"generation_defaults": {"top_k": 0, "max_tokens": 4}}, headers=headers
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["generation_defaults"] == {"top_k": 0, "max_tokens": 4}
    try:
        sampled = [answer(seed) for seed in (1, 2, 3)]  # top_k 0 (every token) over the model's 1
        assert all(tokens == 4 for _, tokens in sampled) and sampled != [expected] * 3
        assert answer(1, temperature=0) == expected  # the request's own field wins
        response = client.responses.create(model=model, input="hello", extra_body={"min_tokens": 4})
        assert response.usage is not None and response.usage.output_tokens == 4
    finally:
        cleared = chat.http.patch(path, json={"generation_defaults": {}}, headers=headers)
    assert cleared.json()["generation_defaults"] == {}
    assert answer(1, max_tokens=4) == expected  # the model's top_k 1 again
    for body, param in (({"top_k": -5}, "top_k"), ({"temprature": 1}, "temprature")):
        refused = chat.http.patch(path, json={"generation_defaults": body}, headers=headers)
        assert_error(refused, 400, param=f"generation_defaults.{param}")


def test_logprobs_and_top_logprobs(chat: Chat) -> None:
    answer = chat.client().chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"min_tokens": 4},
    )
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy picks the best
    assert "".join(e.token for e in content) == answer.choices[0].message.content


def test_streaming_sends_role_then_content_then_finish_then_usage_and_done(chat: Chat) -> None:
    stream = chat.client().chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 8},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    )
    whole = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"min_tokens": 8}
    )
    assert text == whole.choices[0].message.content
    raw = chat.http.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": MESSAGES, "max_tokens": 2, "stream": True},
        headers=bearer(chat.key),
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_a_client_leaving_mid_stream_frees_its_slot_before_its_tokens_are_done(chat: Chat) -> None:
    client = chat.client()
    computed = _metric(chat, "modelhost_generation_tokens_total")
    whole = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"min_tokens": 20}
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 20
    assert _metric(chat, "modelhost_generation_tokens_total") == computed + 20  # what the engine computed
    tokens = 1900  # 2 s of this engine on a fast CPU: had the engine not been told, it would compute them all
    computed = _metric(chat, "modelhost_generation_tokens_total")
    stream = client.chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        extra_body={"min_tokens": tokens},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass  # the engine holds the sequence now: it published so before its first step
    stream.close()
    deadline = time.monotonic() + 15  # the gauge is read from the worker's metrics file
    while (held := _generating(chat)) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert held == 0, f"modelhost_generation_sequences is {held}: {_gauge_files(chat)}"
    assert 2 <= _metric(chat, "modelhost_generation_tokens_total") - computed < tokens  # 3 chunks: 2 tokens


def _generating(chat: Chat) -> float:
    return deployment_metric(chat.http, "modelhost_generation_sequences", chat.deployment_id, missing=-1.0)


def _gauge_files(chat: Chat) -> str:
    """The gauge's value in each process's file of the metrics folder: what a scrape added up."""
    from prometheus_client.mmap_dict import MmapedDict  # after modelhost.metrics chose the folder

    folder = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR", "."))
    values = [
        f"{path.name}: {value}"
        for path in sorted(folder.glob("gauge_*.db"))
        for key, value, _ in MmapedDict.read_all_values_from_file(str(path))
        if "modelhost_generation_sequences" in key and chat.deployment_id in key
    ]
    return f"{values} in {folder}"


def _metric(chat: Chat, name: str) -> float:
    return deployment_metric(chat.http, name, chat.deployment_id)


def test_a_conversation_that_goes_on_reuses_its_cached_prefix_and_says_so_in_usage(chat: Chat) -> None:
    system = {"role": "system", "content": "You answer questions about the weather in european cities. " * 4}
    first_turn = [system, {"role": "user", "content": "what is the weather in berlin?"}]
    client = chat.client()
    first = client.chat.completions.create(model="chat", messages=first_turn, max_tokens=4, temperature=0)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    before = _metric(chat, "modelhost_prefix_cache_hits_tokens_total")
    reply = {"role": "assistant", "content": first.choices[0].message.content or ""}
    second_turn = [*first_turn, reply, {"role": "user", "content": "and in paris?"}]
    second = client.chat.completions.create(model="chat", messages=second_turn, max_tokens=4, temperature=0)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= first.usage.prompt_tokens // 2, (cached, first.usage.prompt_tokens)
    assert cached < second.usage.prompt_tokens
    assert _metric(chat, "modelhost_prefix_cache_hits_tokens_total") == before + cached


def test_the_prefix_cache_counts_prompt_tokens_looked_up_and_found_on_metrics(chat: Chat) -> None:
    """`modelhost_prefix_cache_{queries,hits}_tokens_total`: every started generation's prompt tokens,
    and those its replica's engine took from its cache (what `usage` says per request)."""
    system = {"role": "system", "content": "You name the rivers of european capitals, briefly. " * 4}
    messages = [system, {"role": "user", "content": "which river runs through vienna?"}]
    client = chat.client()
    queries = _metric(chat, "modelhost_prefix_cache_queries_tokens_total")
    hits = _metric(chat, "modelhost_prefix_cache_hits_tokens_total")
    usages = []
    for _ in range(2):  # the same prompt twice: the second finds all of it but its last token
        answer = client.chat.completions.create(model="chat", messages=messages, max_tokens=4, temperature=0)
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        usages.append((answer.usage.prompt_tokens, answer.usage.prompt_tokens_details.cached_tokens or 0))
    assert usages[1][1] == usages[1][0] - 1, usages
    queried = _metric(chat, "modelhost_prefix_cache_queries_tokens_total") - queries
    found = _metric(chat, "modelhost_prefix_cache_hits_tokens_total") - hits
    assert (queried, found) == (sum(p for p, _ in usages), sum(c for _, c in usages))


def salted_keys_find_only_their_own_prefixes(url: str, key: str, deployment_id: str, model: str) -> None:
    """Issue 70, S12: two deployment keys of one account share the deployment's prefix cache, so one
    learns from `cached_tokens` whether the other's prompt starts with a guess. The salted key's request
    after the other key sent the same long prompt finds nothing cached; its own second one finds its
    first; and a key that sends the salt as the request's own `cache_salt` reaches nothing of the salted
    key's cache either (run on each engine: the transformers engine here, vLLM and llama.cpp in their
    modules)."""
    secret = "The launch code of project orion is 7-alpha-tango-9, kept between us. " * 6
    messages = [{"role": "system", "content": secret}, {"role": "user", "content": "what is the code?"}]
    with httpx.Client(base_url=url, timeout=120) as http:
        made = [
            http.post("/v1/keys", json={"deployments": [deployment_id], **salt}, headers=bearer(key))
            for salt in ({}, {"cache_salt": "team-blue"})
        ]
    assert [m.status_code for m in made] == [201, 201], [m.text for m in made]
    assert [m.json()["cache_salt"] for m in made] == [None, "team-blue"]
    plain, salted = (
        openai.OpenAI(base_url=f"{url}/v1", api_key=m.json()["api_key"], max_retries=0) for m in made
    )

    def cached(client: openai.OpenAI, **extra: Any) -> tuple[int, int]:
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, temperature=0, extra_body=extra or None
        )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens, answer.usage.prompt_tokens_details.cached_tokens or 0

    prompt_tokens, _ = cached(plain)
    assert cached(plain)[1] >= prompt_tokens // 2  # the oracle: the same key finds its prompt cached
    assert cached(salted) == (prompt_tokens, 0)  # the other key's prompt is not found
    assert cached(salted)[1] >= prompt_tokens // 2  # its own is
    assert cached(plain, cache_salt="team-blue") == (prompt_tokens, 0)  # naming the salt reaches nothing


def test_a_salted_key_finds_only_its_own_cached_prefixes_never_another_keys(chat: Chat) -> None:
    salted_keys_find_only_their_own_prefixes(chat.url, chat.key, chat.deployment_id, "chat")


def test_only_keys_manage_sets_a_keys_cache_salt_and_a_rotation_keeps_it(chat: Chat) -> None:
    """A key that may rename itself but not manage keys (a developer's) cannot choose its salt: it could
    join another key's and read its prefixes."""
    body = {"role": "developer", "service": True}
    developer = chat.http.post("/v1/keys", json=body, headers=bearer(chat.key)).json()
    own = f"/v1/keys/{developer['id']}"
    renamed = chat.http.patch(own, json={"name": "dev"}, headers=bearer(developer["api_key"]))
    assert renamed.status_code == 200, renamed.text
    for change in ({"cache_salt": "team-blue"}, {"cache_salt": None}):
        refused = chat.http.patch(own, json=change, headers=bearer(developer["api_key"]))
        assert_error(refused, 403, "permission_denied")
    made = chat.http.post("/v1/keys", json={"deployments": [chat.deployment_id]}, headers=bearer(chat.key))
    key = f"/v1/keys/{made.json()['id']}"
    patched = chat.http.patch(key, json={"cache_salt": "team-red"}, headers=bearer(chat.key))
    assert patched.status_code == 200 and patched.json()["cache_salt"] == "team-red", patched.text
    rotated = chat.http.post(f"{key}/rotate", headers=bearer(chat.key))
    assert rotated.status_code == 201 and rotated.json()["cache_salt"] == "team-red", rotated.text
    cleared = chat.http.patch(key, json={"cache_salt": None}, headers=bearer(chat.key))
    assert cleared.status_code == 200 and cleared.json()["cache_salt"] is None, cleared.text
    for bad in ("", "x" * 257, 7):
        answer = chat.http.post(
            "/v1/keys",
            json={"deployments": [chat.deployment_id], "cache_salt": bad},
            headers=bearer(chat.key),
        )
        assert_error(answer, 400)
        assert answer.json()["error"]["param"] == "cache_salt", answer.text


def test_an_accounts_weight_is_the_operators_and_a_keys_needs_keys_manage(chat: Chat) -> None:
    """Weights (docs/limits.md, "Fair shares"): the operator sets an account's, shown on the account; an
    account's admins set a key's, kept by a rotation; a developer's key cannot raise its own share."""
    admin = bearer(ADMIN_KEY)
    made = chat.http.post("/v1/admin/accounts", json={"name": "heavy", "weight": 2.5}, headers=admin)
    assert made.status_code == 201 and made.json()["weight"] == 2.5, made.text
    account = f"/v1/admin/accounts/{made.json()['id']}"
    assert chat.http.get(account, headers=admin).json()["weight"] == 2.5
    patched = chat.http.patch(account, json={"weight": None}, headers=admin)  # null: back to 1
    assert patched.status_code == 200 and patched.json()["weight"] == 1.0, patched.text
    assert_error(chat.http.patch(account, json={"weight": 0}, headers=admin), 400)
    own_account = made.json()["api_key"]
    assert_error(chat.http.patch(account, json={"weight": 9}, headers=bearer(own_account)), 401)

    body = {"role": "developer", "service": True}
    developer = chat.http.post("/v1/keys", json=body, headers=bearer(chat.key)).json()
    assert developer["weight"] == 1.0
    own = f"/v1/keys/{developer['id']}"
    assert_error(chat.http.patch(own, json={"weight": 5}, headers=bearer(developer["api_key"])), 403)
    refused = chat.http.post("/v1/keys", json={"weight": 5}, headers=bearer(developer["api_key"]))
    assert_error(refused, 403, "permission_denied")
    made_key = chat.http.post("/v1/keys", json={**body, "weight": 3}, headers=bearer(chat.key))
    assert made_key.status_code == 201 and made_key.json()["weight"] == 3.0, made_key.text
    key = f"/v1/keys/{made_key.json()['id']}"
    rotated = chat.http.post(f"{key}/rotate", headers=bearer(chat.key))
    assert rotated.status_code == 201 and rotated.json()["weight"] == 3.0, rotated.text
    for bad in (0, -1, 1001, "x"):
        assert_error(chat.http.patch(key, json={"weight": bad}, headers=bearer(chat.key)), 400)


def _tier_metric(chat: Chat, tier: str) -> float:
    """`modelhost_generation_requests_total` of the chat deployment for one tier."""
    for line in chat.http.get("/metrics").text.splitlines():
        ours = line.startswith("modelhost_generation_requests_total{") and f'tier="{tier}"' in line
        if ours and f'deployment="{chat.deployment_id}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_service_tier_is_answered_as_applied_and_counted_per_tier(chat: Chat) -> None:
    """`service_tier` (and vLLM's numeric `priority`) choose the tier a generation runs in: the answer
    says which, streamed or not, and `modelhost_generation_requests_total{tier}` counts it."""
    client = chat.client()
    tiers = ("priority", "default", "flex")
    before = {tier: _tier_metric(chat, tier) for tier in tiers}
    answered = {
        tier: client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2, service_tier=tier)
        for tier in (*tiers, "auto")
    }
    assert {tier: a.service_tier for tier, a in answered.items()} == {
        "priority": "priority",
        "default": "default",
        "flex": "flex",
        "auto": "default",
    }
    stream = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=2, service_tier="flex", stream=True
    )
    assert {chunk.service_tier for chunk in stream} == {"flex"}
    numbered = client.completions.create(
        model="chat", prompt="hello", max_tokens=2, extra_body={"priority": -3}
    )
    assert numbered.service_tier == "priority"  # type: ignore[attr-defined]
    behind = client.completions.create(
        model="chat", prompt="hello", max_tokens=2, extra_body={"priority": 3, "service_tier": "priority"}
    )
    assert behind.service_tier == "default"  # type: ignore[attr-defined]  # its own number wins
    after = {tier: _tier_metric(chat, tier) for tier in tiers}
    assert {tier: after[tier] - before[tier] for tier in tiers} == {"priority": 2, "default": 3, "flex": 2}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "service_tier": "turbo"}, "service_tier"),
        ("/v1/completions", {"prompt": "hi", "service_tier": "express"}, "service_tier"),
        ("/v1/completions", {"prompt": "hi", "priority": 5000}, "priority"),
        ("/v1/chat/completions", {"messages": MESSAGES, "priority": "high"}, "priority"),
        ("/v1/responses", {"input": "hi", "service_tier": "turbo"}, "service_tier"),
    ],
)
def test_an_unknown_service_tier_or_a_priority_out_of_range_is_a_400_naming_it(
    chat: Chat, path: str, body: dict[str, Any], param: str
) -> None:
    assert_error(chat.post(path, model="chat", max_tokens=2, **body), 400, param=param)


def test_the_messages_api_runs_its_service_tiers_as_default_and_refuses_others_naming_it(chat: Chat) -> None:
    """Anthropic's `auto` and `standard_only` both run in the default tier (`usage.service_tier`:
    standard); another value is a 400 in Anthropic's error body, naming the field."""
    hi = [{"role": "user", "content": "hi"}]
    message = chat.anthropic().messages.create(
        model="chat",
        max_tokens=2,
        messages=hi,
        service_tier="standard_only",  # type: ignore[arg-type]
    )
    assert message.usage.service_tier == "standard"
    refused = chat.post("/v1/messages", model="chat", max_tokens=2, messages=hi, service_tier="flex")
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("service_tier:")


def test_the_kv_cache_usage_gauge_rises_while_a_generation_holds_a_slot_and_falls_after(chat: Chat) -> None:
    """`modelhost_kv_cache_usage_ratio`: the replica's busy slots over its slots, one series per
    replica process."""
    chat.client().chat.completions.create(model="chat", messages=MESSAGES, max_tokens=1)  # loaded
    assert _cache_usage(chat) == 0  # idle: every slot free (and the gauge there since the replica loaded)
    busy = read_while_generating(
        lambda: _cache_usage(chat),
        lambda: chat.client().chat.completions.create(  # about a second each
            model="chat", messages=MESSAGES, max_tokens=1900, temperature=0, extra_body={"min_tokens": 1900}
        ),
    )
    assert 0 < busy <= 0.5, busy  # one sequence of a replica with more than one slot
    deadline = time.monotonic() + 15
    while (usage := _cache_usage(chat)) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert usage == 0


def _cache_usage(chat: Chat) -> float:
    return busiest_replica(
        chat.http.get("/metrics").text, "modelhost_kv_cache_usage_ratio", chat.deployment_id
    )


def test_concurrent_requests_share_decoding_steps_and_each_gets_its_own_answer(chat: Chat) -> None:
    async def run() -> list[str]:
        client = chat.async_client()
        prompts = [f"hello world {i}" for i in range(6)]
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": p}],
                    max_tokens=10,
                    temperature=0,
                    extra_body={"min_tokens": 10},
                )
                for p in prompts
            )
        )
        alone = [
            (
                await client.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": p}],
                    max_tokens=10,
                    temperature=0,
                    extra_body={"min_tokens": 10},
                )
            )
            .choices[0]
            .message.content
            or ""
            for p in prompts[:2]
        ]
        await client.close()
        return [a.choices[0].message.content or "" for a in answers][:2] + alone

    together_0, together_1, alone_0, alone_1 = asyncio.run(run())
    assert (together_0, together_1) == (alone_0, alone_1)


# ---------------------------------------------------------------- tools and structured output


def test_tool_choice_required_returns_a_call_whose_arguments_validate(chat: Chat) -> None:
    answer = chat.client().chat.completions.create(
        model="chat",
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])  # type: ignore[union-attr]
    assert call.id.startswith("call-") and call.type == "function"


def test_a_named_tool_choice_calls_that_tool(chat: Chat) -> None:
    for name, tool in (("get_time", TIME), ("get_weather", WEATHER)):
        answer = chat.client().chat.completions.create(
            model="chat",
            messages=MESSAGES,
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": name}},
            max_tokens=80,
            temperature=0.8,
            seed=3,
        )
        call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == name  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])  # type: ignore[index, union-attr]


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(chat: Chat) -> None:
    body = dict(
        model="chat",
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    whole = chat.client().chat.completions.create(**body).choices[0].message.tool_calls[0]  # type: ignore[index]
    name, arguments, ids, finishes = "", "", set(), []
    pieces = 0
    for chunk in chat.client().chat.completions.create(**body, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.index == 0
            if delta.id:
                ids.add(delta.id)
            if delta.function and delta.function.name:
                name += delta.function.name
            if delta.function and delta.function.arguments:
                arguments += delta.function.arguments
                pieces += 1
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    assert (name, arguments) == (whole.function.name, whole.function.arguments)  # type: ignore[union-attr]
    assert len(ids) == 1 and pieces > 1 and finishes == ["tool_calls"]


def test_tool_choice_auto_and_none_render_tools_or_not(chat: Chat) -> None:
    client = chat.client()
    base = dict(model="chat", messages=MESSAGES, max_tokens=3, temperature=0)
    with_tools = client.chat.completions.create(**base, tools=[WEATHER], tool_choice="auto")
    without = client.chat.completions.create(**base, tools=[WEATHER], tool_choice="none")
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens  # type: ignore[union-attr]
    assert with_tools.choices[0].message.tool_calls is None  # a random model writes no <tool_call> markup


def test_tool_results_render_back_into_the_template(chat: Chat) -> None:
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "berlin"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny"},
    ]
    answer = chat.client().chat.completions.create(
        model="chat", messages=messages, tools=[WEATHER], max_tokens=2
    )
    short = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, tools=[WEATHER], max_tokens=2
    )
    assert answer.usage.prompt_tokens > short.usage.prompt_tokens + 10  # type: ignore[union-attr]


PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def _migrated(chat: Chat, reason: str = "died") -> float:
    """`modelhost_generations_migrated_total` of the chat deployment, for one reason."""
    for line in chat.http.get("/metrics").text.splitlines():
        ours = line.startswith("modelhost_generations_migrated_total{") and f'reason="{reason}"' in line
        if ours and chat.deployment_id in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _streamed(chat: Chat, body: dict[str, Any], kill_after: int | None = None) -> tuple[str, int, bool]:
    """A streamed chat answer's text and completion tokens, its replica SIGKILLed once `kill_after`
    chunks of text have arrived (and whether it was before the answer ended)."""
    stream = chat.client().chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True}
    )
    replica = lambda: processes("modelhost.runtime.worker.sync_worker", chat.deployment_id)[0]  # noqa: E731
    return read_stream_killing(stream, kill_after, replica)


def test_a_stream_whose_replica_dies_goes_on_on_its_replacement_with_nothing_repeated_or_lost(
    chat: Chat,
) -> None:
    """Issue 73: a generation whose replica is SIGKILLed mid-answer continues on the replacement from the
    tokens already sent; the client's text and usage equal an undisturbed run's, a JSON-schema answer
    stays valid across the move. (The kill may come after the replica has generated the whole answer:
    then nothing moves, and the test sends it again, up to three times.)"""
    schema = {"name": "person", "schema": PERSON, "strict": True}
    bodies = [
        {
            "model": "chat",
            "messages": MESSAGES,
            "max_tokens": 400,
            "temperature": 0,
            "extra_body": {"min_tokens": 400},
        },
        {
            "model": "chat",
            "messages": MESSAGES,
            "max_tokens": 120,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": schema},
        },
    ]
    for body in bodies:
        expected, tokens, _ = _streamed(chat, body)
        for _ in range(3):
            before = _migrated(chat)
            text, counted, killed = _streamed(chat, body, kill_after=3)
            assert killed and (text, counted) == (expected, tokens)
            if _migrated(chat) == before + 1:
                break
        else:
            pytest.fail("the replica had ended the answer each time before it was killed")
    jsonschema.validate(json.loads(expected), PERSON)
    again, _, _ = _streamed(chat, bodies[0])  # the replacement serves as before
    assert again == _streamed(chat, bodies[0])[0]


def test_whole_answers_of_every_api_move_with_a_stream_when_their_replica_dies(chat: Chat) -> None:
    """Issue 73: a whole chat answer, a completion, a Responses answer and a Messages answer, generated
    beside a stream whose replica is SIGKILLed mid-answer, go on on the replacement with it: each equals
    its undisturbed answer."""
    client, claude, tokens = chat.client(), chat.anthropic(), 200
    story = [{"role": "user", "content": "Tell me a story."}]
    longest = {"max_tokens": tokens, "temperature": 0, "extra_body": {"min_tokens": tokens}}
    calls = {
        "chat": lambda: (
            client.chat.completions.create(model="chat", messages=MESSAGES, **longest)
            .choices[0]
            .message.content
        ),
        "completions": lambda: (
            client.completions.create(model="chat", prompt="Once upon a time", **longest).choices[0].text
        ),
        "responses": lambda: (
            client.responses.create(
                model="chat", input="Tell me a story.", max_output_tokens=tokens, temperature=0
            ).output_text
        ),
        "messages": lambda: "".join(
            b.text
            for b in claude.messages.create(
                model="chat", max_tokens=tokens, messages=story, extra_body={"temperature": 0}
            ).content
            if b.type == "text"
        ),
    }
    body = {"model": "chat", "messages": MESSAGES, **longest}
    with ThreadPoolExecutor(len(calls)) as pool:
        expected = dict(zip(calls, pool.map(lambda call: call(), calls.values()), strict=True))
    for _ in range(3):
        before = _migrated(chat)
        with ThreadPoolExecutor(len(calls)) as pool:
            answers = [pool.submit(call) for call in calls.values()]
            time.sleep(0.05)  # sent: they run in the stream's batch
            _, _, killed = _streamed(chat, body, kill_after=3)
            got = dict(zip(calls, (answer.result() for answer in answers), strict=True))
        assert killed and got == expected
        if _migrated(chat) - before >= 3:  # the stream and at least two of them moved
            break
    else:
        pytest.fail("the replica had ended the answers each time before it was killed")


def _batch_line_answer(chat: Chat, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The batch (one chat line, at the batch tier's low priority) and, once it has ended, its line's
    text, or the line's error when it failed."""
    client = chat.client()
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    upload = client.files.create(file=("in.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    ended = batch.output_file_id or batch.error_file_id
    [answer] = [json.loads(row) for row in client.files.content(ended or "").text.splitlines()]
    return batch.id, answer["response"]["body"] if answer["response"] else answer["error"]


def _agent_run_output(chat: Chat, agent_id: str, body: dict[str, Any]) -> str:
    """An agent run's output once it has ended (its error when it failed)."""
    run = chat.post(f"/v1/agent/{agent_id}/runs", input="Tell me a story.", **body).json()
    deadline = time.monotonic() + 120
    while run["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, run
        time.sleep(0.05)
        run = chat.http.get(f"/v1/agent/{agent_id}/runs/{run['id']}", headers=bearer(chat.key)).json()
    return str(run["output"] if run["status"] == "completed" else run)


def test_a_batch_line_and_an_agent_run_move_when_their_replica_dies(chat: Chat) -> None:
    """Issue 73: a batch line (generated at the batch tier's low priority) and an agent run, their replica
    SIGKILLed while both generate, go on on the replacement: each equals its undisturbed answer (a line
    that had failed would carry the 502 `replica_crashed` instead), and both count as moved."""
    tokens = 800
    body = {
        "model": "chat",
        "messages": MESSAGES,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
    }
    body |= {"frequency_penalty": 1.0, "presence_penalty": 1.0}  # no answer of one repeated token
    agent = chat.post("/v1/agent", name="teller", model="chat", instructions="Tell stories.").json()["id"]
    run_body = {"max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        line = pool.submit(_batch_line_answer, chat, body)
        run = pool.submit(_agent_run_output, chat, agent, run_body)
        expected = (line.result()[1]["choices"][0]["message"]["content"], run.result())
    rounds: list[tuple[float, float]] = []  # (sequences at the kill, generations moved), for a failure
    for _ in range(4):
        before = _migrated(chat)
        with ThreadPoolExecutor(2) as pool:
            # the line first: it pauses while the run (interactive work) generates, and a generation
            # killed before its first token is not moved (it may be what killed its replica)
            line = pool.submit(_batch_line_answer, chat, body)
            _wait_for_line_tokens(chat, line)
            run = pool.submit(_agent_run_output, chat, agent, run_body)
            _wait_for_agent_text(chat, agent, run)
            [replica] = processes("modelhost.runtime.worker.sync_worker", chat.deployment_id)
            generating = deployment_metric(chat.http, "modelhost_generation_sequences", chat.deployment_id)
            os.kill(replica, signal.SIGKILL)
            answer = line.result()[1]
            got = (answer.get("choices", [{}])[0].get("message", {}).get("content", answer), run.result())
        assert got == expected
        rounds.append((generating, _migrated(chat) - before))
        if rounds[-1][1] == 2:
            break
    else:
        # Both answers were whole and undisturbed every round (asserted above: a generation lost to the
        # kill fails there). Open (issue 73): on a loaded machine the engine held one sequence at the
        # kill (the flex line paused behind the run) and fewer than two moves were counted.
        pytest.xfail(f"fewer than two moves counted (sequences at the kill, moved): {rounds}")


def _wait_for_line_tokens(chat: Chat, line: Any) -> None:
    """Until the chat deployment's engine holds the batch line and has produced a few tokens since (the
    line's: it is the only sequence then; one killed before its first token would not move), or the
    line has ended."""
    deadline = time.monotonic() + 60
    while deployment_metric(chat.http, "modelhost_generation_sequences", chat.deployment_id) < 1:
        if line.done():
            return
        assert time.monotonic() < deadline
        time.sleep(0.02)
    held = deployment_metric(chat.http, "modelhost_generation_tokens_total", chat.deployment_id)
    while deployment_metric(chat.http, "modelhost_generation_tokens_total", chat.deployment_id) < held + 5:
        if line.done():
            return
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _wait_for_agent_text(chat: Chat, agent_id: str, run: Any) -> None:
    """Until the agent's newest run has written a piece of its answer (`message.delta`: one killed before
    its first token would not move), or it has ended."""
    deadline = time.monotonic() + 60
    while not run.done():
        assert time.monotonic() < deadline
        listed = chat.http.get(f"/v1/agent/{agent_id}/runs", params={"limit": 1}, headers=bearer(chat.key))
        newest = listed.json()["data"]
        if newest and newest[0]["status"] == "in_progress":
            path = f"/v1/agent/{agent_id}/runs/{newest[0]['id']}/events"
            events = chat.http.get(path, headers=bearer(chat.key)).json()["data"]
            if any(event["type"] == "message.delta" for event in events):
                return
        time.sleep(0.05)


def test_json_schema_response_format_validates(chat: Chat) -> None:
    schema = PERSON
    answer = chat.client().chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=80,
        temperature=0.7,
        seed=1,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    anything = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=80, temperature=0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)


# vLLM's `structured_outputs`, each with what its output must be (a random-weight model obeys them too)
GRAMMAR = 'start: greeting " " name\ngreeting: "hello" | "hi"\nname: /[a-z]{1,8}/\n'  # llguidance's Lark
STRUCTURED: list[tuple[dict[str, Any], str]] = [
    ({"regex": "[0-9]{3}-[a-z]{2}/x"}, "[0-9]{3}-[a-z]{2}/x"),
    ({"choice": ["sunny", "rainy", "cloudy"]}, "sunny|rainy|cloudy"),
    ({"grammar": GRAMMAR}, "(hello|hi) [a-z]{1,8}"),
    ({"grammar": 'root ::= "yes" | "no"'}, "yes|no"),  # GBNF, as vLLM's guidance backend takes it too
    ({"json": PERSON}, ""),
]


def _chat_text(client: openai.OpenAI, stream: bool, **fields: Any) -> str:
    if not stream:
        return client.chat.completions.create(**fields).choices[0].message.content or ""
    chunks = client.chat.completions.create(stream=True, **fields)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _completion_text(client: openai.OpenAI, stream: bool, **fields: Any) -> str:
    if not stream:
        return client.completions.create(**fields).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **fields) if c.choices)


def test_structured_outputs_hold_a_chat_completion_and_a_completion_to_a_regex_choice_grammar_or_schema(
    chat: Chat,
) -> None:
    client = chat.client()
    for index, (spec, pattern) in enumerate(STRUCTURED):
        extra = {"structured_outputs": spec}
        common: dict[str, Any] = dict(
            model="chat", max_tokens=60, temperature=0.7, seed=index, extra_body=extra
        )
        texts = [  # each kind streamed once: the constraint holds on every delta path
            _chat_text(client, index == 0, messages=MESSAGES, **common),
            _completion_text(client, index == 1, prompt="The weather is", **common),
        ]
        for text in texts:
            if pattern:
                assert re.fullmatch(pattern, text), (spec, text)
            else:
                jsonschema.validate(json.loads(text), PERSON)
    answered = client.responses.create(
        model="chat",
        input=MESSAGES,
        max_output_tokens=20,
        extra_body={"structured_outputs": STRUCTURED[0][0]},
    )
    assert re.fullmatch(STRUCTURED[0][1], answered.output_text)
    guided = client.chat.completions.create(  # vLLM's older name, which vLLM 0.32 ignores
        model="chat", messages=MESSAGES, max_tokens=20, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert guided.choices[0].message.content in ("yes", "no")


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex"),
        (
            "/v1/completions",
            {"structured_outputs": {"grammar": "start: nowhere"}},
            "structured_outputs.grammar",
        ),
        ("/v1/completions", {"guided_regex": "a{2,1}"}, "guided_regex"),
        ("/v1/completions", {"structured_outputs": {"regex": "x" * 40_000}}, "structured_outputs.regex"),
        ("/v1/chat/completions", {"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
        ),
        ("/v1/chat/completions", {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
        ("/v1/completions", {"structured_outputs": {"regex": "a"}, "guided_json": {}}, "guided_json"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
            "structured_outputs.choice",
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a"}, "tools": [WEATHER], "tool_choice": "required"},
            "structured_outputs.regex",
        ),
        (
            "/v1/responses",
            {"structured_outputs": {"regex": "a"}, "text": {"format": {"type": "json_object"}}},
            "structured_outputs.regex",
        ),
    ],
)
def test_a_structured_output_that_cannot_be_enforced_is_a_400_naming_its_field(
    chat: Chat, path: str, fields: dict[str, Any], param: str
) -> None:
    prompt = {"/v1/responses": {"input": "hi"}, "/v1/completions": {"prompt": "hi"}}.get(path)
    answer = chat.post(path, model="chat", **(prompt or {"messages": MESSAGES}), **fields)
    assert "Extra inputs" not in assert_error(answer, 400, param=param)["message"]  # a known field


# ---------------------------------------------------------------- validation and routing


def test_tool_choice_validation_names_the_parameter(chat: Chat) -> None:
    assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, tool_choice="auto"),
        400,
        param="tool_choice",
    )
    named = {"type": "function", "function": {"name": "nope"}}
    assert_error(
        chat.post(
            "/v1/chat/completions", model="chat", messages=MESSAGES, tools=[WEATHER], tool_choice=named
        ),
        400,
        param="tool_choice",
    )
    assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, tools=[]), 400, param="tools"
    )


@pytest.fixture(scope="module")
def thinking_model(chat: Chat, recipes: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chat model again with a Qwen3-style thinking template (`chat_model.thinking_copy`)."""
    folder = thinking_copy(recipes, tmp_path_factory.mktemp("thinking"))
    deployment = deploy_folder_sync(
        chat.http, chat.key, folder, "text-generation", "chat-thinking", readiness="warm"
    )
    return str(deployment["model"])


def test_chat_template_kwargs_reach_the_template(chat: Chat, thinking_model: str) -> None:
    def prompt_tokens(**extra: Any) -> int:
        created = chat.client().chat.completions.create(
            model=thinking_model, messages=MESSAGES, max_tokens=1, extra_body=extra
        )
        assert created.usage is not None
        return created.usage.prompt_tokens

    def input_tokens(**extra: Any) -> int:  # the Responses API's, as vLLM's takes them
        created = chat.client().responses.create(
            model=thinking_model, input=MESSAGES, max_output_tokens=1, extra_body=extra
        )
        assert created.usage is not None
        return created.usage.input_tokens

    thinking = prompt_tokens()
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": True}) == thinking
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) > thinking
    assert input_tokens() == thinking < input_tokens(chat_template_kwargs={"enable_thinking": False})
    for kwargs in ({"add_generation_prompt": False}, {"messages": []}, {"big": "x" * 20_000}, []):
        body = {"model": "chat", "messages": MESSAGES, "chat_template_kwargs": kwargs}
        assert_error(chat.post("/v1/chat/completions", **body), 400, param="chat_template_kwargs")
    refused = chat.post("/v1/responses", model="chat", input="hi", chat_template_kwargs={"tools": []})
    assert_error(refused, 400, param="chat_template_kwargs")


def test_a_thinking_models_reasoning_comes_apart_from_its_content_whole_and_streamed(
    chat: Chat, thinking_model: str
) -> None:
    client = chat.client()
    body: dict[str, Any] = dict(
        model=thinking_model, messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"min_tokens": 8}
    )
    answer = client.chat.completions.create(**body)
    message, usage = answer.choices[0].message, answer.usage
    assert message.content is None and message.model_extra is not None
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.model_extra["reasoning"] == reasoning
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join((d.model_extra or {}).get("reasoning", "") for d in deltas) == reasoning
    assert not "".join(d.content or "" for d in deltas)
    streamed = chunks[-1].usage
    assert streamed is not None and streamed.completion_tokens_details is not None
    assert streamed.completion_tokens_details.reasoning_tokens == 8


def test_reasoning_effort_switches_thinking_where_the_family_has_a_switch(
    chat: Chat, thinking_model: str
) -> None:
    client = chat.client()
    off = client.chat.completions.create(
        model=thinking_model, messages=MESSAGES, max_tokens=4, temperature=0, reasoning_effort="none"
    )
    assert off.choices[0].message.model_extra is not None
    assert off.choices[0].message.model_extra["reasoning_content"] is None
    assert off.usage is not None and off.usage.completion_tokens_details is not None
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    explicit = client.chat.completions.create(
        model=thinking_model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert explicit.usage is not None and explicit.usage.prompt_tokens == off.usage.prompt_tokens
    assert off.choices[0].message.content == explicit.choices[0].message.content
    on = client.chat.completions.create(
        model=thinking_model, messages=MESSAGES, max_tokens=4, temperature=0, reasoning_effort="high"
    )
    assert on.usage is not None and on.usage.prompt_tokens < off.usage.prompt_tokens


def test_reasoning_effort_is_a_400_naming_it_where_the_family_has_no_switch(chat: Chat) -> None:
    error = assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, reasoning_effort="low"),
        400,
        param="reasoning_effort",
    )
    assert "hermes" in error["message"]
    error = assert_error(
        chat.post("/v1/responses", model="chat", input="hi", reasoning={"effort": "low"}),
        400,
        param="reasoning.effort",
    )
    assert "hermes" in error["message"]


def test_an_earlier_turns_reasoning_content_is_given_to_the_template(chat: Chat, thinking_model: str) -> None:
    def prompt_tokens(**reasoning: str) -> int:
        turns = [
            *MESSAGES,
            {"role": "assistant", "content": "sunny", **reasoning},
            {"role": "user", "content": "ok"},
        ]
        answer = chat.post("/v1/chat/completions", model=thinking_model, messages=turns, max_tokens=1)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens"])

    without = prompt_tokens()
    assert prompt_tokens(reasoning_content="the sky is clear") > without
    assert prompt_tokens(reasoning="the sky is clear") == prompt_tokens(reasoning_content="the sky is clear")


def test_a_responses_reasoning_is_an_item_before_its_message_and_goes_back_in_as_input(
    chat: Chat, thinking_model: str
) -> None:
    client = chat.client()
    response = client.responses.create(
        model=thinking_model,
        input="what is the weather in berlin?",
        max_output_tokens=6,
        temperature=0,
        extra_body={"min_tokens": 6},
        store=False,
    )
    (item,) = response.output
    assert item.type == "reasoning" and item.summary == [] and item.content
    assert item.content[0].type == "reasoning_text" and item.content[0].text
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 6
    events = list(
        client.responses.create(
            model=thinking_model,
            input="what is the weather in berlin?",
            max_output_tokens=6,
            temperature=0,
            extra_body={"min_tokens": 6},
            store=False,
            stream=True,
        )
    )
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == item.content[0].text
    assert [e.type for e in events if e.type.startswith("response.reasoning_text")][-1].endswith(".done")

    def input_tokens(*earlier: Any) -> int:
        turns = [
            {"role": "user", "content": "hi"},
            *earlier,
            {"role": "assistant", "content": "sunny"},
            {"role": "user", "content": "ok"},
        ]
        again = client.responses.create(model=thinking_model, input=turns, max_output_tokens=1, store=False)
        assert again.usage is not None
        return again.usage.input_tokens

    assert input_tokens(item.model_dump(exclude_none=True)) > input_tokens()
    off = client.responses.create(
        model=thinking_model, input="hi", max_output_tokens=2, reasoning={"effort": "none"}, store=False
    )
    assert [o.type for o in off.output] == ["message"]
    assert off.reasoning is not None and off.reasoning.effort == "none"


def test_a_conversation_keeps_a_responses_reasoning_and_gives_it_to_the_next_turn(
    chat: Chat, thinking_model: str
) -> None:
    client = chat.client()
    conversation = client.conversations.create()
    question = "what is the weather in berlin?"
    first = client.responses.create(
        model=thinking_model,
        conversation=conversation.id,
        input=question,
        max_output_tokens=6,
        temperature=0,
        extra_body={"min_tokens": 6},
    )
    (reasoning,) = first.output
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [item.type for item in items] == ["message", "reasoning"]
    assert items[1].model_dump(exclude_none=True) == reasoning.model_dump(exclude_none=True)
    second = client.responses.create(
        model=thinking_model, conversation=conversation.id, input="ok", max_output_tokens=1
    )
    turns = [{"role": "user", "content": question}, reasoning.model_dump(exclude_none=True)]
    same = client.responses.create(  # the same turn given whole, without the conversation
        model=thinking_model,
        input=[*turns, {"role": "user", "content": "ok"}],  # type: ignore[list-item]
        max_output_tokens=1,
        store=False,
    )
    assert second.usage is not None and same.usage is not None
    assert second.usage.input_tokens == same.usage.input_tokens


def test_litellm_reads_a_reasoning_models_reasoning_content_whole_and_streamed(
    chat: Chat,
    thinking_model: str,
    litellm: ModuleType,  # noqa: F811 (the imported fixture)
) -> None:
    options: dict[str, Any] = dict(
        model=f"openai/{thinking_model}",
        api_base=f"{chat.url}/v1",
        api_key=chat.key,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        num_retries=0,
    )
    message = litellm.completion(**options).choices[0].message
    assert message.reasoning_content and not message.content
    chunks = list(litellm.completion(**options, stream=True))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == message.reasoning_content


def test_tokenize_counts_a_prompt_and_a_chat_as_generation_sees_them_and_detokenize_reverses_it(
    chat: Chat, thinking_model: str, tokenizer: Any
) -> None:
    def tokenize(**body: Any) -> dict[str, Any]:
        answered = chat.post("/tokenize", **body)
        assert answered.status_code == 200, answered.text
        result: dict[str, Any] = answered.json()
        assert result["count"] == len(result["tokens"]) and result["max_model_len"] == 2048
        return result

    text = tokenize(model="chat", prompt="hello world", return_token_strs=True)
    assert text["tokens"] == tokenizer("hello world")["input_ids"]
    assert text["token_strs"] == tokenizer.convert_ids_to_tokens(text["tokens"])
    created = chat.client().chat.completions.create(model="chat", messages=MESSAGES, max_tokens=1)
    assert created.usage is not None
    assert tokenize(model="chat", messages=MESSAGES)["count"] == created.usage.prompt_tokens
    thinking = tokenize(model=thinking_model, messages=MESSAGES)["count"]
    off = {"enable_thinking": False}
    assert tokenize(model=thinking_model, messages=MESSAGES, chat_template_kwargs=off)["count"] > thinking
    assert tokenize(model="chat", messages=MESSAGES, add_generation_prompt=False)["count"] < thinking

    back = chat.post("/detokenize", model="chat", tokens=text["tokens"])
    assert back.status_code == 200 and back.json() == {"prompt": "hello world"}
    assert_error(chat.post("/detokenize", model="chat", tokens=[10**6]), 400, param="tokens")
    assert_error(chat.post("/tokenize", model="chat", prompt="hi", temprature=1), 400)


def test_tokenizer_info_gives_lm_eval_the_deployments_tokenizer_as_vllm_does(
    chat: Chat, tokenizer: Any
) -> None:
    """lm-eval's `local-completions` asks `/tokenizer_info` (and `/tokenize`) with no model: a deployment
    key names it; with `eos_token` there, it uses the server's tokenizer (its `RemoteTokenizer`)."""
    scoped = chat.post("/v1/keys", name="lm-eval", deployments=[chat.deployment_id]).json()["api_key"]
    answered = chat.http.get("/tokenizer_info", headers=bearer(scoped))
    assert answered.status_code == 200, answered.text
    info = answered.json()
    assert info["tokenizer_class"] == type(tokenizer).__name__ and info["eos_token"] == tokenizer.eos_token
    assert info["chat_template"] == tokenizer.chat_template
    assert not any(k.endswith("_file") or k == "name_or_path" for k in info)  # no folder of the replica's
    assert chat.http.get("/tokenizer_info?model=chat", headers=bearer(chat.key)).json() == info
    eos = chat.http.post(
        "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}, headers=bearer(scoped)
    ).json()["tokens"]
    assert eos == [tokenizer.eos_token_id]
    assert_error(chat.http.get("/tokenizer_info", headers=bearer(chat.key)), 400, param="model")


# A deployment's own chat template (`chat_template`), whose greeting is a template argument
GREETING_TEMPLATE = "{%- for m in messages %}{{ greeting }} {{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def base_model(chat: Chat, recipes: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The chat model again as a base model (its copy has no chat template), its deployment's context cut
    to 256 tokens of the model's 2048 (`max_model_len`)."""
    folder = long_context_copy(recipes, tmp_path_factory.mktemp("base"))
    (folder / "chat_template.jinja").unlink()
    return deploy_folder_sync(
        chat.http, chat.key, folder, "text-generation", "chat-base", readiness="warm", max_model_len=256
    )


def test_a_deployments_max_model_len_is_its_context_and_sizes_its_kv_cache(
    chat: Chat, base_model: dict[str, Any]
) -> None:
    assert base_model["max_model_len"] == 256
    assert chat.post("/tokenize", model="chat-base", prompt="hello").json()["max_model_len"] == 256
    long = "hello world " * 100  # 400 tokens: over 256, within the model's 2048
    assert chat.post("/v1/completions", model="chat", prompt=long, max_tokens=1).status_code == 200
    refused = chat.post("/v1/completions", model="chat-base", prompt=long, max_tokens=1)
    assert (
        "the deployment's context (max_model_len) of 256 tokens"
        in assert_error(refused, 400, param="prompt")["message"]
    )
    capacity = chat.http.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY)).json()
    kv_cache = {d["model"]: d["kv_cache_bytes"] for d in capacity["deployments"]}
    assert 0 < kv_cache["chat-base"] < kv_cache["chat"] / 4  # room for 64 contexts of 256 tokens, not 2048
    path = f"/v1/deployments/{base_model['id']}"
    longer = chat.http.patch(path, json={"max_model_len": 4096}, headers=bearer(chat.key))
    assert "context of 2048 tokens" in assert_error(longer, 400, param="max_model_len")["message"]


def test_a_deployments_max_model_len_shrinks_its_measured_footprint_by_the_kv_cache_it_saves(
    chat: Chat, base_model: dict[str, Any]
) -> None:
    """The same weights at the model's 2048 tokens (`chat`) and at 256 (`chat-base`): once each has
    answered (the engine's KV cache is made at its first forward) and been measured again, the measured
    footprint of the shorter one is smaller by most of the KV cache it does not reserve (measured here:
    28.2 MiB less, for 28.0 MiB of KV cache)."""
    for model in ("chat", "chat-base"):
        assert chat.post("/v1/completions", model=model, prompt="hello", max_tokens=2).status_code == 200
    answered = time.monotonic()

    def view() -> dict[str, Any]:
        capacity = chat.http.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY)).json()
        return {d["model"]: d for d in capacity["deployments"]}

    deadline = answered + 30
    while True:
        deployments = view()
        full, short = deployments["chat"], deployments["chat-base"]
        saved = full["kv_cache_bytes"] - short["kv_cache_bytes"]
        assert saved > 16 << 20  # 28 MiB here: well above the noise of two processes' memory
        measured = full["footprint_measured"] and short["footprint_measured"]
        if measured and full["footprint_bytes"] - short["footprint_bytes"] > saved / 2:
            break
        assert time.monotonic() < deadline, (full, short)
        time.sleep(0.5)


def test_a_base_model_answers_chat_once_its_deployment_has_a_template_with_default_arguments(
    chat: Chat, base_model: dict[str, Any]
) -> None:
    no_template = chat.post("/v1/chat/completions", model="chat-base", messages=MESSAGES, max_tokens=2)
    assert "chat_template" in assert_error(no_template, 400, "no_chat_template", param="messages")["message"]
    responses = chat.post("/v1/responses", model="chat-base", input="hello", max_output_tokens=2)
    assert_error(responses, 400, "no_chat_template")
    assert chat.post("/v1/completions", model="chat-base", prompt="hello", max_tokens=2).status_code == 200

    settings = {"chat_template": GREETING_TEMPLATE, "chat_template_kwargs": {"greeting": "hi"}}
    patched = chat.http.patch(f"/v1/deployments/{base_model['id']}", json=settings, headers=bearer(chat.key))
    assert patched.status_code == 200, patched.text
    assert {name: patched.json()[name] for name in settings} == settings

    def rendered(**body: Any) -> str:
        cake = [{"role": "user", "content": "cake"}]
        tokens = chat.post("/tokenize", model="chat-base", messages=cake, **body).json()["tokens"]
        return str(chat.post("/detokenize", model="chat-base", tokens=tokens).json()["prompt"])

    assert rendered() == "hi cake\n"
    assert rendered(chat_template_kwargs={"greeting": "bye"}) == "bye cake\n"  # the request's own wins
    answer = chat.post("/v1/chat/completions", model="chat-base", messages=MESSAGES, max_tokens=2)
    assert answer.status_code == 200, answer.text


def test_a_deployments_tool_parser_replaces_the_detected_one(chat: Chat, base_model: dict[str, Any]) -> None:
    # a call as Llama 3 writes it (a bare JSON object), the output held to it by a JSON schema
    call = {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    body = {
        "messages": MESSAGES,
        "tools": [WEATHER],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "call", "schema": call, "strict": True},
        },
    }
    settings = {"chat_template": GREETING_TEMPLATE, "tool_parser": "llama3_json"}
    patched = chat.http.patch(f"/v1/deployments/{base_model['id']}", json=settings, headers=bearer(chat.key))
    assert patched.status_code == 200 and patched.json()["tool_parser"] == "llama3_json", patched.text
    parsed = chat.post("/v1/chat/completions", model="chat-base", **body).json()["choices"][0]
    assert parsed["finish_reason"] == "tool_calls", parsed
    assert parsed["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    detected = chat.post("/v1/chat/completions", model="chat", **body).json()["choices"][0]  # hermes: text
    assert (
        detected["finish_reason"] == "stop"
        and json.loads(detected["message"]["content"])["name"] == "get_weather"
    )


# ---------------------------------------------------------------- chat templates under a budget


@pytest.fixture(scope="module")
def bombs(chat: Chat, base_model: dict[str, Any]) -> dict[str, Any]:
    """`chat-base` with a template that renders its messages unless the request's `bomb` template
    argument sets one of tests/hostile_templates.py's bombs off (`triggered`); loaded, with its replica's
    process ID (`pid`)."""
    patched = chat.http.patch(
        f"/v1/deployments/{base_model['id']}", json={"chat_template": triggered()}, headers=bearer(chat.key)
    )
    assert patched.status_code == 200, patched.text
    tokens = chat.post("/tokenize", model="chat-base", messages=[{"role": "user", "content": "cake"}])
    assert tokens.status_code == 200, tokens.text
    [pid] = processes("modelhost.runtime.worker.sync_worker", base_model["id"])
    return {**base_model, "pid": pid}


def _stopped(chat: Chat, reason: str) -> float:
    """Renders stopped in the server's replicas (`modelhost_chat_templates_stopped_total`), by reason."""
    pattern = rf'^modelhost_chat_templates_stopped_total{{reason="{reason}"}} ([\d.e+]+)$'
    found = re.search(pattern, chat.http.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def _resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024  # type: ignore[union-attr]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_template_bomb_deployment_answers_400_naming_chat_template_and_its_replica_serves_on(
    chat: Chat, bombs: dict[str, Any]
) -> None:
    """Nested loops (the finding: 12,000 × 12,000 held a replica 19.6 s): a 400 naming `chat_template`
    and the time budget, an error of that request only; the same replica answers the next one."""
    loops = chat.post(
        "/v1/chat/completions", model="chat-base", messages=MESSAGES, chat_template_kwargs={"bomb": "loops"}
    )
    error = assert_error(loops, 400, "chat_template_timeout", param="chat_template")
    assert "1 CPU seconds (MODELHOST_CHAT_TEMPLATE_SECONDS)" in error["message"]
    answer = chat.post("/v1/chat/completions", model="chat-base", messages=MESSAGES, max_tokens=2)
    assert answer.status_code == 200, answer.text
    assert processes("modelhost.runtime.worker.sync_worker", bombs["id"]) == [bombs["pid"]]


def test_a_template_that_builds_a_huge_string_is_a_400_before_the_replica_holds_it(
    chat: Chat, bombs: dict[str, Any]
) -> None:
    """`'x' * 150000000` on /tokenize took a replica from 396 MB to 968 MB: now a 400 naming the cap,
    the string never made; the other size bombs likewise."""
    before = _resident_mb(bombs["pid"])
    for bomb in sorted(set(BOMBS) - set(TIME_BOMBS)):
        tokens = chat.post(
            "/tokenize", model="chat-base", messages=MESSAGES, chat_template_kwargs={"bomb": bomb}
        )
        error = assert_error(tokens, 400, "chat_template_too_large", param="chat_template")
        assert "MODELHOST_CHAT_TEMPLATE_MAX_CHARS" in error["message"], bomb
        if bomb == "string":
            assert "150,000,000 characters at once, over its cap of 1,000,000" in error["message"]
    grown = _resident_mb(bombs["pid"]) - before
    assert grown < 150, grown  # coarse: the most a render may build is 16 M characters
    assert chat.post("/tokenize", model="chat-base", messages=MESSAGES).status_code == 200


def test_a_template_render_stops_when_its_client_leaves_and_the_replica_answers_the_next(
    chat: Chat, bombs: dict[str, Any]
) -> None:
    """The bomb renders (its replica's CPU time grows) when its client closes the connection: the
    render stops then (`client_left`), not at its time budget, and the replica answers the next
    request. The one replica thread renders one template at a time: the next answer comes after the
    bomb's render ended, and the counters say how it ended."""
    left, timed_out = _stopped(chat, "client_left"), _stopped(chat, "time")
    body = json.dumps(
        {"model": "chat-base", "messages": MESSAGES, "chat_template_kwargs": {"bomb": "loops"}}
    ).encode()
    host, port = chat.url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {chat.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    cpu = _cpu_seconds(bombs["pid"])
    with socket.create_connection((host, int(port))) as client:
        client.sendall(request + body)
        deadline = time.monotonic() + 60
        while _cpu_seconds(bombs["pid"]) - cpu < 0.1:  # an idle replica spends none: it renders now
            assert time.monotonic() < deadline
            time.sleep(0.01)
    answer = chat.post("/tokenize", model="chat-base", messages=MESSAGES)
    assert answer.status_code == 200, answer.text
    assert (_stopped(chat, "client_left") - left, _stopped(chat, "time") - timed_out) == (1, 0)


def test_a_prompt_over_the_context_is_a_400_naming_max_tokens(chat: Chat) -> None:
    error = assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, max_tokens=100_000),
        400,
        param="max_tokens",
    )
    assert "context" in error["message"]
    long = [{"role": "user", "content": "hello world " * 1500}]
    assert_error(chat.post("/v1/chat/completions", model="chat", messages=long), 400, param="messages")
    streamed = chat.post(
        "/v1/chat/completions", model="chat", messages=MESSAGES, max_tokens=100_000, stream=True
    )
    assert_error(streamed, 400, param="max_tokens")


def test_vendor_model_names_are_not_found_and_other_pipelines_are_not_supported(
    chat: Chat, recipes: Path
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        chat.client().chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.body["message"] == "Model not found"  # type: ignore[index]
    artifact = push_folder_sync(
        chat.http, chat.key, recipes / "t03_feature_extraction" / "st", "feature-extraction"
    )
    created = chat.http.post(
        "/v1/deployments", json={"model": "embedder", "artifact_id": artifact}, headers=bearer(chat.key)
    )
    assert created.status_code == 201
    error = assert_error(
        chat.post("/v1/chat/completions", model="embedder", messages=MESSAGES),
        400,
        code="endpoint_not_supported",
    )
    assert "Endpoint not supported" in error["message"]


# ---------------------------------------------------------------- completions


def test_completions_take_strings_lists_and_token_ids(chat: Chat) -> None:
    client = chat.client()
    one = client.completions.create(model="chat", prompt="hello world", max_tokens=5, temperature=0)
    assert one.object == "text_completion" and len(one.choices) == 1
    several = client.completions.create(
        model="chat", prompt=["hello world", "a photo"], max_tokens=5, temperature=0, n=2
    )
    assert [c.index for c in several.choices] == [0, 1, 2, 3]
    assert several.choices[0].text == one.choices[0].text
    ids = chat.post("/v1/completions", model="chat", prompt=[1, 2, 3], max_tokens=3).json()
    assert ids["usage"]["prompt_tokens"] == 3
    assert_error(chat.post("/v1/completions", model="chat", prompt=[10**6]), 400, param="prompt")


def test_completions_echo_and_logprobs(chat: Chat) -> None:
    answer = chat.client().completions.create(
        model="chat",
        prompt="hello world",
        max_tokens=4,
        temperature=0,
        echo=True,
        logprobs=2,
        extra_body={"min_tokens": 4},
    )
    choice = answer.choices[0]
    assert choice.text.startswith("hello world")
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.text_offset
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None and all(lp is not None for lp in logprobs.token_logprobs[1:])
    assert (
        logprobs.text_offset[0] == 0 and logprobs.top_logprobs and len(logprobs.top_logprobs[-1] or {}) == 2
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 4


def test_completions_stream_text_completion_chunks(chat: Chat) -> None:
    chunks = list(
        chat.client().completions.create(
            model="chat",
            prompt="hello world",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"min_tokens": 6},
        )
    )
    whole = chat.client().completions.create(
        model="chat", prompt="hello world", max_tokens=6, temperature=0, extra_body={"min_tokens": 6}
    )
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_a_streamed_answer_sends_a_chunk_per_token_even_inside_a_character(chat: Chat) -> None:
    """As vLLM's server: a token whose bytes end inside a character is a chunk with empty text (or
    content), so a client times the first token at the first token (issue 59). The random-weight model
    writes byte tokens that split characters ("\ufffd" and all) within these 24 tokens."""
    tokens = 24
    body: dict[str, Any] = {"max_tokens": tokens, "temperature": 0, "extra_body": {"min_tokens": tokens}}
    completion = list(chat.client().completions.create(model="chat", prompt="é ü", stream=True, **body))
    texts = [c.choices[0].text for c in completion if c.choices]
    whole = chat.client().completions.create(model="chat", prompt="é ü", **body).choices[0].text
    assert len(texts) == tokens and "".join(texts) == whole
    assert "" in texts[:-1]  # a token inside a character: sent all the same
    assert "\ufffd" in "".join(texts[:-3]), texts  # invalid bytes as U+FFFD once known, not at the end
    messages: list[Any] = [{"role": "user", "content": "é ü"}]
    streamed = list(
        chat.client().chat.completions.create(model="chat", messages=messages, stream=True, **body)
    )
    contents = [
        c.choices[0].delta.content for c in streamed[1:] if c.choices and not c.choices[0].finish_reason
    ]
    assert len(contents) in (tokens - 1, tokens)  # the last token's text may come with the finish


async def test_async_client_streams_too(chat: Chat) -> None:
    client = chat.async_client()
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=5, stream=True, temperature=0
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    await client.close()
    assert "".join(pieces)


# ---------------------------------------------------------------- every field of OpenAI's requests


@pytest.fixture(scope="module")
def tokenizer(recipes: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(recipes / "t11_text_generation_chat")


def test_stop_token_ids_ignore_eos_include_stop_str_and_skip_special_tokens(
    chat: Chat, tokenizer: Any
) -> None:
    """vLLM's extensions, on answers a +100 `logit_bias` forces: a token three times, or the end of
    sequence."""
    token, eos = tokenizer("berlin", add_special_tokens=False)["input_ids"][0], tokenizer.eos_token_id

    def answer(forced: int, **extra: Any) -> tuple[str, str, int]:
        body = {"max_tokens": 3, "temperature": 0, "logit_bias": {str(forced): 100}, **extra}
        created = chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, **body).json()
        choice = created["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], created["usage"]["completion_tokens"]

    text = tokenizer.decode([token])
    assert answer(token) == (tokenizer.decode([token] * 3), "length", 3)
    assert answer(token, stop_token_ids=[token]) == ("", "stop", 0)  # as the end of sequence
    assert answer(token, stop_token_ids=[token], include_stop_str_in_output=True) == (text, "stop", 1)
    assert answer(token, stop=[text], include_stop_str_in_output=True)[:2] == (text, "stop")
    assert answer(eos) == ("", "stop", 0)
    assert answer(eos, ignore_eos=True) == ("", "length", 3)
    assert answer(eos, ignore_eos=True, skip_special_tokens=False) == (tokenizer.eos_token * 3, "length", 3)
    assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, stop_token_ids=[10**6]),
        400,
        param="stop_token_ids",
    )


def test_openai_fields_that_change_nothing_are_accepted_and_change_nothing(chat: Chat) -> None:
    client = chat.client()
    base: dict[str, Any] = dict(
        model="chat", messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"min_tokens": 6}
    )
    plain = client.chat.completions.create(**base)
    everything = client.chat.completions.create(
        **base,
        store=True,
        metadata={"team": "search", "run": "42"},
        service_tier="auto",
        user="user-1",
        safety_identifier="hashed-user",
        prompt_cache_key="weather",
        prompt_cache_retention="24h",
        verbosity="low",
        web_search_options={"search_context_size": "low"},
        prediction={"type": "content", "content": "sunny"},
        modalities=["text"],
        audio=None,
        parallel_tool_calls=False,
    )
    assert everything.choices[0].message.content == plain.choices[0].message.content


def test_a_misspelt_field_is_400_naming_it(chat: Chat) -> None:
    error = assert_error(
        chat.post("/v1/chat/completions", model="chat", messages=MESSAGES, temprature=0),
        400,
        param="temprature",
    )
    assert "Extra inputs are not permitted" in error["message"]
    assert_error(chat.post("/v1/completions", model="chat", prompt="x", sufix="y"), 400, param="sufix")


IMAGE_PART = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"format": "wav", "voice": "alloy"}}, "audio"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"messages": [{"role": "user", "content": [IMAGE_PART]}]}, "messages[0].content"),
        ({"tools": [{"type": "custom", "custom": {"name": "shell"}}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": {"type": "custom", "custom": {"name": "shell"}}}, "tool_choice"),
        ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"logit_bias": {"hello": 5}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),  # outside the vocabulary: the worker knows it
        ({"n": 17}, "n"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_fields_whose_answer_we_cannot_give_are_400_naming_them(
    chat: Chat, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 2, **fields}
    assert_error(chat.post("/v1/chat/completions", **body), 400, param=param)


def test_a_plus_100_logit_bias_makes_greedy_output_that_token(chat: Chat, tokenizer: Any) -> None:
    token = tokenizer("berlin", add_special_tokens=False)["input_ids"][0]
    bias = {str(token): 100}
    answer = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=3, temperature=0, logit_bias=bias
    )
    assert answer.choices[0].message.content == tokenizer.decode([token] * 3)
    completion = chat.client().completions.create(
        model="chat", prompt="hello world", max_tokens=3, temperature=0, logit_bias=bias
    )
    assert completion.choices[0].text == tokenizer.decode([token] * 3)


def test_a_chat_keeps_the_special_tokens_of_its_familys_markup_and_hides_the_others(
    chat: Chat, tokenizer: Any
) -> None:
    """This tokenizer marks its `<tool_call>` special: a chat's text keeps it (its tool parser reads
    it), and still hides the other special tokens, such as `<|endoftext|>`, unless asked not to."""

    def answer(text: str, **extra: Any) -> tuple[str | None, str]:
        token = tokenizer.convert_tokens_to_ids(text)
        body = dict(
            model="chat", messages=MESSAGES, max_tokens=2, temperature=0, logit_bias={str(token): 100}
        )
        chat_text = chat.post("/v1/chat/completions", **body, **extra).json()["choices"][0]["message"][
            "content"
        ]
        del body["messages"]
        completion = chat.post("/v1/completions", **body, prompt="hi", **extra).json()["choices"][0]["text"]
        return chat_text, completion

    assert answer("<tool_call>") == ("<tool_call><tool_call>", "")  # completions are never parsed
    assert answer("<|endoftext|>") == ("", "")
    assert answer("<|endoftext|>", skip_special_tokens=False) == ("<|endoftext|>" * 2,) * 2


def test_a_minus_100_logit_bias_on_the_greedy_token_changes_the_output(chat: Chat, tokenizer: Any) -> None:
    client = chat.client()
    base: dict[str, Any] = dict(model="chat", messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True)
    greedy = client.chat.completions.create(**base).choices[0].logprobs.content[0].token  # type: ignore[union-attr, index]
    ids = [i for i in range(len(tokenizer)) if tokenizer.decode([i]) == greedy]
    banned = client.chat.completions.create(**base, logit_bias={str(i): -100 for i in ids})
    assert banned.choices[0].logprobs.content[0].token != greedy  # type: ignore[union-attr, index]


def test_deprecated_functions_answer_with_a_function_call(chat: Chat) -> None:
    client = chat.client()
    body: dict[str, Any] = dict(
        model="chat",
        messages=MESSAGES,
        functions=[WEATHER["function"]],
        function_call={"name": "get_weather"},
        max_tokens=80,
        temperature=0,
    )
    answer = client.chat.completions.create(**body)
    choice = answer.choices[0]
    call = choice.message.function_call
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert call is not None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
    name, arguments, finishes = "", "", []
    for chunk in client.chat.completions.create(**body, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.tool_calls
        name += (delta.function_call and delta.function_call.name) or ""
        arguments += (delta.function_call and delta.function_call.arguments) or ""
        finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert (name, arguments) == (call.name, call.arguments) and finishes == ["function_call"]
    result = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": call.name, "arguments": call.arguments},
        },
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    back = client.chat.completions.create(
        **{**body, "messages": result, "function_call": "auto", "max_tokens": 2}
    )
    assert back.usage.prompt_tokens > answer.usage.prompt_tokens + 10  # type: ignore[union-attr]


def test_allowed_tools_restrict_a_required_call_to_those_tools(chat: Chat) -> None:
    for name in ("get_time", "get_weather"):
        allowed = {"mode": "required", "tools": [{"type": "function", "function": {"name": name}}]}
        answer = chat.client().chat.completions.create(
            model="chat",
            messages=MESSAGES,
            tools=[WEATHER, TIME],
            tool_choice={"type": "allowed_tools", "allowed_tools": allowed},  # type: ignore[typeddict-item]
            max_tokens=80,
            temperature=0,
        )
        assert answer.choices[0].message.tool_calls[0].function.name == name  # type: ignore[index, union-attr]


def test_parallel_tool_calls_false_keeps_the_first_parsed_call() -> None:
    from modelhost.generation.choices import ChatChoice
    from modelhost.generation.contract import Text

    two = '<tool_call>{"name": "get_time", "arguments": {"zone": 1}}</tool_call>' * 2
    for one_call, count in ((False, 2), (True, 1)):
        choice = ChatChoice(0, "auto", ["get_time"], one_call=one_call)
        choice.feed(Text(text=two, completion_tokens=30, finish="stop"))
        assert len(choice.message()["tool_calls"]) == count


# ---------------------------------------------------------------- completions' own fields


def test_best_of_returns_the_n_candidates_with_the_highest_mean_log_probability(chat: Chat) -> None:
    client = chat.client()
    base: dict[str, Any] = dict(
        model="chat",
        prompt="hello world",
        max_tokens=6,
        temperature=1.5,
        seed=5,
        extra_body={"min_tokens": 6},
    )
    candidates = client.completions.create(**base, n=4, logprobs=0).choices  # candidate i: seed 5 + i
    means = [sum(c.logprobs.token_logprobs) / 6 for c in candidates]  # type: ignore[arg-type, union-attr]
    ranked = sorted(range(4), key=lambda i: means[i], reverse=True)
    best = client.completions.create(**base, n=2, best_of=4)
    assert [c.text for c in best.choices] == [candidates[i].text for i in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1] and all(c.logprobs is None for c in best.choices)
    assert best.usage is not None and best.usage.completion_tokens == 24  # every candidate was generated
    assert_error(chat.post("/v1/completions", model="chat", prompt="x", n=2, best_of=1), 400, param="best_of")
    streamed = chat.post("/v1/completions", model="chat", prompt="x", best_of=2, stream=True)
    assert_error(streamed, 400, param="best_of")


def test_suffix_needs_a_model_with_fill_in_the_middle_tokens(chat: Chat) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat.client().completions.create(model="chat", prompt="def add(a, b):", suffix="    return c")
    assert refused.value.body["param"] == "suffix" and "fill-in-the-middle" in refused.value.body["message"]  # type: ignore[index]
    echo = chat.post("/v1/completions", model="chat", prompt="x", suffix="y", echo=True)
    assert_error(echo, 400, param="suffix")


def test_a_null_prompt_starts_a_new_document(chat: Chat) -> None:
    answer = chat.post("/v1/completions", model="chat", prompt=None, max_tokens=3, temperature=0)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 1


# ---------------------------------------------------------------- Anthropic's Messages API (docs/messages.md)

ANTHROPIC_WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
}
QUESTION: list[Any] = [{"role": "user", "content": "what is the weather in berlin?"}]
# The SDK's `create` no longer takes sampling fields (Anthropic's newest models fix them); the API does.
GREEDY = {"temperature": 0}


def test_anthropic_sdk_creates_a_message_with_the_chat_completions_answer_and_usage(chat: Chat) -> None:
    message = chat.anthropic().messages.create(
        model="chat",
        system=[
            {"type": "text", "text": "You are a helpful assistant", "cache_control": {"type": "ephemeral"}}
        ],
        messages=QUESTION,
        max_tokens=6,
        extra_body=GREEDY,
    )
    same = chat.client().chat.completions.create(model="chat", messages=MESSAGES, max_tokens=6, temperature=0)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "chat" and [block.type for block in message.content] == ["text"]
    assert message.content[0].text == same.choices[0].message.content  # type: ignore[union-attr]
    finish = {"length": "max_tokens", "stop": "end_turn"}[same.choices[0].finish_reason]
    assert message.stop_reason == finish and message.stop_sequence is None
    assert same.usage is not None and message.usage.output_tokens == same.usage.completion_tokens
    assert message.usage.cache_creation_input_tokens == 0
    read = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + read == same.usage.prompt_tokens


def test_anthropic_sdk_streams_a_messages_text_and_its_final_message(chat: Chat) -> None:
    client = chat.anthropic()
    body: dict[str, Any] = dict(model="chat", messages=QUESTION, max_tokens=10, extra_body=GREEDY)
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and text == whole.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    raw_body = {"model": "chat", "messages": QUESTION, "max_tokens": 10, "stream": True, **GREEDY}
    raw = chat.http.post("/v1/messages", json=raw_body, headers={"x-api-key": chat.key})
    names = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert raw.headers["content-type"].startswith("text/event-stream")


def test_anthropic_stop_sequences_end_the_text_and_are_named_whole_and_streamed(chat: Chat) -> None:
    client = chat.anthropic()
    body: dict[str, Any] = dict(model="chat", messages=QUESTION, max_tokens=20, extra_body=GREEDY)
    full = client.messages.create(**body)
    text = full.content[0].text  # type: ignore[union-attr]
    assert full.stop_reason == "max_tokens" and len(text) > 6
    stop = text[4:7]  # the transformers engine's random model writes newlines only: then at once
    before = text[: text.index(stop)]
    stopped = client.messages.create(**body, stop_sequences=["never written", stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert "".join(b.text for b in stopped.content if b.type == "text") == before
    assert stopped.usage.output_tokens < 20
    with client.messages.stream(**body, stop_sequences=[stop]) as stream:
        assert "".join(stream.text_stream) == before
        assert stream.get_final_message().stop_sequence == stop


def test_anthropic_tool_use_round_trip_from_call_to_result_to_answer(chat: Chat) -> None:
    client = chat.anthropic()
    body: dict[str, Any] = dict(
        model="chat", messages=QUESTION, tools=[ANTHROPIC_WEATHER], max_tokens=80, extra_body=GREEDY
    )
    called = client.messages.create(**body, tool_choice={"type": "any"})
    assert called.stop_reason == "tool_use"
    (call,) = [block for block in called.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, ANTHROPIC_WEATHER["input_schema"])
    with client.messages.stream(**body, tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(call.name, call.input)]
    turns = [
        *QUESTION,
        {"role": "assistant", "content": [block.model_dump() for block in called.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": "sunny"}],
                }
            ],
        },
    ]
    answer = client.messages.create(**{**body, "max_tokens": 3, "messages": turns})
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) > (
        called.usage.input_tokens + (called.usage.cache_read_input_tokens or 0) + 10
    )  # the call and its result are in the prompt
    counted = client.messages.count_tokens(model="chat", messages=turns, tools=[ANTHROPIC_WEATHER])
    assert counted.input_tokens == answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)


def test_anthropic_thinking_is_a_thinking_block_switched_by_thinking_and_sent_back(
    chat: Chat, thinking_model: str
) -> None:
    client = chat.anthropic()
    body: dict[str, Any] = dict(model=thinking_model, messages=QUESTION, max_tokens=8, extra_body=GREEDY)
    thought = client.messages.create(**body, thinking={"type": "enabled", "budget_tokens": 1024})
    said = chat.client().chat.completions.create(
        model=thinking_model, messages=QUESTION, max_tokens=8, temperature=0
    )
    reasoning = (said.choices[0].message.model_extra or {})["reasoning_content"]
    assert thought.content[0].type == "thinking" and thought.content[0].thinking == reasoning
    with client.messages.stream(**body, thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        deltas = [
            e.delta.thinking
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
        ]
    assert "".join(deltas) == reasoning
    off = client.messages.create(**body, thinking={"type": "disabled"})
    assert [block.type for block in off.content] == ["text"]

    def counted(messages: list[Any] = QUESTION, **more: Any) -> int:
        return client.messages.count_tokens(model=thinking_model, messages=messages, **more).input_tokens

    assert counted(thinking={"type": "disabled"}) > counted()  # the switch
    assert counted(thinking={"type": "disabled"}) == off.usage.input_tokens + (
        off.usage.cache_read_input_tokens or 0
    )

    def turns(*thinking: Any) -> list[Any]:
        said = [*thinking, {"type": "text", "text": "sunny"}]
        return [*QUESTION, {"role": "assistant", "content": said}, {"role": "user", "content": "ok"}]

    block = {"type": "thinking", "thinking": "the sky is clear", "signature": ""}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    assert counted(turns(block)) > counted(turns(redacted))
    assert counted(turns(redacted)) == counted(turns())
    plain = client.messages.create(
        model="chat", messages=QUESTION, max_tokens=2, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert plain.content[0].type == "text"  # a family without a switch ignores it (Claude Code sends it)


def test_anthropic_errors_are_the_sdks_own_exceptions_in_anthropics_shape(chat: Chat) -> None:
    client = chat.anthropic()

    def error_of(refused: pytest.ExceptionInfo[anthropic.APIStatusError], kind: str) -> str:
        body = refused.value.response.json()
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert body["error"]["type"] == kind and body["error"]["message"], body
        assert refused.value.response.headers["x-request-id"]
        return str(body["error"]["message"])

    with pytest.raises(anthropic.BadRequestError) as missing:
        client.post("/v1/messages", body={"model": "chat", "messages": QUESTION}, cast_to=object)
    assert "max_tokens" in error_of(missing, "invalid_request_error")
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        chat.anthropic(api_key="mh-wrong").messages.create(model="chat", messages=QUESTION, max_tokens=1)
    error_of(bad_key, "authentication_error")
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=QUESTION)
    error_of(unknown, "not_found_error")
    with pytest.raises(anthropic.BadRequestError) as server_tool:
        tool = {"type": "web_search_20250305", "name": "web_search"}
        client.messages.create(model="chat", messages=QUESTION, max_tokens=1, tools=[tool])  # type: ignore[list-item]
    assert "tools[0]" in error_of(server_tool, "invalid_request_error")
    assert_error(
        chat.http.post("/v1/chat/completions", json={"model": "chat"}, headers=bearer("mh-wrong")), 401
    )


def test_anthropic_clients_authenticate_with_x_api_key_or_a_bearer_token_on_every_route(chat: Chat) -> None:
    bearer_client = chat.anthropic(api_key=None, auth_token=chat.key)  # Claude Code's ANTHROPIC_AUTH_TOKEN
    assert bearer_client.messages.create(model="chat", messages=QUESTION, max_tokens=1).content
    models = chat.http.get("/v1/models", headers={"x-api-key": chat.key, "anthropic-version": "2023-06-01"})
    assert models.status_code == 200 and "chat" in [m["id"] for m in models.json()["data"]]
    headers = {"x-api-key": chat.key, "anthropic-version": "2023-06-01", "anthropic-beta": "no-such-beta"}
    body = {"model": "chat", "messages": QUESTION, "max_tokens": 1}
    assert chat.http.post("/v1/messages", json=body, headers=headers).status_code == 200  # betas ignored


def test_openai_and_anthropic_clients_share_a_deployment_its_token_count_and_a_keys_rate_limit(
    chat: Chat,
) -> None:
    created = chat.post("/v1/keys", name="both", limits={"requests_per_minute": 2})
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]
    generated = lambda: deployment_metric(chat.http, "modelhost_generation_tokens_total", chat.deployment_id)  # noqa: E731
    before = generated()
    gpt = openai.OpenAI(base_url=f"{chat.url}/v1", api_key=key, max_retries=0)
    claude = chat.anthropic(api_key=key)
    first = gpt.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES, max_tokens=2)
    second = claude.messages.with_raw_response.create(model="chat", messages=QUESTION, max_tokens=3)
    assert [int(r.headers["x-ratelimit-remaining-requests"]) for r in (first, second)] == [1, 0]
    used = first.parse().usage.completion_tokens + second.parse().usage.output_tokens  # type: ignore[union-attr]
    assert generated() - before == used  # both counted on the one deployment
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(model="chat", messages=QUESTION, max_tokens=1)
    assert limited.value.response.json()["error"]["type"] == "rate_limit_error"
    assert int(limited.value.response.headers["retry-after"]) > 0
    with pytest.raises(openai.RateLimitError):
        gpt.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=1)


def test_a_claude_code_like_request_streams_thinking_and_text_under_its_betas(
    chat: Chat, thinking_model: str
) -> None:
    """Claude Code's requests, reproduced through the SDK (its own traffic cannot run here): system blocks
    with `cache_control`, tools with long schemas, `thinking`, `metadata.user_id`, its beta headers and
    `context_management`, streamed."""
    edit = {
        "name": "Edit",
        "description": "Performs exact string replacements in files. " * 8,
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "The absolute path to the file to modify"},
                "old_string": {"type": "string", "description": "The text to replace"},
                "new_string": {"type": "string", "description": "The text to replace it with"},
                "replace_all": {"type": "boolean", "default": False},
            },
            "required": ["file_path", "old_string", "new_string"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }
    bash = {
        "name": "Bash",
        "description": "Executes a given bash command in a persistent shell session. " * 8,
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
    }
    shape: dict[str, Any] = dict(
        model=thinking_model,
        system=[
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>todo list empty</system-reminder>"},
                    {"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ],
        tools=[edit, bash],
        thinking={"type": "enabled", "budget_tokens": 31999},
    )
    betas = "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
    client = chat.anthropic(default_headers={"anthropic-beta": betas, "anthropic-version": "2023-06-01"})
    extra = {**GREEDY, "context_management": {"edits": []}}
    with client.messages.stream(
        **shape, max_tokens=6, metadata={"user_id": "user_abc_account_x_session_y"}, extra_body=extra
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].type == "thinking" and final.content[0].thinking
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    counted = client.messages.count_tokens(**shape)
    assert counted.input_tokens == final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)


# ---------------------------------------------------------------- rollouts (docs/deploy.md)


def versions_of(chat: Chat, deployment_id: str) -> list[tuple[str, str]]:
    view = chat.http.get(f"/v1/deployments/{deployment_id}", headers=bearer(chat.key)).json()
    return [(v["artifact_id"], v["state"]) for v in view["versions"]]


def roll(chat: Chat, targets: dict[str, str]) -> None:
    """PATCH each deployment to its artifact at once, and wait until each new version alone serves (the
    old one drained)."""
    for deployment_id, artifact_id in targets.items():
        patch = {"artifact_id": artifact_id}
        patched = chat.http.patch(f"/v1/deployments/{deployment_id}", json=patch, headers=bearer(chat.key))
        assert patched.status_code == 200, patched.text
    deadline = time.monotonic() + 60
    for deployment_id, artifact_id in targets.items():
        while versions_of(chat, deployment_id) != [(artifact_id, "active")]:
            assert time.monotonic() < deadline, versions_of(chat, deployment_id)
            time.sleep(0.05)


def test_a_rollout_and_a_rollback_under_load_fail_no_request(
    chat: Chat, recipes: Path, tmp_path: Path
) -> None:
    headers = bearer(chat.key)
    old = chat.http.get(f"/v1/deployments/{chat.deployment_id}", headers=headers).json()["artifact_id"]
    new = push_folder_sync(chat.http, chat.key, long_context_copy(recipes, tmp_path), "text-generation")
    encoder = recipes / "t03_feature_extraction" / "st"
    emb = deploy_folder_sync(chat.http, chat.key, encoder, "feature-extraction", "emb", readiness="warm")
    emb_old = emb["artifact_id"]
    emb_new = push_folder_sync(chat.http, chat.key, encoder, "feature-extraction")
    answers: list[tuple[str, int, str | None, bool]] = []  # (endpoint, status, version, whole answer)
    stop = threading.Event()

    def stream_chat() -> None:
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 8, "stream": True}
        while not stop.is_set():
            with chat.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
                text = answer.read()
            whole = text.rstrip().endswith(b"data: [DONE]") and b'"error"' not in text
            answers.append(("chat", answer.status_code, answer.headers.get("x-modelhost-artifact"), whole))

    def embed() -> None:
        while not stop.is_set():
            answer = chat.http.post("/v1/embeddings", json={"model": "emb", "input": "hi"}, headers=headers)
            answers.append(("emb", answer.status_code, answer.headers.get("x-modelhost-artifact"), True))

    clients = [threading.Thread(target=work) for work in (stream_chat, stream_chat, embed)]
    for client in clients:
        client.start()
    try:
        time.sleep(0.3)
        roll(chat, {chat.deployment_id: new, emb["id"]: emb_new})
        capacity = chat.http.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY)).json()
        held = {(d["id"], d["artifact_id"]) for d in capacity["deployments"]}
        assert (chat.deployment_id, old) not in held and (chat.deployment_id, new) in held  # the old unloaded
        time.sleep(0.3)
        roll(chat, {chat.deployment_id: old, emb["id"]: emb_old})  # the rollback
        time.sleep(0.3)
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=60)
    failed = [a for a in answers if a[1] != 200 or not a[3]]
    assert not failed, failed
    assert {a[2] for a in answers if a[0] == "chat"} == {old, new}  # each answer names its one version
    assert {a[2] for a in answers if a[0] == "emb"} == {emb_old, emb_new}
    view = chat.http.get(f"/v1/deployments/{chat.deployment_id}", headers=headers).json()
    assert view["model"] == "chat" and [(h["from"], h["to"]) for h in view["history"]][-2:] == [
        ({old: 100}, {new: 100}),
        ({new: 100}, {old: 100}),
    ]
    metrics = chat.http.get("/metrics").text  # each version's requests, to compare a canary on
    for artifact_id in (old, new):
        assert f'artifact_id="{artifact_id}",deployment="{chat.deployment_id}",status="200"' in metrics
    chat.http.delete(f"/v1/deployments/{emb['id']}", headers=headers)


def test_a_rollouts_old_version_hands_its_long_streams_to_the_new_one_and_drains_in_seconds(
    chat: Chat, recipes: Path, tmp_path: Path
) -> None:
    """Issue 73: four streams of 1,900 greedy tokens run on the version a rollout replaces; once the new
    version is ready, the old one hands them off (it does not wait for their end) and each goes on on
    the new version with no token repeated or missing. The versions are the same weights, so each text
    equals an undisturbed run's."""
    headers = bearer(chat.key)
    old = chat.http.get(f"/v1/deployments/{chat.deployment_id}", headers=headers).json()["artifact_id"]
    new = push_folder_sync(chat.http, chat.key, long_context_copy(recipes, tmp_path), "text-generation")
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 1900, "temperature": 0}
    body["extra_body"] = {"min_tokens": 1900}
    expected, tokens, _ = _streamed(chat, body)
    for target in (new, old):  # on a busy machine the streams may all end before a load: once more
        handed_off = _migrated(chat, "drained")
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(_streamed, chat, body) for _ in range(4)]
            time.sleep(0.5)  # all four under way on the old version
            assert not any(s.done() for s in streams)
            roll(chat, {chat.deployment_id: target})  # the new version loads, then the old one drains
            finished = [s.done() for s in streams]
            answers = [s.result() for s in streams]
        if not all(finished):
            break
    print(f"\nthe old version drained with {finished.count(False)} of 4 streams still running")
    assert not all(finished)  # the drain did not wait for them
    assert [(text, counted) for text, counted, _ in answers] == [(expected, tokens)] * 4
    assert _migrated(chat, "drained") - handed_off == finished.count(False)
    roll(chat, {chat.deployment_id: old})


def test_a_ten_percent_canary_takes_ten_percent_of_a_thousand_requests(chat: Chat, recipes: Path) -> None:
    """Over HTTP, both versions loaded: each answer names its version, and the canary's share of 1,000
    requests lands within 10 ± 3 % (the draw itself, and sticky callers: tests/test_routing.py)."""
    headers = bearer(chat.key)
    encoder = recipes / "t03_feature_extraction" / "st"
    emb = deploy_folder_sync(chat.http, chat.key, encoder, "feature-extraction", "canary", readiness="warm")
    old, new = emb["artifact_id"], push_folder_sync(chat.http, chat.key, encoder, "feature-extraction")
    split = {"traffic": {old: 90, new: 10}, "sticky": None}
    patched = chat.http.patch(f"/v1/deployments/{emb['id']}", json=split, headers=headers)
    assert patched.status_code == 200, patched.text
    deadline = time.monotonic() + 60
    while sorted(versions_of(chat, emb["id"])) != sorted([(old, "active"), (new, "active")]):
        assert time.monotonic() < deadline, versions_of(chat, emb["id"])
        time.sleep(0.1)

    def version() -> str:
        answer = chat.http.post("/v1/embeddings", json={"model": "canary", "input": "hi"}, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.headers["x-modelhost-artifact"]

    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda _: version(), range(1000)))
    print(f"\nthe 10 % canary answered {served.count(new)} of 1,000 requests")
    assert set(served) == {old, new} and 70 <= served.count(new) <= 130, served.count(new)
    chat.http.delete(f"/v1/deployments/{emb['id']}", headers=headers)
