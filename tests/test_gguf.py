"""A GGUF file served on llama.cpp (`engine: llamacpp`, docs/engines-llamacpp.md), end to end: the tiny
Qwen3 of the families tests (tests/tiny_models/families.py) converted and quantized to Q4_0 by llama.cpp's
own tools (tests/tiny_models/gguf.py), uploaded, inspected, deployed with `engine: auto`, and asked
through real clients (the openai SDK, LangChain, LiteLLM), unchanged but their base URL, key and model.
Its greedy answers are the family's trained ones (tool calls, reasoning), parsed by our parsers as on
the safetensors model, and the same tokens a bare llama.cpp server gives on the same file; their
log-probabilities stay close to the float32 model's, and a Q8_0 file's closer.

One server and one deployment for the module (each llama.cpp replica start is a process and a load), and
a Q8_0 deployment beside it for the one test that compares the two quantizations.
"""

from __future__ import annotations

import asyncio
import base64
import glob
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import msgspec
import numpy as np
import openai
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from modelhost.engines import llamacpp, llamacpp_server
from modelhost.errors import InvalidRequest
from modelhost.generation.contract import GenerationRequest, Sampling, Text
from modelhost.runtime import engine_choice
from modelhost.runtime.footprint import BASE_COSTS, llamacpp_layout, predict
from modelhost.runtime.gateway.client import ReplicaConnection
from tests.conftest import make_settings
from tests.helpers import (
    ADMIN_KEY,
    assert_error,
    bearer,
    busiest_replica,
    deploy_folder_sync,
    deployment_metric,
    push_folder_sync,
    read_stream_killing,
)
from tests.live import live_server
from tests.recipes import FAMILIES_FOLDER, GGUF_FOLDER, QUANTIZED_FOLDER
from tests.server_process import processes
from tests.test_chat import salted_keys_find_only_their_own_prefixes
from tests.test_clients import litellm, outside_lookups  # noqa: F401 (LiteLLM offline; nothing leaves)
from tests.test_families import OUTPUTS, _request, _streamed
from tests.tiny_models.gguf import EMBEDDING

GGUF = "qwen3-Q4_0"
MODEL = "qwen3-gguf"
SLOTS = 2
EMBEDDER = "minilm-gguf"
CONVERSATIONS = OUTPUTS["qwen3"]["conversations"]


@pytest.fixture(scope="module")
def gguf_dir(recipes: Path) -> Path:
    return recipes / GGUF_FOLDER / GGUF


