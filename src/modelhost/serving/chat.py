"""OpenAI chat completions and completions served on the generation engine (`POST /v1/chat/completions`,
`POST /v1/completions`; api.md §4.16, §6).

A request → one engine request per choice (`frontend`, the one pipeline every front-end shares) → the
runtime's event streams, merged → OpenAI's JSON body or Server-Sent Events. Every choice's stream is
opened (and its prompt checked by the worker) before the answer starts, so a prompt that does not fit is a
400, not a broken stream. A client that goes away closes the streams, which cancels the generations in
the worker at its next step. The routes (`api.routes.chat`) parse, call `chat_completion` / `completion`
and send what they answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from modelhost.auth.principal import low_priority
from modelhost.errors import ModelhostError
from modelhost.frontend import Generation, Streams, Target, Until
from modelhost.generation.choices import ChatChoice, effective_tools, new_id, tokenize_request, tool_schemas
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationRequest,
    GenerationStarted,
    Logprob,
    Text,
    Tokenized,
    TokenLogprob,
)
from modelhost.generation.priority import applied_tier
from modelhost.protocol.chat import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

Event = dict[str, Any]
# A JSON body, or the bytes of a Server-Sent Events stream.
Answer = Event | AsyncIterator[bytes]


# ---------------------------------------------------------------- chat completions


async def chat_completion(
    body: ChatCompletionRequest, generation: Generation, target: Target, until: Until
) -> Answer:
    """A chat completion on `target` (`frontend`: the one pipeline every front-end shares)."""
    requests, mode = await generation.chat(body, target)
    choices = chat_choices(body, mode, len(requests))
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": body.model}
    head["service_tier"] = service_tier(requests)
    if body.stream:
        streams = await generation.open(target, requests)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_chat_chunks(head, choices, streams, usage))
    streams, events = await generation.whole(target, requests, until)
    for index, event in events:
        choices[index].feed(event)
    return {
        **head,
        "object": "chat.completion",
        "choices": [
            {
                "index": c.index,
                "message": c.message(),
                "logprobs": {"content": c.logprobs, "refusal": None} if body.logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": _chat_usage(streams, choices),
        "system_fingerprint": None,
    }


def service_tier(requests: list[GenerationRequest]) -> str:
    """The tier the requests run in, as the answer's `service_tier` says (`generation.priority`): a
    batch job's line runs as `flex`, whatever its body asked."""
    first = requests[0]
    return applied_tier(first.priority, first.low or low_priority())


def _chat_usage(streams: Streams, choices: list[ChatChoice]) -> Event:
    """A chat completion's usage: `completion_tokens_details.reasoning_tokens` counts the tokens its
    choices generated inside their reasoning (`ChatChoice.reasoning_tokens`)."""
    usage = _usage(streams, 1, sum(c.completion_tokens for c in choices))
    usage["completion_tokens_details"] = {"reasoning_tokens": sum(c.reasoning_tokens for c in choices)}
    return usage


