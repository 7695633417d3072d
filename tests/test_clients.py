"""Real client libraries against a live server (issue 17): LangChain, LiteLLM, Instructor and the OpenAI
Agents SDK, each driven unchanged but for base URL, API key and model ID, on the tiny recipe chat model
and the real all-MiniLM-L6-v2, deployed side by side on one gateway (one model load for the module).

The chat model has random weights: its answers are checked for structure and validity, never content.
It writes a valid tool call or JSON object only when decoding is constrained, so tool calls are forced.
Nothing here may leave this machine: every lookup of a host other than the live server's fails the test.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import instructor
import openai
import pytest
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, ConfigDict, Field

from tests.chat_model import served_chat_model
from tests.helpers import bearer, push_folder_sync

set_tracing_disabled(True)  # the Agents SDK would export traces to api.openai.com
# LiteLLM's own TypedDicts warn when pydantic first builds their schemas (at its import)
pytestmark = pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier:UserWarning")

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "what is the weather in berlin?"},
]
SENTENCES = ["A man is playing a guitar.", "The weather is lovely today.", "Paris is the capital of France."]
MINILM_DIM = 384
MINILM_VOCAB = 30522
# the name tiktoken gives its cached copy of cl100k_base (the SHA-1 of the download URL)
CL100K_CACHE_KEY = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
MAX_TOKENS = 96  # room for a constrained call or object (strings are at most 16 characters here)


class Weather(BaseModel):
    """The weather in a city."""

    city: str
    unit: Literal["c", "f"]
    sunny: bool


class WeatherArguments(BaseModel):
    """`get_weather`'s parameters, as strict as the tool's JSON schema: `city`, a string, and nothing else."""

    model_config = ConfigDict(extra="forbid", strict=True)

    city: str


class Person(BaseModel):
    name: str = Field(description="The person's first name.")
    adult: bool


@dataclass
class Served:
    url: str
    key: str

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def openai_client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0)

    def async_openai_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.key, max_retries=0)

    def chat_openai(self, **options: Any) -> ChatOpenAI:
        return ChatOpenAI(
            base_url=self.base_url,
            api_key=self.key,
            model="chat",
            **{"max_retries": 0, "temperature": 0, "max_tokens": MAX_TOKENS, **options},
        )

    def chat_anthropic(self, **options: Any) -> ChatAnthropic:
        """LangChain's Anthropic chat model on the Messages API (`/v1/messages`)."""
        return ChatAnthropic(  # type: ignore[call-arg]
            base_url=self.url,
            api_key=self.key,
            model="chat",
            **{"max_retries": 0, "temperature": 0, "max_tokens": MAX_TOKENS, **options},
        )

    def embeddings(self, **options: Any) -> OpenAIEmbeddings:
        return OpenAIEmbeddings(
            base_url=self.base_url,  # type: ignore[call-arg]
            api_key=self.key,
            model="minilm",
            max_retries=0,
            **options,
        )


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def outside_lookups() -> Iterator[list[str]]:
    """Every host name looked up during the module other than the live server's, refused."""
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def local_only(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in LOCAL_HOSTS:
            looked_up.append(name)
            raise socket.gaierror(socket.EAI_NONAME, f"test_clients: no outside connections ({name})")
        return real(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket, "getaddrinfo", local_only)
        yield looked_up


@pytest.fixture(autouse=True)
def stays_local(outside_lookups: list[str]) -> Iterator[None]:
    before = len(outside_lookups)
    yield
    assert outside_lookups[before:] == [], "a client tried to reach a host other than the live server"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, recipes: Path, minilm_dir: Path, outside_lookups: list[str]
) -> Iterator[Served]:
    """One live gateway with the tiny chat model as `chat` and all-MiniLM-L6-v2 as `minilm`, both warm."""
    with served_chat_model(
        tmp_path_factory.mktemp("clients"), recipes, constrained_max_string_length=16
    ) as server:
        artifact = push_folder_sync(server.http, server.key, minilm_dir, "feature-extraction")
        created = server.http.post(
            "/v1/deployments",
            json={"model": "minilm", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(server.key),
        )
        assert created.status_code == 201, created.text
        for path, body in (  # both models loaded before the first test, so its time is the client's
            ("/v1/chat/completions", {"model": "chat", "messages": MESSAGES, "max_tokens": 1}),
            ("/v1/embeddings", {"model": "minilm", "input": "warm"}),
        ):
            answer = server.http.post(path, json=body, headers=bearer(server.key))
            assert answer.status_code == 200, answer.text
        yield Served(server.url, server.key)


@pytest.fixture(scope="module")
def litellm(outside_lookups: list[str]) -> ModuleType:
    """LiteLLM, imported here (it takes seconds) with its bundled model cost map: by default it downloads
    one from GitHub at import. In its `PRODUCTION` mode: by default (`DEV`) its import loads the working
    directory's `.env` into the environment, which would hand the admin key `make run` wrote there to the
    tests after it."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["LITELLM_MODE"] = "PRODUCTION"
    import litellm

    litellm.telemetry = False
    return litellm


def assert_unit_vectors(vectors: list[list[float]], count: int) -> None:
    assert len(vectors) == count
    for vector in vectors:
        assert len(vector) == MINILM_DIM and all(isinstance(x, float) for x in vector)
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-4)  # MiniLM normalises


def assert_weather_call(name: str, arguments: dict[str, Any]) -> None:
    """A call of `get_weather` whose arguments follow its schema exactly."""
    assert name == "get_weather"
    WeatherArguments.model_validate(arguments)


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return "sunny"


# ---------------------------------------------------------------- LangChain


def test_langchain_chat_openai_invokes_and_streams(served: Served) -> None:
    model = served.chat_openai(max_tokens=8)
    answer = model.invoke(MESSAGES)
    assert isinstance(answer, AIMessage) and isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    assert answer.usage_metadata is not None and 0 < answer.usage_metadata["output_tokens"] <= 8
    chunks = list(model.stream(MESSAGES))
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(str(c.content) for c in chunks) == answer.content  # greedy: the same text streamed


def test_langchain_chat_openai_calls_a_forced_tool_whole_and_streamed(served: Served) -> None:
    bound = served.chat_openai().bind_tools([get_weather], tool_choice="get_weather")
    answer = bound.invoke(MESSAGES)
    assert isinstance(answer, AIMessage) and len(answer.tool_calls) == 1 and not answer.invalid_tool_calls
    call = answer.tool_calls[0]
    assert_weather_call(call["name"], call["args"])
    assert call["id"] and answer.response_metadata["finish_reason"] == "tool_calls"
    merged: AIMessageChunk | None = None
    for chunk in bound.stream(MESSAGES):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and len(merged.tool_calls) == 1
    assert (merged.tool_calls[0]["name"], merged.tool_calls[0]["args"]) == (call["name"], call["args"])


def test_langchain_structured_output_with_json_schema_gives_the_pydantic_model(served: Served) -> None:
    structured = served.chat_openai().with_structured_output(Weather, method="json_schema")
    weather = structured.invoke(MESSAGES)
    assert isinstance(weather, Weather)
    assert len(weather.city) <= 16  # the server's constrained_max_string_length


def test_langchain_embeddings_without_client_tokenisation_are_unit_vectors(served: Served) -> None:
    embeddings = served.embeddings(check_embedding_ctx_length=False)
    documents = embeddings.embed_documents(SENTENCES)
    assert_unit_vectors(documents, 3)
    query = embeddings.embed_query(SENTENCES[0])
    assert_unit_vectors([query], 1)
    assert max(abs(a - b) for a, b in zip(query, documents[0], strict=True)) < 1e-5


def test_langchain_default_embeddings_send_tiktoken_ids_and_are_told_to_send_text(
    served: Served, litellm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OpenAIEmbeddings()` by default tokenises with tiktoken (OpenAI's vocabulary) and sends token IDs,
    which mean nothing to another model: the 400 must say how to send text instead."""
    import tiktoken

    bundled = Path(litellm.__file__ or "").parent / "litellm_core_utils" / "tokenizers"  # LiteLLM's copy
    if (bundled / CL100K_CACHE_KEY).is_file():
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(bundled))
    elif not (Path(os.environ.get("TIKTOKEN_CACHE_DIR") or "/nonexistent") / CL100K_CACHE_KEY).is_file():
        pytest.skip("tiktoken would download cl100k_base to tokenise client-side; this machine is offline")
    text = "Photosynthesis happens in chloroplasts."
    assert max(tiktoken.get_encoding("cl100k_base").encode(text)) >= MINILM_VOCAB  # outside MiniLM's range
    with pytest.raises(openai.BadRequestError) as refused:
        served.embeddings().embed_documents([text])
    assert refused.value.status_code == 400
    request = json.loads(refused.value.response.request.content)
    assert isinstance(request["input"][0], list)  # token IDs, not text
    message = str(refused.value.body.get("message") if isinstance(refused.value.body, dict) else "")
    assert "check_embedding_ctx_length=False" in message