class Served:
    def __init__(self, url: str, key: str, deployment: dict[str, Any], embedder: dict[str, Any]) -> None:
        self.url, self.key, self.deployment, self.embedder = url, key, deployment, embedder

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    gguf_dir: Path,
    recipes: Path,
    outside_lookups: list[str],  # noqa: F811 (the imported fixture: before any client is made)
) -> Iterator[Served]:
    """The Q4_0 GGUF deployed warm with `engine: auto`, on llama.cpp with `SLOTS` slots; and beside it
    all-MiniLM-L6-v2 as an embedding GGUF (`EMBEDDER`), deployed warm as feature-extraction."""
    root = tmp_path_factory.mktemp("gguf")
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1, llamacpp_slots=SLOTS)
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=300) as http:
        key = http.post("/v1/admin/accounts", json={"name": "gguf"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        created = deploy_folder_sync(http, key, gguf_dir, "text-generation", MODEL, readiness="warm")
        embedder = recipes / GGUF_FOLDER / EMBEDDING
        embedding = deploy_folder_sync(http, key, embedder, "feature-extraction", EMBEDDER, readiness="warm")
        yield Served(url, key, _ready(http, key, created["id"]), _ready(http, key, embedding["id"]))


def _deploy_warm(http: httpx.Client, key: str, folder: Path, model: str) -> dict[str, Any]:
    """The GGUF in `folder` deployed as `model`, once its replica is ready."""
    created = deploy_folder_sync(http, key, folder, "text-generation", model, readiness="warm")
    return _ready(http, key, created["id"])


def _ready(http: httpx.Client, key: str, deployment_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while (deployment := http.get(f"/v1/deployments/{deployment_id}", headers=bearer(key)).json())[
        "state"
    ] != "ready":
        assert deployment["state"] != "failed" and time.monotonic() < deadline, deployment
        time.sleep(0.2)
    return deployment


def _ask(name: str) -> dict[str, Any]:
    return {**_request("qwen3", name), "model": MODEL}


# ---------------------------------------------------------------- the engine chosen


def test_auto_runs_a_gguf_artifact_on_llamacpp_and_says_why(served: Served) -> None:
    assert served.deployment["engine"] == "auto"
    assert served.deployment["engine_in_use"] == "llamacpp"
    assert "GGUF" in served.deployment["engine_reason"]
    # the family and parsers its replicas use, from the chat template inside the GGUF
    assert (served.deployment["family"], served.deployment["tool_parser_in_use"]) == ("qwen3", "hermes")


def test_vllm_or_transformers_for_a_gguf_and_llamacpp_for_safetensors_are_refused(
    served: Served, gguf_dir: Path, recipes: Path
) -> None:
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for engine in ("vllm", "transformers"):
            answer = http.patch(
                f"/v1/deployments/{served.deployment['id']}",
                json={"engine": engine},
                headers=bearer(served.key),
            )
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["code"] == "engine_not_supported" and "GGUF" in error["message"]
        too_long = http.patch(
            f"/v1/deployments/{served.deployment['id']}",
            json={"max_model_len": 4096},
            headers=bearer(served.key),
        )
        assert too_long.status_code == 400 and "2048" in too_long.json()["error"]["message"]  # the GGUF's
    with pytest.raises(InvalidRequest, match="serves GGUF files") as refused:
        engine_choice.choose("llamacpp", "text-generation", recipes / FAMILIES_FOLDER / "qwen3")
    assert refused.value.code == "engine_not_supported"
    with pytest.raises(InvalidRequest, match="this GGUF is none") as refused:
        engine_choice.choose("auto", "feature-extraction", gguf_dir)  # embeddings from an embedding GGUF only
    assert refused.value.code == "engine_not_supported"


def test_the_replica_holds_the_weights_read_in_not_mapped_and_is_billed_for_them(served: Served) -> None:
    """`--no-mmap` (docs/engines-llamacpp.md): the worker maps no GGUF file (its weights are its own
    memory, measured once and never dropped by the kernel); its measured memory is the deployment's."""
    (worker,) = processes("modelhost.runtime.worker.llamacpp_worker", served.deployment["id"])
    assert ".gguf" not in Path(f"/proc/{worker}/maps").read_text()
    with httpx.Client(base_url=served.url, timeout=30) as http:
        shown = http.get(f"/v1/deployments/{served.deployment['id']}", headers=bearer(served.key)).json()
    assert shown["memory_gb"] > 0


def test_a_lora_adapter_on_a_gguf_base_is_a_400_saying_llamacpp_takes_none_yet(
    served: Served, recipes: Path
) -> None:
    """A PEFT adapter of the very model the GGUF was converted from: llama.cpp would need it converted to
    a GGUF LoRA, which modelhost does not do yet, and no other engine serves a GGUF (docs/adapters.md)."""
    with httpx.Client(base_url=served.url, timeout=60) as http:
        adapter = push_folder_sync(
            http, served.key, recipes / QUANTIZED_FOLDER / "qwen3-lora", "text-generation"
        )
        refused = assert_error(
            http.post(
                "/v1/deployments",
                json={"model": "qwen3-gguf-tuned", "artifact_id": adapter, "base_deployment": MODEL},
                headers=bearer(served.key),
            ),
            400,
            "adapter_base_unsupported",
            param="base_deployment",
        )
    assert refused["message"] == (
        f"'{MODEL}' is a GGUF model on the llamacpp engine, which serves no adapters here: a PEFT adapter "
        "would have to be converted to a GGUF LoRA adapter, which modelhost does not do yet "
        "(docs/adapters.md)."
    )


# ---------------------------------------------------------------- embeddings from an embedding GGUF

SENTENCES = [
    "The cat sat on the mat.",
    "Photosynthesis happens in chloroplasts.",
    "¿Dónde está la biblioteca? Crème brûlée, naïve café.",
]


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> tuple[np.ndarray, list[int]]:
    """sentence-transformers' own embeddings of `SENTENCES` on the model the GGUF was converted from, and
    each sentence's token count."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    counts = [len(ids) for ids in model.tokenizer(SENTENCES)["input_ids"]]
    return model.encode(SENTENCES), counts


def _cosines(vectors: np.ndarray, expected: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    return np.asarray((vectors * expected).sum(axis=1) / norms)


def test_an_embedding_gguf_is_inspected_as_such_and_auto_serves_it_on_llamacpp(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as http:
        artifact_id = served.embedder["artifact_id"]
        artifact = http.get(f"/v1/model-artifacts/{artifact_id}", headers=bearer(served.key)).json()
    assert artifact["status"] == "ready" and artifact["pipeline"] == "feature-extraction"
    assert artifact["gguf"]["architecture"] == "bert" and artifact["gguf"]["embedding"] is True
    assert artifact["gguf"]["file_type"] == "F32"
    assert served.embedder["engine"] == "auto" and served.embedder["engine_in_use"] == "llamacpp"
    assert "embedding" in served.embedder["engine_reason"]
    (worker,) = processes("modelhost.runtime.worker.llamacpp_worker", served.embedder["id"])
    assert worker
    with httpx.Client(base_url=served.url, timeout=30) as http:
        body = {"model": "minilm-int8", "artifact_id": artifact_id, "precision": "int8"}
        refused = http.post("/v1/deployments", json=body, headers=bearer(served.key))
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "precision"
    assert "GGUF" in refused.json()["error"]["message"]


def test_embeddings_are_sentence_transformers_own_in_a_batch_as_floats_or_base64(
    served: Served, reference: tuple[np.ndarray, list[int]]
) -> None:
    expected, counts = reference
    client = served.client()
    answer = client.embeddings.create(model=EMBEDDER, input=SENTENCES)
    vectors = np.array([item.embedding for item in answer.data], dtype=np.float32)
    assert [item.index for item in answer.data] == [0, 1, 2] and vectors.shape == (3, 384)
    assert _cosines(vectors, expected).min() >= 0.99
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)  # unit length, as MiniLM's
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(counts)
    encoded = client.embeddings.with_raw_response.create(
        model=EMBEDDER, input=SENTENCES[0], encoding_format="base64"
    )
    raw = json.loads(encoded.http_response.text)["data"][0]["embedding"]
    # alone rather than in a batch: llama.cpp's sums in another order, the same vector to float32's noise
    assert np.allclose(np.frombuffer(base64.b64decode(raw), dtype="<f4"), vectors[0], atol=1e-6)
    shorter = client.embeddings.create(model=EMBEDDER, input=SENTENCES[0], dimensions=128).data[0].embedding
    assert len(shorter) == 128 and abs(np.linalg.norm(shorter) - 1.0) < 1e-4


def test_the_task_endpoint_and_langchain_get_the_same_vectors(
    served: Served, reference: tuple[np.ndarray, list[int]]
) -> None:
    expected, _ = reference
    with httpx.Client(base_url=served.url, timeout=60) as http:
        answer = http.post(
            "/v1/feature-extraction",
            json={"model": EMBEDDER, "inputs": SENTENCES[:2]},
            headers=bearer(served.key),
        )
    assert answer.status_code == 200, answer.text
    assert _cosines(np.array(answer.json()), expected[:2]).min() >= 0.99
    langchain = OpenAIEmbeddings(
        base_url=f"{served.url}/v1",  # type: ignore[call-arg]
        api_key=served.key,  # type: ignore[arg-type]
        model=EMBEDDER,
        max_retries=0,
        check_embedding_ctx_length=False,  # text, not tiktoken's IDs (docs/engines-llamacpp.md)
    )
    assert _cosines(np.array(langchain.embed_documents(SENTENCES)), expected).min() >= 0.99


def test_a_too_long_input_or_another_tokenizers_ids_is_a_400_naming_the_input(served: Served) -> None:
    client = served.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBEDDER, input=["short", "word " * 600])
    assert refused.value.status_code == 400
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "input[1]"
    assert (
        "602 tokens long" in refused.value.body["message"] and "at most 512" in refused.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBEDDER, input=[[9906, 1917]])  # tiktoken's "Hello world"
    assert (
        isinstance(refused.value.body, dict)
        and "check_embedding_ctx_length=False" in refused.value.body["message"]
    )
    own = client.embeddings.create(model=EMBEDDER, input=[[101, 7592, 2088, 102]])  # MiniLM's own IDs
    assert len(own.data[0].embedding) == 384 and own.usage.prompt_tokens == 4


# ---------------------------------------------------------------- chat through the openai SDK


def test_a_streamed_chat_with_tools_gets_the_call_and_the_reasoning_parsed(served: Served) -> None:
    expected = CONVERSATIONS["weather"]
    request = {**_ask("weather"), "stream_options": {"include_usage": True}}
    reasoning, content, calls, finish = _streamed(served.client(), request)
    assert reasoning.strip() == expected["reasoning"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (expected["tool_call"]["name"], expected["tool_call"]["arguments"])
    ]
    assert finish == "tool_calls" and not content.strip()
    last = list(served.client().chat.completions.create(**request, stream=True))[-1]
    assert last.usage is not None and last.usage.prompt_tokens > 100 and last.usage.completion_tokens > 10


def test_the_answer_after_a_tool_result_is_the_trained_one(served: Served) -> None:
    expected = CONVERSATIONS["tool_result"]
    message = served.client().chat.completions.create(**_ask("tool_result")).choices[0].message
    assert message.content == expected["content"]
    assert (message.model_extra or {}).get("reasoning_content", "").strip() == expected["reasoning"]


def test_json_schema_is_enforced_through_llamacpps_grammar(served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    answer = served.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris as JSON"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": schema, "strict": True},
        },
        max_tokens=60,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    parsed = json.loads(answer.choices[0].message.content or "")
    assert set(parsed) == {"city", "sunny"} and isinstance(parsed["sunny"], bool)


def test_logprobs_n_and_stop_work_as_on_the_other_engines(served: Served) -> None:
    client = served.client()
    answer = client.chat.completions.create(**_ask("greeting"), logprobs=True, top_logprobs=2, n=2)
    assert len(answer.choices) == 2
    assert answer.choices[0].message.content == answer.choices[1].message.content  # greedy, both
    entries = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    assert entries[0].token == "<think>"
    stopped = client.chat.completions.create(**_ask("tool_result"), stop=["Paris"]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.message.content == "It is sunny in "
    refused = httpx.post(
        f"{served.url}/v1/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 4, "min_tokens": 2},
        headers=bearer(served.key),
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "min_tokens"


@pytest.mark.xfail(
    strict=True,
    reason="llama.cpp's server sends no chunk while its text ends inside a character, and never sends "
    "those tokens' IDs later (the next chunk names only its own token; the last none): the engine never "
    "sees them, so it can neither send their chunks nor decode them (a character split over tokens comes "
    "out as U+FFFD; issue 59)",
)
def test_a_streamed_completion_sends_a_chunk_per_token_inside_a_character_too(
    served: Served, gguf_dir: Path
) -> None:
    """Every token the lead byte of a character that never comes (the byte forced by `logit_bias`):
    a chunk each, empty until the bytes are known to be invalid, then U+FFFD each (issue 59)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=f"{GGUF}.gguf")
    lead = tokenizer.convert_tokens_to_ids("\u00e2")  # byte 0xE2 in the byte-level vocabulary
    tokens = 8
    stream = served.client().completions.create(
        model=MODEL,
        prompt="a",
        max_tokens=tokens,
        stream=True,
        logit_bias={str(lead): 100},
        extra_body={"ignore_eos": True},
    )
    texts = [c.choices[0].text for c in stream if c.choices]
    assert len(texts) == tokens and "".join(texts) == "\ufffd" * tokens
    assert texts[:3] == ["", "", ""] and texts[3] == "\ufffd"  # known invalid 3 tokens on, not at the end


def test_a_client_that_disconnects_stops_its_generation(served: Served) -> None:
    """Streams that would run to the end of the slot's context, each dropped after its first token: the
    replica stops them (the tokens it computed are well below what they asked for together), and the
    next request gets a slot and answers. Under a full suite's load the tiny model (thousands of tokens
    a second) has computed most of both streams before a stop landed (3452 of 4000 once): such a round
    runs again, three times at most; a replica that never stops them fails all three."""
    client = served.client()
    deployment = served.deployment["id"]
    rounds = []
    with httpx.Client(base_url=served.url, timeout=30) as http:
        for _attempt in range(3):
            before = deployment_metric(http, "modelhost_generation_tokens_total", deployment)
            for _ in range(SLOTS):
                stream = client.completions.create(
                    model=MODEL, prompt="a", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
                )
                next(iter(stream))
                stream.close()
            deadline = time.monotonic() + 15  # the gauge is read from the worker's metrics file
            while (
                deployment_metric(http, "modelhost_generation_sequences", deployment)
                and time.monotonic() < deadline
            ):
                time.sleep(0.02)
            rounds.append(deployment_metric(http, "modelhost_generation_tokens_total", deployment) - before)
            if rounds[-1] < SLOTS * 2000 * 3 // 4:
                break
        else:
            pytest.fail(f"three rounds computed {rounds} tokens of {SLOTS * 2000} after their clients left")
    answer = client.chat.completions.create(**_ask("greeting"), timeout=60)
    assert answer.choices[0].message.content == CONVERSATIONS["greeting"]["content"]


async def test_a_continuation_on_llamacpp_goes_on_from_the_tokens_sent_as_the_undisturbed_answer_did(
    served: Served,
) -> None:
    """Issue 73 on llama.cpp, through the replica's own socket, as a gateway sends a generation whose
    replica died: the tokens, text and count after the cut equal the undisturbed answer's (the decoder
    and stop strings replayed, the prompt the prompt and the tokens sent); a grammar's answer says no
    tokens, so it never moves."""
    [path] = glob.glob(f"/tmp/modelhost-replicas-*/{served.deployment['id']}-*.sock")
    connection = await ReplicaConnection.open(path)
    try:
        request = GenerationRequest(
            prompt="The weather in Paris is", params=Sampling(max_tokens=24, temperature=0, ignore_eos=True)
        )
        whole = [e async for e in connection.stream(request) if isinstance(e, Text)]
        ids = [t for e in whole for t in e.token_ids or ()]
        assert len(ids) == whole[-1].completion_tokens == 24
        cut = len(whole[0].token_ids or ()) + len(whole[1].token_ids or ())  # after two events
        rest = [e async for e in connection.stream(msgspec.structs.replace(request, continued=ids[:cut]))]
        texts = [e for e in rest if isinstance(e, Text)]
        assert [t for e in texts for t in e.token_ids or ()] == ids[cut:]
        assert "".join(e.text for e in texts) == "".join(e.text for e in whole[2:])
        assert (texts[-1].completion_tokens, texts[-1].finish) == (24, "length")
        constrained = msgspec.structs.replace(
            request, grammar='start: "yes" | "no"', params=Sampling(max_tokens=4)
        )
        said = [e.token_ids for e in [e async for e in connection.stream(constrained)] if isinstance(e, Text)]
        assert said and all(ids is None for ids in said)
        # llama.cpp never sends the IDs of tokens it held back (a character's first bytes, issue 59): from
        # the first such, the answer says no tokens (a continuation would lack them), so it cannot move
        penalized = msgspec.structs.replace(
            request, params=Sampling(max_tokens=1000, temperature=0, ignore_eos=True, frequency_penalty=1.0)
        )
        said = [e.token_ids for e in [e async for e in connection.stream(penalized)] if isinstance(e, Text)]
        hidden = said.index(None)
        assert hidden > 0 and all(ids is None for ids in said[hidden:])
    finally:
        connection.close()


def _streamed_completion(served: Served, kill_after: int | None = None) -> tuple[str, int, bool]:
    """A greedy streamed completion's text and completion tokens, its llama.cpp replica SIGKILLed once
    `kill_after` chunks have arrived (and whether that was before the answer ended)."""
    stream = served.client().completions.create(
        model=MODEL,
        prompt="The weather in Paris is",
        max_tokens=1500,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    replica = lambda: processes("modelhost.runtime.worker.llamacpp_worker", served.deployment["id"])[0]  # noqa: E731
    return read_stream_killing(stream, kill_after, replica)


def test_a_stream_whose_llamacpp_replica_dies_goes_on_on_its_replacement_as_undisturbed(
    served: Served,
) -> None:
    """Issue 73 on llama.cpp through HTTP: a greedy stream (penalties replayed too) whose replica is
    SIGKILLed mid-answer continues on the replacement: text and usage equal an undisturbed run's, and
    the move is counted. (The tiny model may have generated the whole answer before the kill landed:
    then nothing moved, and the round runs again, three times at most.)"""
    deployment = served.deployment["id"]
    expected = _streamed_completion(served)[:2]
    with httpx.Client(base_url=served.url, timeout=30) as http:
        for _ in range(3):
            before = deployment_metric(http, "modelhost_generations_migrated_total", deployment)
            text, tokens, killed = _streamed_completion(served, kill_after=3)
            assert killed and (text, tokens) == expected
            if deployment_metric(http, "modelhost_generations_migrated_total", deployment) == before + 1:
                break
        else:
            pytest.fail("the replica had ended the answer each time before it was killed")
        _ready(http, served.key, deployment)


def test_llamacpps_prefix_cache_is_counted_on_metrics_as_the_other_engines(served: Served) -> None:
    """`modelhost_prefix_cache_{queries,hits}_tokens_total` from llama.cpp's own `cache_n`: the same
    prompt twice, the second finds most of it in its slot."""
    deployment = served.deployment["id"]
    messages = [{"role": "user", "content": "Name three rivers of Europe, one word each. " * 3}]
    with httpx.Client(base_url=served.url, timeout=30) as http:
        queries = deployment_metric(http, "modelhost_prefix_cache_queries_tokens_total", deployment)
        hits = deployment_metric(http, "modelhost_prefix_cache_hits_tokens_total", deployment)
        usages = []
        for _ in range(2):
            answer = served.client().chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=3,
                temperature=0,  # type: ignore[arg-type]
            )
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            usages.append((answer.usage.prompt_tokens, answer.usage.prompt_tokens_details.cached_tokens or 0))
        queried = deployment_metric(http, "modelhost_prefix_cache_queries_tokens_total", deployment) - queries
        found = deployment_metric(http, "modelhost_prefix_cache_hits_tokens_total", deployment) - hits
    assert usages[1][1] > usages[1][0] // 2, usages
    assert (queried, found) == (sum(p for p, _ in usages), sum(c for _, c in usages))


def test_a_salted_key_finds_only_its_own_cached_prefixes_on_llamacpp(served: Served) -> None:
    """llama.cpp has no salt: from the first salted request the replica chooses each request's slot, and
    one last used by another salt computes the whole prompt (`engines.llamacpp`, "Cache salts")."""
    salted_keys_find_only_their_own_prefixes(served.url, served.key, served.deployment["id"], MODEL)


def test_llamacpps_kv_cache_usage_is_its_busy_slots_over_its_slots(served: Served) -> None:
    """`modelhost_kv_cache_usage_ratio` as the transformers engine's: above 0 while streams hold slots,
    0 once they end. Streams one after another in each slot until a scrape has seen them (at most a
    minute): the tiny model answers one in a moment, and on a loaded machine one scrape can take longer
    than several of them (four per slot were all done before the second scrape once)."""
    deployment = served.deployment["id"]
    http = httpx.AsyncClient(base_url=served.url, timeout=30)
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    seen = asyncio.Event()

    async def usage() -> float:
        metrics = (await http.get("/metrics")).text
        return busiest_replica(metrics, "modelhost_kv_cache_usage_ratio", deployment)

    async def stream() -> None:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            while not seen.is_set() and time.monotonic() < deadline:
                async with client.stream(
                    "POST", "/v1/completions", json=body, headers=bearer(served.key)
                ) as answer:
                    async for _line in answer.aiter_lines():
                        pass

    async def run() -> tuple[float, float]:
        streams = [asyncio.ensure_future(stream()) for _ in range(SLOTS)]
        busy = -1.0
        while busy <= 0 and not all(s.done() for s in streams):
            busy = max(busy, await usage())
        seen.set()
        await asyncio.gather(*streams)
        deadline = time.monotonic() + 15
        while (idle := await usage()) != 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await http.aclose()
        return busy, idle

    busy, idle = asyncio.run(run())
    assert 0 < busy <= 1 and idle == 0, (busy, idle)


def test_greedy_tokens_are_llamacpps_own_on_the_same_file(served: Served, gguf_dir: Path) -> None:
    """The deployment against a bare llama.cpp server of this process on the same file and the same
    token IDs: the same tokens."""
    import xllamacpp as xlc
    from transformers import AutoTokenizer

    path = gguf_dir / f"{GGUF}.gguf"
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=path.name)
    prompt = tokenizer(CONVERSATIONS["weather"]["prompt"], add_special_tokens=False)["input_ids"]
    params = xlc.CommonParams()
    params.model.path = str(path)
    params.n_ctx, params.n_parallel, params.verbosity = 1024, 1, 0
    bare = xlc.Server(params).handle_completions(
        {"prompt": prompt, "n_predict": 40, "temperature": 0, "return_tokens": True}
    )
    bare_text = bare["choices"][0]["text"] if "choices" in bare else bare["content"]
    ours = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    assert ours.choices[0].text == bare_text and "<tool_call>" in bare_text
    assert ours.usage is not None and ours.usage.completion_tokens == bare["usage"]["completion_tokens"] - 1


# the mean absolute difference, in nats, between the GGUF's log-probabilities of its greedy answer's
# tokens and the float32 model's of the same tokens (measured: Q4_0 0.012, Q8_0 0.0006, its tokens'
# own log-probabilities being -0.09 to -0.42; the full model's after another conversation's prompt are
# 0.86 off, and zeros for all 0.16)
LOGPROB_DISTANCE = {"Q4_0": 0.05, "Q8_0": 0.005}
ANSWER_TOKENS = 32  # of the weather conversation's answer: its reasoning and the start of its tool call


def test_log_probabilities_stay_close_to_the_full_precision_model_q8_0_closer(
    served: Served, recipes: Path
) -> None:
    """The GGUFs our converter quantized (tests/tiny_models/gguf.py), Q4_0 (the module's deployment) and
    Q8_0 (a second deployment on the same server: ready in a few seconds), against the float32
    safetensors model they came from, run here by transformers. llama.cpp gives no prompt
    log-probabilities, so the fixed text is the weather conversation's greedy answer: each token the GGUF
    chose, with its log-probability, against the full model's for the same token after the same prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = recipes / FAMILIES_FOLDER / "qwen3"
    tokenizer = AutoTokenizer.from_pretrained(source)
    full = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32).eval()
    prompt = tokenizer(CONVERSATIONS["weather"]["prompt"], add_special_tokens=False)["input_ids"]
    with httpx.Client(base_url=served.url, timeout=120) as http:
        q8_0 = _deploy_warm(http, served.key, recipes / GGUF_FOLDER / "qwen3-Q8_0", "qwen3-gguf-q8")
        distances = {
            quantization: _logprob_distance(http, served.key, model, prompt, tokenizer, full)
            for quantization, model in (("Q4_0", MODEL), ("Q8_0", q8_0["model"]))
        }
    assert 0 < distances["Q8_0"] < distances["Q4_0"] < LOGPROB_DISTANCE["Q4_0"], distances
    assert distances["Q8_0"] < LOGPROB_DISTANCE["Q8_0"], distances


def _logprob_distance(
    http: httpx.Client, key: str, model: str, prompt: list[int], tokenizer: Any, full: Any
) -> float:
    import torch

    answer = http.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": prompt,
            "max_tokens": ANSWER_TOKENS,
            "temperature": 0,
            "logprobs": 0,
            "ignore_eos": True,
        },
        headers=bearer(key),
    )
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    tokens, ours = choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]
    ids = tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == tokens  # the text's tokens are the ones it chose
    with torch.no_grad():
        logits = full(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    reference = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
    return sum(abs(a - b) for a, b in zip(ours, reference, strict=True)) / len(ids)


# ---------------------------------------------------------------- real clients, unchanged


def test_langchain_gets_the_tool_call_whole_and_streamed(served: Served) -> None:
    conversation = CONVERSATIONS["weather"]
    bound = ChatOpenAI(
        base_url=f"{served.url}/v1", api_key=served.key, model=MODEL, temperature=0, max_retries=0
    ).bind_tools(conversation["tools"])
    expected = [(conversation["tool_call"]["name"], conversation["tool_call"]["arguments"])]
    answer = bound.invoke(conversation["messages"][0]["content"])
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == expected
    chunks = [
        c for c in bound.stream(conversation["messages"][0]["content"]) if isinstance(c, AIMessageChunk)
    ]
    assert [(c["name"], c["args"]) for c in sum(chunks[1:], chunks[0]).tool_calls] == expected


def test_litellm_reads_the_reasoning_whole_and_streamed(
    served: Served,
    litellm: ModuleType,  # noqa: F811 (the imported fixture)
) -> None:
    options: dict[str, Any] = dict(
        model=f"openai/{MODEL}",
        api_base=f"{served.url}/v1",
        api_key=served.key,
        messages=CONVERSATIONS["greeting"]["messages"],
        max_tokens=40,
        temperature=0,
        num_retries=0,
    )
    message = litellm.completion(**options).choices[0].message
    assert message.reasoning_content.strip() == CONVERSATIONS["greeting"]["reasoning"]
    assert message.content == CONVERSATIONS["greeting"]["content"]
    chunks = list(litellm.completion(**options, stream=True))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == message.reasoning_content


# ---------------------------------------------------------------- footprint and the engine alone


def test_a_ggufs_footprint_is_its_tensors_its_slots_kv_cache_and_compute_buffers(gguf_dir: Path) -> None:
    layout = llamacpp_layout(gguf_dir, None, 3, 1000)
    # the tiny Qwen3: 2 layers, 1 KV head of 64 + 64, f16; 1000 tokens a slot, allocated as 1024
    assert (layout.slots, layout.context) == (3, 1000)
    assert llamacpp_layout(gguf_dir, None, 3, 8192).context == 2048  # its training context at most
    assert layout.kv_cache == 2 * 1 * (64 + 64) * 2 * 3 * 1024
    assert 0 < layout.weights < (gguf_dir / f"{GGUF}.gguf").stat().st_size
    predicted = predict(
        model_dir=gguf_dir,
        pipeline="text-generation",
        engine="llamacpp",
        on_gpu=False,
        remembered=None,
        kv_cache_mb=None,
        host_budget=1 << 34,
        gpu_budget=0,
        base_costs={},
        preload=True,
        llamacpp=(3, 1000),
    )
    parts = layout.weights + layout.kv_cache + layout.compute
    assert predicted.footprint.host == BASE_COSTS["llamacpp"] + parts
    assert llamacpp_layout(gguf_dir, 512, 3, 1000).context == 512  # the deployment's max_model_len


def test_an_encoders_footprint_has_no_kv_cache_and_buffers_for_one_whole_input(recipes: Path) -> None:
    """all-MiniLM-L6-v2 as a GGUF: its 512 positions a slot whatever the setting, no KV cache (an encoder
    keeps none), and compute buffers for one batch of 512 tokens (width 384, 12 heads), no logits."""
    layout = llamacpp_layout(recipes / GGUF_FOLDER / EMBEDDING, None, 4, 4096)
    assert (layout.context, layout.kv_cache) == (512, 0)
    assert layout.compute == 512 * 4 * 8 * 384 + 512 * 512 * 12 * 4
    assert 90_000_000 < layout.weights < 92_000_000  # float32 tensors


# A `llama-server` program (MODELHOST_LLAMA_SERVER) where the machine has one built; the wheel's always
LLAMA_SERVER = os.environ.get("MODELHOST_TEST_LLAMA_SERVER")
SERVERS = [
    pytest.param(None, id="wheel"),
    pytest.param(
        LLAMA_SERVER,
        id="llama-server",
        marks=pytest.mark.skipif(
            not LLAMA_SERVER, reason="MODELHOST_TEST_LLAMA_SERVER names no llama-server"
        ),
    ),
]


@pytest.mark.parametrize("binary", SERVERS)
def test_a_cancelled_request_stops_llamacpps_slot_at_once(gguf_dir: Path, binary: str | None) -> None:
    """The worker cancels a request's task when its caller is gone: the stream to llama.cpp closes and
    its slot stops decoding (llama.cpp's own counters: a few tokens, not the 2000 asked), and the gate's
    slot is free again. On the wheel's server and on a `llama-server` program, each the caller's child
    process, which ends with the model's shutdown."""

    async def predicted(model: llamacpp.LlamaCppModel) -> int:
        metrics = (await model.client.get("/metrics")).text.splitlines()
        return int(
            float(next(m for m in metrics if m.startswith("llamacpp:tokens_predicted_total")).split()[1])
        )

    async def run() -> None:
        model = llamacpp.load(gguf_dir, 1, 2048, 1, binary)
        process = model.process
        events: list[dict[str, Any]] = []
        request = GenerationRequest(prompt="a", params=Sampling(max_tokens=2000, ignore_eos=True))
        task = asyncio.create_task(model.generate("1", request, events.append))
        while not any(isinstance(e, Text) for e in events):
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while any(s["is_processing"] for s in (await model.client.get("/slots")).json()):
            await asyncio.sleep(0.01)
        # a few tokens on a quiet machine, over a hundred on a loaded one: far from the 2000 asked
        assert await predicted(model) < 500 and model.gate.free == 1
        assert not any(isinstance(e, Text) and e.finish for e in events)
        await model.generate("2", request, events.append)  # the slot serves the next one whole
        assert (
            isinstance(events[-1], Text) and events[-1].finish == "length" and await predicted(model) >= 2000
        )
        await model.client.aclose()
        model.shutdown()
        assert process.poll() is not None

    asyncio.run(run())


def test_batch_lines_wait_behind_interactive_requests_for_a_slot() -> None:
    """The gate in front of llama.cpp's slots: with the one slot busy, a batch line that came first
    waits until the interactive request that came after it has had the slot; a waiter cancelled while
    waiting takes no slot."""

    async def run() -> list[str]:
        gate, order = llamacpp.SlotGate(1), list[str]()

        async def use(name: str, low: bool) -> None:
            async with gate.slot(low):
                order.append(name)
                await asyncio.sleep(0.01)

        async with gate.slot(False):
            batch = asyncio.create_task(use("batch", True))
            gone = asyncio.create_task(use("gone", False))
            chat = asyncio.create_task(use("chat", False))
            await asyncio.sleep(0.01)
            gone.cancel()
        await asyncio.gather(batch, chat, return_exceptions=True)
        assert gate.free == 1
        return order

    assert asyncio.run(run()) == ["chat", "batch"]


def test_from_the_first_salted_request_the_gate_chooses_slots_and_reuses_only_one_of_the_same_salt() -> None:
    """llama.cpp reuses what the slot it gives a request holds, and chooses the slot itself: once a salted
    request comes, the gate waits for the requests llama.cpp placed, then places each request itself, on
    a slot of its salt sharing its prompt where one is free (reused), else on the least recently used
    one (not reused: its whole prompt computed, over the other salt's keys and values)."""

    async def run() -> None:
        gate = llamacpp.SlotGate(2)
        prompt, other = [1, 2, 3, 4, 5], [9, 8, 7, 6, 5]
        async with gate.slot(False, prompt=prompt) as placed:
            assert placed is None  # no salt yet: llama.cpp's choice, as before
            salted = asyncio.create_task(_placed(gate, "a", prompt))
            await asyncio.sleep(0.01)
            assert not salted.done()  # it waits for the request llama.cpp placed
        assert await salted == llamacpp.Placed(0, reuse=False)  # unsalted content: computed again
        assert await _placed(gate, "a", prompt) == llamacpp.Placed(0, reuse=True)
        assert await _placed(gate, None, prompt) == llamacpp.Placed(1, reuse=True)  # unsalted, as it was
        assert await _placed(gate, "b", prompt) == llamacpp.Placed(0, reuse=False)  # the least recently used
        assert await _placed(gate, "a", prompt) == llamacpp.Placed(1, reuse=False)  # "a" is gone
        # an unrelated prompt takes the least recently used slot, as llama.cpp chooses, keeping "a"'s
        assert await _placed(gate, "a", other) == llamacpp.Placed(0, reuse=False)
        assert await _placed(gate, "a", prompt[:3]) == llamacpp.Placed(1, reuse=True)
        assert gate.free == 2

    asyncio.run(run())


async def _placed(gate: llamacpp.SlotGate, salt: str | None, prompt: list[int]) -> llamacpp.Placed | None:
    async with gate.slot(False, salt=salt, prompt=prompt) as placed:
        return placed


def test_the_gate_lets_in_the_least_served_tenant_next_not_the_first_come() -> None:
    """Key a queues three requests, then key b one (while a's first runs, not yet charged: b starts
    level with a): b's goes in after a's first, not after all three. Each request is charged its tokens
    as llama.cpp streams them (here by hand)."""

    async def run() -> list[str]:
        gate, order = llamacpp.SlotGate(1), list[str]()

        async def use(name: str, tenant: str) -> None:
            async with gate.slot(False, tenant=tenant):
                order.append(name)
                await asyncio.sleep(0.005)
                gate.served.charge(tenant, prompt=4, output=8)

        tasks = []
        for name, tenant in (("a1", "x/a"), ("a2", "x/a"), ("a3", "x/a"), ("b1", "x/b")):
            tasks.append(asyncio.create_task(use(name, tenant)))
            await asyncio.sleep(0)  # in this order
        await asyncio.gather(*tasks)
        assert gate.free == 1
        return order

    assert asyncio.run(run()) == ["a1", "b1", "a2", "a3"]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_flex_requests_wait_beside_a_chat_holding_a_slot_and_then_leave_one_slot_spare() -> None:
    """The same rule as the transformers engine's (`generation.priority`): with a chat inside and three
    slots free, no flex request goes in; once the interactive traffic is over, flex requests take every
    slot but one, which the next chat gets at once."""

    async def run() -> None:
        clock = _Clock()
        gate, inside, done = llamacpp.SlotGate(4, clock=clock), list[str](), asyncio.Event()

        async def flex(name: str) -> None:
            async with gate.slot(True):
                inside.append(name)
                await done.wait()

        async with gate.slot(False):
            tasks = [asyncio.create_task(flex(f"flex{i}")) for i in range(4)]
            await asyncio.sleep(0.01)
            assert inside == [] and gate.free == 3
            clock.now += llamacpp.BUSY_SECONDS
        await asyncio.sleep(0.01)
        assert inside == ["flex0", "flex1", "flex2"] and gate.free == 1
        async with asyncio.timeout(1):
            async with gate.slot(False, priority=-1, tenant="k"):
                assert gate.free == 0
        done.set()
        await asyncio.gather(*tasks)
        assert inside == ["flex0", "flex1", "flex2", "flex3"] and gate.free == 4

    asyncio.run(run())


def test_a_token_with_a_unicode_line_separator_stays_in_its_chunk() -> None:
    """llama.cpp's JSON leaves U+2028 and U+0085 unescaped in a token's text (the tiny random models
    write them): the stream is split into events at newlines alone."""
    splitter = llamacpp_server.Lines()
    parts = ('data: {"content": "a\u2028b', '\u0085c"}\n', "\ndata: ", '{"stop": true}\n\n')
    lines = [line for part in parts for line in splitter.feed(part.encode())]
    assert [json.loads(line[6:]) for line in lines if line] == [
        {"content": "a\u2028b\u0085c"},
        {"stop": True},
    ]
