"""Summarization, translation and text2text generation (issue 19) through HTTP on a tiny T5 (t22) and a
tiny NLLB-style M2M100 (t23), each pushed through the real artifact path and served by a real worker.
Every answer is compared with the model's own `generate` on the prompt that transformers' former
pipelines built."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modelhost.artifacts.architectures import transformers_architectures
from modelhost.errors import InvalidRequest
from modelhost.tasks.text2text_generation import Prompt, Seq2Seq, Text2TextGeneration, Translation
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, Gateway, assert_error, bearer
from tests.live import live_server

TEXTS = ["paris is the capital of france", "the quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("seq2seq")
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1)
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=120) as client:
        created = client.post("/v1/admin/accounts", json={"name": "s2s"}, headers=bearer(ADMIN_KEY))
        yield Gateway(client, created.json()["api_key"], recipes)


def t5(gw: Gateway, pipeline: str) -> str:
    return gw.deploy("t22_text2text", "", pipeline, model=f"t5-{pipeline}")


def nllb(gw: Gateway) -> str:
    return gw.deploy("t23_translation", "", "translation", model="nllb")


def generate(folder: Path, texts: list[str], src_lang: str | None = None, **options: Any) -> list[str]:
    """What the model itself generates for these prompts, batched and padded as one call."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    if src_lang is not None:
        tokenizer.src_lang = src_lang
    seed = options.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.inference_mode():
        encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        tokens = model.generate(**encoded, **options)
    return [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]


def test_text2text_generation_equals_the_models_generate_for_one_text_and_for_a_list(gw: Gateway) -> None:
    model, folder = t5(gw, "text2text-generation"), gw.recipes / "t22_text2text"
    one = gw.ok("/v1/text/generation", model=model, inputs=TEXTS[0], max_new_tokens=6)
    both = gw.ok("/v1/text/generation", model=model, inputs=TEXTS, max_new_tokens=6)
    assert one == [{"generated_text": generate(folder, TEXTS[:1], max_new_tokens=6)[0]}]
    assert both == [{"generated_text": text} for text in generate(folder, TEXTS, max_new_tokens=6)]


def test_generate_kwargs_reach_generate_under_their_own_names(gw: Gateway) -> None:
    model, folder = t5(gw, "text2text-generation"), gw.recipes / "t22_text2text"
    options = {
        "num_beams": 3,
        "no_repeat_ngram_size": 1,
        "min_new_tokens": 4,
        "length_penalty": 0.5,
        "repetition_penalty": 1.3,
    }
    answer = gw.ok(
        "/v1/text/generation", model=model, inputs=TEXTS, generate_kwargs=options, max_new_tokens=7
    )
    assert answer == [{"generated_text": t} for t in generate(folder, TEXTS, max_new_tokens=7, **options)]


def test_a_seeded_sampling_request_answers_what_generate_samples_with_that_seed(gw: Gateway) -> None:
    model, folder = t5(gw, "text2text-generation"), gw.recipes / "t22_text2text"
    sampling = {"do_sample": True, "temperature": 1.7, "top_k": 0, "top_p": 0.95, "seed": 2**64 - 1}
    body = {"model": model, "inputs": TEXTS[1], "max_new_tokens": 8, "generate_kwargs": sampling}
    first, second = gw.ok("/v1/text/generation", **body), gw.ok("/v1/text/generation", **body)
    expected = generate(folder, TEXTS[1:], max_new_tokens=8, **sampling)
    assert first == second == [{"generated_text": expected[0]}]


def test_a_seeded_request_batched_with_others_answers_as_it_does_alone(recipes: Path) -> None:
    """Concurrent requests reach the worker as one batch; a seeded one must not share its call."""
    handler = Text2TextGeneration()
    model = handler.load(recipes / "t22_text2text", "cpu")
    sampling = {"do_sample": True, "temperature": 1.7, "top_k": 0, "seed": 5}
    seeded = {"inputs": TEXTS[1:], "max_new_tokens": 8, "generate_kwargs": sampling}
    other = {**seeded, "inputs": TEXTS[:1]}
    alone = handler.run(model, [seeded])
    assert handler.run(model, [seeded, seeded]) == alone * 2
    assert handler.run(model, [other, seeded])[1:] == alone
    expected = generate(recipes / "t22_text2text", TEXTS[1:], max_new_tokens=8, **sampling)
    assert alone == [{"results": [{"generated_text": expected[0]}]}]


