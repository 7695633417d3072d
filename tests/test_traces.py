"""Traces (issue 42): a real OTLP/HTTP receiver in the test process gets the spans a live server exports,
decoded with opentelemetry-proto; a client's `traceparent` is continued by the gateway and joined by the
replica; with tracing off nothing is exported and no `traceresponse` is sent."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from modelhost import tracing
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, push_folder_sync
from tests.live import live_server
from tests.otlp import Receiver, _attributes

Json = dict[str, Any]


def _serve_tiny_embedder(root: Path, recipes: Path) -> Iterator[Json]:
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}")
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        created = http.post("/v1/admin/accounts", json={"name": "t"}, headers=bearer(ADMIN_KEY))
        key = created.json()["api_key"]
        artifact = push_folder_sync(
            http, key, recipes / "t03_feature_extraction" / "st", "feature-extraction"
        )
        deployed = http.post(
            "/v1/deployments",
            json={"model": "emb", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(key),
        )
        assert deployed.status_code == 201, deployed.text
        yield {"http": http, "key": key}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, recipes: Path, receiver: Receiver) -> Iterator[Json]:
    """A live server (its replica worker too) exporting to the receiver, every request sampled."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        env.setenv("OTEL_SERVICE_NAME", "modelhost-test")
        env.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        yield from _serve_tiny_embedder(tmp_path_factory.mktemp("traced"), recipes)


@pytest.fixture
def untraced(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Json]:
    """A live server as an operator runs it without tracing (first in this module: while the traced
    server runs, this process's tracing is on)."""
    with pytest.MonkeyPatch.context() as env:
        for name in tracing.ENDPOINTS:
            env.delenv(name, raising=False)
        yield from _serve_tiny_embedder(tmp_path_factory.mktemp("untraced"), recipes)


def client_traceparent() -> tuple[str, str, str]:
    """A client's own trace: (its header, the trace ID, the client span's ID)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def embed(served: Json, headers: dict[str, str]) -> httpx.Response:
    response: httpx.Response = served["http"].post(
        "/v1/embeddings",
        json={"model": "emb", "input": "a traced sentence"},
        headers={**bearer(served["key"]), **headers},
    )
    assert response.status_code == 200, response.text
    return response


def test_with_tracing_off_nothing_is_exported_and_no_traceresponse_is_sent(
    untraced: Json, receiver: Receiver
) -> None:
    assert not tracing.ENABLED
    before = receiver.posts
    header, trace_id, _ = client_traceparent()
    response = embed(untraced, {"traceparent": header})
    assert "traceresponse" not in response.headers
    time.sleep(0.5)  # several of a traced server's export delays
    assert receiver.posts == before
    assert receiver.of_trace(trace_id) == []


def test_the_gateway_continues_the_clients_trace_and_the_replica_joins_it(
    traced: Json, receiver: Receiver
) -> None:
    header, trace_id, client_span = client_traceparent()
    embed(traced, {"traceparent": header})
    spans = receiver.wait_for(trace_id, {"embeddings emb", "model call"})
    gateway_resource, gateway = spans["embeddings emb"]
    assert gateway.kind == Span.SPAN_KIND_SERVER
    assert gateway.parent_span_id.hex() == client_span
    assert gateway_resource["service.name"] == "modelhost-test"
    assert gateway_resource["modelhost.process"] == "gateway"
    attributes = _attributes(gateway)
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.request.model"] == "emb"
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["http.route"] == "/v1/embeddings"
    assert attributes["http.response.status_code"] == 200

    replica_resource, replica = spans["model call"]
    assert replica_resource["modelhost.process"] == "replica"
    assert replica.parent_span_id == gateway.span_id
    replica_attributes = _attributes(replica)
    assert replica_attributes["modelhost.batch.size"] >= 1
    assert replica_attributes["modelhost.queue.seconds"] >= 0
    assert gateway.start_time_unix_nano <= replica.start_time_unix_nano <= gateway.end_time_unix_nano


def test_the_answer_names_the_trace_in_traceresponse(traced: Json, receiver: Receiver) -> None:
    header, trace_id, _ = client_traceparent()
    answer = embed(traced, {"traceparent": header}).headers["traceresponse"]
    version, answered_trace, span_id, flags = answer.split("-")
    assert (version, answered_trace, flags) == ("00", trace_id, "01")
    spans = receiver.wait_for(trace_id, {"embeddings emb"})
    assert spans["embeddings emb"][1].span_id.hex() == span_id


def test_a_request_without_traceparent_starts_a_trace_of_its_own(traced: Json, receiver: Receiver) -> None:
    _, trace_id, _, _ = embed(traced, {}).headers["traceresponse"].split("-")
    spans = receiver.wait_for(trace_id, {"embeddings emb", "model call"})
    assert spans["embeddings emb"][1].parent_span_id == b""
