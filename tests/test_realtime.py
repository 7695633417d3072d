"""OpenAI's Realtime API over WebSocket (`/v1/realtime`, docs/realtime.md): the session's state machine
without a socket (events, errors, bounds), the protocol's audio formats, and the official `openai` SDK's
`client.realtime.connect()` against a live gateway with the tiny recipe chat model (a text turn, a
cancel, a bad event, keys refused with their close codes)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import openai
import pytest
from websockets.exceptions import ConnectionClosed

from modelhost.errors import ModelNotFound
from modelhost.media.decode import decode_audio, g711_samples
from modelhost.media.encode import encode_g711
from modelhost.protocol.realtime import Item, SessionUpdate
from modelhost.serving.realtime import audio
from modelhost.serving.realtime.conversation import Conversation, chat_messages
from modelhost.serving.realtime.session import Abuse, Bounds, RealtimeSession
from tests.chat_model import ChatServer, served_chat_model
from tests.helpers import bearer, push_folder_sync

# ---------------------------------------------------------------- without a socket


class Transcriber:
    """A runtime whose every deployment transcribes anything as "hello"."""

    async def infer(self, key: str, item: dict[str, Any]) -> dict[str, Any]:
        assert key == "dep-whisper" and item["file"][:4] == b"RIFF"
        return {"text": " hello ", "duration": 1.0}


def session(events: list[dict[str, Any]], **bounds: Any) -> RealtimeSession:
    """A session whose chat and speech deployments are never reached (its transcriptions are fakes)."""

    async def send(event: dict[str, Any]) -> None:
        events.append(event)

    async def resolve(model: str, endpoint: str) -> str:
        if model != "whisper":
            raise ModelNotFound(model)
        return "dep-whisper"

    return RealtimeSession(
        chat_model="chat",
        generation=cast(Any, None),
        target=cast(Any, None),
        runtime=cast(Any, Transcriber()),
        resolve=resolve,
        send=send,
        bounds=Bounds(**bounds),
        expires_at=0,
    )


async def test_a_session_answers_its_events_and_refuses_bad_ones_with_openai_errors() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    await s.start()
    assert events[0]["type"] == "session.created" and events[0]["session"]["model"] == "chat"
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await s.handle(event("conversation.item.create", item=item))
    created = events[-1]
    assert created["type"] == "conversation.item.created" and created["previous_item_id"] is None
    assert created["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    await s.handle(event("conversation.item.retrieve", item_id=created["item"]["id"]))
    assert events[-1]["type"] == "conversation.item.retrieved"

    await s.handle('{"type": "no.such.event", "event_id": "e1"}')
    error = events[-1]
    assert error["type"] == "error" and error["event_id"] != "e1"
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "type" and error["error"]["event_id"] == "e1"
    await s.handle('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "mp3"}}}}}')
    assert events[-1]["error"]["param"] == "session.audio.input.format.type"
    await s.handle('{"type": "session.update", "session": {"colour": "red"}}')
    assert (
        events[-1]["error"]["code"] == "unknown_parameter"
        and events[-1]["error"]["param"] == "session.colour"
    )
    await s.handle("not json")
    assert events[-1]["error"]["code"] == "invalid_json"
    await s.handle('{"type": "response.cancel"}')
    assert events[-1]["error"]["code"] == "response_cancel_not_active"
    await s.handle('{"type": "conversation.item.delete", "item_id": "nope"}')
    assert events[-1]["error"]["code"] == "item_not_found" and events[-1]["error"]["param"] == "item_id"
    # an unknown transcription model is refused by routing, naming the session's field
    transcription = (
        '{"type": "session.update", "session": {"audio": {"input": {"transcription": {"model": "x"}}}}}'
    )
    await s.handle(transcription)
    assert events[-1]["error"]["code"] == "model_not_found"
    assert events[-1]["error"]["param"] == "session.audio.input.transcription.model"
    await s.handle('{"type": "session.update", "session": {"output_modalities": ["audio"]}}')
    assert events[-1]["error"]["param"] == "session.audio.output.model"


async def test_audio_needs_a_transcription_model_and_fits_the_turn_bound() -> None:
    events: list[dict[str, Any]] = []
    s = session(events, max_turn_seconds=1.0, max_append_bytes=64_000)
    second = base64.b64encode(b"\0\0" * 24_000).decode()  # 1 s of pcm16 at 24 kHz
    await s.handle(event("input_audio_buffer.append", audio=second))
    assert len(s.buffer) == 48_000
    await s.handle(event("input_audio_buffer.append", audio=base64.b64encode(b"\0\0").decode()))
    assert events[-1]["error"]["code"] == "input_audio_buffer_full" and len(s.buffer) == 48_000
    await s.handle('{"type": "input_audio_buffer.commit"}')
    assert events[-1]["error"]["code"] == "transcription_not_configured"
    await s.handle('{"type": "input_audio_buffer.clear"}')
    assert events[-1]["type"] == "input_audio_buffer.cleared" and not s.buffer
    await s.handle('{"type": "input_audio_buffer.commit"}')
    assert events[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
    big = base64.b64encode(b"\0" * 64_002).decode()
    await s.handle(event("input_audio_buffer.append", audio=big))
    assert events[-1]["error"]["param"] == "audio"


async def test_too_many_events_a_second_end_the_session() -> None:
    events: list[dict[str, Any]] = []
    s = session(events, events_per_second=3)
    for _ in range(3):
        await s.handle('{"type": "input_audio_buffer.clear"}')
    with pytest.raises(Abuse):
        await s.handle('{"type": "input_audio_buffer.clear"}')
    assert events[-1]["error"]["code"] == "too_many_events"


def speech_clip() -> np.ndarray:
    """A spoken word at 24 kHz (litellm's health-check clip, where litellm is installed)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        pytest.skip("needs a recorded voice: litellm's audio_health_check.wav")
    path = Path(spec.origin).parent / "litellm_core_utils" / "audio_utils" / "audio_health_check.wav"
    if not path.exists():
        pytest.skip(f"no {path}")
    return decode_audio(path.read_bytes(), target_rate=24_000, max_seconds=10, param="file")


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


async def test_server_vad_finds_the_turn_commits_and_transcribes_it() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    vad = {
        "type": "server_vad",
        "silence_duration_ms": 300,
        "prefix_padding_ms": 200,
        "create_response": False,
    }
    audio_input = {"transcription": {"model": "whisper"}, "turn_detection": vad}
    await s.handle(event("session.update", session={"audio": {"input": audio_input}}))
    assert events[-1]["type"] == "session.updated", events[-1]
    silence = np.zeros(24_000, dtype=np.float32)
    stream = pcm16(np.concatenate([silence[:12_000], speech_clip(), silence]))
    for start in range(0, len(stream), 4_800):  # 100 ms appends
        await s.handle(
            event("input_audio_buffer.append", audio=base64.b64encode(stream[start : start + 4_800]).decode())
        )
    await asyncio.gather(*list(s._transcriptions.values()))
    kinds = [e["type"] for e in events]
    assert kinds[1:] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ], kinds
    started, stopped, committed = events[1], events[2], events[3]
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert 500 <= started["audio_start_ms"] < stopped["audio_end_ms"] <= 1_700
    assert events[-1]["transcript"] == "hello"
    assert s.conversation.items[0].content[0].transcript == "hello"  # what the chat model will read
    # without a transcription model, server VAD is refused: nothing could read the turns
    await s.handle(event("session.update", session={"audio": {"input": {"transcription": None}}}))
    assert events[-1]["error"]["param"] == "session.audio.input.turn_detection"


