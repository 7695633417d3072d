"""`POST /v1/chat/completions` and `POST /v1/completions` (OpenAI-compatible, api.md §4.16, §6).

Parse → one engine request per choice → the runtime's event streams → OpenAI's JSON or Server-Sent
Events. Every choice's stream is opened (and its prompt checked by the worker) before the answer
starts, so a prompt that does not fit is a 400, not a broken stream. A client that goes away closes
the streams, which cancels the generations in the worker at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from modelhost.api.deps import CallerPrincipal, await_or_disconnect, deployment_for, get_services
from modelhost.api.errors import error_responses
from modelhost.errors import ModelhostError
from modelhost.protocol.chat import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest
from modelhost.runtime.metrics import PROMPT_TOKENS_CACHED
from modelhost.services.generation import (
    ChatChoice,
    CompletionChoice,
    best_of,
    chat_choices,
    chat_requests,
    completion_requests,
    new_id,
)

router = APIRouter(tags=["openai"], responses=error_responses(400, 401, 402, 404, 413, 429, 503))
Event = dict[str, Any]
Stream = AsyncGenerator[Event, None]
SSE = {"text/event-stream": {"example": 'data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n'}}

CHAT_EXAMPLE = {
    "id": "chatcmpl-4f1c",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "chat",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help?", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
}


@router.post(
    "/v1/chat/completions",
    summary="Chat completion (OpenAI-compatible; `stream: true` answers Server-Sent Events)",
    response_model=ChatCompletion,
    responses={200: {"content": {"application/json": {"example": CHAT_EXAMPLE}, **SSE}}},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    settings = get_services(request).settings
    requests, mode = chat_requests(body, settings.constrained_max_string_length)
    choices = chat_choices(body, mode, len(requests))
    streams = await _open(request, deployment.id, requests)
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": body.model}
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_chat_chunks(head, choices, streams, usage))
    events = await await_or_disconnect(request, _collect(streams))
    for index, event in events:
        choices[index].feed(event)
    payload = {
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
        "usage": _usage(streams, 1, sum(c.completion_tokens for c in choices)),
        "system_fingerprint": None,
    }
    return Response(orjson.dumps(payload), media_type="application/json")


async def _chat_chunks(
    head: Event, choices: list[ChatChoice], streams: _Streams, include_usage: bool
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
        delta = choice.feed(event)
        if "logprobs" in delta:
            pending[index] += delta.pop("logprobs")
        if delta:
            logprobs = {"content": pending[index], "refusal": None} if pending[index] else None
            pending[index] = []
            yield data(choice, delta, logprobs=logprobs)
        if choice.finish is not None:
            yield data(choice, {}, choice.finish_reason)
    if include_usage:
        usage = _usage(streams, 1, sum(c.completion_tokens for c in choices))
        yield _event({**chunk, "choices": [], "usage": usage})


@router.post(
    "/v1/completions",
    summary="Text completion (OpenAI-compatible legacy completions; `stream: true` answers SSE)",
    response_model=Completion,
    responses={200: {"content": SSE}},
)
async def completions(body: CompletionRequest, request: Request, principal: CallerPrincipal) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    requests = completion_requests(body)
    echo, want_logprobs = bool(body.echo), body.logprobs is not None
    choices = [CompletionChoice(i, want_logprobs, echo) for i in range(len(requests))]
    streams = await _open(request, deployment.id, requests)
    head = {"id": new_id("cmpl"), "created": int(time.time()), "model": body.model}
    n = body.n or 1
    candidates = body.best_of or n  # per prompt; above n only without streaming
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_completion_chunks(head, choices, streams, usage, n))
    for index, event in await await_or_disconnect(request, _collect(streams)):
        choices[index].feed(event)
    generated = sum(c.completion_tokens for c in choices)  # every candidate's tokens were generated
    if candidates > n:
        choices = best_of(choices, candidates, n)
    payload = {
        **head,
        "object": "text_completion",
        "choices": [
            {"index": c.index, "text": c.text, "logprobs": c.logprobs(), "finish_reason": c.finish or "stop"}
            for c in choices
        ],
        "usage": _usage(streams, candidates, generated),
        "system_fingerprint": None,
    }
    return Response(orjson.dumps(payload), media_type="application/json")


async def _completion_chunks(
    head: Event, choices: list[CompletionChoice], streams: _Streams, include_usage: bool, n: int
) -> AsyncIterator[bytes]:
    chunk = {**head, "object": "text_completion", "system_fingerprint": None}
    async for index, event in streams.merged():
        choice = choices[index]
        offset, first = len(choice.text), len(choice.tokens)
        text, added = choice.feed(event)
        if not text and not added and "finish" not in event:
            continue
        entry = {
            "index": index,
            "text": text,
            "logprobs": choice.logprobs(first, offset) if added else None,
            "finish_reason": event.get("finish"),
        }
        yield _event({**chunk, "choices": [entry]})
    if include_usage:
        usage = _usage(streams, n, sum(c.completion_tokens for c in choices))
        yield _event({**chunk, "choices": [], "usage": usage})


# ---------------------------------------------------------------- streams of one request


class _Streams:
    """The engine streams of one request's choices, each already past its first event."""

    def __init__(self, streams: list[Stream], firsts: list[Event]) -> None:
        self._streams = streams
        self._firsts = firsts

    def prompt_tokens(self, per_prompt: int) -> int:
        """Prompt tokens counted once per prompt (choices of one prompt share it)."""
        return sum(int(e.get("prompt_tokens", 0)) for e in self._firsts[::per_prompt])

    def cached_tokens(self, per_prompt: int) -> int:
        """Of those, the tokens the engine took from its KV cache (a prefix it had computed before)."""
        return sum(int(e.get("cached_tokens", 0)) for e in self._firsts[::per_prompt])

    async def merged(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) from every stream as they come, starting with each first event."""
        queue: asyncio.Queue[tuple[int, Event] | BaseException | None] = asyncio.Queue()
        for index, first in enumerate(self._firsts):
            queue.put_nowait((index, first))

        async def pump(index: int, stream: Stream) -> None:
            try:
                async for event in stream:
                    queue.put_nowait((index, event))
            except BaseException as exc:
                queue.put_nowait(exc)
                return
            queue.put_nowait(None)

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self._streams)]
        try:
            open_streams = len(tasks)
            while open_streams:
                item = await queue.get()
                if item is None:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            await self.close(tasks)

    async def close(self, tasks: list[asyncio.Task[None]] | None = None) -> None:
        for task in tasks or []:
            task.cancel()
        await asyncio.gather(*(tasks or []), return_exceptions=True)
        for stream in self._streams:
            with contextlib.suppress(Exception):
                await stream.aclose()


async def _open(request: Request, deployment_id: str, requests: list[Event]) -> _Streams:
    """Start every choice's generation and wait for its first event: errors are raised here, before
    any answer is sent."""
    runtime = get_services(request).runtime
    streams: list[Stream] = [runtime.stream(deployment_id, r) for r in requests]
    firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    failure = next((f for f in firsts if isinstance(f, BaseException)), None)
    if failure is not None:
        await _Streams(streams, []).close()
        raise failure
    opened = [f for f in firsts if not isinstance(f, BaseException)]
    PROMPT_TOKENS_CACHED.labels(deployment_id).inc(sum(int(f.get("cached_tokens", 0)) for f in opened))
    return _Streams(streams, opened)


async def _collect(streams: _Streams) -> list[tuple[int, Event]]:
    return [item async for item in streams.merged()]


def _usage(streams: _Streams, per_prompt: int, completion_tokens: int) -> Event:
    prompt_tokens = streams.prompt_tokens(per_prompt)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": streams.cached_tokens(per_prompt)},
    }


def _event(payload: Event) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _sse(chunks: AsyncIterator[bytes]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        except ModelhostError as exc:  # after the 200 has gone out: report in the stream, as OpenAI does
            error = {"message": exc.message, "type": exc.error_type, "code": exc.code, "param": exc.param}
            yield _event({"error": error})
            return
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