async def _chat_chunks(
    head: Event, choices: list[ChatChoice], streams: Streams, include_usage: bool
) -> AsyncIterator[bytes]:
    chunk = {**head, "object": "chat.completion.chunk", "system_fingerprint": None}

    def data(choice: ChatChoice, delta: Event, finish: str | None = None, logprobs: Any = None) -> bytes:
        entry = {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return _event({**chunk, "choices": [entry]})

    for choice in choices:
        yield data(choice, {"role": "assistant", "content": ""})
    pending: dict[int, list[Event]] = {c.index: [] for c in choices}
    async for index, event in streams.merged():
        choice = choices[index]
        counted = choice.completion_tokens
        delta = choice.feed(event)
        if "logprobs" in delta:
            pending[index] += delta.pop("logprobs")
        if not delta and _token_without_text(choice, counted):
            delta = {"content": ""}  # a chunk per token, as vLLM's, while a character's bytes arrive
        if delta:
            logprobs = {"content": pending[index], "refusal": None} if pending[index] else None
            pending[index] = []
            yield data(choice, delta, logprobs=logprobs)
        if choice.finish is not None:
            yield data(choice, {}, choice.finish_reason)
    if include_usage:
        yield _event({**chunk, "choices": [], "usage": _chat_usage(streams, choices)})


def _token_without_text(choice: ChatChoice, counted: int) -> bool:
    """Whether the event counted a token that released no content yet, where content streams as it
    comes (no tool call that may be forming, not inside the reasoning, not the end)."""
    reasoning = choice.reasoner is not None and choice.reasoner.in_reasoning
    plain = choice.mode in ("none", "json") and not reasoning
    return plain and choice.finish is None and choice.completion_tokens > counted


def chat_choices(body: ChatCompletionRequest, mode: str, count: int) -> list[ChatChoice]:
    """The assemblers of a chat completion's `count` choices."""
    tools = effective_tools(body)[0]
    names, schemas = [t.function.name for t in tools], tool_schemas(tools)
    legacy = body.functions is not None  # answers carry `function_call`, one call at most
    one_call = legacy or body.parallel_tool_calls is False
    return [
        ChatChoice(i, mode, names, tool_schemas=schemas, legacy=legacy, one_call=one_call)
        for i in range(count)
    ]


# ---------------------------------------------------------------- completions


async def completion(body: CompletionRequest, generation: Generation, target: Target, until: Until) -> Answer:
    """A completion on `target` (`frontend`: the one pipeline every front-end shares)."""
    requests = await generation.completion(body, target)
    echo, want_logprobs = bool(body.echo), body.logprobs is not None
    choices = [CompletionChoice(i, want_logprobs, echo) for i in range(len(requests))]
    head = {"id": new_id("cmpl"), "created": int(time.time()), "model": body.model}
    head["service_tier"] = service_tier(requests)
    n = body.n or 1
    candidates = body.best_of or n  # per prompt; above n only without streaming
    if body.stream:
        streams = await generation.open(target, requests)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_completion_chunks(head, choices, streams, usage, n))
    streams, events = await generation.whole(target, requests, until)
    for index, event in events:
        choices[index].feed(event)
    generated = sum(c.completion_tokens for c in choices)  # every candidate's tokens were generated
    if candidates > n:
        choices = best_of(choices, candidates, n)
    return {
        **head,
        "object": "text_completion",
        "choices": [
            {"index": c.index, "text": c.text, "logprobs": c.logprobs(), "finish_reason": c.finish or "stop"}
            for c in choices
        ],
        "usage": _usage(streams, candidates, generated),
        "system_fingerprint": None,
    }


async def _completion_chunks(
    head: Event, choices: list[CompletionChoice], streams: Streams, include_usage: bool, n: int
) -> AsyncIterator[bytes]:
    chunk = {**head, "object": "text_completion", "system_fingerprint": None}
    async for index, event in streams.merged():
        choice = choices[index]
        offset, first, counted = len(choice.text), len(choice.tokens), choice.completion_tokens
        text, added = choice.feed(event)
        finish = event.finish if isinstance(event, Text) else None
        if not text and not added and finish is None and choice.completion_tokens == counted:
            continue  # a token without text yet (a character's first bytes) is a chunk, as on vLLM
        entry = {
            "index": index,
            "text": text,
            "logprobs": choice.logprobs(first, offset) if added else None,
            "finish_reason": finish,
        }
        yield _event({**chunk, "choices": [entry]})
    if include_usage:
        usage = _usage(streams, n, sum(c.completion_tokens for c in choices))
        yield _event({**chunk, "choices": [], "usage": usage})


def best_of(choices: list[CompletionChoice], candidates: int, n: int) -> list[CompletionChoice]:
    """Of each prompt's candidates, the `n` with the highest mean log probability per generated token
    (OpenAI's "best"), best first, indexed again in OpenAI's order (`prompt × n + choice`)."""
    kept: list[CompletionChoice] = []
    for start in range(0, len(choices), candidates):
        group = choices[start : start + candidates]
        kept += sorted(group, key=lambda c: c.mean_logprob, reverse=True)[:n]
    for index, choice in enumerate(kept):
        choice.index = index
    return kept


