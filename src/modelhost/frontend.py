"""The one generation pipeline every front-end shares: chat completions, completions, the Messages API,
the Responses API, agent runs, and the batch lines that run as those.

A parsed request becomes engine requests here, always in the same steps: the family's own translation
(`generation.choices`), the grammar checked and compiled under bounds (`generation.compile_sandbox`), the
deployment's sampling defaults (`generation_defaults`), the request's images read with the one media
reader; then their streams are opened (errors before any answer) or run whole. `generation.choices.ChatChoice`
assembles each choice from the events. Each front-end used to assemble these steps itself and the copies
drifted (agent runs took no defaults and read no images, Responses ignored a rollout's version); there is
now one copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import msgspec

from modelhost.auth.principal import Principal
from modelhost.errors import InvalidRequest
from modelhost.generation.choices import chat_requests, completion_requests
from modelhost.generation.compile_sandbox import GrammarChecker
from modelhost.generation.contract import GenerationEvent, GenerationRequest, GenerationStarted
from modelhost.media.sources import MediaPolicy, load_media
from modelhost.protocol.chat import ChatCompletionRequest, CompletionRequest
from modelhost.protocol.tasks import MAX_MEDIA_INPUTS
from modelhost.routing import DeploymentRef
from modelhost.runtime.gateway.interface import Runtime

Event = GenerationEvent
Stream = AsyncGenerator[Event, None]
Collected = list[tuple[int, Event]]
# How a whole answer is waited for (a route: until the client goes away, which cancels it).
Until = Callable[[Awaitable[Collected]], Awaitable[Collected]]

IMAGE_TEXT_TO_TEXT = "image-text-to-text"


@dataclass(frozen=True, slots=True)
class Target:
    """What a deployment adds to every generation request it runs: where the runtime runs it (the
    version a rollout chose: `DeploymentRef.runtime_key`), whether it reads images (a vision-language
    deployment) and its sampling defaults (`generation_defaults`); and what the calling key adds: its
    prefix-cache salt (`Principal.cache_salt`). Plain values, so an agent run carries it to the
    supervisor that runs it."""

    runtime_key: str
    reads_images: bool = False
    defaults: dict[str, int | float] | None = None
    cache_salt: str | None = None

    @classmethod
    def of(cls, deployment: DeploymentRef, principal: Principal | None = None) -> Target:
        return cls(
            deployment.runtime_key or deployment.id,
            deployment.pipeline == IMAGE_TEXT_TO_TEXT,
            dict(deployment.generation_defaults) if deployment.generation_defaults else None,
            principal.cache_salt if principal is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Generation:
    """How this server generates: its runtime, its grammar checker and its media policy."""

    runtime: Runtime
    grammars: GrammarChecker
    media: MediaPolicy

    async def chat(
        self,
        body: ChatCompletionRequest,
        target: Target,
        *,
        effort_param: str = "reasoning_effort",
        format_param: str = "response_format",
        effort_optional: bool = False,
        image_params: list[str] | None = None,
    ) -> tuple[list[GenerationRequest], str]:
        """A chat request's engine requests (one per choice) and its tool mode (`chat_requests`), ready
        to run; the keywords as `chat_requests`'. `image_params`: the fields the images came from, where
        they are not chat's."""
        limit = self.grammars.max_string_length
        requests, mode = chat_requests(body, limit, effort_param, format_param, effort_optional)
        await self.grammars.check(requests)
        _with_defaults(requests, target, body.cache_salt)
        await self._fetch_images(requests, target, image_params)
        return requests, mode

    async def completion(self, body: CompletionRequest, target: Target) -> list[GenerationRequest]:
        """A completion's engine requests (one per prompt and candidate), ready to run."""
        requests = completion_requests(body, self.grammars.max_string_length)
        await self.grammars.check(requests)
        _with_defaults(requests, target, body.cache_salt)
        return requests

    async def open(self, target: Target, requests: list[GenerationRequest]) -> Streams:
        """Start every request's generation and wait for its first event: errors are raised here,
        before any answer is sent."""
        streams: list[Stream] = [self.runtime.stream(target.runtime_key, r) for r in requests]
        firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
        failure = next((f for f in firsts if isinstance(f, BaseException)), None)
        if failure is not None:
            await Streams(streams, []).close()
            raise failure
        opened = [f for f in firsts if not isinstance(f, BaseException)]
        return Streams(streams, opened)

    async def whole(
        self, target: Target, requests: list[GenerationRequest], until: Until
    ) -> tuple[Streams, Collected]:
        """A non-streamed answer's generations, from their start to their end while the client waits
        (`until`: its leaving cancels them). Each is marked `whole`: the dispatcher holds its events until
        it ends, so a replica that dies under it at any point costs the client only the time to run it
        again."""
        opened: list[Streams] = []

        async def generate() -> Collected:
            opened.append(await self.open(target, [msgspec.structs.replace(r, whole=True) for r in requests]))
            return [item async for item in opened[0].merged()]

        events = await until(generate())
        return opened[0], events

    async def _fetch_images(
        self, requests: list[GenerationRequest], target: Target, params: list[str] | None
    ) -> None:
        """`image_url` parts' images, read here with the one media reader (its private-address and size
        rules: a bad one is a 400 naming its part) and sent to the worker as bytes with every choice. A
        text-only deployment refuses them before anything is fetched. `params`: the request fields the
        images came from, in order, where they are not the chat completion's (the Responses API's)."""
        found = requests[0].image_urls
        if not found:
            return
        urls = [(url, param) for (url, _), param in zip(found, params or [p for _, p in found], strict=True)]
        part = re.sub(r"\.image_url(\.url)?$", "", urls[0][1])  # messages[i].content[j]
        if not target.reads_images:
            raise InvalidRequest(
                "This model reads text only: image parts need a deployment of an image-text-to-text "
                "(vision-language) model.",
                param=part.rsplit("[", 1)[0] if part.endswith("]") else part,  # messages[i].content
            )
        if len(urls) > MAX_MEDIA_INPUTS:  # the media endpoints' limit on inputs per request
            raise InvalidRequest(
                f"At most {MAX_MEDIA_INPUTS} images per request; this one has {len(urls)}.",
                param=re.sub(r"\.image_url(\.url)?$", "", urls[MAX_MEDIA_INPUTS][1]),
            )
        media = self.media
        images = await asyncio.gather(*(load_media(url, media, param=p, timeout=None) for url, p in urls))
        for request in requests:
            request.image_urls = []
            request.images = list(images)
            request.image_params = [param for _, param in urls]  # the worker's decoding errors name the part


