"""Where a taken-over background response stands (issue 73, `serving.responses.resume`): its written
events' engine events replayed put a fresh assembler where its dead owner's stood, the items keeping the
IDs the client has, and the engine events after them make the rest of an undisturbed run's events."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from modelhost.frontend import Target
from modelhost.generation.choices import ChatChoice
from modelhost.generation.contract import GenerationEvent, GenerationRequest, GenerationStarted, Text
from modelhost.serving.responses.items import OutputAssembler
from modelhost.serving.responses.resume import PREAMBLE, Job, decode_job, encode_heard, encode_job, replay
from modelhost.serving.responses.service import EventLog
from modelhost.serving.responses.store import Written

JOB = Job(
    request=GenerationRequest(messages=[{"role": "user", "content": "hi"}], images=[b"\x00\xff"]),
    target=Target("dep_1", defaults={"temperature": 0.0}),
    mode="none",
    tool_names=[],
    tool_schemas={},
)
ENGINE: list[GenerationEvent] = [
    GenerationStarted(prompt_tokens=5),
    Text(text="Hel", completion_tokens=1, token_ids=[11]),
    Text(text="", completion_tokens=2, token_ids=[12]),  # a character's first bytes, held back
    Text(text="lo é", completion_tokens=3, token_ids=[13]),
    Text(text=" wor", completion_tokens=4, token_ids=[14]),
    Text(text="ld", completion_tokens=5, token_ids=[15], finish="stop"),
]


def owned(engine: list[GenerationEvent]) -> tuple[list[Written], list[int]]:
    """What an owner writes, as `Responses.run` and `_background` make it: each event with the engine
    events read since the one before; and where its writes may end (the events one engine event makes,
    or the closing of the items, go to the log in one turn of the event loop: a batch holds all or none)."""
    log, assembler = EventLog(), OutputAssembler(ChatChoice(0, "none", []))
    for kind in PREAMBLE:
        log.add({"type": kind})
    ends = [0, 1, 2]
    for event in engine:
        log.heard(event)
        for made in assembler.feed(event):
            log.add(made)
        ends.append(len(log.pending))
    for made in assembler.finish():
        log.add(made)
    ends.append(len(log.pending))
    written = [(event, encode_heard(heard)) for event, heard in zip(log.pending, log.heard_with, strict=True)]
    return written, sorted(set(ends))


Heard = list[GenerationEvent]


def wire(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "sequence_number"} for e in events]


def masked(events: list[dict[str, Any]]) -> str:
    return re.sub(r"msg_[0-9a-f]+", "msg_", repr(events))


def test_a_job_goes_through_the_database_whole() -> None:
    assert decode_job(encode_job(JOB)) == JOB


def test_a_replay_at_any_end_of_a_write_goes_on_into_the_undisturbed_events() -> None:
    whole, ends = owned(ENGINE)
    assert len(ends) == 8
    for cut in ends[2:]:
        went_on(whole, cut)


def went_on(whole: list[Written], cut: int) -> None:
    written = whole[:cut]
    replayed = replay(JOB, written)
    assert replayed is not None and replayed.next == cut and replayed.preamble == 2
    heard = [e for _, engine in written if engine for e in msgspec.msgpack.decode(engine, type=Heard)]
    texts = [e for e in heard if isinstance(e, Text)]
    if replayed.ended:
        rest: list[GenerationEvent] = []
    else:
        assert replayed.continued == ([t for e in texts for t in e.token_ids or []] or None)
        # a continuation's: the tokens after them (a fresh start's: its `GenerationStarted` too)
        rest = [e for e in ENGINE[0 if replayed.continued is None else 1 :] if e not in texts]
    assembler, made = replayed.assembler, []
    for event in rest:
        made += assembler.feed(event)
    made += assembler.finish()
    went_on, undisturbed = wire([e for e, _ in written] + made), wire([e for e, _ in whole])
    if cut == 2:  # nothing written: a new start, its message a new ID
        assert masked(went_on) == masked(undisturbed)
    else:
        assert went_on == undisturbed  # the same IDs, too, once the client has them
    assert assembler.usage()["output_tokens"] == 5 and assembler.usage()["input_tokens"] == 5


def test_nothing_generated_starts_afresh_and_unknown_tokens_cannot_go_on() -> None:
    replayed = replay(JOB, owned(ENGINE)[0][:2])
    assert replayed is not None and replayed.continued is None and not replayed.ended
    assert replay(JOB, []) is not None
    unknown = [ENGINE[0], Text(text="Hel", completion_tokens=1)]  # an engine that does not say its tokens
    assert replay(JOB, owned(unknown)[0][:5]) is None
    whole, _ = owned(ENGINE)
    assert replay(JOB, whole[:3]) is None  # a write that ended inside an engine event's events
    assert replay(JOB, whole[:2] + whole[3:5]) is None  # numbers that skip one