@dataclass
class CompletionChoice:
    index: int
    want_logprobs: bool
    echo: bool
    text: str = ""
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, int | float] | None] = field(default_factory=list)
    finish: str | None = None
    completion_tokens: int = 0
    score: float = 0.0  # sum of the generated tokens' log probabilities (for best_of)
    scored: int = 0

    def feed(self, event: GenerationEvent) -> tuple[str, int]:
        """Apply one event; the text it adds and how many logprob entries it added."""
        before_text, before = len(self.text), len(self.tokens)
        if isinstance(event, GenerationStarted):
            if self.echo:
                self.text += event.prompt_text or ""
            for entry in event.prompt_logprobs or []:
                self._add(entry)
        elif isinstance(event, Logprob):
            self._add(event.entry)
            self.score += event.entry.logprob or 0.0
            self.scored += 1
        elif isinstance(event, Text):
            self.text += event.text
            self.completion_tokens = event.completion_tokens
            self.finish = event.finish or self.finish
        return self.text[before_text:], len(self.tokens) - before

    @property
    def mean_logprob(self) -> float:
        return self.score / self.scored if self.scored else -math.inf

    def _add(self, entry: TokenLogprob) -> None:
        self.tokens.append(entry.token)
        self.token_logprobs.append(entry.logprob)
        self.top_logprobs.append(None if entry.top is None else dict(entry.top))

    def logprobs(self, start: int = 0, text_start: int = 0) -> Event | None:
        """OpenAI's legacy logprobs object for entries from `start`, offsets counted from `text_start`."""
        if not self.want_logprobs:
            return None
        offsets, offset = [], text_start
        for token in self.tokens[start:]:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": self.tokens[start:],
            "token_logprobs": self.token_logprobs[start:],
            "top_logprobs": self.top_logprobs[start:],
            "text_offset": offsets,
        }


# ---------------------------------------------------------------- /tokenize and /detokenize


async def tokenize(
    body: TokenizeRequest | DetokenizeRequest, generation: Generation, target: Target, until: Until
) -> Event:
    """vLLM's answer to `/tokenize` (`count`, `max_model_len`, `tokens`) or `/detokenize` (`prompt`),
    from the deployment's replica, which holds its tokenizer and chat template."""
    _, events = await generation.whole(target, [tokenize_request(body)], until)
    tokenized = events[-1][1]
    assert isinstance(tokenized, Tokenized)
    answer = {k: v for k, v in msgspec.structs.asdict(tokenized).items() if v is not None}
    if tokenized.tokens is not None:
        answer["count"] = len(tokenized.tokens)
    return answer


async def tokenizer_info(generation: Generation, target: Target, until: Until) -> Event:
    """vLLM's `/tokenizer_info`, from the replica by the `/tokenize` path (`generation.requests`)."""
    request = GenerationRequest(tokenize=True, tokenizer_info=True)
    _, events = await generation.whole(target, [request], until)
    tokenized = events[-1][1]
    assert isinstance(tokenized, Tokenized) and tokenized.tokenizer_info is not None
    return tokenized.tokenizer_info


def _usage(streams: Streams, per_prompt: int, completion_tokens: int) -> Event:
    prompt_tokens = streams.prompt_tokens(per_prompt)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": streams.cached_tokens(per_prompt)},
    }


def _event(payload: Event) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _sse(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The event stream's bytes: the chunks, then `[DONE]`; an error once the 200 has gone out is
    reported in the stream, as OpenAI does."""
    try:
        async for chunk in chunks:
            yield chunk
    except ModelhostError as exc:
        error = {"message": exc.message, "type": exc.error_type, "code": exc.code, "param": exc.param}
        yield _event({"error": error})
        return
    yield b"data: [DONE]\n\n"
