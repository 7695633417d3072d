"""The continuous-batching engine on the tiny recipe chat model, in process (no server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from modelhost.engines.interface import Engine
from modelhost.engines.native.engine import GenerationEngine, SamplingParams, Sequence
from modelhost.errors import InvalidRequest
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationRequest,
    GenerationStarted,
    Logprob,
    Sampling,
    Text,
)
from modelhost.generation.fairness import TokenWeights
from modelhost.generation.grammar import json_schema_grammar
from modelhost.generation.priority import BUSY_SECONDS
from modelhost.generation.text import IncrementalDecoder, StopStrings
from tests.hostile import lark_chain

torch = pytest.importorskip("torch")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the engine's CUDA path where a GPU is present


@pytest.fixture(scope="module")
def loaded(recipes: Path) -> Iterator[tuple[Any, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    folder = recipes / "t11_text_generation_chat"
    model = AutoModelForCausalLM.from_pretrained(folder).to(DEVICE).eval()
    yield model, AutoTokenizer.from_pretrained(folder)


def engine_of(loaded: tuple[Any, Any], max_running: int = 8) -> GenerationEngine:
    model, tokenizer = loaded
    return GenerationEngine(model, tokenizer, DEVICE, max_running, 512, lambda t: tokenizer.decode([t]))


def sequence(loaded: tuple[Any, Any], sid: int, text: str, **params: Any) -> Sequence:
    tokenizer = loaded[1]
    decoder = IncrementalDecoder(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    defaults: dict[str, Any] = {"max_tokens": 8, "min_tokens": 8, "temperature": 0}
    return Sequence(sid, tokenizer(text)["input_ids"], SamplingParams(**{**defaults, **params}), decoder)


def run(engine: GenerationEngine, joins: dict[int, list[Sequence]] | None = None) -> dict[int, str]:
    """Step until idle, adding `joins[k]` before step k; the text of each sequence."""
    texts: dict[int, str] = {}
    step = 0
    while not engine.idle or (joins and any(k >= step for k in joins)):
        for s in (joins or {}).get(step, []):
            engine.add(s)
        for sid, event in engine.step():
            texts[sid] = texts.get(sid, "") + text_of(event)
        step += 1
    return texts


PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a photo", "paris is the capital of"]


def test_the_engine_is_what_a_replicas_loop_steps(loaded: tuple[Any, Any]) -> None:
    assert isinstance(engine_of(loaded), Engine)


def test_sequences_joining_between_steps_generate_what_each_would_alone(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    lengths = [12, 5, 9, 7]
    joins = {0: [], 2: [], 4: []}
    for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        joins[[0, 0, 2, 4][i]].append(sequence(loaded, i, prompt, max_tokens=n, min_tokens=n))
    texts = run(engine_of(loaded), joins)
    for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(DEVICE)
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        assert texts[i] == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), i


def test_cancel_frees_the_slot_before_the_next_step(loaded: tuple[Any, Any]) -> None:
    engine = engine_of(loaded, max_running=1)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=400, min_tokens=400))
    engine.add(sequence(loaded, 2, "a photo", max_tokens=3, min_tokens=3))
    engine.step()
    assert [s.id for s in engine.running] == [1] and len(engine.waiting) == 1 and engine.max_running == 1
    engine.cancel(1)
    assert engine.running == []
    events = engine.step()
    assert {sid for sid, _ in events} == {2}  # the waiting one took the freed slot at once


def test_cancelling_a_sequence_ahead_of_another_running_one_moves_the_cache_and_keeps_the_other(
    loaded: tuple[Any, Any],
) -> None:
    """The running sequences close ranks (the last one's keys and values move into the cancelled one's
    slot), outside a step: a client that leaves mid-stream once killed the replica here ("Inplace update
    to inference tensor outside InferenceMode")."""
    engine = engine_of(loaded)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=40, min_tokens=40))
    engine.add(sequence(loaded, 2, "a photo", max_tokens=6, min_tokens=6))
    for _ in range(3):
        engine.step()
    assert [s.id for s in engine.running] == [1, 2]
    engine.cancel(1)
    assert [s.id for s in engine.running] == [2] and engine.running[0].slot == 0
    texts = run(engine, {0: []})
    assert texts.get(2)


def test_a_batch_line_waits_behind_interactive_sequences_for_a_slot(loaded: tuple[Any, Any]) -> None:
    engine = engine_of(loaded, max_running=1)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=3, min_tokens=3))
    engine.add(sequence(loaded, 2, "a photo", max_tokens=3, min_tokens=3), low=True)
    engine.add(sequence(loaded, 3, "paris is", max_tokens=3, min_tokens=3))  # interactive: ahead of 2
    assert [s.id for s in engine.waiting] == [1, 3, 2]
    order: list[int] = []
    while not engine.idle:
        for sid, event in engine.step():
            if isinstance(event, Text) and event.finish and sid not in order:
                order.append(sid)
    assert order == [1, 3, 2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def held(engine: GenerationEngine) -> list[int]:
    """The sequences holding slots (prefilling or running), by ID."""
    return sorted(s.id for s in (*engine.running, *engine.prefilling))


def test_flex_sequences_are_held_back_from_free_slots_while_interactive_ones_run(
    loaded: tuple[Any, Any],
) -> None:
    """Ordering the waiting list changes nothing when slots are free: while an interactive sequence
    runs no flex one starts, with seven slots free; in the moments after it (its caller's next turn may
    follow) one does; once the interactive traffic is over they take every slot but one, and when an
    interactive one comes again it takes that slot and the flex ones pause while it runs."""
    clock = Clock()
    model, tokenizer = loaded
    engine = GenerationEngine(model, tokenizer, DEVICE, 8, 512, lambda t: tokenizer.decode([t]), clock=clock)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=6, min_tokens=6))
    for sid in range(2, 12):
        engine.add(sequence(loaded, sid, "a photo", max_tokens=40, min_tokens=40), low=True)
    engine.step()
    assert held(engine) == [1] and len(engine.waiting) == 10 and engine.max_running == 8
    while 1 in held(engine):
        engine.step()
        assert held(engine) in ([1], [])
    engine.step()  # the interactive one ended just now (its caller's next turn may follow): one flex
    assert held(engine) == [2]
    clock.now += BUSY_SECONDS
    engine.step()
    assert held(engine) == list(range(2, 9)) and [s.id for s in engine.waiting] == [9, 10, 11]  # one spare
    engine.add(sequence(loaded, 12, "paris is", max_tokens=6, min_tokens=6))
    engine.step()
    assert held(engine) == [*range(2, 9), 12]  # an interactive arrival finds the spare slot at once
    generated = {s.id: len(s.generated) for s in engine.running}
    engine.step()
    grew = sorted(s.id for s in engine.running if len(s.generated) > generated[s.id])
    assert grew == [12]  # the flex ones admitted meanwhile pause in their slots while it runs
    while any(s.id == 12 for s in (*engine.running, *engine.prefilling)):
        engine.step()
    clock.now += BUSY_SECONDS
    generated = {s.id: len(s.generated) for s in engine.running}
    engine.step()
    assert all(len(s.generated) > generated[s.id] for s in engine.running)  # and go on after it


