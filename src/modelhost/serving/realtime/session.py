"""One realtime session: the protocol's state machine, fed the client's text frames, emitting the
server's events through `send` (docs/realtime.md).

Testable without a socket: the route (`api.routes.realtime`) checks the key, resolves the chat
deployment, and then only hands frames to `handle` and sends what comes out. Every answer is made by
what the HTTP endpoints use, never by a copy: text by the one generation pipeline (`frontend.Generation`,
assembled by `generation.choices.ChatChoice` as a streamed chat completion), transcription by the
runtime call of `/v1/audio/transcriptions` (`serving.audio.recognition_item`), speech by that of
`/v1/audio/speech` (`serving.audio.speech_item`).

A response is generated in a task of its own, so that the session keeps reading the client's events
(`response.cancel` among them) while it streams; cancelling the task closes the engine stream, which
stops the generation in its worker at its next step. `close` (the client went away) cancels everything
the session started and sends nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from modelhost.config import Settings
from modelhost.errors import InvalidRequest, ModelhostError, RateLimitExceeded
from modelhost.frontend import Generation, Target
from modelhost.generation.choices import ChatChoice, new_id
from modelhost.media.sources import decode_base64
from modelhost.protocol.audio import SpeechRequest, SpeechToTextOptions
from modelhost.protocol.chat import ChatCompletionRequest
from modelhost.protocol.realtime import (
    CLIENT_EVENT_TYPES,
    AudioAppend,
    AudioClear,
    AudioCommit,
    ClientEvent,
    ContentOut,
    ErrorDetail,
    FunctionTool,
    InputAudio,
    Item,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    MessageItem,
    Response,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    ResponseUsage,
    ServerVad,
    SessionConfig,
    SessionUpdate,
    StatusDetails,
    TokenDetails,
    ToolChoice,
    Transcription,
)
from modelhost.runtime.gateway.interface import Runtime
from modelhost.serving.audio import recognition_item, speech_item
from modelhost.serving.chat import chat_choices
from modelhost.serving.realtime import audio
from modelhost.serving.realtime.conversation import Conversation, chat_messages, item_id, item_of
from modelhost.serving.realtime.settings import SessionSettings
from modelhost.serving.realtime.turns import TurnDetector

# what the route sends: one server event, a JSON object
Send = Callable[[dict[str, Any]], Awaitable[None]]
# the runtime key of the caller's deployment of `model` that answers `endpoint`, decided as for any
# request to that endpoint (`api.deps.deployment_for`: routing, the key's scope, a rollout's version)
Resolve = Callable[[str, str], Awaitable[str]]
TRANSCRIPTIONS = "/v1/audio/transcriptions"
SPEECH = "/v1/audio/speech"
MIN_COMMIT_SECONDS = 0.1  # OpenAI's: a shorter buffer is `input_audio_buffer_commit_empty`
CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
# a sentence ends at . ! ? … (and their CJK forms) followed by a space, or at a line break: what is spoken
# as soon as it is complete
SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+|\n+")


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one session may hold and send (`MODELHOST_REALTIME_*`, docs/realtime.md)."""

    max_items: int = 256
    max_append_bytes: int = 1024 * 1024
    max_turn_seconds: float = 120.0
    events_per_second: float = 100.0
    max_media_seconds: float = 600.0
    max_session_seconds: float = 1800.0

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        return cls(
            settings.realtime_max_items,
            settings.realtime_max_append_bytes,
            settings.realtime_max_turn_seconds,
            settings.realtime_max_events_per_second,
            settings.media_max_seconds,
            settings.realtime_max_session_seconds,
        )


class Abuse(Exception):
    """The client broke a bound that ends its session (its `error` event is sent): the route closes the
    socket (1008, policy violation)."""


