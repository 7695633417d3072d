"""The continuous-batching engine on the tiny recipe chat model, in process (no server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from modelhost.generation.engine import GenerationEngine, SamplingParams, Sequence
from modelhost.generation.grammar import json_schema_grammar
from modelhost.generation.text import IncrementalDecoder, StopStrings

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
            texts[sid] = texts.get(sid, "") + event.get("text", "")
        step += 1
    return texts


PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a photo", "paris is the capital of"]


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
    assert [s.id for s in engine.running] == [1] and len(engine.waiting) == 1
    engine.cancel(1)
    assert engine.running == []
    events = engine.step()
    assert {sid for sid, _ in events} == {2}  # the waiting one took the freed slot at once


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
    assert events[0] == {"started": True, "prompt_tokens": 2}
    assert events[-1]["finish"] == "length" and events[-1]["completion_tokens"] == 3
    assert engine.idle


def test_logprobs_and_prompt_logprobs_give_an_entry_per_token(loaded: tuple[Any, Any]) -> None:
    engine = engine_of(loaded)
    engine.add(sequence(loaded, 1, "hello world", logprobs=True, top_logprobs=2, prompt_logprobs=True))
    events = [e for _, e in run_events(engine)]
    prompt = events[0]["prompt_logprobs"]
    assert len(prompt) == 2 and prompt[0]["logprob"] is None and prompt[1]["logprob"] < 0
    entries = [e["logprob"] for e in events if "logprob" in e]
    assert len(entries) == 8 and all(len(e["top"]) == 2 and e["top"][0][1] == e["logprob"] for e in entries)


def run_events(engine: GenerationEngine) -> list[tuple[int, dict[str, Any]]]:
    events: list[tuple[int, dict[str, Any]]] = []
    while not engine.idle:
        events += engine.step()
    return events


def test_a_grammar_forces_output_that_validates_against_its_schema(loaded: tuple[Any, Any]) -> None:
    import llguidance.hf

    from modelhost.generation.guidance import GrammarConstraint

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


# ---------------------------------------------------------------- text (pure)


def test_incremental_decoder_holds_back_a_split_character() -> None:
    raw = "héllo".encode()
    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731  one byte per token
    decoder = IncrementalDecoder(decode)
    pieces = [decoder.push(b) for b in raw]
    assert pieces == ["h", "", "é", "l", "l", "o"]
    assert decoder.flush() == ""


def test_stop_strings_never_release_the_stop_or_what_follows() -> None:
    stops = StopStrings(["END", "xyz"])
    assert stops.feed("hello E") == "hello "
    assert stops.feed("N") == ""
    assert stops.feed("Dafter") == "" and stops.stopped
    assert stops.flush() == ""
    partial = StopStrings(["END"])
    assert partial.feed("ab EN") == "ab " and partial.flush() == "EN"