def test_an_interactive_sequence_waiting_for_the_one_slot_a_flex_one_holds_lets_it_finish(
    loaded: tuple[Any, Any],
) -> None:
    """A flex sequence pauses only beside interactive ones holding slots: one that waits for the slot
    a flex sequence holds (a one-slot engine) lets it finish, then runs."""
    clock = Clock()
    model, tokenizer = loaded
    engine = GenerationEngine(model, tokenizer, DEVICE, 1, 512, lambda t: tokenizer.decode([t]), clock=clock)
    engine.add(sequence(loaded, 1, "a photo", max_tokens=6, min_tokens=6), low=True)
    engine.step()
    engine.add(sequence(loaded, 2, "hello world", max_tokens=3, min_tokens=3))
    texts = run(engine)
    assert set(texts) == {1, 2} and engine.idle


def test_paused_flex_sequences_generate_what_they_would_have_unpaused(loaded: tuple[Any, Any]) -> None:
    """A paused sequence keeps its slot and cache while others move around it: its greedy output is
    unchanged."""
    clock = Clock()
    model, tokenizer = loaded
    engine = GenerationEngine(model, tokenizer, DEVICE, 8, 512, lambda t: tokenizer.decode([t]), clock=clock)
    flex = [sequence(loaded, i, prompt, max_tokens=16, min_tokens=16) for i, prompt in enumerate(PROMPTS)]
    for s in flex:
        engine.add(s, low=True)
    texts: dict[int, str] = {}
    for step in range(40):
        if step in (3, 9):  # interactive turns: all flex ones but the oldest pause meanwhile
            engine.add(sequence(loaded, 10 + step, "hello world", max_tokens=4, min_tokens=4))
        if step in (8, 20):
            clock.now += BUSY_SECONDS
        for sid, event in engine.step():
            texts[sid] = texts.get(sid, "") + text_of(event)
    assert engine.idle
    alone = run(
        engine_of(loaded),
        {0: [sequence(loaded, i, p, max_tokens=16, min_tokens=16) for i, p in enumerate(PROMPTS)]},
    )
    assert {i: texts[i] for i in range(len(PROMPTS))} == alone


def test_priority_goes_ahead_of_its_keys_default_sequences_and_never_ahead_of_another_keys(
    loaded: tuple[Any, Any],
) -> None:
    """A key's numbers sort its own waiting sequences over the places their arrival gave them, so key
    B finds as many of key A's sequences ahead of it as it would without them; a flex one stays last."""
    engine = engine_of(loaded, max_running=1)

    def add(sid: int, tenant: str, priority: int = 0, low: bool = False) -> None:
        s = sequence(loaded, sid, "hello world", max_tokens=2, min_tokens=2)
        s.tenant, s.priority = tenant, priority
        engine.add(s, low=low)

    add(1, "a")
    add(2, "b")
    add(3, "a")
    add(4, "a", low=True)
    add(5, "a", priority=-1)
    add(6, "b", priority=5)
    add(7, "b")
    assert [s.id for s in engine.waiting] == [5, 2, 1, 3, 7, 6, 4]


def finish_order(engine: GenerationEngine, joins: dict[int, list[Sequence]] | None = None) -> list[int]:
    """Step until idle, adding `joins[k]` once `k` sequences have finished; the IDs in finishing order."""
    order: list[int] = []
    while not engine.idle or (joins and len(order) in joins):
        for added in (joins or {}).pop(len(order), []):
            engine.add(added)
        for sid, event in engine.step():
            if isinstance(event, Text) and event.finish:
                order.append(sid)
    return order


def fair_engine(loaded: tuple[Any, Any]) -> GenerationEngine:
    """One slot (admission order is finishing order); output tokens only in the counters, so that the
    prefix cache's reuse of a prompt does not make one tenant's requests cheaper than another's."""
    model, tokenizer = loaded
    return GenerationEngine(
        model,
        tokenizer,
        DEVICE,
        1,
        512,
        lambda t: tokenizer.decode([t]),
        token_weights=TokenWeights(prompt=0),
    )


def of(loaded: tuple[Any, Any], sid: int, tenant: str) -> Sequence:
    s = sequence(loaded, sid, "hello world", max_tokens=3, min_tokens=3)
    s.tenant = tenant
    return s


def test_the_least_served_tenant_is_admitted_next_not_the_first_come(loaded: tuple[Any, Any]) -> None:
    """Key A queues three requests and then key B one: B's goes after A's first, not after all three
    (first come, first served would give 1, 2, 3, 4); an account's keys count inside it."""
    engine = fair_engine(loaded)
    for sid, tenant in ((1, "x/a"), (2, "x/a"), (3, "x/a"), (4, "x/b")):
        engine.add(of(loaded, sid, tenant))
    assert finish_order(engine) == [1, 4, 2, 3]