class Endless:
    """A generation pipeline whose one stream never ends: it says when it starts and when it is closed."""

    def __init__(self) -> None:
        self.started, self.closed = asyncio.Event(), asyncio.Event()

    async def chat(self, body: Any, target: Any) -> tuple[list[Any], str]:
        return [object()], "none"

    async def open(self, target: Any, requests: list[Any]) -> Any:
        return self

    async def merged(self) -> Any:
        self.started.set()
        try:
            await asyncio.Event().wait()
            yield 0, None
        finally:
            self.closed.set()


async def test_a_client_that_leaves_stops_its_sessions_generation() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    endless = Endless()
    s.generation = cast(Any, endless)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await s.handle(event("conversation.item.create", item=item))
    await s.handle(event("response.create"))
    async with asyncio.timeout(10):
        await endless.started.wait()
    await s.close()  # what the route does when the socket is gone
    assert endless.closed.is_set()  # the engine stream is closed: the worker stops at its next step
    assert events[-1]["type"] == "response.created"  # and nothing more is sent to nobody


async def test_server_vad_answers_the_turn_and_speech_over_the_answer_cancels_it() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    endless = Endless()
    s.generation = cast(Any, endless)
    vad = {"type": "server_vad", "silence_duration_ms": 300}  # create_response, interrupt_response: true
    audio_input = {"transcription": {"model": "whisper"}, "turn_detection": vad}
    await s.handle(event("session.update", session={"audio": {"input": audio_input}}))
    silence = np.zeros(24_000, dtype=np.float32)
    turn = pcm16(np.concatenate([silence[:12_000], speech_clip(), silence]))

    async def say() -> None:
        for start in range(0, len(turn), 4_800):
            await s.handle(
                event(
                    "input_audio_buffer.append", audio=base64.b64encode(turn[start : start + 4_800]).decode()
                )
            )

    await say()
    async with asyncio.timeout(10):
        await endless.started.wait()  # answered once the transcript is known
    kinds = [e["type"] for e in events]
    assert "conversation.item.input_audio_transcription.completed" in kinds
    assert "response.created" in kinds and "response.done" not in kinds
    await say()  # the user speaks over the answer
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
    assert endless.closed.is_set()
    await s.close()


