"""OpenAI's audio endpoints (api.md §4.16) through the official `openai` SDK against a live server, on the
tiny recipe models (VITS, Whisper, Wav2Vec2 CTC) pushed through the artifact path: `/v1/audio/speech`
answers audio files that decode back, `/v1/audio/transcriptions` and `/v1/audio/translations` answer
every response format."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.live import live_server

RATE = 16000  # the recipe models' sampling rate
SPEECH_FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


@dataclass
class Audio:
    url: str
    key: str
    http: httpx.Client
    recipes: Path
    root: Path
    deployed: set[str] = field(default_factory=set)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)

    def deploy(self, model: str, folder: Path, pipeline: str) -> str:
        """Push a model folder and deploy it (cold: it loads on the first request), once per module."""
        if model not in self.deployed:
            artifact_id = push_folder_sync(self.http, self.key, folder, pipeline)
            created = self.http.post(
                "/v1/deployments", json={"model": model, "artifact_id": artifact_id}, headers=bearer(self.key)
            )
            assert created.status_code == 201, created.text
            self.deployed.add(model)
        return model

    def tts(self) -> str:
        return self.deploy("vits", self.recipes / "t12_speech" / "vits", "text-to-speech")

    def tts_voices(self) -> str:
        return self.deploy("vits-voices", multi_speaker_vits(self.recipes, self.root), "text-to-speech")

    def whisper(self) -> str:
        return self.deploy("whisper", self.recipes / "t12_speech" / "whisper", "automatic-speech-recognition")

    def whisper_aligned(self) -> str:
        folder = aligned_whisper(self.recipes, self.root)
        return self.deploy("whisper-aligned", folder, "automatic-speech-recognition")

    def ctc(self) -> str:
        return self.deploy(
            "ctc", self.recipes / "t12_speech" / "wav2vec2_ctc", "automatic-speech-recognition"
        )

    def speak(self, **body: Any) -> httpx.Response:
        return self.http.post("/v1/audio/speech", json=body, headers=bearer(self.key), timeout=120)

    def transcribe(self, data: bytes, name: str = "clip.wav", **form: Any) -> httpx.Response:
        """A raw multipart request, for what the SDK would not send."""
        return self.http.post(
            "/v1/audio/transcriptions",
            data=form,
            files={"file": (name, data, "application/octet-stream")},
            headers=bearer(self.key),
            timeout=120,
        )


def multi_speaker_vits(recipes: Path, root: Path) -> Path:
    """The recipe VITS with three speakers. Editing only `num_speakers` would leave the speaker weights
    uninitialised (NaN audio), so the model is rebuilt from the edited config, seeded."""
    import torch
    from transformers import VitsConfig, VitsModel

    folder = root / "vits-voices"
    if not folder.exists():
        shutil.copytree(recipes / "t12_speech" / "vits", folder)
        config = VitsConfig.from_pretrained(folder)
        config.num_speakers, config.speaker_embedding_size = 3, 8
        torch.manual_seed(0)
        VitsModel(config).eval().save_pretrained(folder)
    return folder


def aligned_whisper(recipes: Path, root: Path) -> Path:
    """The recipe Whisper with `alignment_heads` (cross-attention heads whose alignment gives word times)."""
    folder = root / "whisper-aligned"
    if not folder.exists():
        shutil.copytree(recipes / "t12_speech" / "whisper", folder)
        path = folder / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "alignment_heads": [[0, 0], [0, 1]]}))
    return folder


def tone(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def wav(seconds: float = 1.0, rate: int = RATE) -> bytes:
    return wav_like("WAV", rate, seconds)


def wav_like(fmt: str, rate: int, seconds: float = 1.0) -> bytes:
    """A mono tone in a format libsndfile writes (WAV, FLAC, OGG Vorbis)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, tone(seconds, rate), rate, format=fmt)
    return buffer.getvalue()