def test_three_tenants_take_turns_by_the_service_each_has_received(loaded: tuple[Any, Any]) -> None:
    engine = fair_engine(loaded)
    for sid, tenant in ((1, "a/1"), (2, "a/1"), (3, "a/1"), (4, "b/1"), (5, "b/1"), (6, "c/1")):
        engine.add(of(loaded, sid, tenant))
    assert finish_order(engine) == [1, 4, 6, 2, 5, 3]
    served = [engine.served.counters(tenant)[0] for tenant in ("a/1", "b/1", "c/1")]
    assert served == [18.0, 12.0, 6.0]  # 3 output tokens of weight 2 a request


def test_a_tenant_of_weight_two_is_admitted_twice_as_often_while_both_wait(loaded: tuple[Any, Any]) -> None:
    """Account x of weight 2 and account y of weight 1, each with four requests of three tokens waiting:
    x's requests go two for each of y's."""
    engine = fair_engine(loaded)
    for sid in range(1, 9):
        s = of(loaded, sid, "x/a" if sid <= 4 else "y/b")
        s.weights = (2.0, 1.0) if sid <= 4 else (1.0, 1.0)
        engine.add(s)
    assert finish_order(engine) == [1, 5, 2, 3, 6, 4, 7, 8]


def test_a_tenant_arriving_after_another_was_served_alone_takes_turns_with_it_and_banks_nothing(
    loaded: tuple[Any, Any],
) -> None:
    """B arrives after A's first two requests were served: its counter starts level with A's (the lift
    rule), so they alternate; starting from nothing it would take every turn until it had caught up
    with what A received alone (5, 6, then 3, 4)."""
    engine = fair_engine(loaded)
    for sid in range(1, 5):
        engine.add(of(loaded, sid, "a/1"))
    late = {2: [of(loaded, 5, "b/1"), of(loaded, 6, "b/1")]}
    assert finish_order(engine, late) == [1, 2, 3, 5, 4, 6]


class FixedCap:
    """Step costs that say a batch of `cap` keeps a light tenant's steps fast enough, whatever the steps
    took (the real ones, `generation.fairness.StepCosts`, learn it from their timing)."""

    def __init__(self, cap: int) -> None:
        self.fixed = cap

    def record(self, size: int, seconds: float) -> None:
        return None

    def cap(self, slowdown: float = 0.0) -> int:
        return self.fixed


def test_a_light_tenant_gets_a_token_every_step_while_the_heavy_ones_pause_by_turns_unchanged(
    loaded: tuple[Any, Any],
) -> None:
    """Key a runs four sequences and key b one, with room for three a step: b's decodes every step, a's
    take turns (paused ones go on when others end, or at the next turn), and every greedy answer is
    what it is alone."""
    engine = engine_of(loaded)
    engine.step_costs = FixedCap(3)  # type: ignore[assignment]
    made = [sequence(loaded, i, p, max_tokens=12, min_tokens=12) for i, p in enumerate([*PROMPTS, "a cat"])]
    for index, s in enumerate(made):
        s.tenant = "x/b" if index == 2 else "x/a"
        engine.add(s)
    texts: dict[int, str] = {}
    paused_steps = dict.fromkeys(range(len(made)), 0)
    while not engine.idle:
        before = {s.id: len(s.generated) for s in engine.running}
        for sid, event in engine.step():
            texts[sid] = texts.get(sid, "") + text_of(event)
        grew = [s.id for s in engine.running if s.id in before and len(s.generated) > before[s.id]]
        assert len(grew) <= 3
        for s in engine.running:
            if s.id in before and len(s.generated) == before[s.id]:
                paused_steps[s.id] += 1
    assert paused_steps[2] == 0 and sum(paused_steps[i] for i in (0, 1, 3, 4)) > 0
    alone = run(
        engine_of(loaded),
        {
            0: [
                sequence(loaded, i, p, max_tokens=12, min_tokens=12)
                for i, p in enumerate([*PROMPTS, "a cat"])
            ]
        },
    )
    assert texts == alone


def test_a_tenants_first_token_comes_in_a_step_that_decodes_nobody_elses_batch(
    loaded: tuple[Any, Any],
) -> None:
    engine = engine_of(loaded)
    for sid in range(4):
        heavy = sequence(loaded, sid, PROMPTS[sid], max_tokens=8, min_tokens=8)
        heavy.tenant = "x/a"
        engine.add(heavy)
    engine.step()
    engine.step()
    before = {s.id: len(s.generated) for s in engine.running}
    engine.add(of(loaded, 9, "x/b"))
    events = engine.step()
    assert 9 in {sid for sid, _ in events}  # b's first token (and its second) this step
    assert all(len(s.generated) == before[s.id] for s in engine.running if s.id in before)  # a's paused
    texts = run(engine)
    assert set(texts) == {0, 1, 2, 3, 9}


def test_seeded_sampling_is_reproducible_whatever_runs_beside_it(loaded: tuple[Any, Any]) -> None:
    alone = engine_of(loaded)
    alone.add(sequence(loaded, 1, "hello world", temperature=1.2, seed=5, max_tokens=10, min_tokens=10))
    first = run(alone)[1]
    crowded = engine_of(loaded)
    crowded.add(sequence(loaded, 7, "a photo", temperature=1.0, seed=9, max_tokens=10, min_tokens=10))
    crowded.add(sequence(loaded, 1, "hello world", temperature=1.2, seed=5, max_tokens=10, min_tokens=10))
    assert run(crowded)[1] == first
    other = engine_of(loaded)
    other.add(sequence(loaded, 1, "hello world", temperature=1.2, seed=6, max_tokens=10, min_tokens=10))
    assert run(other)[1] != first


def test_max_tokens_finishes_with_length_and_counts_tokens(loaded: tuple[Any, Any]) -> None:
    engine = engine_of(loaded)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=3, min_tokens=3))
    events = [e for _, e in [*engine.step(), *engine.step(), *engine.step()]]
    assert events[0] == GenerationStarted(prompt_tokens=2, cached_tokens=0)
    last = events[-1]
    assert isinstance(last, Text) and last.token_ids is not None and len(last.token_ids) == 1
    assert last == Text(text=last.text, completion_tokens=3, finish="length", token_ids=last.token_ids)
    assert engine.idle


