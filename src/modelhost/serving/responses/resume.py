"""Going on with a background response another gateway process began (issue 73): what is stored for
that, and where its written events stand.

A taker cannot ask the dead process what it held. It has the response's `Job`, stored with it (the
engine request as the first owner sent it, images and the deployment's defaults included, and how its
output is parsed), and its written events, each with the engine events its owner read up to the one
that made it (`heard`). `replay` feeds those engine events to a fresh `ChatChoice` and `OutputAssembler`:
they then stand exactly where the owner's stood when it made the last written event (the reasoning and
tool-call parsers' state, the items open, the usage so far), its items carrying the IDs the client
already has. The generation goes on as a continuation (`GenerationRequest.continued`: the prompt and
the output tokens so far, as a stream that outlives its replica does), so the rest is what an
undisturbed run would have made, and the new events are numbered after the last written one.

Engine events read after the last written event made nothing a client saw: their tokens are generated
again. A replay that does not make the written events again (an engine that does not say its tokens,
a client's text held back mid-character) cannot be gone on with: the response is failed as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from modelhost.frontend import Target
from modelhost.generation.choices import ChatChoice
from modelhost.generation.contract import GenerationEvent, GenerationRequest, Text
from modelhost.serving.responses.items import OutputAssembler
from modelhost.serving.responses.store import Written

PREAMBLE = ("response.created", "response.in_progress")  # a response's first events, before its output


class Job(msgspec.Struct, kw_only=True):
    """What a taker needs to go on with a background response: its engine request and target as the
    first owner prepared them, and how the engine's output becomes the response's items."""

    request: GenerationRequest
    target: Target
    mode: str
    tool_names: list[str]
    tool_schemas: dict[str, Any]
    conversation_id: str | None = None


_heard_decoder = msgspec.msgpack.Decoder(list[GenerationEvent])
_job_decoder = msgspec.msgpack.Decoder(Job)


def encode_job(job: Job) -> bytes:
    return msgspec.msgpack.encode(job)


def decode_job(data: bytes) -> Job:
    return _job_decoder.decode(data)


def encode_heard(events: list[GenerationEvent]) -> bytes | None:
    return msgspec.msgpack.encode(events) if events else None


@dataclass
class Replayed:
    """Where a taken-over response stands: its assembler as its owner's stood, the tokens its
    continuation carries (None: nothing generated yet, so it starts afresh), whether its generation had
    ended, how many of the preamble events were written, and the number of its next event."""

    assembler: OutputAssembler
    continued: list[int] | None
    ended: bool
    preamble: int
    next: int


def replay(job: Job, written: list[Written]) -> Replayed | None:
    """The state of the response whose written events are `written` (in order, from 0); None when it
    cannot be gone on with (see the module docstring)."""
    events = [event for event, _ in written]
    if [e["sequence_number"] for e in events] != list(range(len(events))):
        return None
    preamble = 0
    while preamble < min(len(events), len(PREAMBLE)) and events[preamble]["type"] == PREAMBLE[preamble]:
        preamble += 1
    if preamble < len(PREAMBLE) and len(events) > preamble:
        return None
    heard: list[GenerationEvent] = []
    for _, engine in written:
        if engine is not None:
            heard += _heard_decoder.decode(engine)
    choice = ChatChoice(0, job.mode, job.tool_names, tool_schemas=job.tool_schemas)
    assembler = OutputAssembler(choice)
    made: list[dict[str, Any]] = []
    for engine_event in heard:
        made += assembler.feed(engine_event)
    output = events[preamble:]
    if len(made) < len(output) and choice.finish is not None:  # its items were closed, too
        made += assembler.finish()
    if [e["type"] for e in made] != [e["type"] for e in output]:
        return None
    for event in output:  # the items as the client has them (each ID was made at random)
        if event["type"] == "response.output_item.added":
            item, given = assembler.output[event["output_index"]], event["item"]
            item["id"] = given["id"]
            if "call_id" in given:
                item["call_id"] = given["call_id"]
    texts = [engine_event for engine_event in heard if isinstance(engine_event, Text)]
    ended = choice.finish is not None
    tokens: list[int] = []
    for text in texts:
        if text.token_ids is None:  # an engine that does not say its tokens
            return None
        tokens += text.token_ids
    if texts and not ended and (not texts[-1].text or len(tokens) != texts[-1].completion_tokens):
        return None
    return Replayed(assembler, tokens or None, ended, preamble, len(events))