def test_langchain_chat_openai_on_the_responses_api_invokes_streams_and_calls_a_forced_tool(
    served: Served,
) -> None:
    model = served.chat_openai(use_responses_api=True, max_tokens=8)
    answer = model.invoke(MESSAGES)
    assert isinstance(answer, AIMessage) and answer.text
    assert "".join(chunk.text for chunk in model.stream(MESSAGES)) == answer.text  # greedy: the same
    forced = served.chat_openai(use_responses_api=True).bind_tools([get_weather], tool_choice="get_weather")
    called = forced.invoke(MESSAGES)
    assert isinstance(called, AIMessage) and len(called.tool_calls) == 1
    assert_weather_call(called.tool_calls[0]["name"], called.tool_calls[0]["args"])


def test_langchain_chat_anthropic_invokes_streams_and_calls_a_bound_tool(served: Served) -> None:
    model = served.chat_anthropic(max_tokens=8)
    answer = model.invoke(MESSAGES)
    assert isinstance(answer, AIMessage) and answer.text
    assert answer.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    assert answer.usage_metadata is not None and 0 < answer.usage_metadata["output_tokens"] <= 8
    assert "".join(chunk.text for chunk in model.stream(MESSAGES)) == answer.text  # greedy: the same
    bound = served.chat_anthropic().bind_tools([get_weather], tool_choice="get_weather")
    called = bound.invoke(MESSAGES)
    assert isinstance(called, AIMessage) and len(called.tool_calls) == 1
    assert_weather_call(called.tool_calls[0]["name"], called.tool_calls[0]["args"])
    assert called.response_metadata["stop_reason"] == "tool_use"
    merged: AIMessageChunk | None = None
    for chunk in bound.stream(MESSAGES):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and [(c["name"], c["args"]) for c in merged.tool_calls] == [
        (called.tool_calls[0]["name"], called.tool_calls[0]["args"])
    ]