def test_logprobs_and_prompt_logprobs_give_an_entry_per_token(loaded: tuple[Any, Any]) -> None:
    engine = engine_of(loaded)
    engine.add(sequence(loaded, 1, "hello world", logprobs=True, top_logprobs=2, prompt_logprobs=True))
    events = [e for _, e in run_events(engine)]
    assert isinstance(events[0], GenerationStarted) and events[0].prompt_logprobs is not None
    prompt = events[0].prompt_logprobs
    assert len(prompt) == 2 and prompt[0].logprob is None and (prompt[1].logprob or 0) < 0
    entries = [e.entry for e in events if isinstance(e, Logprob)]
    assert len(entries) == 8 and all(e.top and len(e.top) == 2 and e.top[0][1] == e.logprob for e in entries)


def run_events(engine: GenerationEngine) -> list[tuple[int, GenerationEvent]]:
    events: list[tuple[int, GenerationEvent]] = []
    while not engine.idle:
        events += engine.step()
    return events


def test_a_grammar_forces_output_that_validates_against_its_schema(loaded: tuple[Any, Any]) -> None:
    import llguidance.hf

    from modelhost.engines.native.guidance import GrammarConstraint

    tokenizer = loaded[1]
    engine = engine_of(loaded)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    guidance = llguidance.hf.from_tokenizer(tokenizer, n_vocab=engine.vocab_size)
    seq = sequence(loaded, 1, "hello world", max_tokens=100, min_tokens=0)
    seq.constraint = GrammarConstraint(guidance, json_schema_grammar(schema, 10, strict=True))
    engine.add(seq)
    text = run(engine)[1]
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert set(value) == {"city", "days"} and len(value["city"]) <= 10


def test_logit_bias_is_added_before_sampling_greedy_included(loaded: tuple[Any, Any]) -> None:
    token = loaded[1]("berlin", add_special_tokens=False)["input_ids"][0]
    plain = sequence(loaded, 1, "hello world")
    forced = sequence(loaded, 2, "hello world", logit_bias=((token, 100.0),))
    run(engine_of(loaded), {0: [plain, forced]})
    assert forced.generated == [token] * 8 and plain.generated != forced.generated
    banned = sequence(loaded, 3, "hello world", logit_bias=((plain.generated[0], -100.0),))
    run(engine_of(loaded), {0: [banned]})
    assert banned.generated[0] != plain.generated[0]


def test_top_k_1_and_min_p_1_sample_the_greedy_answer(loaded: tuple[Any, Any]) -> None:
    greedy = sequence(loaded, 1, "hello world", max_tokens=10, min_tokens=10)
    hot = dict(temperature=1.8, max_tokens=10, min_tokens=10)
    top_k = [sequence(loaded, 2 + s, "hello world", top_k=1, seed=s, **hot) for s in range(3)]
    min_p = [sequence(loaded, 5 + s, "hello world", min_p=1.0, seed=s, **hot) for s in range(3)]
    free = [sequence(loaded, 8 + s, "hello world", seed=s, **hot) for s in range(3)]
    run(engine_of(loaded), {0: [greedy, *top_k, *min_p, *free]})
    assert all(s.generated == greedy.generated for s in (*top_k, *min_p))
    assert any(s.generated != greedy.generated for s in free)


def test_repetition_penalty_generates_what_transformers_does_with_it(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    prompt = "hello hello hello world world"
    plain = sequence(loaded, 1, prompt, max_tokens=12, min_tokens=12)
    penalised = sequence(loaded, 2, prompt, max_tokens=12, min_tokens=12, repetition_penalty=1.8)
    run(engine_of(loaded), {0: [plain, penalised]})
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(DEVICE)
    out = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, repetition_penalty=1.8)
    assert penalised.generated == out[0, ids.shape[1] :].tolist()
    assert penalised.generated != plain.generated


class _Model:
    """What `sampling_params` reads of a loaded model."""

    tokenizer = None
    vocab_size = 100
    context_length = 64
    fim = None

    def __init__(self, defaults: dict[str, Any]) -> None:
        self.generation_defaults = defaults


def test_fields_left_unset_take_the_models_generation_config_and_set_ones_win(tmp_path: Path) -> None:
    from modelhost.generation.requests import generation_defaults, sampling_params

    config = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "max_new_tokens": 30}
    (tmp_path / "generation_config.json").write_text(
        json.dumps({**config, "repetition_penalty": 1.1, "do_sample": False, "top_k": 20})
    )
    defaults = generation_defaults(tmp_path)
    unset = {"temperature": None, "top_p": None, "top_k": None, "max_tokens": None, "min_p": None}
    params = sampling_params(_Model(defaults), Sampling(**unset), 10, "messages")
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.95, 20, 0.05)
    assert params.repetition_penalty == 1.1 and params.max_tokens == 30
    given = {"temperature": 0.0, "top_k": 0, "max_tokens": 5}
    params = sampling_params(_Model(defaults), Sampling(**given), 10, "messages")
    assert (params.temperature, params.top_k, params.max_tokens, params.top_p) == (0.0, 0, 5, 0.95)
    assert sampling_params(_Model(defaults), Sampling(), 50, "messages").max_tokens == 14  # the room left
    plain = sampling_params(_Model(generation_defaults(tmp_path / "none")), Sampling(), 10, "messages")
    assert (plain.temperature, plain.top_p, plain.top_k, plain.max_tokens) == (1.0, 1.0, 0, 54)


def test_a_generation_config_value_out_of_range_is_ignored(tmp_path: Path) -> None:
    from modelhost.generation.requests import generation_defaults

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": -1, "top_p": "0.9", "top_k": 2.5, "min_p": 0.1, "max_new_tokens": True})
    )
    assert generation_defaults(tmp_path) == {"min_p": 0.1}


