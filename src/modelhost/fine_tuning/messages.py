"""What the fine-tuning runner (supervisor) and its trainer process (`fine_tuning.trainer`) say to each
other: one `Train` on the trainer's stdin, then its events on stdout, each a msgpack message behind a
4-byte big-endian length. Typed both ways (msgspec), as the replica protocol is."""

from __future__ import annotations

import struct
from typing import IO

import msgspec


class Hyperparameters(msgspec.Struct, frozen=True):
    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float


class Train(msgspec.Struct, frozen=True):
    """A job to train, or to resume: `resume_from` is the folder of its last checkpoint (the adapter
    saved at `start_step`), "" to start from the base."""

    base_dir: str
    training_path: str
    validation_path: str  # "": none
    out_dir: str  # where the trainer writes its checkpoints, `step-<n>/` each
    hyperparameters: Hyperparameters
    seed: int
    checkpoint_every: int
    resume_from: str = ""
    start_step: int = 0
    device: str = "cpu"
    threads: int = 0  # torch's CPU threads; 0: torch's default
    chat_template: str = ""  # the base deployment's own template, where it sets one ("": the model's)
    max_model_len: int = 0  # the base deployment's context, where it sets one (0: the model's)


class Started(msgspec.Struct, tag=True, frozen=True):
    total_steps: int
    examples: int
    tokens: int  # trained tokens of one epoch (those with loss)


class Step(msgspec.Struct, tag=True, frozen=True):
    step: int
    train_loss: float
    valid_loss: float | None
    trained_tokens: int  # so far, resumed runs included


class Checkpointed(msgspec.Struct, tag=True, frozen=True):
    step: int
    folder: str  # adapter_config.json + adapter_model.safetensors
    train_loss: float
    valid_loss: float | None


class Finished(msgspec.Struct, tag=True, frozen=True):
    folder: str  # the final adapter
    trained_tokens: int


class Failed(msgspec.Struct, tag=True, frozen=True):
    code: str
    message: str
    param: str | None = None  # `training_file` / `validation_file` when a line is at fault


Event = Started | Step | Checkpointed | Finished | Failed
_HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
_events: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)
_trains = msgspec.msgpack.Decoder(Train)


def frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


def read_train(stream: IO[bytes]) -> Train:
    (size,) = _HEADER.unpack(stream.read(_HEADER.size))
    return _trains.decode(stream.read(size))


def decode_event(body: bytes) -> Event:
    return _events.decode(body)


HEADER_SIZE = _HEADER.size


def body_size(header: bytes) -> int:
    return int(_HEADER.unpack(header)[0])