async def test_an_audio_item_is_transcribed_and_an_answers_audio_can_be_truncated() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    await s.handle(
        event("session.update", session={"audio": {"input": {"transcription": {"model": "whisper"}}}})
    )
    clip = base64.b64encode(tone(0.5)).decode()
    parts = [{"type": "input_text", "text": "Listen:"}, {"type": "input_audio", "audio": clip}]
    await s.handle(
        event("conversation.item.create", item={"type": "message", "role": "user", "content": parts})
    )
    await asyncio.gather(*list(s._transcriptions.values()))
    completed = events[-1]
    assert completed["type"] == "conversation.item.input_audio_transcription.completed"
    assert completed["content_index"] == 1 and completed["transcript"] == "hello"
    assert chat_messages(s.conversation.items, None) == [{"role": "user", "content": "Listen:hello"}]

    spoken = [{"type": "output_audio", "transcript": "Hi there."}]
    await s.handle(
        event("conversation.item.create", item={"type": "message", "role": "assistant", "content": spoken})
    )
    answer = events[-1]["item"]["id"]
    await s.handle(event("conversation.item.truncate", item_id=answer, content_index=0, audio_end_ms=300))
    assert events[-1] == {**events[-1], "type": "conversation.item.truncated", "audio_end_ms": 300}
    await s.handle(
        event("conversation.item.truncate", item_id=completed["item_id"], content_index=0, audio_end_ms=1)
    )
    assert events[-1]["type"] == "error" and events[-1]["error"]["param"] == "item_id"


