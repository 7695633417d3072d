"""Traces of work that outlives the request that created it (issue 42): each batch line, agent run and
video job starts a trace of its own whose root span links to the creator's SERVER span, and the work's
requests and replica spans are in that trace. Spans come from a live server through a real OTLP/HTTP
receiver (`tests.otlp`); with tracing off no traceparent is stored and nothing is exported."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from sqlalchemy import create_engine, text

from modelhost import tracing
from tests.chat_model import ChatServer, served_chat_model
from tests.helpers import bearer, deploy_folder_sync, push_folder_sync
from tests.otlp import Receiver, attributes_of, client_traceparent, exporting_to

Json = dict[str, Any]
TINY_VIDEO = {"num_inference_steps": 2, "seed": 1, "seconds": 0.25, "size": "32x32", "fps": 8}


def serve(root: Path, recipes: Path) -> Iterator[ChatServer]:
    """A live server with a warm `chat` deployment and a warm `emb` one (the tiny embedder)."""
    settings = {"batch_poll_seconds": 0.1, "video_poll_seconds": 0.05}
    with served_chat_model(root, recipes, **settings) as served:
        folder = recipes / "t03_feature_extraction" / "st"
        deploy_folder_sync(served.http, served.key, folder, "feature-extraction", "emb", readiness="warm")
        yield served


@pytest.fixture
def untraced(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[ChatServer]:
    """A server without tracing (first in this module: while the traced server runs, this process's
    tracing is on)."""
    with pytest.MonkeyPatch.context() as env:
        for name in tracing.ENDPOINTS:
            env.delenv(name, raising=False)
        yield from serve(tmp_path_factory.mktemp("untraced"), recipes)


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, recipes: Path, receiver: Receiver
) -> Iterator[ChatServer]:
    """A live server (its replica workers too) exporting to the receiver, every trace sampled."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in exporting_to(receiver).items():
            env.setenv(name, value)
        yield from serve(tmp_path_factory.mktemp("traced"), recipes)


def creator_span(receiver: Receiver, trace_id: str, name: str) -> Span:
    """The gateway's SERVER span of the request that created the work, in the client's trace."""
    span = receiver.wait_for(trace_id, {name})[name][1]
    assert span.kind == Span.SPAN_KIND_SERVER
    return span


def spans_named(
    receiver: Receiver, name: str, key: str, value: str, count: int, timeout: float = 30
) -> list[Span]:
    """The `count` spans called `name` whose attribute `key` is `value`, once all have arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [s for _, s in list(receiver.spans) if s.name == name and attributes_of(s).get(key) == value]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{count} spans {name!r} with {key}={value!r} not received; got {len(found)}")


def traceparent_of(span: Span) -> str:
    return f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01"


def assert_linked_root(span: Span, creator: Span) -> None:
    """`span` starts a trace of its own, linked to `creator`."""
    assert span.parent_span_id == b"" and span.trace_id != creator.trace_id
    assert [(link.trace_id, link.span_id) for link in span.links] == [(creator.trace_id, creator.span_id)]


def child_of(receiver: Receiver, parent: Span, name: str) -> Span:
    """The span called `name` in `parent`'s trace whose parent it is."""
    spans = receiver.wait_for(parent.trace_id.hex(), {name})
    child = spans[name][1]
    assert child.parent_span_id == parent.span_id, name
    return child