@dataclass
class Pace:
    """Client events per second: a bucket of `rate` events, refilled at `rate` a second."""

    rate: float
    clock: Callable[[], float] = time.monotonic
    level: float = -1.0
    last: float = 0.0

    def take(self) -> bool:
        now = self.clock()
        if self.level < 0:
            self.level, self.last = self.rate, now
        self.level = min(self.rate, self.level + (now - self.last) * self.rate)
        self.last = now
        if self.level < 1:
            return False
        self.level -= 1
        return True


@dataclass
class Run:
    """One response while it is generated."""

    response: Response
    into_conversation: bool
    speech_model: str | None  # None: text out
    voice: str | None = None
    speed: float | None = None
    text_item: Item | None = None
    part: ContentOut | None = None
    text_index: int = 0
    text_closed: bool = False
    choice: ChatChoice | None = None
    started: bool = False  # its task has begun (one cancelled before never runs: its end is sent for it)
    cancelled: bool = False
    interrupted: bool = False  # cancelled by the user's speech (server VAD)
    error: ModelhostError | None = None
    spoken: int = 0  # characters of the transcript already sent to the text-to-speech deployment
    speaking: list[asyncio.Task[bytes]] = field(default_factory=list)
    audio_seconds: float = 0.0

    @property
    def ids(self) -> dict[str, Any]:
        assert self.text_item is not None
        return {
            "response_id": self.response.id,
            "item_id": self.text_item.id,
            "output_index": self.text_index,
            "content_index": 0,
        }


