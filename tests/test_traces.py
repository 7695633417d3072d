"""Traces (issue 42): a real OTLP/HTTP receiver in the test process gets the spans a live server exports,
decoded with opentelemetry-proto; a client's `traceparent` is continued by the gateway and joined by the
replica; with tracing off nothing is exported and no `traceresponse` is sent."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from modelhost import tracing
from modelhost.outbound import Bounds, fetch_url, parse_networks
from tests.chat_model import served_chat_model
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, deploy_folder_sync
from tests.live import live_server
from tests.otlp import Receiver, attributes_of, client_traceparent, exporting_to
from tests.server_process import ServerProcess
from tests.test_media import PNG, serving
from tests.trace_picture import save_if_asked

Json = dict[str, Any]
ST = Path("t03_feature_extraction", "st")  # the tiny sentence-transformers model


def _serve_tiny_embedder(root: Path, recipes: Path) -> Iterator[Json]:
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}")
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=120) as http:
        created = http.post("/v1/admin/accounts", json={"name": "t"}, headers=bearer(ADMIN_KEY))
        key = created.json()["api_key"]
        deploy_folder_sync(http, key, recipes / ST, "feature-extraction", "emb", readiness="warm")
        yield {"http": http, "key": key}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, recipes: Path, receiver: Receiver) -> Iterator[Json]:
    """A live server (its replica worker too) exporting to the receiver, every request sampled."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in exporting_to(receiver).items():
            env.setenv(name, value)
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        env.setenv("OTEL_SERVICE_NAME", "modelhost-test")
        yield from _serve_tiny_embedder(tmp_path_factory.mktemp("traced"), recipes)


@pytest.fixture
def untraced(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Json]:
    """A live server as an operator runs it without tracing (first in this module: while the traced
    server runs, this process's tracing is on)."""
    with pytest.MonkeyPatch.context() as env:
        for name in tracing.ENDPOINTS:
            env.delenv(name, raising=False)
        yield from _serve_tiny_embedder(tmp_path_factory.mktemp("untraced"), recipes)


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
    steps = {"authenticate", "limits", "wait for replica", "dispatch"}
    spans = receiver.wait_for(trace_id, {"embeddings emb", "replica", "queue", "model call", *steps})
    gateway_resource, gateway = spans["embeddings emb"]
    assert gateway.kind == Span.SPAN_KIND_SERVER
    assert gateway.parent_span_id.hex() == client_span
    assert gateway_resource["service.name"] == "modelhost-test"
    assert gateway_resource["modelhost.process"] == "gateway"
    attributes = attributes_of(gateway)
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.request.model"] == "emb"
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["http.route"] == "/v1/embeddings"
    assert attributes["http.response.status_code"] == 200

    # the gateway's steps, in order, inside its span
    for name in steps:
        assert spans[name][1].parent_span_id == gateway.span_id, name
        assert within(spans[name][1], gateway), name
    ordered = [spans[name][1] for name in ("authenticate", "limits", "wait for replica", "dispatch")]
    assert all(a.end_time_unix_nano <= b.start_time_unix_nano for a, b in itertools.pairwise(ordered))
    dispatch = spans["dispatch"][1]
    assert dispatch.kind == Span.SPAN_KIND_CLIENT

    # the replica's spans, children of the dispatch that sent the request
    replica_resource, replica = spans["replica"]
    assert replica_resource["modelhost.process"] == "replica"
    assert replica.kind == Span.SPAN_KIND_SERVER
    assert replica.parent_span_id == dispatch.span_id
    replica_attributes = attributes_of(replica)
    assert replica_attributes["modelhost.batch.size"] >= 1
    assert replica_attributes["modelhost.queue.seconds"] >= 0
    queue, call = spans["queue"][1], spans["model call"][1]
    assert queue.parent_span_id == call.parent_span_id == replica.span_id
    assert queue.end_time_unix_nano == call.start_time_unix_nano
    assert attributes_of(call)["modelhost.batch.size"] == replica_attributes["modelhost.batch.size"]
    # the clocks of two processes of one machine: the replica's spans lie within the dispatch
    assert within(replica, dispatch)


def within(inner: Span, outer: Span) -> bool:
    return (
        outer.start_time_unix_nano <= inner.start_time_unix_nano
        and inner.end_time_unix_nano <= outer.end_time_unix_nano
    )


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


def test_a_caller_without_a_valid_key_cannot_continue_its_trace_but_is_linked_to_it(
    traced: Json, receiver: Receiver
) -> None:
    """Anyone can send a sampled `traceparent`: without a valid key it does not decide (forcing this
    server to trace every request costs 3.4x its CPU); the request's trace is this server's own."""
    header, trace_id, client_span = client_traceparent()
    wrong = {"Authorization": "Bearer mh-" + "q" * 43, "traceparent": header}
    answer = traced["http"].post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers=wrong)
    assert answer.status_code == 401
    answered = answer.headers["traceresponse"].split("-")[1]
    assert answered != trace_id
    server = receiver.wait_for(answered, {"POST /v1/embeddings"})["POST /v1/embeddings"][1]
    assert server.parent_span_id == b""
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in server.links] == [(trace_id, client_span)]
    assert receiver.of_trace(trace_id) == []


