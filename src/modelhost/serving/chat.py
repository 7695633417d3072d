"""OpenAI chat completions and completions served on the generation engine (`POST /v1/chat/completions`,
`POST /v1/completions`; api.md §4.16, §6).

A request → one engine request per choice (`generation.chat` builds a chat completion's) → the runtime's
event streams, merged → OpenAI's JSON body or Server-Sent Events. Every choice's stream is opened (and
its prompt checked by the worker) before the answer starts, so a prompt that does not fit is a 400, not a
broken stream. A client that goes away closes the streams, which cancels the generations in the worker
at its next step. The routes (`api.routes.chat`) parse, call `chat_completion` / `completion` and send
what they answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from modelhost.errors import InvalidRequest, ModelhostError
from modelhost.generation.chat import (
    ChatChoice,
    chat_requests,
    effective_tools,
    new_id,
    per_choice,
    sampling,
    tokenize_request,
    tool_schemas,
    with_defaults,
)
from modelhost.generation.compile_sandbox import GrammarChecker
from modelhost.generation.structured import structured_grammar
from modelhost.media.sources import MediaPolicy, load_media
from modelhost.protocol.chat import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from modelhost.protocol.tasks import MAX_MEDIA_INPUTS
from modelhost.routing import split_key
from modelhost.runtime.dispatch import WHOLE
from modelhost.runtime.interface import Runtime
from modelhost.runtime.metrics import PROMPT_TOKENS_CACHED

Event = dict[str, Any]
Stream = AsyncGenerator[Event, None]
Collected = list[tuple[int, Event]]
# How a whole answer is waited for (the route: until the client goes away, which cancels it).
Until = Callable[[Awaitable[Collected]], Awaitable[Collected]]
# A JSON body, or the bytes of a Server-Sent Events stream.
Answer = Event | AsyncIterator[bytes]


# ---------------------------------------------------------------- chat completions


async def chat_completion(
    body: ChatCompletionRequest,
    runtime: Runtime,
    deployment_id: str,
    grammars: GrammarChecker,
    until: Until,
    media: MediaPolicy,
    reads_images: bool = False,
    defaults: dict[str, int | float] | None = None,
) -> Answer:
    """`grammars`: how constrained output is made and checked (`compile_sandbox`); `reads_images`: the
    deployment is a vision-language one (`image-text-to-text`); `defaults`: its sampling defaults
    (`generation_defaults`)."""
    requests, mode = chat_requests(body, grammars.max_string_length)
    await grammars.check(requests)
    with_defaults(requests, defaults)
    await fetch_images(requests, media, reads_images)
    choices = chat_choices(body, mode, len(requests))
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": body.model}
    if body.stream:
        streams = await open_streams(runtime, deployment_id, requests)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_chat_chunks(head, choices, streams, usage))
    streams, events = await whole_answer(runtime, deployment_id, requests, until)
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
        yield _event({**chunk, "choices": [], "usage": _chat_usage(streams, choices)})


async def fetch_images(
    requests: list[Event], media: MediaPolicy, reads_images: bool, params: list[str] | None = None
) -> None:
    """`image_url` parts' images, read here with the one media reader (its private-address and size
    rules: a bad one is a 400 naming its part) and sent to the worker as bytes with every choice. A
    text-only deployment refuses them before anything is fetched. `params`: the request fields the
    images came from, in order, where they are not the chat completion's (the Responses API's)."""
    found: list[tuple[str, str]] = requests[0].get("image_urls") or []
    if not found:
        return
    urls = [(url, param) for (url, _), param in zip(found, params or [p for _, p in found], strict=True)]
    part = re.sub(r"\.image_url(\.url)?$", "", urls[0][1])  # messages[i].content[j]
    if not reads_images:
        raise InvalidRequest(
            "This model reads text only: image parts need a deployment of an image-text-to-text "
            "(vision-language) model.",
            param=part.rsplit("[", 1)[0] if part.endswith("]") else part,  # messages[i].content
        )
    if len(urls) > MAX_MEDIA_INPUTS:  # the media endpoints' limit on inputs per request
        raise InvalidRequest(
            f"At most {MAX_MEDIA_INPUTS} images per request; this one has {len(urls)}.",
            param=re.sub(r"\.image_url(\.url)?$", "", urls[MAX_MEDIA_INPUTS][1]),  # messages[i].content[j]
        )
    images = await asyncio.gather(*(load_media(url, media, param=param, timeout=None) for url, param in urls))
    for request in requests:
        del request["image_urls"]
        request["images"] = list(images)
        request["image_params"] = [param for _, param in urls]  # the worker's decoding errors name the part


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


async def completion(
    body: CompletionRequest,
    runtime: Runtime,
    deployment_id: str,
    until: Until,
    grammars: GrammarChecker,
    defaults: dict[str, int | float] | None = None,
) -> Answer:
    """`defaults`: the deployment's sampling defaults (`generation_defaults`)."""
    requests = completion_requests(body, grammars.max_string_length)
    await grammars.check(requests)
    with_defaults(requests, defaults)
    echo, want_logprobs = bool(body.echo), body.logprobs is not None
    choices = [CompletionChoice(i, want_logprobs, echo) for i in range(len(requests))]
    head = {"id": new_id("cmpl"), "created": int(time.time()), "model": body.model}
    n = body.n or 1
    candidates = body.best_of or n  # per prompt; above n only without streaming
    if body.stream:
        streams = await open_streams(runtime, deployment_id, requests)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _sse(_completion_chunks(head, choices, streams, usage, n))
    streams, events = await whole_answer(runtime, deployment_id, requests, until)
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