def test_summarization_prompts_with_the_configs_prefix_and_takes_its_generation_defaults(gw: Gateway) -> None:
    model, folder = t5(gw, "summarization"), gw.recipes / "t22_text2text"
    prompts = [f"summarize: {text}" for text in TEXTS]
    defaults = gw.ok("/v1/text/summarization", model=model, inputs=TEXTS, max_new_tokens=6)
    assert defaults == [
        {"summary_text": text}
        for text in generate(folder, prompts, max_new_tokens=6, num_beams=2, no_repeat_ngram_size=2)
    ]
    mine = gw.ok(
        "/v1/text/summarization",
        model=model,
        inputs=TEXTS[0],
        generate_kwargs={"num_beams": 1, "max_new_tokens": 5},
    )
    assert mine == [
        {"summary_text": generate(folder, prompts[:1], max_new_tokens=5, no_repeat_ngram_size=2)[0]}
    ]


def test_translation_with_language_codes_reads_the_source_code_and_forces_the_target_one(gw: Gateway) -> None:
    model, folder = nllb(gw), gw.recipes / "t23_translation"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for target in ("deu_Latn", "eng_Latn"):
        answer = gw.ok(
            "/v1/text/translation",
            model=model,
            inputs=TEXTS,
            src_lang="fra_Latn",
            tgt_lang=target,
            max_new_tokens=5,
        )
        forced = tokenizer.convert_tokens_to_ids(target)
        expected = generate(folder, TEXTS, "fra_Latn", max_new_tokens=5, forced_bos_token_id=forced)
        assert answer == [{"translation_text": text} for text in expected]


def test_translation_without_language_codes_names_the_languages_in_the_prompt(gw: Gateway) -> None:
    model, folder = t5(gw, "translation"), gw.recipes / "t22_text2text"
    text = TEXTS[0]
    cases = [
        ({"src_lang": "en", "tgt_lang": "de"}, "translate English to German: "),  # the config's own pair
        ({"src_lang": "English", "tgt_lang": "French"}, "translate English to French: "),
        ({}, ""),  # no languages: the text as it is (a model that translates one pair)
    ]
    for languages, prefix in cases:
        answer = gw.ok("/v1/text/translation", model=model, inputs=text, max_new_tokens=5, **languages)
        assert answer == [{"translation_text": generate(folder, [prefix + text], max_new_tokens=5)[0]}], (
            languages
        )


def test_each_of_the_three_endpoints_answers_only_its_own_task(gw: Gateway) -> None:
    deployed = {"text2text-generation": "/v1/text/generation", "summarization": "/v1/text/summarization"}
    for pipeline, own in deployed.items():
        model = t5(gw, pipeline)
        for path in ("/v1/text/generation", "/v1/text/summarization", "/v1/text/translation"):
            if path != own:
                assert_error(gw.call(path, model=model, inputs="a"), 400, code="endpoint_not_supported")
    assert_error(
        gw.call("/v1/classifications/text", model=nllb(gw), inputs="a"), 400, code="endpoint_not_supported"
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": ""}, "inputs"),
        ({"inputs": []}, "inputs"),
        ({"inputs": "a", "max_new_tokens": 0}, "max_new_tokens"),
        (
            {"inputs": "a", "generate_kwargs": {"temperature": 0.001, "do_sample": True}},
            "generate_kwargs.temperature",
        ),
        ({"inputs": "a", "generate_kwargs": {"repetition_penalty": 0}}, "generate_kwargs.repetition_penalty"),
        ({"inputs": "a", "generate_kwargs": {"seed": 2**64}}, "generate_kwargs.seed"),
        ({"inputs": "a", "generate_kwargs": {"streamer": "x"}}, "generate_kwargs.streamer"),
        ({"inputs": "a", "generate_kwargs": {"num_beams": 99}}, "generate_kwargs.num_beams"),
    ],
)
def test_bad_text2text_requests_answer_400_naming_the_field(
    gw: Gateway, body: dict[str, Any], param: str
) -> None:
    assert_error(
        gw.call("/v1/text/generation", model=t5(gw, "text2text-generation"), **body), 400, param=param
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"src_lang": "eng_Latn"}, "tgt_lang"),
        ({"tgt_lang": "fra_Latn"}, "src_lang"),
        ({"src_lang": "eng_Latn", "tgt_lang": "xx_Latn"}, "tgt_lang"),
        ({"src_lang": "English", "tgt_lang": "fra_Latn"}, "src_lang"),
    ],
)
def test_translation_needs_the_models_language_codes(gw: Gateway, body: dict[str, Any], param: str) -> None:
    error = assert_error(
        gw.call("/v1/text/translation", model=nllb(gw), inputs="hello", **body), 400, param=param
    )
    assert "language code" in error["message"]