async def test_telephony_audio_is_read_and_written_as_g711() -> None:
    events: list[dict[str, Any]] = []
    s = session(events)
    formats = {"format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper"}}
    await s.handle(event("session.update", session={"audio": {"input": formats}}))
    assert events[-1]["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    half = encode_g711(0.3 * np.sin(np.linspace(0, 800 * np.pi, 4000)).astype(np.float32), "ulaw")
    await s.handle(event("input_audio_buffer.append", audio=base64.b64encode(half).decode()))
    await s.handle(event("input_audio_buffer.commit"))
    await asyncio.gather(*list(s._transcriptions.values()))
    assert events[-1]["type"] == "conversation.item.input_audio_transcription.completed"
    assert events[-1]["usage"] == {"type": "duration", "seconds": 0.5}  # 4000 bytes at 8 kHz
    # speech at a model's 16 kHz becomes 8 kHz A-law: a byte a sample
    spoken = audio.encoded(pcm16(np.zeros(16_000, dtype=np.float32)), 16_000, "audio/pcma")
    assert len(spoken) == 8_000 and set(spoken) == {0xD5}  # A-law's silence


def test_the_beta_protocols_names_are_read_as_the_ga_places() -> None:
    beta = {
        "type": "session.update",
        "session": {
            "modalities": ["text"],
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper"},
            "turn_detection": None,
            "voice": "alloy",
            "max_response_output_tokens": 20,
        },
    }
    update = SessionUpdate.model_validate(beta).session
    assert update.audio is not None and update.audio.input is not None and update.audio.output is not None
    assert update.audio.input.format is not None and update.audio.input.format.type == "audio/pcmu"
    assert (
        update.audio.input.transcription is not None and update.audio.input.transcription.model == "whisper"
    )
    assert update.audio.output.voice == "alloy" and update.max_output_tokens == 20
    assert update.output_modalities == ["text"]


def test_conversation_keeps_its_bound_and_makes_chat_messages() -> None:
    conversation = Conversation(max_items=3)
    for n in range(3):
        conversation.add(Item(id=f"i{n}", type="message", role="user", content=[]))
    previous, dropped = conversation.add(Item(id="i3", type="message", role="user", content=[]))
    assert previous == "i2" and dropped == ["i0"]
    conversation.add(Item(id="first", type="message", role="system", content=[]), "root")
    assert [i.id for i in conversation.items] == ["first", "i2", "i3"]
    call = Item(id="c", type="function_call", call_id="call_1", name="f", arguments="{}")
    output = Item(id="o", type="function_call_output", call_id="call_1", output="42")
    messages = chat_messages([call, output], "Be brief.")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_g711_round_trips_within_its_quantization(law: str) -> None:
    wave = (0.5 * np.sin(np.linspace(0, 40 * np.pi, 8000))).astype(np.float32)
    back = g711_samples(encode_g711(wave, law), law)
    assert back.shape == wave.shape and np.max(np.abs(back - wave)) < 0.02
    coded = encode_g711(wave, law)
    assert encode_g711(g711_samples(coded, law), law) == coded  # a decoded byte encodes back to itself


def event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


# ---------------------------------------------------------------- the SDK against a live gateway


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[ChatServer]:
    bounds = {
        "realtime_max_events_per_second": 20,
        "realtime_max_sessions_per_key": 2,
        "constrained_max_string_length": 16,
    }
    with served_chat_model(tmp_path_factory.mktemp("realtime"), recipes, **bounds) as served:
        yield served


def client(server: ChatServer, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key or server.key, max_retries=0)


async def until(connection: Any, last: str) -> list[Any]:
    """The events up to and with the first of type `last`."""
    events = []
    async with asyncio.timeout(120):
        async for event in connection:
            events.append(event)
            if event.type == last:
                return events
    raise AssertionError(f"the socket closed before {last}: {[e.type for e in events]}")


USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something."}]}


async def test_a_text_turn_streams_the_chat_models_answer_in_openais_events(server: ChatServer) -> None:
    async with client(server).realtime.connect(model="chat") as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        await connection.session.update(
            session={"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]}
        )
        assert (await connection.recv()).type == "session.updated"
        await connection.conversation.item.create(item=cast(Any, USER))
        item = await connection.recv()
        assert item.type == "conversation.item.created"
        await connection.response.create(response={"max_output_tokens": 6})
        events = await until(connection, "response.done")
        kinds = [e.type for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.output_item.added",
            "conversation.item.created",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done",
        ]
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        text = next(e for e in events if e.type == "response.output_text.done").text
        assert deltas and "".join(deltas) == text
        done = events[-1].response
        assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens"
        assert done.usage.output_tokens == 6 and done.usage.input_tokens > 5
        assert done.usage.total_tokens == done.usage.input_tokens + 6
        assert done.output[0].content[0].text == text

        # the next turn reads the first: the conversation holds both messages and the answer
        await connection.conversation.item.create(item=cast(Any, USER))
        await until(connection, "conversation.item.created")
        await connection.response.create(response={"max_output_tokens": 2})
        second = (await until(connection, "response.done"))[-1].response
        assert second.usage.input_tokens > done.usage.input_tokens + 6
        session_id = created.session.id

    # the session's start and end are audited, its end with what it used
    ended: list[dict[str, Any]] = []
    for _ in range(100):
        query = {"action": "realtime_session.ended", "target_id": session_id}
        ended = server.http.get("/v1/audit", params=query, headers=bearer(server.key)).json()["data"]
        if ended:
            break
        await asyncio.sleep(0.1)
    assert ended and ended[0]["changes"]["responses"]["after"] == 2
    assert ended[0]["changes"]["usage"]["after"] >= done.usage.total_tokens + second.usage.total_tokens
    query = {"action": "realtime_session.started", "target_id": session_id}
    started = server.http.get("/v1/audit", params=query, headers=bearer(server.key)).json()["data"]
    assert started[0]["changes"]["model"]["after"] == "chat"


async def test_a_cancel_stops_the_response_and_a_bad_event_is_an_error(server: ChatServer) -> None:
    async with client(server).realtime.connect(model="chat") as connection:
        await until(connection, "session.created")
        await connection.conversation.item.create(item=cast(Any, USER))
        await until(connection, "conversation.item.created")
        await connection.response.create()  # no token limit but the context's
        await connection.response.cancel()
        done = (await until(connection, "response.done"))[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"

        await connection.send_raw('{"type": "response.create", "response": {"max_output_tokens": "many"}}')
        error = (await until(connection, "error"))[-1].error
        assert error.type == "invalid_request_error" and error.param == "response.max_output_tokens"
        # the session goes on: a response after the cancel runs to its end
        await connection.response.create(response={"max_output_tokens": 3})
        assert (await until(connection, "response.done"))[-1].response.status == "incomplete"


@pytest.mark.parametrize(
    ("role", "code", "close"),
    [(None, "invalid_api_key", 4401), ("viewer", "permission_denied", 4403)],
    ids=["wrong key", "no models:call"],
)
async def test_a_key_without_access_is_refused_with_an_error_then_its_close_code(
    server: ChatServer, role: str | None, code: str, close: int
) -> None:
    key = "mh-not-a-key"
    if role is not None:
        made = server.http.post("/v1/keys", json={"name": role, "role": role}, headers=bearer(server.key))
        assert made.status_code == 201, made.text
        key = made.json()["api_key"]
    async with client(server, key).realtime.connect(model="chat") as connection:
        error = await connection.recv()
        assert error.type == "error" and error.error.code == code
        with pytest.raises(ConnectionClosed) as closed:
            await connection.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == close


async def test_an_unknown_model_is_refused_with_4404(server: ChatServer) -> None:
    async with client(server).realtime.connect(model="no-such-model") as connection:
        error = await connection.recv()
        assert error.type == "error" and error.error.code == "model_not_found"
        with pytest.raises(ConnectionClosed) as closed:
            await connection.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


def deploy(server: ChatServer, model: str, folder: Path, pipeline: str) -> None:
    """A speech deployment beside the chat one, once per module (cold: it loads on its first request)."""
    listed = server.http.get("/v1/deployments", headers=bearer(server.key)).json()["data"]
    if any(d["model"] == model for d in listed):
        return
    artifact = push_folder_sync(server.http, server.key, folder, pipeline)
    made = server.http.post(
        "/v1/deployments", json={"model": model, "artifact_id": artifact}, headers=bearer(server.key)
    )
    assert made.status_code == 201, made.text


def tone(seconds: float, rate: int = 24_000) -> bytes:
    """A 440 Hz tone as 16-bit little-endian PCM."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()


async def test_an_audio_turn_is_transcribed_answered_and_spoken(server: ChatServer, recipes: Path) -> None:
    deploy(server, "whisper", recipes / "t12_speech" / "whisper", "automatic-speech-recognition")
    deploy(server, "vits", recipes / "t12_speech" / "vits", "text-to-speech")
    async with client(server).realtime.connect(model="chat") as connection:
        await until(connection, "session.created")
        session: Any = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "whisper"},
                },
                "output": {"model": "vits", "format": {"type": "audio/pcm", "rate": 24000}},
            },
        }
        await connection.session.update(session=session)
        updated = (await until(connection, "session.updated"))[-1].session
        assert updated.audio.input.transcription.model == "whisper"
        clip = tone(1.0)
        for start in range(0, len(clip), 12_000):  # four appends of 0.25 s
            await connection.input_audio_buffer.append(
                audio=base64.b64encode(clip[start : start + 12_000]).decode()
            )
        await connection.input_audio_buffer.commit()
        events = await until(connection, "conversation.item.input_audio_transcription.completed")
        kinds = [e.type for e in events]
        assert kinds[:2] == ["input_audio_buffer.committed", "conversation.item.created"]
        item_id = events[0].item_id
        completed = events[-1]
        assert completed.item_id == item_id and isinstance(completed.transcript, str)

        await connection.response.create(response={"max_output_tokens": 8})
        events = await until(connection, "response.done")
        done = events[-1].response
        assert done.status in ("completed", "incomplete"), done.status_details
        assert done.output_modalities == ["audio"]
        transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        spoken = b"".join(
            base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
        )
        assert transcript.strip() and len(spoken) > 2400 and len(spoken) % 2 == 0  # > 50 ms of pcm16
        assert done.output[0].content[0].transcript == transcript


async def test_a_flood_of_events_closes_the_session_and_sessions_per_key_are_bounded(
    server: ChatServer,
) -> None:
    key = server.http.post("/v1/keys", json={"name": "bounded"}, headers=bearer(server.key)).json()["api_key"]
    async with client(server, key).realtime.connect(model="chat") as first:
        await until(first, "session.created")
        async with client(server, key).realtime.connect(model="chat") as second:
            await until(second, "session.created")
            async with client(server, key).realtime.connect(model="chat") as third:
                error = await third.recv()
                assert error.type == "error" and error.error.code == "too_many_sessions"
                with pytest.raises(ConnectionClosed) as refused:
                    await third.recv()
                assert refused.value.rcvd is not None and refused.value.rcvd.code == 4429
        with contextlib.suppress(ConnectionClosed):  # the server may close before the last is sent
            for _ in range(200):  # the bucket holds 20, refilled at 20 a second
                await first.send_raw('{"type": "input_audio_buffer.clear"}')
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(60):
                while True:  # the answers to the first 20, then the refusal
                    event = await first.recv()
                    if event.type == "error":
                        assert event.error.code == "too_many_events"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_forced_tool_call_is_a_function_call_item_and_its_output_is_read(server: ChatServer) -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    async with client(server).realtime.connect(model="chat") as connection:
        await until(connection, "session.created")
        forced = {"type": "function", "name": "get_weather"}
        await connection.session.update(
            session=cast(Any, {"type": "realtime", "tools": [weather], "tool_choice": forced})
        )
        await until(connection, "session.updated")
        await connection.conversation.item.create(item=cast(Any, USER))
        await until(connection, "conversation.item.created")
        await connection.response.create(response={"max_output_tokens": 200})
        events = await until(connection, "response.done")
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert done.name == "get_weather" and isinstance(json.loads(done.arguments)["city"], str)
        call = events[-1].response.output[-1]
        assert call.type == "function_call" and call.call_id == done.call_id

        output = {"type": "function_call_output", "call_id": done.call_id, "output": '{"celsius": 21}'}
        await connection.conversation.item.create(item=cast(Any, output))
        await until(connection, "conversation.item.created")
        await connection.response.create(response={"max_output_tokens": 3, "tool_choice": "none"})
        answer = (await until(connection, "response.done"))[-1].response
        assert answer.status == "incomplete" and answer.output[0].type == "message"


def test_a_session_ends_at_its_longest_life(tmp_path: Path, recipes: Path) -> None:
    async def live(url: str, key: str) -> None:
        realtime = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).realtime
        async with realtime.connect(model="chat") as connection:
            assert (await connection.recv()).type == "session.created"
            error = await connection.recv()
            assert error.type == "error" and error.error.code == "session_expired"
            with pytest.raises(ConnectionClosed) as closed:
                await connection.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000

    with served_chat_model(tmp_path, recipes, realtime_max_session_seconds=1.5) as short:
        asyncio.run(live(short.url, short.key))