def _with_defaults(requests: list[GenerationRequest], target: Target, salt: str | None) -> None:
    """The deployment's sampling defaults sent with each engine request: the replica puts them between
    the request's own fields and the model's (`generation.requests.sampling_params`); and the prefix
    cache it may use (`cache_salt`: the key's salt and the request's own `salt`)."""
    if target.defaults:
        for request in requests:
            request.defaults = dict(target.defaults)
    if target.cache_salt is not None or salt is not None:
        salted = cache_salt(target.cache_salt, salt)
        for request in requests:
            request.cache_salt = salted


def cache_salt(key: str | None, request: str | None) -> str:
    """The salt an engine keys its prefix cache by, from the key's salt and the request's own
    `cache_salt` (vLLM's field). A key's salt is written with its length first and a request's after a
    different mark, so no request's own salt, whatever its text, names the prefix cache of a key's salt:
    a key without a salt (or with another) cannot reach a salted key's cache by sending that salt."""
    parts = [] if key is None else [f"key:{len(key)}:{key}"]
    if request is not None:
        parts.append(f"request:{request}")
    return "/".join(parts)


class Streams:
    """The engine streams of one request's choices, each already past its first event."""

    def __init__(self, streams: list[Stream], firsts: list[Event]) -> None:
        self._streams = streams
        self._firsts = firsts

    def prompt_tokens(self, per_prompt: int = 1) -> int:
        """Prompt tokens counted once per prompt (choices of one prompt share it)."""
        firsts = self._firsts[::per_prompt]
        return sum(e.prompt_tokens for e in firsts if isinstance(e, GenerationStarted))

    def cached_tokens(self, per_prompt: int = 1) -> int:
        """Of those, the tokens the engine took from its KV cache (a prefix it had computed before)."""
        firsts = self._firsts[::per_prompt]
        return sum(e.cached_tokens for e in firsts if isinstance(e, GenerationStarted))

    async def merged(self) -> AsyncGenerator[tuple[int, Event], None]:
        """(choice index, event) from every stream as they come, starting with each first event. One
        stream (most requests) is read directly: no task and queue between it and its reader, a task
        wake per token fewer (issue 59: a token's CPU on our path is taken from the engine's)."""
        if len(self._streams) == 1:
            try:
                yield 0, self._firsts[0]
                async for event in self._streams[0]:
                    yield 0, event
            finally:
                await self.close()
            return
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