def encoded(container: str, codec: str, rate: int, seconds: float = 1.0) -> bytes:
    """A mono tone in any container and codec PyAV writes (m4a, webm, ...)."""
    pcm16 = (tone(seconds, rate) * 32767).astype("<i2").reshape(1, -1)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream: Any = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm16, format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def decoded(data: bytes) -> tuple[int, float]:
    """(sampling rate, seconds) of an audio file, read back with PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
    return frames[0].sample_rate, sum(f.samples for f in frames) / frames[0].sample_rate


def pcm_seconds(data: bytes) -> float:
    return len(data) / 2 / RATE


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Audio]:
    root = tmp_path_factory.mktemp("audio")
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1)
    with live_server(settings) as url:
        http = httpx.Client(base_url=url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "audio"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        yield Audio(url, key, http, recipes, root)
        http.close()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clips") / "tone.wav"
    path.write_bytes(wav())
    return path


# ---------------------------------------------------------------- speech


def test_speech_is_the_models_waveform_as_a_wav_at_its_rate(audio: Audio) -> None:
    import torch
    from transformers import pipeline

    answer = audio.client().audio.speech.create(
        model=audio.tts(), voice="alloy", input="hello world", response_format="wav"
    )
    assert answer.response.headers["content-type"] == "audio/wav"
    assert answer.response.headers["x-sample-rate"] == str(RATE)
    samples, rate = soundfile.read(io.BytesIO(answer.content), dtype="int16")
    speak = pipeline("text-to-audio", model=str(audio.recipes / "t12_speech" / "vits"))
    torch.manual_seed(0)  # the server seeds every request with 0
    expected = speak("hello world")
    assert rate == RATE == expected["sampling_rate"]
    assert np.array_equal(samples, (np.clip(expected["audio"], -1, 1) * 32767).astype(np.int16))


def test_every_speech_format_decodes_with_its_content_type_and_duration(audio: Audio) -> None:
    client, model = audio.client(), audio.tts()
    seconds = pcm_seconds(
        client.audio.speech.create(
            model=model, voice="alloy", input="hello world", response_format="pcm"
        ).content
    )
    assert seconds > 0.1
    for fmt, content_type in SPEECH_FORMATS.items():
        answer = client.audio.speech.create(
            model=model, voice="alloy", input="hello world", response_format=fmt
        )
        assert answer.response.headers["content-type"] == content_type, fmt
        if fmt == "pcm":
            continue
        rate, duration = decoded(answer.content)
        assert answer.response.headers["x-sample-rate"] == str(RATE), fmt
        assert rate == (48000 if fmt == "opus" else RATE), fmt  # Opus decoders always give 48 kHz
        assert duration == pytest.approx(seconds, abs=0.1), fmt  # AAC adds up to a frame of padding


def test_speech_defaults_to_mp3(audio: Audio) -> None:
    answer = audio.client().audio.speech.create(model=audio.tts(), voice="alloy", input="hello world")
    assert answer.response.headers["content-type"] == "audio/mpeg"
    assert decoded(answer.content)[0] == RATE


def test_the_same_speech_request_gives_the_same_bytes(audio: Audio) -> None:
    client, model = audio.client(), audio.tts()
    first, second = (
        client.audio.speech.create(model=model, voice="alloy", input="good morning", response_format="flac")
        for _ in range(2)
    )
    assert first.content == second.content


def test_speed_changes_the_duration(audio: Audio) -> None:
    client, model = audio.client(), audio.tts()

    def seconds(speed: float) -> float:
        answer = client.audio.speech.create(
            model=model, voice="alloy", input="hello world", response_format="pcm", speed=speed
        )
        return pcm_seconds(answer.content)

    normal = seconds(1.0)
    assert seconds(2.0) == pytest.approx(normal / 2, rel=0.15)
    assert seconds(0.5) == pytest.approx(normal * 2, rel=0.15)


def test_voices_pick_the_speakers_of_a_multi_speaker_model(audio: Audio) -> None:
    client, model = audio.client(), audio.tts_voices()

    def speech(voice: str) -> bytes:
        return client.audio.speech.create(
            model=model, voice=voice, input="hello world", response_format="wav"
        ).content

    by_number = [speech(str(n)) for n in range(3)]
    assert len(set(by_number)) == 3
    # OpenAI's names in the SDK's order, modulo the 3 speakers: alloy 0, ash 1, ballad 2, coral 0.
    assert [speech(v) for v in ("alloy", "ash", "ballad", "coral")] == [*by_number, by_number[0]]


def test_a_single_speaker_model_accepts_and_ignores_any_voice(audio: Audio) -> None:
    client, model = audio.client(), audio.tts()
    voices = [
        client.audio.speech.create(model=model, voice=v, input="hello world", response_format="wav").content
        for v in ("alloy", "nova", "7")
    ]
    assert voices[0] == voices[1] == voices[2]


def test_instructions_are_accepted_and_leave_the_audio_unchanged(audio: Audio) -> None:
    client, model = audio.client(), audio.tts()
    plain = client.audio.speech.create(model=model, voice="alloy", input="hello world", response_format="wav")
    instructed = client.audio.speech.create(
        model=model, voice="alloy", input="hello world", response_format="wav", instructions="Speak calmly."
    )
    assert instructed.content == plain.content


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"speed": 4.5}, "speed"),
        ({"speed": 0.2}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "sse"}, "stream_format"),
        ({"sample_rate": 8000}, "sample_rate"),
    ],
)
def test_bad_speech_requests_answer_400_naming_the_field(
    audio: Audio, change: dict[str, Any], param: str
) -> None:
    body = {"model": audio.tts(), "voice": "alloy", "input": "hello", **change}
    assert_error(audio.speak(**body), 400, code="invalid_request", param=param)


def test_text_the_model_cannot_speak_is_refused_naming_input(audio: Audio) -> None:
    assert_error(audio.speak(model=audio.tts(), input="日本語"), 400, param="input")


def test_an_unknown_voice_of_a_multi_speaker_model_is_refused(audio: Audio) -> None:
    for voice in ("3", "bob"):
        error = assert_error(
            audio.speak(model=audio.tts_voices(), input="hi", voice=voice), 400, param="voice"
        )
        assert "3 speakers" in error["message"]


def test_speech_and_transcription_refuse_deployments_of_the_other_task(audio: Audio) -> None:
    assert_error(audio.speak(model=audio.ctc(), input="hello"), 400, code="endpoint_not_supported")
    assert_error(audio.transcribe(wav(), model=audio.tts()), 400, code="endpoint_not_supported")


# ---------------------------------------------------------------- transcription


@pytest.mark.parametrize("kind", ["whisper", "ctc"])
def test_every_response_format_carries_the_same_transcript(audio: Audio, clip: Path, kind: str) -> None:
    client, model = audio.client(), getattr(audio, kind)()

    def create(fmt: Any) -> Any:
        with clip.open("rb") as file:
            return client.audio.transcriptions.create(model=model, file=file, response_format=fmt)

    plain = create("json")
    assert plain.text and plain.usage is not None and plain.usage.seconds == 1
    assert create("text") == plain.text + "\n"
    verbose = create("verbose_json")
    assert verbose.text == plain.text and verbose.duration == pytest.approx(1.0) and verbose.words is None
    assert verbose.segments and all(0 <= s.start <= s.end <= 1.0 for s in verbose.segments)
    assert "".join(s.text for s in verbose.segments).replace(" ", "") == plain.text.replace(" ", "")
    cues = [s.text.strip() for s in verbose.segments]
    assert re.findall(r"\n(.+)\n\n", create("srt")) == cues
    assert re.findall(r"\n(.+)\n\n", create("vtt")) == cues


def test_srt_and_vtt_follow_their_formats(audio: Audio, clip: Path) -> None:
    client, model = audio.client(), audio.ctc()
    with clip.open("rb") as file:
        srt = client.audio.transcriptions.create(model=model, file=file, response_format="srt")
    with clip.open("rb") as file:
        vtt = client.audio.transcriptions.create(model=model, file=file, response_format="vtt")
    assert re.match(r"1\n00:00:00,000 --> 00:00:0\d,\d{3}\n.+\n\n$", srt), srt
    assert re.match(r"WEBVTT\n\n00:00:00\.000 --> 00:00:0\d\.\d{3}\n.+\n\n$", vtt), vtt


def test_a_json_body_with_the_file_as_base64_or_a_data_uri_transcribes_as_the_form_does(
    audio: Audio, clip: Path
) -> None:
    model, data = audio.ctc(), clip.read_bytes()
    options = {"model": model, "response_format": "verbose_json", "timestamp_granularities[]": "word"}
    form = audio.transcribe(data, **options)
    assert form.status_code == 200, form.text
    encoded = base64.b64encode(data).decode()
    for file in (encoded, f"data:audio/wav;base64,{encoded}"):
        body = {"model": model, "file": file, "response_format": "verbose_json"}
        answer = audio.http.post(
            "/v1/audio/transcriptions",
            json={**body, "timestamp_granularities": ["word"]},
            headers=bearer(audio.key),
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == form.json()
    not_audio = {"model": model, "file": base64.b64encode(b"just text").decode()}
    assert_error(
        audio.http.post("/v1/audio/transcriptions", json=not_audio, headers=bearer(audio.key), timeout=120),
        400,
        param="file",
    )


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("ctc", {}),
        (
            "whisper",
            {
                "return_timestamps": True,
                "generate_kwargs": {"max_new_tokens": 32, "task": "transcribe"},
            },
        ),
    ],
)
def test_the_transcript_is_the_transformers_pipelines(
    audio: Audio, clip: Path, kind: str, options: dict[str, Any]
) -> None:
    """Greedy decoding; Whisper with its timestamp tokens and half its context, as OpenAI's Whisper."""
    from transformers import pipeline

    folder = {"ctc": "wav2vec2_ctc", "whisper": "whisper"}[kind]
    expected = pipeline("automatic-speech-recognition", model=str(audio.recipes / "t12_speech" / folder))
    with clip.open("rb") as file:
        answer = audio.client().audio.transcriptions.create(model=getattr(audio, kind)(), file=file)
    samples = soundfile.read(io.BytesIO(wav()), dtype="float32")[0]  # what the server decodes
    assert answer.text == expected(samples, **options)["text"].strip()