class RealtimeSession:
    """The state of one session: its settings, conversation and input audio buffer, and the response
    in progress (at most one, as OpenAI's)."""

    def __init__(
        self,
        *,
        chat_model: str,
        generation: Generation,
        target: Target,
        runtime: Runtime,
        resolve: Resolve,
        send: Send,
        bounds: Bounds,
        expires_at: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.chat_model = chat_model
        self.generation = generation
        self.target = target
        self.runtime = runtime
        self.resolve = resolve
        self.send = send
        self.bounds = bounds
        self.expires_at = expires_at
        self.settings = SessionSettings()
        self.conversation = Conversation(bounds.max_items)
        self.buffer = bytearray()
        self._appended_ms = 0.0  # input audio appended since the session started
        self._buffer_start_ms = 0.0  # where the buffer's first byte is on that clock
        self._turns: TurnDetector | None = None  # server VAD, where the session asks for it
        self._turns_origin_ms = 0.0  # where its clock starts on the session's
        self._speech_item: str | None = None  # the item the turn being spoken will be
        self.audio_in_seconds = 0.0  # committed and transcribed, for the session's usage
        self.audio_out_seconds = 0.0
        self._pace = Pace(bounds.events_per_second, clock)
        self._run: Run | None = None
        self._response: asyncio.Task[None] | None = None
        self._transcriptions: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self.responses = 0  # responses created, for the session's audit row

    # ---------------------------------------------------------------- the route's calls

    async def start(self) -> None:
        await self._emit("session.created", session=self._shown())

    async def handle(self, frame: str | bytes) -> None:
        """One client event: its answer events, or an `error` event naming what is wrong with it. Raises
        Abuse past the events-per-second bound."""
        if not self._pace.take():
            refused = RateLimitExceeded(
                f"More than {self.bounds.events_per_second:g} events per second; the session is closed.",
                code="too_many_events",
            )
            await self._error(refused, None)
            raise Abuse(refused.message)
        try:
            event = CLIENT_EVENTS.validate_json(frame)
        except ValidationError as exc:
            sent = _json_of(frame)
            event_id = sent.get("event_id") if isinstance(sent, dict) else None
            await self._error(invalid_event(exc, sent), event_id[:128] if isinstance(event_id, str) else None)
            return
        try:
            await self._dispatch(event)
        except ModelhostError as exc:
            await self._error(exc, event.event_id)

    async def expire(self) -> None:
        """The session reached its longest life: said, before the route closes the socket."""
        minutes = self.bounds.max_session_seconds / 60
        message = f"Your session hit the maximum duration of {minutes:g} minutes."
        await self._error(InvalidRequest(message, code="session_expired"), None)

    async def report(self, exc: ModelhostError) -> None:
        """An error of the session itself (not of one event), before the route closes the socket."""
        await self._error(exc, None)

    async def close(self) -> None:
        """The client went away (or the session ended): everything it started stops; nothing more is sent."""
        self._closed = True
        tasks = [t for t in (self._response, *self._transcriptions.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- events

    async def _dispatch(self, event: ClientEvent) -> None:
        if isinstance(event, SessionUpdate):
            await self._update(event.session)
        elif isinstance(event, AudioAppend):
            await self._append(event.audio)
        elif isinstance(event, AudioCommit):
            await self._commit()
        elif isinstance(event, AudioClear):
            self._drop(len(self.buffer))
            await self._emit("input_audio_buffer.cleared")
        elif isinstance(event, ItemCreate):
            await self._create_item(event)
        elif isinstance(event, ItemDelete):
            self.conversation.delete(event.item_id)
            await self._emit("conversation.item.deleted", item_id=event.item_id)
        elif isinstance(event, ItemRetrieve):
            found = self.conversation.get(event.item_id)
            await self._emit("conversation.item.retrieved", item=_dump(found))
        elif isinstance(event, ItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ResponseCreate):
            await self._create_response(event.response)
        elif isinstance(event, ResponseCancel):
            await self._cancel(event.response_id)

    async def _update(self, update: SessionConfig) -> None:
        new = self.settings.merged(update, self.chat_model)
        if new.turn_detection is not None and new.transcription is None:
            raise InvalidRequest(
                "server_vad commits the user's turns for the chat model to read their transcripts: set "
                "`session.audio.input.transcription.model` too.",
                param="session.audio.input.turn_detection",
            )
        if new.transcription is not None and new.transcription != self.settings.transcription:
            await self._deployment(
                new.transcription.model, TRANSCRIPTIONS, "session.audio.input.transcription.model"
            )
        if new.speech_model is not None and new.speech_model != self.settings.speech_model:
            await self._deployment(new.speech_model, SPEECH, "session.audio.output.model")
        if new.turn_detection != self.settings.turn_detection:
            self._turns = TurnDetector(new.turn_detection) if new.turn_detection is not None else None
            self._turns_origin_ms = self._appended_ms
        self.settings = new
        await self._emit("session.updated", session=self._shown())

    async def _append(self, encoded: str) -> None:
        data = decode_base64(encoded, param="audio", max_bytes=self.bounds.max_append_bytes)
        fmt = self.settings.input_format
        if audio.seconds(len(self.buffer) + len(data), fmt) > self.bounds.max_turn_seconds:
            raise InvalidRequest(
                f"The input audio buffer holds at most {self.bounds.max_turn_seconds:g} s; commit or clear "
                "it before appending more.",
                param="audio",
                code="input_audio_buffer_full",
            )
        self.buffer += data
        self._appended_ms += audio.seconds(len(data), fmt) * 1000
        turns = self._turns
        if turns is None:
            return
        for turn in turns.feed(audio.samples(data, fmt, "audio"), audio.RATES[fmt]):
            at = round(self._turns_origin_ms + turn.at_ms)
            if turn.kind == "started":
                await self._speech_started(turns.config, at)
            else:
                await self._speech_stopped(turns.config, at)
        if not turns.speaking:  # between turns only the prefix padding is kept
            keep = len(self.buffer) - self._bytes(turns.config.prefix_padding_ms)
            self._drop(max(0, keep))

    async def _speech_started(self, config: ServerVad, at: int) -> None:
        self._speech_item = item_id()
        self._drop(self._bytes(at - config.prefix_padding_ms - self._buffer_start_ms))
        await self._emit("input_audio_buffer.speech_started", audio_start_ms=at, item_id=self._speech_item)
        run, task = self._run, self._response
        if config.interrupt_response and run is not None and task is not None and not task.done():
            run.interrupted = True  # barge-in: the answer in progress stops
            await self._cancel(None)

    async def _speech_stopped(self, config: ServerVad, at: int) -> None:
        ident = self._speech_item or item_id()
        await self._emit("input_audio_buffer.speech_stopped", audio_end_ms=at, item_id=ident)
        try:
            await self._commit(ident)
        except ModelhostError as exc:
            await self._error(exc, None)
            return
        if config.create_response and (self._response is None or self._response.done()):
            await self._create_response(None)

    def _bytes(self, ms: float) -> int:
        """Whole samples of the input format in `ms` (0 when negative)."""
        fmt = self.settings.input_format
        return max(0, int(ms * audio.RATES[fmt] / 1000)) * audio.SAMPLE_BYTES[fmt]

    def _drop(self, size: int) -> None:
        """The buffer's first `size` bytes dropped (whole samples)."""
        fmt = self.settings.input_format
        size = min(size - size % audio.SAMPLE_BYTES[fmt], len(self.buffer))
        if size > 0:
            del self.buffer[:size]
            self._buffer_start_ms += audio.seconds(size, fmt) * 1000
        if not self.buffer:
            self._buffer_start_ms = self._appended_ms

    async def _commit(self, ident: str | None = None) -> None:
        fmt = self.settings.input_format
        held = audio.seconds(len(self.buffer), fmt)
        if held < MIN_COMMIT_SECONDS:
            raise InvalidRequest(
                "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, "
                f"but buffer only has {held * 1000:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        self._needs_transcription()
        data = bytes(self.buffer)
        self._drop(len(self.buffer))
        item = Item(
            id=ident or item_id(), type="message", role="user", content=[ContentOut(type="input_audio")]
        )
        previous, dropped = self.conversation.add(item)
        await self._emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        await self._created(item, previous, dropped)
        self._transcribe(item, 0, data, fmt)

    async def _create_item(self, event: ItemCreate) -> None:
        item = item_of(event.item)
        clips: list[tuple[int, bytes]] = []
        if isinstance(event.item, MessageItem):
            for index, part in enumerate(event.item.content):
                if isinstance(part, InputAudio) and part.audio and part.transcript is None:
                    self._needs_transcription()
                    limit = self._turn_bytes()
                    clips.append(
                        (
                            index,
                            decode_base64(part.audio, param=f"item.content[{index}].audio", max_bytes=limit),
                        )
                    )
        previous, dropped = self.conversation.add(item, event.previous_item_id)
        await self._created(item, previous, dropped)
        for index, data in clips:
            self._transcribe(item, index, data, self.settings.input_format)

    async def _truncate(self, event: ItemTruncate) -> None:
        """The client stopped playing an answer's audio at `audio_end_ms` (barge-in). Its transcript is
        kept whole: the audio the server sent is not kept to cut (docs/realtime.md)."""
        item = self.conversation.get(event.item_id)
        parts = item.content or []
        if item.role != "assistant" or event.content_index >= len(parts):
            raise InvalidRequest("Only an assistant message's content can be truncated.", param="item_id")
        if parts[event.content_index].type != "output_audio":
            raise InvalidRequest("Only audio content can be truncated.", param="content_index")
        await self._emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    async def _create_response(self, params: ResponseParams | None) -> None:
        if self._response is not None and not self._response.done() and self._run is not None:
            raise InvalidRequest(
                f"Conversation already has an active response in progress: {self._run.response.id}. Wait "
                "until the response is finished before creating a new one.",
                code="conversation_already_has_active_response",
            )
        params = params or ResponseParams()
        settings = self.settings
        modalities = params.output_modalities or params.modalities or settings.modalities
        speech_model = settings.speech_model if "audio" in modalities else None
        if "audio" in modalities and speech_model is None:
            raise InvalidRequest(
                "Audio output needs a text-to-speech deployment: set `session.audio.output.model` first.",
                param="response.output_modalities",
            )
        limit = params.max_output_tokens or params.max_response_output_tokens or settings.max_output_tokens
        into = params.conversation != "none"
        response = Response(
            id=new_id("resp"),
            output_modalities=["audio"] if speech_model else ["text"],
            conversation_id=self.conversation_id if into else None,
            max_output_tokens=limit,
            metadata=params.metadata,
        )
        voice = params.audio.output.voice if params.audio and params.audio.output else None
        run = Run(
            response,
            into,
            speech_model,
            voice=(voice if isinstance(voice, str) else voice.id if voice else None)
            or params.voice
            or settings.voice,
            speed=settings.speed,
        )
        await self._emit("response.created", response=_dump(response))
        self.responses += 1
        self._run = run
        self._response = asyncio.create_task(self._respond(run, params))

    async def _cancel(self, response_id: str | None) -> None:
        run, task = self._run, self._response
        if run is None or task is None or task.done() or (response_id and response_id != run.response.id):
            raise InvalidRequest(
                "Cancellation failed: no active response found", code="response_cancel_not_active"
            )
        run.cancelled = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its response.done is sent before what follows
        if not run.started:  # cancelled before its task ran (`response.cancel` right behind its create)
            await self._finish(run)

    # ---------------------------------------------------------------- responses

    async def _respond(self, run: Run, params: ResponseParams) -> None:
        run.started = True
        try:
            try:
                await self._generate(run, params)
            except asyncio.CancelledError:
                if not run.cancelled or self._closed:
                    raise
                this = asyncio.current_task()
                if this is not None:
                    this.uncancel()
            except ModelhostError as exc:
                run.error = exc
            await self._finish(run)
        finally:  # sentences still being synthesized are not wanted any more
            for task in run.speaking:
                task.cancel()
            await asyncio.gather(*run.speaking, return_exceptions=True)

    async def _generate(self, run: Run, params: ResponseParams) -> None:
        pending = list(self._transcriptions.values())
        if pending:  # the user's audio turns are read by their transcripts: wait for them
            await asyncio.gather(*pending, return_exceptions=True)
        body = self._chat_request(run, params)
        requests, mode = await self.generation.chat(body, self.target)
        streams = await self.generation.open(self.target, requests)
        choice = run.choice = chat_choices(body, mode, 1)[0]
        async for _, event in streams.merged():
            text = choice.feed(event).get("content")
            if text:
                await self._text(run, text)
        await self._close_text(run)
        for call in choice.message().get("tool_calls") or []:
            await self._call(run, call)

    def _chat_request(self, run: Run, params: ResponseParams) -> ChatCompletionRequest:
        """The conversation as a streamed chat completion request on the session's chat deployment."""
        settings = self.settings
        items = self.conversation.items if run.into_conversation else []
        if params.input is not None:  # this response reads these items instead of the conversation
            items = [item_of(given) for given in params.input]
        instructions = params.instructions if params.instructions is not None else settings.instructions
        messages = chat_messages(items, instructions)
        if not any(message["role"] != "system" for message in messages):
            raise InvalidRequest(
                "The conversation has nothing to answer yet: add an item (conversation.item.create) or "
                "commit audio first.",
                code="empty_conversation",
            )
        tools = params.tools if params.tools is not None else settings.tools
        choice = params.tool_choice if params.tool_choice is not None else settings.tool_choice
        temperature = params.temperature if params.temperature is not None else settings.temperature
        limit = run.response.max_output_tokens
        fields: dict[str, Any] = {"model": self.chat_model, "messages": messages, "stream": True}
        if temperature is not None:
            fields["temperature"] = temperature
        if limit != "inf":
            fields["max_completion_tokens"] = limit
        if tools:
            fields["tools"] = [_chat_tool(tool) for tool in tools]
            fields["tool_choice"] = _chat_tool_choice(choice)
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidRequest(f"The response cannot be generated: {first['msg']}") from None

    async def _text(self, run: Run, delta: str) -> None:
        """A piece of the answer's text: its message item and content part opened at the first piece."""
        spoken = run.speech_model is not None
        if run.part is None:
            item = Item(id=item_id(), type="message", role="assistant", status="in_progress", content=[])
            run.text_item, run.text_index = item, len(run.response.output)
            run.response.output.append(item)
            await self._emit(
                "response.output_item.added",
                response_id=run.response.id,
                output_index=run.text_index,
                item=_dump(item),
            )
            if run.into_conversation:
                await self._created(item, *self.conversation.add(item))
            opened = (
                ContentOut(type="output_audio", transcript="")
                if spoken
                else ContentOut(type="output_text", text="")
            )
            item.content, run.part = [opened], opened
            shown = {"type": "audio", "transcript": ""} if spoken else {"type": "text", "text": ""}
            await self._emit("response.content_part.added", **run.ids, part=shown)
        part = run.part
        if spoken:
            part.transcript = (part.transcript or "") + delta
            await self._emit("response.output_audio_transcript.delta", **run.ids, delta=delta)
            await self._speak(run, final=False)
        else:
            part.text = (part.text or "") + delta
            await self._emit("response.output_text.delta", **run.ids, delta=delta)

    async def _close_text(self, run: Run) -> None:
        """The answer's text is complete (or cut short): its part and item done."""
        if run.part is None or run.text_item is None or run.text_closed:
            return
        run.text_closed = True
        if run.speech_model is not None:
            if not run.cancelled and run.error is None:
                await self._speak(run, final=True)
            await self._emit("response.output_audio.done", **run.ids)
            transcript = run.part.transcript or ""
            await self._emit("response.output_audio_transcript.done", **run.ids, transcript=transcript)
            part = {"type": "audio", "transcript": transcript}
        else:
            await self._emit("response.output_text.done", **run.ids, text=run.part.text or "")
            part = {"type": "text", "text": run.part.text or ""}
        await self._emit("response.content_part.done", **run.ids, part=part)
        run.text_item.status = "completed" if _status(run)[0] == "completed" else "incomplete"
        await self._emit(
            "response.output_item.done",
            response_id=run.response.id,
            output_index=run.text_index,
            item=_dump(run.text_item),
        )

    async def _call(self, run: Run, call: dict[str, Any]) -> None:
        """A tool call of the answer: a `function_call` item, its arguments in one delta."""
        function = call["function"]
        item = Item(
            id=item_id(),
            type="function_call",
            status="in_progress",
            call_id=call["id"],
            name=function["name"],
            arguments="",
        )
        index = len(run.response.output)
        run.response.output.append(item)
        await self._emit(
            "response.output_item.added", response_id=run.response.id, output_index=index, item=_dump(item)
        )
        if run.into_conversation:
            await self._created(item, *self.conversation.add(item))
        ids = {
            "response_id": run.response.id,
            "item_id": item.id,
            "output_index": index,
            "call_id": item.call_id,
        }
        item.arguments = function["arguments"]
        await self._emit("response.function_call_arguments.delta", **ids, delta=item.arguments)
        await self._emit(
            "response.function_call_arguments.done", **ids, name=item.name, arguments=item.arguments
        )
        item.status = "completed"
        await self._emit(
            "response.output_item.done", response_id=run.response.id, output_index=index, item=_dump(item)
        )

    async def _finish(self, run: Run) -> None:
        await self._close_text(run)
        if run.error is not None:
            await self._error(run.error, None)
        response = run.response
        status, reason = _status(run)
        response.status = status
        if status != "completed":
            error = None
            if run.error is not None:
                error = ErrorDetail(type=run.error.error_type, code=run.error.code, message=run.error.message)
            response.status_details = StatusDetails(type=status, reason=reason, error=error)
        choice = run.choice
        prompt, cached, output = (
            (choice.prompt_tokens, choice.cached_tokens, choice.completion_tokens) if choice else (0, 0, 0)
        )
        response.usage = ResponseUsage(
            total_tokens=prompt + output,
            input_tokens=prompt,
            output_tokens=output,
            input_token_details=TokenDetails(text_tokens=prompt, cached_tokens=cached),
            output_token_details=TokenDetails(text_tokens=output),
        )
        self.audio_out_seconds += run.audio_seconds
        await self._emit("response.done", response=_dump(response))

    # ---------------------------------------------------------------- speech

    async def _speak(self, run: Run, final: bool) -> None:
        """Each complete sentence of the transcript to the text-to-speech deployment as soon as it is
        complete (the rest at the end), spoken in order: each sentence's synthesis starts at once, and
        its audio is sent when those before it have been."""
        transcript = (run.part.transcript or "") if run.part is not None else ""
        pending = transcript[run.spoken :]
        if final:
            cut = len(pending)
        else:
            ends = [match.end() for match in SENTENCE_END.finditer(pending)]
            cut = ends[-1] if ends else 0
        sentence = pending[:cut].strip()
        run.spoken += cut
        if sentence:
            run.speaking.append(asyncio.create_task(self._synthesize(run, sentence)))
        while run.speaking and (final or run.speaking[0].done()):
            pcm = await run.speaking.pop(0)
            if pcm:
                run.audio_seconds += audio.seconds(len(pcm), self.settings.output_format)
                await self._emit("response.output_audio.delta", **run.ids, delta=_b64(pcm))

    async def _synthesize(self, run: Run, text: str) -> bytes:
        assert run.speech_model is not None
        key = await self.resolve(run.speech_model, SPEECH)
        body = SpeechRequest(
            model=run.speech_model,
            input=text[:4096],
            voice=run.voice,
            response_format="pcm",
            speed=run.speed or 1.0,
        )
        output = await self.runtime.infer(key, speech_item(body))
        return audio.encoded(output["audio"], int(output["sampling_rate"]), self.settings.output_format)

    # ---------------------------------------------------------------- transcription

    def _needs_transcription(self) -> None:
        if self.settings.transcription is None:
            raise InvalidRequest(
                "Audio is read through its transcript: set `session.audio.input.transcription.model` to your "
                "automatic-speech-recognition deployment first (session.update).",
                param="session.audio.input.transcription",
                code="transcription_not_configured",
            )

    def _turn_bytes(self) -> int:
        fmt = self.settings.input_format
        return int(self.bounds.max_turn_seconds * audio.RATES[fmt] * audio.SAMPLE_BYTES[fmt])

    def _transcribe(self, item: Item, index: int, data: bytes, fmt: str) -> None:
        """The clip of `item`'s part `index`, transcribed in a task of its own; its transcript becomes
        the part's (what the chat deployment reads) and is sent as it is known."""
        chosen = self.settings.transcription
        assert chosen is not None and item.content is not None
        transcription: Transcription = chosen
        part = item.content[index]
        ids = {"item_id": item.id, "content_index": index}

        async def transcribe() -> None:
            try:
                key = await self.resolve(transcription.model, TRANSCRIPTIONS)
                form = SpeechToTextOptions(model=transcription.model, prompt=transcription.prompt)
                clip = audio.wav_of(data, fmt, "audio")
                request = recognition_item(
                    form, clip, "transcribe", transcription.language, False, self.bounds.max_media_seconds
                )
                output = await self.runtime.infer(key, request)
            except ModelhostError as exc:
                error = ErrorDetail(type=exc.error_type, code=exc.code, message=exc.message, param=exc.param)
                await self._emit(
                    "conversation.item.input_audio_transcription.failed", **ids, error=_dump(error)
                )
                return
            text = str(output.get("text", "")).strip()
            part.transcript = text
            self.audio_in_seconds += audio.seconds(len(data), fmt)
            await self._emit("conversation.item.input_audio_transcription.delta", **ids, delta=text)
            usage = {"type": "duration", "seconds": round(audio.seconds(len(data), fmt), 3)}
            await self._emit(
                "conversation.item.input_audio_transcription.completed", **ids, transcript=text, usage=usage
            )

        task = asyncio.create_task(transcribe())
        self._transcriptions[item.id] = task
        task.add_done_callback(lambda _: self._transcriptions.pop(item.id, None))

    # ---------------------------------------------------------------- helpers

    async def _deployment(self, model: str, endpoint: str, param: str) -> str:
        """The runtime key of the caller's deployment of `model` for `endpoint`; its refusal names `param`."""
        try:
            return await self.resolve(model, endpoint)
        except ModelhostError as exc:
            exc.param = param
            raise

    async def _created(self, item: Item, previous: str | None, dropped: list[str]) -> None:
        for gone in dropped:  # past the bound: the oldest items went
            await self._emit("conversation.item.deleted", item_id=gone)
        await self._emit("conversation.item.created", previous_item_id=previous, item=_dump(item))

    async def _error(self, exc: ModelhostError, event_id: str | None) -> None:
        detail = ErrorDetail(
            type=exc.error_type, code=exc.code, message=exc.message, param=exc.param, event_id=event_id
        )
        await self._emit("error", error=detail.model_dump(mode="json"))

    async def _emit(self, kind: str, **fields: Any) -> None:
        if self._closed:
            return
        await self.send({"type": kind, "event_id": new_id("event"), **fields})

    def _shown(self) -> dict[str, Any]:
        return self.settings.shown(self.id, self.chat_model, self.expires_at)


def _status(run: Run) -> tuple[Literal["completed", "cancelled", "incomplete", "failed"], Any]:
    """A response's final status and its reason."""
    if run.cancelled:
        return "cancelled", "turn_detected" if run.interrupted else "client_cancelled"
    if run.error is not None:
        return "failed", None
    if run.choice is not None and run.choice.finish == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: ToolChoice) -> Any:
    return choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}


def _dump(model: BaseModel) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return dumped


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json_of(frame: str | bytes) -> Any:
    """A frame that failed to parse as an event, as JSON (None: not JSON either)."""
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(frame)
    return None


def invalid_event(exc: ValidationError, sent: Any = None) -> InvalidRequest:
    """A frame that is not a valid client event, as OpenAI's server answers it: the first problem, its
    field as `param` (`session.audio.input.format.type`: `_param`, along `sent`, the frame's JSON), and
    OpenAI's codes."""
    first = exc.errors()[0]
    kind = first["type"]
    param = _param(first["loc"], sent, missing=kind == "missing")
    if kind == "json_invalid":
        return InvalidRequest(f"The event is not valid JSON: {first['msg']}.", code="invalid_json")
    if kind in ("union_tag_invalid", "union_tag_not_found") and param in ("", "type"):
        tag = (first.get("ctx") or {}).get("tag")
        if kind == "union_tag_not_found":
            return InvalidRequest(
                "Missing required parameter: 'type'.", param="type", code="missing_required_parameter"
            )
        return InvalidRequest(
            f"Invalid value: '{tag}'. Supported values are: {', '.join(map(repr, CLIENT_EVENT_TYPES))}.",
            param="type",
            code="invalid_value",
        )
    if kind == "missing":
        return InvalidRequest(
            f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    return InvalidRequest(
        f"Invalid value for '{param}': {first['msg']}.", param=param or None, code="invalid_value"
    )


def _param(loc: tuple[int | str, ...], sent: Any, missing: bool) -> str:
    """An error's location as the field the client wrote: `('session.update', 'session', 'audio',
    'input')` → `session.audio.input`. Pydantic's location also names the members of unions it tried
    (an event's or a part's `type`, `str`, `constrained-int`): a segment is a field where the client's
    JSON has it there (or, for a missing field, at the end)."""
    param, node = "", sent
    for position, segment in enumerate(loc):
        if isinstance(segment, int):
            param += f"[{segment}]"
            node = node[segment] if isinstance(node, list) and segment < len(node) else None
        elif (isinstance(node, dict) and segment in node) or (missing and position == len(loc) - 1):
            param += f".{segment}" if param else segment
            node = node.get(segment) if isinstance(node, dict) else None
    return param