# ---------------------------------------------------------------- LiteLLM


def test_litellm_completion_answers_and_streams(served: Served, litellm: ModuleType) -> None:
    options: dict[str, Any] = dict(
        model="openai/chat",
        api_base=served.base_url,
        api_key=served.key,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        num_retries=0,
    )
    answer = litellm.completion(**options)
    text = answer.choices[0].message.content
    assert isinstance(text, str) and text and answer.choices[0].finish_reason in ("stop", "length")
    assert 0 < answer.usage.completion_tokens <= 8
    pieces = [chunk.choices[0].delta.content or "" for chunk in litellm.completion(**options, stream=True)]
    assert len(pieces) > 2 and "".join(pieces) == text


def test_litellm_completion_calls_a_forced_tool(served: Served, litellm: ModuleType) -> None:
    answer = litellm.completion(
        model="openai/chat",
        api_base=served.base_url,
        api_key=served.key,
        messages=MESSAGES,
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Get the current weather for a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
            }
        ],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
        num_retries=0,
    )
    call = answer.choices[0].message.tool_calls[0]
    assert_weather_call(call.function.name, json.loads(call.function.arguments))


def test_litellm_anthropic_route_answers_streams_and_calls_a_forced_tool(
    served: Served, litellm: ModuleType
) -> None:
    options: dict[str, Any] = dict(
        model="anthropic/chat",
        api_base=served.url,
        api_key=served.key,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        num_retries=0,
    )
    answer = litellm.completion(**options)
    text = answer.choices[0].message.content
    assert isinstance(text, str) and text and answer.choices[0].finish_reason in ("stop", "length")
    assert 0 < answer.usage.completion_tokens <= 8
    pieces = [chunk.choices[0].delta.content or "" for chunk in litellm.completion(**options, stream=True)]
    assert "".join(pieces) == text
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WeatherArguments.model_json_schema()},
    }
    options.update(tools=[tool], tool_choice="required", max_tokens=MAX_TOKENS)
    call = litellm.completion(**options).choices[0].message.tool_calls[0]
    assert_weather_call(call.function.name, json.loads(call.function.arguments))