def completion_requests(body: CompletionRequest, max_string_length: int) -> list[Event]:
    """One engine request per prompt and candidate (`best_of`, else `n`), in OpenAI's order
    (prompt-major), each with the grammar of its `structured_outputs`."""
    candidates = _candidates(body)
    prompts: list[str | list[int] | None]
    if body.prompt is None or isinstance(body.prompt, str) or isinstance(body.prompt[0], int):
        prompts = [body.prompt]
    else:
        prompts = list(body.prompt)
    if body.suffix and body.echo:
        raise InvalidRequest("echo cannot be used with suffix (insert mode).", param="suffix")
    params = sampling(body, body.max_tokens)
    wants = body.logprobs is not None
    params.update(
        logprobs=wants or candidates > (body.n or 1),  # best_of ranks candidates by their log probabilities
        top_logprobs=body.logprobs or 0,
        prompt_logprobs=bool(body.echo and wants),
    )
    structured = structured_grammar(body, max_string_length)
    requests: list[Event] = []
    for prompt in prompts:
        base: Event = {"prompt": prompt, "echo": bool(body.echo), "suffix": body.suffix or None}
        if structured is not None:
            base["grammar"], base["grammar_param"] = structured
        requests += per_choice(base, params, candidates, body.seed)
    return requests


def _candidates(body: CompletionRequest) -> int:
    """Completions generated per prompt: `best_of`, which must not be below `n` nor be streamed."""
    n, best_of = body.n or 1, body.best_of or body.n or 1
    if best_of < n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({n}).", param="best_of")
    if best_of > n and body.stream:
        raise InvalidRequest(
            "best_of above n cannot be streamed (the best are known only at the end).", param="best_of"
        )
    return best_of


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

    def feed(self, event: Event) -> tuple[str, int]:
        """Apply one event; the text it adds and how many logprob entries it added."""
        before_text, before = len(self.text), len(self.tokens)
        if event.get("started"):
            if self.echo:
                self.text += event.get("prompt_text", "")
            for entry in event.get("prompt_logprobs") or []:
                self._add(entry)
        elif "logprob" in event:
            self._add(event["logprob"])
            self.score += event["logprob"]["logprob"]
            self.scored += 1
        else:
            self.text += event.get("text", "")
            self.completion_tokens = event.get("completion_tokens", self.completion_tokens)
            self.finish = event.get("finish", self.finish)
        return self.text[before_text:], len(self.tokens) - before

    @property
    def mean_logprob(self) -> float:
        return self.score / self.scored if self.scored else -math.inf

    def _add(self, entry: Event | None) -> None:
        if entry is None:
            return
        self.tokens.append(entry["token"])
        self.token_logprobs.append(entry.get("logprob"))
        top = entry.get("top")
        self.top_logprobs.append(None if top is None else {t: lp for t, lp in top})

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
    body: TokenizeRequest | DetokenizeRequest, runtime: Runtime, deployment_id: str, until: Until
) -> Event:
    """vLLM's answer to `/tokenize` (`count`, `max_model_len`, `tokens`) or `/detokenize` (`prompt`),
    from the deployment's replica, which holds its tokenizer and chat template."""
    _, events = await whole_answer(runtime, deployment_id, [tokenize_request(body)], until)
    answer = {k: v for k, v in events[-1][1].items() if k != "finish"}
    if "tokens" in answer:
        answer["count"] = len(answer["tokens"])
    return answer


# ---------------------------------------------------------------- streams of one request


class Streams:
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
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
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


async def open_streams(runtime: Runtime, deployment_id: str, requests: list[Event]) -> Streams:
    """Start every choice's generation and wait for its first event: errors are raised here, before
    any answer is sent."""
    streams: list[Stream] = [runtime.stream(deployment_id, r) for r in requests]
    firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    failure = next((f for f in firsts if isinstance(f, BaseException)), None)
    if failure is not None:
        await Streams(streams, []).close()
        raise failure
    opened = [f for f in firsts if not isinstance(f, BaseException)]
    PROMPT_TOKENS_CACHED.labels(split_key(deployment_id)[0]).inc(
        sum(int(f.get("cached_tokens", 0)) for f in opened)
    )
    return Streams(streams, opened)


async def _collect(streams: Streams) -> Collected:
    return [item async for item in streams.merged()]


async def whole_answer(
    runtime: Runtime, deployment_id: str, requests: list[Event], until: Until
) -> tuple[Streams, Collected]:
    """A non-streamed answer's generations, from their start to their end while the client waits (its
    leaving cancels them). Each is marked `WHOLE`: the dispatcher holds its events until it ends, so a
    replica that dies under it at any point costs the client only the time to run it again."""
    opened: list[Streams] = []

    async def generate() -> Collected:
        opened.append(await open_streams(runtime, deployment_id, [{**r, WHOLE: True} for r in requests]))
        return await _collect(opened[0])

    events = await until(generate())
    return opened[0], events


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
