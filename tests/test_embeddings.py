"""Embeddings and feature extraction on the real all-MiniLM-L6-v2, pushed through the artifact path."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.live import live_server

Json = dict[str, Any]
SENTENCES = ["A man is playing a guitar.", "The weather is lovely today.", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Iterator[Json]:
    root = tmp_path_factory.mktemp("emb")
    with live_server(make_settings(root, f"sqlite:///{root / 'db.sqlite'}")) as url:
        http = httpx.Client(base_url=url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "emb"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        artifact_id = push_folder_sync(http, key, minilm_dir, "feature-extraction")
        created = http.post(
            "/v1/deployments",
            json={"model": "minilm", "artifact_id": artifact_id, "readiness": "warm"},
            headers=bearer(key),
        )
        assert created.status_code == 201
        yield {"url": url, "http": http, "key": key, "deployment": created.json()}
        http.close()


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def embed(served: Json, **body: Any) -> httpx.Response:
    return served["http"].post(
        "/v1/embeddings", json={"model": "minilm", **body}, headers=bearer(served["key"])
    )


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def test_vectors_equal_sentence_transformers_own_output(served: Json, reference: Any) -> None:
    got = vectors(embed(served, input=SENTENCES))
    expected = reference.encode(SENTENCES)
    assert got.shape == (3, 384)
    assert np.abs(got - expected).max() < 1e-5


def test_response_has_openais_shape_and_exact_usage(served: Json, reference: Any) -> None:
    body = embed(served, input="Hello world").json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    tokens = len(reference.tokenizer("Hello world")["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_paraphrases_score_higher_than_unrelated_sentences(served: Json) -> None:
    a, b, c = vectors(
        embed(served, input=["How old are you?", "What is your age?", "The cat sat on the mat."])
    )
    assert float(a @ b) > float(a @ c) + 0.3


def test_token_id_inputs_give_the_same_vectors_as_their_text(served: Json, reference: Any) -> None:
    ids = [reference.tokenizer(s)["input_ids"] for s in SENTENCES[:2]]
    from_text = vectors(embed(served, input=SENTENCES[:2]))
    assert np.abs(vectors(embed(served, input=ids)) - from_text).max() < 1e-5
    assert np.abs(vectors(embed(served, input=ids[0]))[0] - from_text[0]).max() < 1e-5


def test_base64_encoding_decodes_to_the_float_vectors(served: Json) -> None:
    floats = vectors(embed(served, input=SENTENCES))
    encoded = embed(served, input=SENTENCES, encoding_format="base64").json()["data"]
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in encoded])
    assert np.array_equal(decoded, floats)


def test_dimensions_truncates_and_renormalises(served: Json) -> None:
    full = vectors(embed(served, input=SENTENCES[0]))[0]
    short = vectors(embed(served, input=SENTENCES[0], dimensions=64))[0]
    assert short.shape == (64,)
    assert np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
    assert np.abs(short - full[:64] / np.linalg.norm(full[:64])).max() < 1e-6


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": "word " * 400}, "input"),
        ({"input": [[101, 99999999]]}, "input"),
        ({"input": [1, -1]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "unknown": 1}, "unknown"),
    ],
)
def test_bad_input_is_400_with_param(served: Json, body: Json, param: str) -> None:
    error = assert_error(embed(served, **body), 400)
    assert error["param"] is not None and error["param"].startswith(param), error


def test_the_openai_sdk_gets_identical_vectors(served: Json) -> None:
    client = OpenAI(base_url=f"{served['url']}/v1", api_key=served["key"])
    result = client.embeddings.create(model="minilm", input=SENTENCES)  # the SDK asks for base64
    sdk = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert np.array_equal(sdk, vectors(embed(served, input=SENTENCES)))
    assert result.usage.prompt_tokens > 0


def test_every_field_of_openais_embedding_request_is_accepted(served: Json) -> None:
    client = OpenAI(base_url=f"{served['url']}/v1", api_key=served["key"])
    result = client.embeddings.create(
        model="minilm", input=SENTENCES[0], dimensions=64, encoding_format="float", user="user-1"
    )
    assert len(result.data[0].embedding) == 64


def test_another_tokenizers_ids_are_refused_with_what_to_set_instead(served: Json) -> None:
    import openai

    client = OpenAI(base_url=f"{served['url']}/v1", api_key=served["key"])
    with pytest.raises(openai.BadRequestError) as caught:  # tiktoken's "Hello world", as LangChain sends it
        client.embeddings.create(model="minilm", input=[[9906, 1917]])
    error: Json = caught.value.body  # type: ignore[assignment]
    assert error["param"] == "input" and "check_embedding_ctx_length=False" in error["message"]
    assert "[101]" in error["message"] and "[102]" in error["message"]  # what this model's IDs look like


def test_the_openai_sdk_sees_vendor_names_as_model_not_found(served: Json) -> None:
    import openai

    client = OpenAI(base_url=f"{served['url']}/v1", api_key=served["key"])
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert "Model not found" in str(caught.value)


def test_feature_extraction_gives_a_vector_for_a_string_and_a_list_for_a_list(
    served: Json, reference: Any
) -> None:
    post = served["http"].post
    one = post(
        "/v1/feature-extraction",
        json={"model": "minilm", "inputs": SENTENCES[0]},
        headers=bearer(served["key"]),
    )
    many = post(
        "/v1/feature-extraction", json={"model": "minilm", "inputs": SENTENCES}, headers=bearer(served["key"])
    )
    assert isinstance(one.json()[0], float) and len(one.json()) == 384
    assert np.abs(np.array(many.json()) - reference.encode(SENTENCES)).max() < 1e-5


def test_deployment_view_reports_live_state_memory_and_cold_start(served: Json) -> None:
    embed(served, input="load me")
    view = (
        served["http"]
        .get(f"/v1/deployments/{served['deployment']['id']}", headers=bearer(served["key"]))
        .json()
    )
    assert view["state"] == "ready" and view["replicas"] == 1
    assert 0.05 < view["memory_gb"] < 8
    assert view["last_cold_start_seconds"] > 0


def test_metrics_expose_per_deployment_runtime_series(served: Json) -> None:
    embed(served, input="count me")
    text = served["http"].get("/metrics").text
    dep = served["deployment"]["id"]
    names = (
        "modelhost_batch_size_count",
        "modelhost_inference_seconds_count",
        "modelhost_cold_starts_total",
        "modelhost_loaded_replicas",
        "modelhost_replica_memory_bytes",
        "modelhost_queue_depth",
    )
    for name in names:
        assert f'{name}{{deployment="{dep}"}}' in text, name