def test_a_tracestate_the_standard_does_not_allow_is_dropped_unlogged(
    traced: Json, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    allowed = "vendor=abc,tenant@sys=1"
    for tracestate, kept in ((allowed, allowed), ("Evil Key=<script>", "")):
        header, trace_id, _ = client_traceparent()
        embed(traced, {"traceparent": header, "tracestate": tracestate})
        assert receiver.wait_for(trace_id, {"embeddings emb"})["embeddings emb"][1].trace_state == kept
    assert "Evil" not in caplog.text


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        ("rojo=00f067aa0ba902b7", True),
        ("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,,", True),
        ("fw529a3039@dt=ZmxhZ3M9MQ", True),
        ("Rojo=1", False),
        ("rojo=a=b", False),
        ("rojo=caf\u00e9", False),
        ("rojo", False),
        (",".join(f"k{i}=v" for i in range(33)), False),
        ("k=" + "v" * 600, False),
    ],
)
def test_tracestate_follows_the_w3c_grammar(header: str, valid: bool) -> None:
    assert tracing.valid_tracestate(header) is valid


def test_a_cold_start_shows_as_the_load_inside_the_wait_for_a_replica(
    traced: Json, receiver: Receiver, recipes: Path
) -> None:
    http, key = traced["http"], traced["key"]
    deployed = deploy_folder_sync(http, key, recipes / ST, "feature-extraction", "cold-emb", readiness="cold")
    header, trace_id, _ = client_traceparent()
    answer = http.post(
        "/v1/embeddings",
        json={"model": "cold-emb", "input": "a cold start"},
        headers={**bearer(key), "traceparent": header},
    )
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(trace_id, {"wait for replica", "load deployment", "wait for memory"})
    wait, load, memory = (
        spans[name][1] for name in ("wait for replica", "load deployment", "wait for memory")
    )
    assert load.parent_span_id == wait.span_id
    assert memory.parent_span_id == load.span_id
    assert attributes_of(load)["modelhost.deployment"] == deployed["id"]
    # the load is most of the wait, and of the request: the replica's start
    assert load.end_time_unix_nano - load.start_time_unix_nano > 0.5 * (
        wait.end_time_unix_nano - wait.start_time_unix_nano
    )