def test_ctc_gives_word_timestamps(audio: Audio, clip: Path) -> None:
    with clip.open("rb") as file:
        answer = audio.client().audio.transcriptions.create(
            model=audio.ctc(), file=file, response_format="verbose_json", timestamp_granularities=["word"]
        )
    assert answer.words and answer.segments is None  # only the granularity asked for
    assert all(0 <= w.start <= w.end <= 1.0 for w in answer.words)
    assert " ".join(w.word for w in answer.words) == answer.text


def test_whisper_with_alignment_heads_gives_word_and_segment_timestamps(audio: Audio, clip: Path) -> None:
    with clip.open("rb") as file:
        answer = audio.client().audio.transcriptions.create(
            model=audio.whisper_aligned(),
            file=file,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    assert answer.words and answer.segments
    assert all(0 <= w.start <= w.end <= 1.0 for w in answer.words)
    assert answer.segments[0].start == answer.words[0].start


def test_whisper_without_alignment_heads_refuses_word_timestamps(audio: Audio) -> None:
    refused = audio.transcribe(
        wav(), model=audio.whisper(), response_format="verbose_json", **{"timestamp_granularities[]": "word"}
    )
    assert_error(refused, 400, param="timestamp_granularities")


def test_audio_longer_than_one_window_is_transcribed_window_by_window(audio: Audio, tmp_path: Path) -> None:
    """The recipe Whisper hears 1 s at a time: a 3.5 s clip is cut into windows (`chunk_length_s`), so
    words are found all along it rather than only in the first second."""
    path = tmp_path / "long.wav"
    path.write_bytes(wav(3.5))
    with path.open("rb") as file:
        answer = audio.client().audio.transcriptions.create(
            model=audio.whisper_aligned(),
            file=file,
            response_format="verbose_json",
            timestamp_granularities=["word"],
        )
    assert answer.duration == pytest.approx(3.5)
    assert answer.words and max(w.end for w in answer.words) > 2.0


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("clip.wav", lambda: wav(rate=44100)),
        ("clip.mp3", lambda: encoded("mp3", "libmp3lame", 22050)),
        ("clip.flac", lambda: encoded("flac", "flac", RATE)),
        ("clip.ogg", lambda: wav_like("OGG", 22050)),
        ("clip.webm", lambda: encoded("webm", "libopus", 48000)),
        ("clip.m4a", lambda: encoded("ipod", "aac", 44100)),
    ],
)
def test_files_of_every_container_are_decoded(audio: Audio, name: str, data: Any) -> None:
    answer = audio.client().audio.transcriptions.create(
        model=audio.ctc(), file=(name, data()), response_format="verbose_json"
    )
    assert answer.duration == pytest.approx(1.0, abs=0.05)