def test_litellm_embedding_gives_unit_vectors(served: Served, litellm: ModuleType) -> None:
    answer = litellm.embedding(
        model="openai/minilm", input=SENTENCES, api_base=served.base_url, api_key=served.key
    )
    assert_unit_vectors([item["embedding"] for item in answer.data], 3)
    assert answer.usage.prompt_tokens > 0


def test_litellm_responses_answers(served: Served, litellm: ModuleType) -> None:
    answer = litellm.responses(
        model="openai/chat",
        input="what is the weather in berlin?",
        api_base=served.base_url,
        api_key=served.key,
        max_output_tokens=8,
        temperature=0,
    )
    messages = [item for item in answer.output if item.type == "message"]
    assert answer.status in ("completed", "incomplete") and len(messages) == 1
    assert messages[0].content[0].text


# ---------------------------------------------------------------- Instructor


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_creates_a_valid_pydantic_object(served: Served, mode: instructor.Mode) -> None:
    client = instructor.from_openai(served.openai_client(), mode=mode)
    person = client.chat.completions.create(
        model="chat",
        response_model=Person,
        messages=[{"role": "user", "content": "Make up a person."}],
        max_retries=0,  # one attempt: the answer must validate the first time
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert isinstance(person, Person)  # Instructor answers a subclass of the response model
    assert Person.model_validate(person.model_dump()).model_dump() == person.model_dump()
    assert len(person.name) <= 16


# ---------------------------------------------------------------- OpenAI Agents SDK


async def tool_calls_in_two_turns(model: Model, **settings: Any) -> list[str]:
    """Run an agent whose every turn must call its one tool (`tool_choice` required, not reset after a
    call) for at most two turns: the second turn sends the first call and its result back, and the run
    ends at `max_turns`. Answers the cities the tool was called with."""
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return "sunny"

    agent = Agent(
        name="weather",
        instructions="Answer briefly.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(
            tool_choice="required", max_tokens=MAX_TOKENS, temperature=0, **settings
        ),
        reset_tool_choice=False,
    )
    with pytest.raises(MaxTurnsExceeded):
        await Runner.run(agent, "what is the weather in berlin?", max_turns=2)
    return calls


async def test_agents_sdk_chat_completions_model_calls_its_tool_each_turn(served: Served) -> None:
    model = OpenAIChatCompletionsModel(model="chat", openai_client=served.async_openai_client())
    calls = await tool_calls_in_two_turns(model)
    assert len(calls) == 2 and all(isinstance(city, str) and len(city) <= 16 for city in calls)


async def test_agents_sdk_sends_metadata_and_store_and_still_calls_its_tool(served: Served) -> None:
    model = OpenAIChatCompletionsModel(model="chat", openai_client=served.async_openai_client())
    calls = await tool_calls_in_two_turns(model, metadata={"a": "b"}, store=False)
    assert len(calls) == 2


async def test_agents_sdk_default_responses_model_calls_its_tool(served: Served) -> None:
    model = OpenAIResponsesModel(model="chat", openai_client=served.async_openai_client())
    calls = await tool_calls_in_two_turns(model)
    assert len(calls) == 2 and all(isinstance(city, str) and len(city) <= 16 for city in calls)