def test_no_logit_bias_brings_back_a_token_the_grammar_forbids(loaded: tuple[Any, Any]) -> None:
    import llguidance.hf

    from modelhost.engines.native.guidance import GrammarConstraint

    tokenizer = loaded[1]
    engine = engine_of(loaded)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    guidance = llguidance.hf.from_tokenizer(tokenizer, n_vocab=engine.vocab_size)
    token = tokenizer("berlin", add_special_tokens=False)["input_ids"][0]
    seq = sequence(loaded, 1, "hello world", max_tokens=40, min_tokens=0, logit_bias=((token, 100.0),))
    seq.constraint = GrammarConstraint(guidance, json_schema_grammar(schema, 10, strict=True))
    engine.add(seq)
    assert isinstance(json.loads(run(engine)[1])["ok"], bool)


def test_the_replica_refuses_a_grammar_past_the_bounds_before_its_engine_compiles_it(
    loaded: tuple[Any, Any],
) -> None:
    """A request that reached the replica without the gateway's check (a bypass) is a 400 naming its
    field, and nothing is compiled: llguidance dies of SIGSEGV past about 2,700 chained rules; 600 are
    past the bounds but within what it survives, so this fails without the check and crashes nothing."""
    from modelhost.tasks.text_generation import TextGeneration, chat_model

    state = chat_model(loaded[0], loaded[1], DEVICE, {})
    request = GenerationRequest(
        prompt="hello",
        params=Sampling(max_tokens=2),
        grammar=lark_chain(600),
        grammar_param="structured_outputs.grammar",
    )
    with pytest.raises(InvalidRequest) as refused:
        TextGeneration().start(state, 1, request)
    assert refused.value.param == "structured_outputs.grammar" and refused.value.code == "grammar_too_complex"
    assert state.engine.idle and state._guidance is None  # no matcher was ever built


def test_insert_mode_prompts_are_prefix_suffix_middle_in_the_models_fim_tokens(
    loaded: tuple[Any, Any],
) -> None:
    import copy

    from modelhost.generation.requests import fill_in_the_middle, fim_tokens

    assert fim_tokens(loaded[1]) is None  # the recipe model was not trained for it: suffix is a 400
    tokenizer = copy.deepcopy(loaded[1])
    names = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": names})
    fim = fim_tokens(tokenizer)
    assert fim == tuple(tokenizer.convert_tokens_to_ids(names))
    prompt = tokenizer("def add(a, b):")["input_ids"]
    suffix = tokenizer("    return c", add_special_tokens=False)["input_ids"]
    assert fill_in_the_middle(tokenizer, fim, prompt, "    return c") == [
        fim[0],
        *prompt,
        fim[1],
        *suffix,
        fim[2],
    ]


# ---------------------------------------------------------------- the KV cache: reuse, buckets, limits

SYSTEM = "you are a helpful assistant who answers in short sentences about cats and dogs. " * 3


def engine_with(loaded: tuple[Any, Any], **options: Any) -> GenerationEngine:
    model, tokenizer = loaded
    return GenerationEngine(model, tokenizer, DEVICE, 8, 512, lambda t: tokenizer.decode([t]), **options)


def started_events(events: list[tuple[int, GenerationEvent]]) -> dict[int, GenerationStarted]:
    return {sid: event for sid, event in events if isinstance(event, GenerationStarted)}


def text_of(event: GenerationEvent) -> str:
    return event.text if isinstance(event, Text) else ""


def test_a_prompt_sharing_a_finished_ones_prefix_reuses_it_and_generates_the_same(
    loaded: tuple[Any, Any],
) -> None:
    fresh = engine_with(loaded)
    fresh.add(sequence(loaded, 2, SYSTEM + "tell me about dogs", max_tokens=12, min_tokens=12))
    alone = run(fresh)[2]
    assert fresh.reused_tokens == 0
    engine = engine_with(loaded)
    engine.add(sequence(loaded, 1, SYSTEM + "tell me about cats", max_tokens=4, min_tokens=4))
    run(engine)
    engine.add(sequence(loaded, 2, SYSTEM + "tell me about dogs", max_tokens=12, min_tokens=12))
    events = run_events(engine)
    text = "".join(text_of(e) for sid, e in events if sid == 2)
    shared = len(loaded[1](SYSTEM + "tell me about")["input_ids"]) - 1
    assert text == alone
    assert started_events(events)[2].cached_tokens >= shared
    assert engine.reused_tokens == started_events(events)[2].cached_tokens


def test_requests_arriving_together_compute_their_shared_prefix_once(loaded: tuple[Any, Any]) -> None:
    engine = engine_with(loaded, prefill_chunk=32)
    questions = ["cats", "dogs", "birds", "fish"]
    for i, topic in enumerate(questions):
        engine.add(sequence(loaded, i, SYSTEM + f"tell me about {topic}", max_tokens=6, min_tokens=6))
    events = run_events(engine)
    texts = {i: "".join(text_of(e) for sid, e in events if sid == i) for i in range(4)}
    prefix = len(loaded[1](SYSTEM)["input_ids"])
    cached = [started_events(events)[i].cached_tokens for i in range(4)]
    assert cached[0] == 0 and all(c >= prefix - 1 for c in cached[1:]), cached
    for i, topic in enumerate(questions):
        alone = engine_with(loaded)
        alone.add(sequence(loaded, i, SYSTEM + f"tell me about {topic}", max_tokens=6, min_tokens=6))
        assert run(alone)[i] == texts[i], topic