def test_translation_on_t5_needs_both_languages_or_neither(gw: Gateway) -> None:
    response = gw.call(
        "/v1/text/translation", model=t5(gw, "translation"), inputs="hello", src_lang="English"
    )
    assert_error(response, 400, param="tgt_lang")


class M2M100Tokenizer:
    """What translation reads of transformers' `M2M100Tokenizer` (facebook/m2m100_*), which needs
    sentencepiece, not installed here: its codes are `en`, `fr`, whose tokens `__en__`, `__fr__` sit after
    the vocabulary, and the vocabulary knows no token `fr` (it reads as `<unk>`)."""

    lang_code_to_id: dict[str, int] = {"en": 128, "fr": 129}
    unk_token_id = 3

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"__en__": 128, "__fr__": 129}.get(token, self.unk_token_id)


def test_m2m100s_own_tokenizer_forces_the_target_codes_token_not_the_code_read_as_a_word() -> None:
    model = Seq2Seq(model=None, tokenizer=M2M100Tokenizer(), device="cpu")
    prompt = Translation().prompt(model, {"src_lang": "en", "tgt_lang": "fr"})
    assert prompt == Prompt(src_lang="en", generate=(("forced_bos_token_id", 129),))
    with pytest.raises(InvalidRequest) as refused:
        Translation().prompt(model, {"src_lang": "en", "tgt_lang": "__fr__"})
    assert refused.value.param == "tgt_lang"


SPEECH_SEQ2SEQ = ("VoxtralForConditionalGeneration", "Qwen2AudioForConditionalGeneration")


@pytest.mark.parametrize("pipeline", ["summarization", "translation", "text2text-generation"])
def test_the_three_tasks_take_text_encoder_decoders_and_not_the_speech_models_of_the_same_table(
    pipeline: str,
) -> None:
    allowed = transformers_architectures(pipeline)
    text = {"T5ForConditionalGeneration", "M2M100ForConditionalGeneration", "BartForConditionalGeneration"}
    assert text | {"MarianMTModel"} <= allowed
    assert not allowed & {*SPEECH_SEQ2SEQ, "GraniteSpeechForConditionalGeneration"}


def test_inspection_refuses_a_speech_model_of_the_seq2seq_table_for_summarization(
    gw: Gateway, tmp_path: Path
) -> None:
    folder = shutil.copytree(gw.recipes / "t22_text2text", tmp_path / "voxtral")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": [SPEECH_SEQ2SEQ[0]]}))
    headers = bearer(gw.key)
    created = gw.http.post(
        "/v1/model-artifacts", json={"display_name": "voxtral", "pipeline": "summarization"}, headers=headers
    ).json()
    upload = gw.http.post(f"/v1/model-artifacts/{created['id']}/uploads", headers=headers).json()
    base = f"/v1/model-artifacts/{created['id']}/uploads/{upload['upload_id']}"
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        assert gw.http.put(f"{base}/files/{file.name}", content=file.read_bytes(), headers=headers).is_success
    artifact = gw.http.post(f"{base}/complete", headers=headers).json()["artifact"]
    assert artifact["status"] == "failed"
    assert artifact["error"]["code"] == "unsupported_architecture"
    assert SPEECH_SEQ2SEQ[0] in artifact["error"]["message"]