@pytest.fixture(scope="module")
def traced_chat(tmp_path_factory: pytest.TempPathFactory, recipes: Path, receiver: Receiver) -> Iterator[Any]:
    """A live server with the recipe chat model on the transformers engine, every request traced."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in exporting_to(receiver).items():
            env.setenv(name, value)
        with served_chat_model(tmp_path_factory.mktemp("traced-chat"), recipes) as served:
            warm_up = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert served.http.post(
                "/v1/chat/completions", json=warm_up, headers=bearer(served.key)
            ).is_success
            yield served


def test_a_streamed_chat_trace_has_the_generation_its_phases_and_its_tokens(
    traced_chat: Any, receiver: Receiver
) -> None:
    header, trace_id, _ = client_traceparent()
    sdk = openai.OpenAI(base_url=f"{traced_chat.url}/v1", api_key=traced_chat.key, max_retries=0)
    chunks = list(
        sdk.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"traceparent": header},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 1

    names = {
        "chat chat",
        "authenticate",
        "limits",
        "wait for replica",
        "dispatch",
        "generate",
        "prefill",
        "decode",
    }
    spans = receiver.wait_for(trace_id, names)
    save_if_asked(receiver.of_trace(trace_id))  # the picture in docs/operations.md
    server = attributes_of(spans["chat chat"][1])
    assert server["gen_ai.operation.name"] == "chat"
    assert server["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert server["gen_ai.usage.output_tokens"] == usage.completion_tokens
    dispatch = spans["dispatch"][1]
    assert dispatch.parent_span_id == spans["chat chat"][1].span_id
    assert attributes_of(dispatch)["gen_ai.usage.output_tokens"] == usage.completion_tokens

    resource, generate = spans["generate"]
    assert resource["modelhost.process"] == "replica"
    assert generate.parent_span_id == dispatch.span_id
    attributes = attributes_of(generate)
    assert attributes["modelhost.engine"] == "transformers"
    assert attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert list(attributes["gen_ai.response.finish_reasons"].values) != []
    ttft = attributes["gen_ai.server.time_to_first_token"]
    assert 0 < ttft <= (generate.end_time_unix_nano - generate.start_time_unix_nano) / 1e9
    assert attributes["gen_ai.server.time_per_output_token"] > 0
    prefill, decode = spans["prefill"][1], spans["decode"][1]
    assert prefill.parent_span_id == decode.parent_span_id == generate.span_id
    assert prefill.start_time_unix_nano == generate.start_time_unix_nano
    assert prefill.end_time_unix_nano == decode.start_time_unix_nano
    assert decode.end_time_unix_nano == generate.end_time_unix_nano


async def test_a_media_fetch_is_a_client_span_of_the_request_that_reads_it(
    traced: Json, receiver: Receiver
) -> None:
    span = tracing.server_span("POST", "/v1/test", "http", None, None)
    active = tracing.activate(span)
    try:
        with serving() as port:
            policy = Bounds(
                networks=parse_networks(["127.0.0.0/8"]),
                max_bytes=1 << 20,
                seconds=5,
                idle_seconds=5,
                requests=1,
            )
            body = await fetch_url(f"http://127.0.0.1:{port}/image.png", policy, timeout=None, param="image")
    finally:
        tracing.deactivate(active)
        span.end()
    assert body == PNG
    fetched = receiver.wait_for(tracing.trace_id_of(span), {"fetch media"})["fetch media"][1]
    assert fetched.kind == Span.SPAN_KIND_CLIENT
    assert fetched.parent_span_id.hex() == f"{span.get_span_context().span_id:016x}"
    attributes = attributes_of(fetched)
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["http.response.body.size"] == len(PNG)
    assert attributes["modelhost.param"] == "image"


def test_the_log_lines_of_a_request_name_its_trace(
    tmp_path: Path, sqlite_url: str, receiver: Receiver
) -> None:
    server = ServerProcess(tmp_path / "data", sqlite_url, log_level="info", **exporting_to(receiver))
    server.start()
    header, trace_id, _ = client_traceparent()
    try:
        answer = httpx.get(
            f"{server.url}/v1/no-such-route", headers={"X-Request-Id": "req-42", "traceparent": header}
        )
        trace_id = answer.headers["traceresponse"].split("-")[1]  # no key: a trace of its own
        receiver.wait_for(trace_id, {"GET"})  # its span, named for the method alone: no route matched
    finally:
        server.terminate()
    access = [line for line in server.log.read_text().splitlines() if "/v1/no-such-route" in line]
    assert access and all(f"[req-42 trace={trace_id}]" in line for line in access), access


def test_metrics_have_the_genai_conventions_time_to_first_token_and_time_per_output_token(
    traced_chat: Any,
) -> None:
    sdk = openai.OpenAI(base_url=f"{traced_chat.url}/v1", api_key=traced_chat.key, max_retries=0)
    before = _genai_counts(traced_chat)
    answer = sdk.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 1
    after = _genai_counts(traced_chat)
    assert (
        after["gen_ai_server_time_to_first_token_seconds"]
        == before["gen_ai_server_time_to_first_token_seconds"] + 1
    )
    assert (
        after["gen_ai_server_time_per_output_token_seconds"]
        == before["gen_ai_server_time_per_output_token_seconds"] + 1
    )


def _genai_counts(served: Any) -> dict[str, float]:
    """The observation counts of the GenAI histograms for the chat deployment, from /metrics."""
    body = served.http.get("/metrics").text
    counts = {
        "gen_ai_server_time_to_first_token_seconds": 0.0,
        "gen_ai_server_time_per_output_token_seconds": 0.0,
    }
    for line in body.splitlines():
        for name in counts:
            if line.startswith(f'{name}_count{{deployment="{served.deployment_id}"}}'):
                counts[name] = float(line.rsplit(" ", 1)[1])
    return counts


def test_a_request_its_caller_did_not_sample_is_named_in_the_answer_and_exports_nothing(
    traced: Json, receiver: Receiver
) -> None:
    _, trace_id, span_id = client_traceparent()
    answer = embed(traced, {"traceparent": f"00-{trace_id}-{span_id}-00"})  # flags 00: not sampled
    version, answered_trace, _, flags = answer.headers["traceresponse"].split("-")
    assert (version, answered_trace, flags) == ("00", trace_id, "00")
    after, sampled, _ = client_traceparent()
    embed(traced, {"traceparent": after})  # a sampled request after it: once its replica's spans are in,
    receiver.wait_for(sampled, {"embeddings emb", "replica"})  # the first one's would be too
    assert receiver.of_trace(trace_id) == []  # neither the gateway's spans nor the replica's


def test_traces_go_over_grpc_when_the_protocol_says_so(tmp_path: Path, sqlite_url: str) -> None:
    receiver = Receiver("grpc")
    grpc = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    server = ServerProcess(tmp_path / "data", sqlite_url, **exporting_to(receiver), **grpc)
    server.start()
    try:
        answer = httpx.get(f"{server.url}/health")
        assert answer.status_code == 200
        receiver.wait_for(answer.headers["traceresponse"].split("-")[1], {"GET /health"})
    finally:
        server.terminate()
        receiver.close()