def test_whisper_transcribes_in_the_language_asked_and_reports_it(audio: Audio, clip: Path) -> None:
    client, model = audio.client(), audio.whisper()
    for language, name in (("de", "german"), ("en", "english")):
        with clip.open("rb") as file:
            answer = client.audio.transcriptions.create(
                model=model, file=file, language=language, response_format="verbose_json"
            )
        assert answer.language == name


def test_a_prompt_conditions_whisper(audio: Audio, clip: Path) -> None:
    client, model = audio.client(), audio.whisper()
    with clip.open("rb") as file:
        plain = client.audio.transcriptions.create(model=model, file=file)
    with clip.open("rb") as file:
        prompted = client.audio.transcriptions.create(model=model, file=file, prompt="hello there")
    assert prompted.text != plain.text


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478"
    "9c63f8cfc000000301010018dd8db40000000049454e44ae426082"
)


@pytest.mark.parametrize(
    ("data", "form", "param"),
    [
        (b"just some text, not audio", {}, "file"),
        (PNG, {}, "file"),
        (b"", {}, "file"),
        (None, {}, "file"),
        (b"wav", {"response_format": "xml"}, "response_format"),
        (b"wav", {"temperature": "2"}, "temperature"),
        (b"wav", {"temperature": "warm"}, "temperature"),
        (
            b"wav",
            {"timestamp_granularities[]": "char", "response_format": "verbose_json"},
            "timestamp_granularities[0]",
        ),
        (b"wav", {"timestamp_granularities[]": "word"}, "timestamp_granularities"),
        (b"wav", {"stream": "true"}, "stream"),
        (b"wav", {"chunking_strategy[type]": "server_vad"}, "chunking_strategy"),
        (b"wav", {"chunking_strategy": "server_vad"}, "chunking_strategy"),
        (b"wav", {"include[]": "logprobs"}, "include"),
        (b"wav", {"known_speaker_names[]": "agent"}, "known_speaker_names"),
        (b"wav", {"known_speaker_references[]": "data:audio/wav;base64,UklG"}, "known_speaker_references"),
        (b"wav", {"response_format": "diarized_json"}, "response_format"),
        (b"wav", {"langauge": "en"}, "langauge"),
        (b"wav", {"language": "xx"}, "language"),
        (b"wav", {"prompt": "<|en|>"}, "prompt"),
    ],
)
def test_bad_transcription_requests_answer_400_naming_the_field(
    audio: Audio, data: bytes | None, form: dict[str, Any], param: str
) -> None:
    model = audio.whisper()
    if data is None:
        response = audio.http.post(
            "/v1/audio/transcriptions", data={"model": model}, headers=bearer(audio.key), timeout=120
        )
    else:
        response = audio.transcribe(wav() if data == b"wav" else data, model=model, **form)
    assert_error(response, 400, param=param)