def test_a_long_prompt_is_prefilled_in_chunks_while_a_running_stream_gets_a_token_every_step(
    loaded: tuple[Any, Any],
) -> None:
    engine = engine_with(loaded, prefill_chunk=16)
    engine.add(sequence(loaded, 1, "hello world", max_tokens=40, min_tokens=40))
    engine.step()
    engine.add(sequence(loaded, 2, SYSTEM * 2, max_tokens=5, min_tokens=5))
    prompt_tokens = len(loaded[1](SYSTEM * 2)["input_ids"])
    steps_until_started = 0
    while True:
        events = engine.step()
        steps_until_started += 1
        assert any(sid == 1 and isinstance(e, Text) for sid, e in events)  # the stream never stalls
        if 2 in started_events(events):
            break
    assert steps_until_started == -(-prompt_tokens // 16)
    texts = run(engine)
    alone = engine_with(loaded)
    alone.add(sequence(loaded, 2, SYSTEM * 2, max_tokens=5, min_tokens=5))
    first = [text_of(e) for sid, e in events if sid == 2 and isinstance(e, Text)]
    assert "".join(first) + texts.get(2, "") == run(alone)[2]


def test_a_sequence_that_outgrows_its_length_bucket_generates_what_the_model_does(
    loaded: tuple[Any, Any],
) -> None:
    model, tokenizer = loaded
    prompt = "one two three four five six seven eight nine ten " * 5
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(DEVICE)
    new = 64 + 10 - ids.shape[1] % 64  # crosses a 64-column read bucket while decoding
    engine = engine_with(loaded)
    engine.add(sequence(loaded, 1, prompt, max_tokens=new, min_tokens=new))
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    assert run(engine)[1] == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


TOPICS = ["cats", "dogs", "birds", "fish", "trees"]  # prefixes A..E: the template's header, then their own


def chat_prompt(loaded: tuple[Any, Any], topic: str, question: str) -> list[int]:
    """A chat prompt whose ~150-token system prompt differs from its first word: all that prompts of
    different system prompts share is the template's `<|im_start|>system` header."""
    tokenizer = loaded[1]
    system = f"{topic} are what you answer questions about, in short and kind sentences. " * 6
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def system_length(loaded: tuple[Any, Any], topic: str) -> int:
    """Tokens of the prompt up to its user turn: what a prompt with the same system prompt shares."""
    one, other = chat_prompt(loaded, topic, "why?"), chat_prompt(loaded, topic, "how so?")
    return next(i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b)


def cached_of(engine: GenerationEngine, loaded: tuple[Any, Any], sid: int, prompt: list[int]) -> int:
    """Run one chat request alone on `engine`; the prompt tokens it took from the cache."""
    decoder = IncrementalDecoder(lambda ids: loaded[1].decode(ids, skip_special_tokens=True))
    params = SamplingParams(max_tokens=8, min_tokens=8, temperature=0)
    engine.add(Sequence(sid, prompt, params, decoder))
    return started_events(run_events(engine))[sid].cached_tokens


def test_a_replica_keeps_as_many_prefixes_as_it_has_free_slots(loaded: tuple[Any, Any]) -> None:
    """Issue 62's sequence: after A, the requests A, B, A, B, C, A, A. Every prompt shares the template's
    header, so a miss matches those few tokens somewhere; with 4 slots that must not cost A its prefix
    (before, B's miss cut A's slot to the header: cached 976, 8, 8, 8, 8, 8, 976 on a real model)."""
    engine = engine_of(loaded, max_running=4)
    header = common_prefix_length(chat_prompt(loaded, "cats", "q"), chat_prompt(loaded, "dogs", "q"))
    assert 0 < header < 12  # what the prefixes share: the template's first tokens only
    order = ["cats", "cats", "dogs", "cats", "dogs", "fish", "cats", "cats"]
    cached = [
        cached_of(engine, loaded, sid, chat_prompt(loaded, topic, f"question number {sid}?"))
        for sid, topic in enumerate(order)
    ]
    first_sight = {order.index(topic) for topic in order}
    for sid, topic in enumerate(order):
        if sid in first_sight:  # nothing, then the template's header
            assert cached[sid] == (header if sid else 0), (sid, cached)
        else:  # the whole system prompt, and the user turn's opening tokens
            assert cached[sid] >= system_length(loaded, topic), (sid, cached)
    assert engine.reused_tokens == sum(cached)


def test_a_prefix_asked_again_reuses_its_own_slot_and_evicts_no_other(loaded: tuple[Any, Any]) -> None:
    """A popular system prompt asked again and again must not fill the slots with copies of itself:
    with 4 slots and 4 prefixes, all 4 stay; a fifth evicts the least recently used one."""
    engine = engine_of(loaded, max_running=4)
    sids = iter(range(100))

    def cached(topic: str) -> int:
        sid = next(sids)
        return cached_of(engine, loaded, sid, chat_prompt(loaded, topic, f"question number {sid}?"))

    for topic in TOPICS[:4]:
        cached(topic)
    for topic in ["cats", "cats", "cats", "dogs", "birds", "fish", "cats"]:
        assert cached(topic) >= system_length(loaded, topic), topic
    assert cached("trees") < 12  # a fifth prefix: it takes the least recently used slot (dogs')
    assert cached("dogs") < 12
    for topic in ["trees", "cats", "fish"]:
        assert cached(topic) >= system_length(loaded, topic), topic


def test_a_salted_sequence_reuses_only_prefixes_its_own_salt_left(loaded: tuple[Any, Any]) -> None:
    """A request's `cache_salt` (issue 70, S12): the slots of another salt, or of none, are never a
    source of its prefix, alone or arriving together with one of another salt."""
    engine = engine_of(loaded, max_running=4)
    prompt = chat_prompt(loaded, "cats", "which one purrs?")
    decoder = IncrementalDecoder(lambda ids: loaded[1].decode(ids, skip_special_tokens=True))
    params = SamplingParams(max_tokens=2, min_tokens=2, temperature=0)
    sids = iter(range(100))

    def cached(*salts: str | None) -> list[int]:
        added = []
        for salt in salts:
            added.append(Sequence(next(sids), prompt, params, decoder, salt=salt))
            engine.add(added[-1])
        started = started_events(run_events(engine))
        return [started[s.id].cached_tokens for s in added]

    whole = len(prompt) - 1  # all but the last token, whose logits give the first new one
    assert cached(None) == [0]
    assert cached(None) == [whole]
    assert cached("a") == [0]
    assert cached("a") == [whole]
    assert cached("b", "c") == [0, 0]  # side by side, neither takes the other's
    assert cached(None, "a", "b") == [whole, whole, whole]


def common_prefix_length(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def slot_cache(*held: list[int], first_free: int = 0) -> Any:
    """A `SlotCache` holding `held` (no tensors: its choices only), slot i last used at time i + 1."""
    from modelhost.engines.native.kv_cache import SlotCache

    cache = SlotCache(len(held), 64, torch.device("cpu"), torch.float32)
    for slot, tokens in enumerate(held):
        cache.held[slot] = list(tokens)
        cache.touch(slot)
    return cache


def test_a_short_match_leaves_the_slot_holding_more_and_takes_the_least_recently_used() -> None:
    header, a, b = [1, 2], [10] * 20, [20] * 20
    cache = slot_cache([*header, *a], [7, 7, 7])  # slot 0: A's prefix, used before slot 1's
    cache.touch(0)  # A reused since: slot 1 is the least recently used
    assert cache.admit([*header, *b, 5], 21, first_free=0) == 2
    assert cache.held[0] == header  # the new sequence's slot, holding the match
    assert cache.held[1] == [*header, *a]  # A kept: moved where slot 1's content was (evicted)


def test_a_short_match_in_the_least_recently_used_slot_cuts_that_slot() -> None:
    header, a, b = [1, 2], [10] * 20, [20] * 20
    cache = slot_cache([*header, *a], [7, 7, 7])  # slot 0 is the least recently used
    assert cache.admit([*header, *b, 5], 21, first_free=0) == 2
    assert cache.held == [header, [7, 7, 7]]


def test_a_match_covering_most_of_a_slot_takes_that_slot_whole() -> None:
    prefix = list(range(1, 31))
    cache = slot_cache([9, 9], [*prefix, 40, 41], [8, 8])  # slot 1: an earlier answer to the prefix
    assert cache.admit([*prefix, 50, 51], 31, first_free=0) == 30
    assert cache.held == [prefix, [9, 9], [8, 8]]  # nothing else lost; slot 0's content moved to 1


def test_an_empty_slot_is_taken_before_any_that_holds_something() -> None:
    cache = slot_cache([3, 3], [4, 4], [])
    cache.touch(0)
    cache.touch(1)
    cache.held[2], cache.used[2] = [], 0
    assert cache.admit([5, 6, 7], 2, first_free=1) == 0
    assert cache.held == [[3, 3], [], [4, 4]]


def test_a_slot_whose_prompt_another_slot_holds_too_is_given_up_before_the_only_copy_of_another() -> None:
    header, a, b, c = [1, 2], [10] * 20, [20] * 20, [30] * 20
    # slot 0: B, the least recently used and its only copy; slots 1 and 2: two answers to A (two
    # requests with prompt A ran at once)
    cache = slot_cache([*header, *b], [*header, *a, 41], [*header, *a, 42])
    assert cache.admit([*header, *c, 5], 23, first_free=0) == 2
    assert sorted(map(tuple, cache.held)) == sorted([(*header,), (*header, *b), (*header, *a, 42)])


def test_a_prefix_held_by_a_running_sequence_is_copied_into_the_first_free_slot() -> None:
    header, a = [1, 2], [10] * 20
    cache = slot_cache([*header, *a, 99], [6, 6], [7, 7])  # slot 0 runs, 1 and 2 free, 1 the older
    assert cache.admit([*header, *a, 5], 22, first_free=1) == 22
    assert cache.held == [[*header, *a, 99], [*header, *a], [7, 7]]


def test_the_cache_budget_sets_the_slots_and_a_full_queue_answers_overloaded(loaded: tuple[Any, Any]) -> None:
    from modelhost.engines.native.kv_cache import CacheLayout
    from modelhost.errors import Overloaded

    per_slot = CacheLayout.of(loaded[0]).bytes_per_token * 513
    engine = engine_with(loaded, cache_bytes=2 * per_slot, max_waiting=2)
    assert engine.max_running == 2
    for sid, text in enumerate(["hello world", "paris is"]):
        engine.add(sequence(loaded, sid, text, max_tokens=30, min_tokens=30))
    engine.step()
    assert len(engine.running) == 2  # both slots taken
    for sid in range(2, 4):
        engine.add(sequence(loaded, sid, "a photo"))
    with pytest.raises(Overloaded) as refused:
        engine.add(sequence(loaded, 4, "a photo"))
    assert refused.value.status_code == 429
    assert set(run(engine)) == {0, 1, 2, 3}  # everything admitted still finishes


def _tiny(architecture: str) -> Any:
    """A random-weight model of one family: what the engine's cache and masks must fit (GPT-2's own
    attention, grouped-query heads, a sliding window, Gemma 2's alternating sliding and full layers)."""
    import transformers

    common = {"vocab_size": 300, "max_position_embeddings": 256, "eos_token_id": 1, "bos_token_id": 2}
    llama_like = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    configs: dict[str, tuple[str, dict[str, Any]]] = {
        "gpt2": ("GPT2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "vocab_size": 300,
                          "eos_token_id": 1, "bos_token_id": 2}),
        "llama": ("Llama", {**common, **llama_like, "num_key_value_heads": 2}),
        "mistral": ("Mistral", {**common, **llama_like, "num_key_value_heads": 2, "sliding_window": 16}),
        "gemma2": ("Gemma2", {**common, **llama_like, "num_key_value_heads": 2, "head_dim": 16,
                              "sliding_window": 16}),
        "phi": ("Phi", {**common, **llama_like}),
    }  # fmt: skip
    family, fields = configs[architecture]
    config = getattr(transformers, f"{family}Config")(**fields)
    head = "GPT2LMHeadModel" if family == "GPT2" else f"{family}ForCausalLM"
    torch.manual_seed(0)
    return getattr(transformers, head)(config).to(DEVICE).eval()


@pytest.mark.parametrize("architecture", ["gpt2", "llama", "mistral", "gemma2", "phi"])
def test_the_engine_generates_what_the_model_does_for_each_family(architecture: str) -> None:
    model = _tiny(architecture)
    prompts = [list(range(5, 23)), [30, 31, 32]]  # 18 + 20 tokens: past a 16-token sliding window
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    tokenizer = type("Tokenizer", (), {"eos_token_id": 1, "decode": staticmethod(decode)})()
    engine = GenerationEngine(model, tokenizer, DEVICE, 8, 256, str)
    sequences = [
        Sequence(
            i, p, SamplingParams(max_tokens=20, min_tokens=20, temperature=0), IncrementalDecoder(decode)
        )
        for i, p in enumerate(prompts)
    ]
    for s in sequences:
        engine.add(s)
    while not engine.idle:
        engine.step()
    for s, prompt in zip(sequences, prompts, strict=True):
        ids = torch.tensor([prompt], device=DEVICE)
        out = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
        assert s.generated == out[0, len(prompt) :].tolist(), architecture


# ---------------------------------------------------------------- text (pure)


def test_incremental_decoder_holds_back_a_split_character() -> None:
    raw = "héllo".encode()
    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731  one byte per token
    decoder = IncrementalDecoder(decode)
    pieces = [decoder.push(b) for b in raw]
    assert pieces == ["h", "", "é", "l", "l", "o"]
    assert decoder.flush() == ""


def test_incremental_decoder_releases_invalid_bytes_as_soon_as_they_are_known(recipes: Path) -> None:
    """On the recipe model's byte-level tokenizer, one token per byte: a lone continuation byte is a
    U+FFFD with the next character; a run of them one by one, `CHARACTER_WAIT` tokens behind (any of
    them could be a character's start until then); never only at the end (issue 59)."""
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokenizer = AutoTokenizer.from_pretrained(recipes / "t11_text_generation_chat")
    as_token = bytes_to_unicode()
    byte_tokens = {b: tokenizer.convert_tokens_to_ids(as_token[b]) for b in range(256)}

    def pieces(raw: bytes) -> tuple[list[str], str]:
        decoder = IncrementalDecoder(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        return [decoder.push(byte_tokens[b]) for b in raw], decoder.flush()

    assert pieces(b"a\x80b") == (["a", "", "\ufffdb"], "")
    assert pieces(b"a\x80\x80\x80\x80\x80") == (["a", "", "", "", "\ufffd", "\ufffd"], "\ufffd" * 3)
    # a lead byte whose character never came: its U+FFFD goes with the next whole character
    assert pieces(b"a\xe2" + "€".encode()) == (["a", "", "", "", "\ufffd€"], "")
    assert pieces("😀".encode()) == (["", "", "", "😀"], "")
    assert pieces(b"x\xf0\x9f\x98") == (["x", "", "", ""], "\ufffd")  # cut off: U+FFFD at the end


def test_incremental_decoder_holds_a_character_whose_bytes_each_decode_to_a_replacement() -> None:
    """Byte-fallback decoders write one U+FFFD per byte of an unfinished character: it is held whole."""

    def decode(ids: list[int]) -> str:
        text = bytes(ids).decode("utf-8", errors="replace")
        return text if not text.endswith("\ufffd") else text.rstrip("\ufffd") + "\ufffd" * len(ids)

    decoder = IncrementalDecoder(decode)
    assert [decoder.push(b) for b in "é😀".encode()] == ["", "é", "", "", "", "😀"]


def test_stop_strings_never_release_the_stop_or_what_follows() -> None:
    stops = StopStrings(["END", "xyz"])
    assert stops.feed("hello E") == "hello "
    assert stops.feed("N") == ""
    assert stops.feed("Dafter") == "" and stops.stopped
    assert stops.flush() == ""
    partial = StopStrings(["END"])
    assert partial.feed("ab EN") == "ab " and partial.flush() == "EN"


def test_include_stop_str_in_output_releases_the_stop_but_never_what_follows() -> None:
    stops = StopStrings(["END", "xyz"], include=True)
    assert stops.feed("hello E") == "hello "
    assert stops.feed("NDafter xyz") == "END" and stops.stopped
    assert stops.flush() == ""


# ---------------------------------------------------------------- continuations (issue 73)


def _events(engine: GenerationEngine, seq: Sequence) -> list[Text]:
    engine.add(seq)
    texts: list[Text] = []
    while not engine.idle:
        texts += [e for _, e in engine.step() if isinstance(e, Text)]
    return texts


def _continued(seq: Sequence, tokens: list[int]) -> Sequence:
    """`seq` as a continuation after `tokens` of its output (`GenerationRequest.continued`)."""
    seq.prompt = [*seq.prompt, *tokens]
    seq.carried = len(tokens)
    return seq


@pytest.mark.parametrize("cut", [1, 7, 23])
def test_a_continuation_sends_exactly_what_the_undisturbed_generation_sent_after_its_cut(
    loaded: tuple[Any, Any], cut: int
) -> None:
    """Text, token IDs and counts of the events after the cut equal the undisturbed run's (stop strings
    and a split character included: the replayed decoder and stop strings hold what they held)."""
    params = {"max_tokens": 40, "min_tokens": 0, "stop": ["zz"]}
    whole = _events(engine_of(loaded), sequence(loaded, 1, PROMPTS[1], **params))
    sent = [t for e in whole[:cut] for t in e.token_ids or []]
    assert [len(e.token_ids or []) for e in whole[:cut]] == [1] * cut  # one token per event
    rest = _events(engine_of(loaded), _continued(sequence(loaded, 1, PROMPTS[1], **params), sent))
    assert rest == whole[cut:]
    assert rest[-1].completion_tokens == whole[-1].completion_tokens  # counted once, from the first


def test_a_continuation_under_a_grammar_finishes_a_valid_answer(loaded: tuple[Any, Any]) -> None:
    import llguidance.hf

    from modelhost.engines.native.guidance import GrammarConstraint

    tokenizer = loaded[1]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    guidance = llguidance.hf.from_tokenizer(tokenizer, n_vocab=engine_of(loaded).vocab_size)

    def constrained() -> Sequence:
        seq = sequence(loaded, 1, "hello world", max_tokens=60, min_tokens=0)
        seq.constraint = GrammarConstraint(guidance, json_schema_grammar(schema, 12, strict=True))
        return seq

    whole = _events(engine_of(loaded), constrained())
    sent = [t for e in whole[:4] for t in e.token_ids or []]
    rest = _events(engine_of(loaded), _continued(constrained(), sent))
    text = "".join(e.text for e in whole[:4]) + "".join(e.text for e in rest)
    jsonschema.validate(json.loads(text), schema)
    assert text == "".join(e.text for e in whole)