def embeddings_batch(served: ChatServer, custom_ids: list[str], headers: dict[str, str]) -> Any:
    """An embeddings batch of one line per custom ID, created with `headers`, run to its end."""
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=served.key, max_retries=0)
    lines = [
        {"custom_id": c, "method": "POST", "url": "/v1/embeddings", "body": {"model": "emb", "input": c}}
        for c in custom_ids
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    file_id = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h", extra_headers=headers
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, f"batch {batch.id} still {batch.status}"
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch.errors
    return batch


def stored_traceparent(served: ChatServer, table: str, row_id: str) -> str | None:
    """What the work's row keeps of its creator: what links it after a restart too."""
    engine = create_engine(served.database_url)
    try:
        with engine.connect() as connection:
            query = text(f"SELECT traceparent FROM {table} WHERE id = :id")
            value: str | None = connection.execute(query, {"id": row_id}).scalar_one()
            return value
    finally:
        engine.dispose()


def test_with_tracing_off_no_traceparent_is_stored_and_nothing_is_exported(
    untraced: ChatServer, receiver: Receiver
) -> None:
    assert not tracing.ENABLED
    before = receiver.posts
    header, trace_id, _ = client_traceparent()
    batch = embeddings_batch(untraced, ["a", "b"], {"traceparent": header})
    assert stored_traceparent(untraced, "batches", batch.id) is None
    time.sleep(0.5)  # several of a traced server's export delays
    assert receiver.posts == before and receiver.of_trace(trace_id) == []


def test_each_batch_line_has_a_span_linked_to_the_request_that_created_the_batch(
    traced: ChatServer, receiver: Receiver
) -> None:
    header, trace_id, _ = client_traceparent()
    batch = embeddings_batch(traced, ["a", "b", "c"], {"traceparent": header})
    creator = creator_span(receiver, trace_id, "POST /v1/batches")
    assert stored_traceparent(traced, "batches", batch.id) == traceparent_of(creator)
    lines = spans_named(receiver, "batch line", "modelhost.batch.id", batch.id, 3)
    assert sorted(attributes_of(s)["modelhost.batch.custom_id"] for s in lines) == ["a", "b", "c"]
    assert len({s.trace_id for s in lines}) == 3  # a trace per line
    for line in lines:
        assert line.kind == Span.SPAN_KIND_INTERNAL
        assert attributes_of(line)["modelhost.batch.endpoint"] == "/v1/embeddings"
        assert_linked_root(line, creator)
        request = child_of(receiver, line, "embeddings emb")  # the line's request through the app
        assert request.kind == Span.SPAN_KIND_SERVER
        replica = child_of(receiver, child_of(receiver, request, "dispatch"), "replica")  # and the replica's
        child_of(receiver, replica, "model call")


def test_an_agent_run_span_is_linked_to_the_request_that_created_it(
    traced: ChatServer, receiver: Receiver
) -> None:
    agent = traced.http.post(
        "/v1/agent",
        json={"name": "helper", "model": "chat", "instructions": "Answer briefly."},
        headers=bearer(traced.key),
    ).json()
    header, trace_id, _ = client_traceparent()
    created = traced.http.post(
        f"/v1/agent/{agent['id']}/runs",
        json={"input": "hello", "max_tokens": 4, "min_tokens": 4, "temperature": 0},
        headers={**bearer(traced.key), "traceparent": header},
    )
    assert created.status_code == 200, created.text
    creator = creator_span(receiver, trace_id, "POST /v1/agent/{agent_id}/runs")
    assert stored_traceparent(traced, "agent_runs", created.json()["id"]) == traceparent_of(creator)
    [run] = spans_named(receiver, "invoke_agent helper", "modelhost.agent_run.id", created.json()["id"], 1)
    assert_linked_root(run, creator)
    attributes = attributes_of(run)
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert (attributes["gen_ai.agent.name"], attributes["gen_ai.agent.id"]) == ("helper", agent["id"])
    assert attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.usage.output_tokens"] == 4
    generation = child_of(receiver, child_of(receiver, run, "dispatch"), "generate")  # in the run's trace
    assert run.start_time_unix_nano <= generation.start_time_unix_nano <= run.end_time_unix_nano


def test_a_video_job_span_is_linked_to_the_request_that_created_it(
    traced: ChatServer, receiver: Receiver, recipes: Path
) -> None:
    folder = recipes / "t14_diffusers_text_to_video" / "text_to_video_sd"
    artifact = push_folder_sync(traced.http, traced.key, folder, "text-to-video")
    deployed = traced.http.post(
        "/v1/deployments", json={"model": "t2v", "artifact_id": artifact}, headers=bearer(traced.key)
    )
    assert deployed.status_code == 201, deployed.text
    header, trace_id, _ = client_traceparent()
    created = traced.http.post(
        "/v1/videos",
        json={"model": "t2v", "prompt": "a cat", **TINY_VIDEO},
        headers={**bearer(traced.key), "traceparent": header},
    )
    assert created.status_code == 200, created.text
    creator = creator_span(receiver, trace_id, "POST /v1/videos")
    assert stored_traceparent(traced, "video_jobs", created.json()["id"]) == traceparent_of(creator)
    [job] = spans_named(receiver, "video job", "modelhost.video.id", created.json()["id"], 1, timeout=120)
    assert_linked_root(job, creator)
    assert attributes_of(job)["gen_ai.request.model"] == "t2v"
    assert job.status.code != Status.STATUS_CODE_ERROR
    child_of(receiver, child_of(receiver, job, "dispatch"), "generate")