def test_hints_for_other_models_are_accepted_and_change_nothing(audio: Audio, clip: Path) -> None:
    """`keywords`, `languages` and `chunking_strategy: auto` steer OpenAI's newer models; no model here
    takes them, and the transcript without them is still the right one."""
    client, model = audio.client(), audio.whisper()
    with clip.open("rb") as file:
        plain = client.audio.transcriptions.create(model=model, file=file)
    with clip.open("rb") as file:
        hinted = client.audio.transcriptions.create(
            model=model, file=file, keywords=["tone"], languages=["en", "de"], chunking_strategy="auto"
        )
    assert hinted.text == plain.text


def test_what_no_model_here_can_do_is_refused_with_the_reason(audio: Audio, clip: Path) -> None:
    client = audio.client()
    refusals: list[tuple[dict[str, Any], str, str]] = [
        ({"include": ["logprobs"]}, "include", "log probabilities"),
        ({"known_speaker_names": ["agent"]}, "known_speaker_names", "diarization"),
        (
            {"chunking_strategy": {"type": "server_vad", "threshold": 0.5}},
            "chunking_strategy",
            "voice activity",
        ),
    ]
    for fields, param, reason in refusals:
        with clip.open("rb") as file, pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model=audio.whisper(), file=file, **fields)
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] == param and reason in body["message"], body


# ---------------------------------------------------------------- translation


def test_every_translation_format_carries_whispers_translate_task(audio: Audio, clip: Path) -> None:
    from transformers import pipeline

    client, model = audio.client(), audio.whisper()

    def translate(fmt: Any) -> Any:
        with clip.open("rb") as file:
            return client.audio.translations.create(model=model, file=file, response_format=fmt)

    expected = pipeline("automatic-speech-recognition", model=str(audio.recipes / "t12_speech" / "whisper"))
    samples = soundfile.read(io.BytesIO(wav()), dtype="float32")[0]
    generate = {"max_new_tokens": 32, "task": "translate"}
    text = expected(samples, return_timestamps=True, generate_kwargs=generate)["text"].strip()
    with clip.open("rb") as file:
        transcribed = client.audio.transcriptions.create(model=model, file=file)
    plain = translate("json")
    assert plain.text == text != transcribed.text
    assert translate("text") == text + "\n"
    verbose = translate("verbose_json")
    assert (verbose.text, verbose.language, verbose.duration) == (text, "english", pytest.approx(1.0))
    assert verbose.model_extra is not None and verbose.model_extra["task"] == "translate"
    assert verbose.segments and all(0 <= s.start <= s.end <= 1.0 for s in verbose.segments)
    cues = [s.text.strip() for s in verbose.segments]
    assert re.findall(r"\n(.+)\n\n", translate("srt")) == cues
    assert re.findall(r"\n(.+)\n\n", translate("vtt")) == cues


def test_a_translation_takes_prompt_and_temperature_as_a_transcription_does(audio: Audio, clip: Path) -> None:
    client, model = audio.client(), audio.whisper()
    with clip.open("rb") as file:
        plain = client.audio.translations.create(model=model, file=file, temperature=0.0)
    with clip.open("rb") as file:
        prompted = client.audio.translations.create(model=model, file=file, prompt="hello there")
    assert prompted.text != plain.text
    with clip.open("rb") as file:
        sampled = client.audio.translations.create(model=model, file=file, temperature=0.7)
    assert isinstance(sampled.text, str)


def test_a_model_that_cannot_translate_is_refused_naming_model(audio: Audio, clip: Path) -> None:
    with clip.open("rb") as file, pytest.raises(openai.BadRequestError) as refused:
        audio.client().audio.translations.create(model=audio.ctc(), file=file)
    body = refused.value.body
    assert isinstance(body, dict) and (body["param"], body["code"]) == ("model", "endpoint_not_supported")
    assert "cannot translate" in body["message"]
    translated = audio.http.post(
        "/v1/audio/translations",
        data={"model": audio.tts()},
        files={"file": ("clip.wav", wav(), "audio/wav")},
        headers=bearer(audio.key),
    )
    assert_error(translated, 400, code="endpoint_not_supported")


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"language": "en"}, "language"),  # not a translation field: the output is English
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities[]"),
        ({"promt": "hi"}, "promt"),
        ({"response_format": "xml"}, "response_format"),
        ({"temperature": "2"}, "temperature"),
    ],
)
def test_bad_translation_requests_answer_400_naming_the_field(
    audio: Audio, form: dict[str, Any], param: str
) -> None:
    response = audio.http.post(
        "/v1/audio/translations",
        data={"model": audio.whisper(), **form},
        files={"file": ("clip.wav", wav(), "audio/wav")},
        headers=bearer(audio.key),
    )
    assert_error(response, 400, param=param)
