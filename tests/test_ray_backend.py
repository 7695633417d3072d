"""The Ray Serve replica backend (`MODELHOST_RUNTIME=ray`) through the real gateway, on a local Ray cluster.

One Ray instance (2 CPUs) and one gateway serve the whole module: Ray's start-up takes seconds on a small
machine. The gateway has a cold embeddings deployment (the sentence-transformers recipe) and a warm chat
deployment (the tiny chat recipe), each one Ray Serve application whose replicas are Ray actors. Later
tests add deployments on the other engines (ONNX Runtime, vLLM: skipped where vLLM is not installed) and
one whose footprint no node can hold, each deleted again by its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import ray
from ray import serve
from sqlalchemy import select

from modelhost import tracing
from modelhost.api.app import create_app
from modelhost.billing.ledger import shared_meter_id
from modelhost.config import get_settings
from modelhost.container import Services
from modelhost.generation.contract import GenerationRequest, Sampling, Text
from modelhost.metrics import sample
from modelhost.runtime.capacity import MB, Footprint
from modelhost.runtime.memory import tree
from modelhost.runtime.supervisor.ray_backend import (
    RayServeReplica,
    actor_resources,
    gpu_share,
    no_room,
    running_definition,
)
from modelhost.store.models import LedgerEntry, Meter
from tests.chat_model import greedy_reference, long_context_copy
from tests.conftest import make_settings
from tests.helpers import assert_error, bearer, push_folder
from tests.otlp import Receiver, attributes_of, client_traceparent, exporting_to
from tests.recipes import GGUF_FOLDER
from tests.server_process import alive, processes
from tests.test_runtime import ST_RECIPE, Gateway, in_process, ok, until
from tests.tiny_models.gguf import EMBEDDING
from tests.vllm_setup import wait_for_vllm

# Ray 2.60 warns about its own deprecated fields (pydantic ones, and `metrics_interval_s`, which is still
# the only per-deployment way to shorten Serve's 10 s metrics period, see `ray_backend.autoscaling`).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")
MESSAGES: list[dict[str, str]] = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "what is the weather in berlin?"},
]
IDLE_SECONDS = 2.0  # the cold deployment's downscale delay
SETTINGS = {"runtime": "ray", "cold_idle_seconds": IDLE_SECONDS, "request_timeout_seconds": 90}


@dataclass
class Served:
    gw: Gateway
    root: Path  # the gateway's data directory
    database: str
    embeddings: str  # the cold embeddings deployment's ID
    chat: str  # the warm chat deployment's ID


@pytest.fixture(scope="module")
def ray_cluster(receiver: Receiver) -> Iterator[None]:
    # traced, for the test of the replicas' spans: the cluster's processes take the environment it
    # starts with; only requests that come with a `traceparent` are sampled
    with pytest.MonkeyPatch.context() as env:
        for name, value in exporting_to(receiver, "parentbased_always_off").items():
            env.setenv(name, value)
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        yield
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
async def served(
    ray_cluster: None, tmp_path_factory: pytest.TempPathFactory, recipes: Path
) -> AsyncIterator[Served]:
    root = tmp_path_factory.mktemp("ray")
    database, model = f"sqlite:///{root / 'db.sqlite'}", recipes.joinpath(*ST_RECIPE)
    async with in_process(root, database, model, **SETTINGS) as gw:
        embeddings = (await gw.deploy())["id"]
        pushed = await push_folder(gw.client, gw.key, long_context_copy(recipes, root), "text-generation")
        body = {"model": "chat", "artifact_id": pushed["artifact"]["id"], "readiness": "warm"}
        chat = ok(await gw.client.post("/v1/deployments", json=body, headers=bearer(gw.key)), 201)["id"]
        await until(lambda: gw.show(chat, "ready"), timeout=120)
        yield Served(gw, root, database, embeddings, chat)


@contextlib.asynccontextmanager
async def second_gateway(
    served: Served, **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Services]]:
    """Another gateway on the same database, files and Ray cluster (what a second machine would run),
    with settings of its own where `overrides` gives them."""
    settings = make_settings(served.root, served.database, worker_threads=1, **{**SETTINGS, **overrides})
    services = Services.build(settings)
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://second.test") as client:
        try:
            yield client, services
        finally:
            await services.manager.shutdown()
            services.close()


@pytest.fixture
def engine_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """`runtime.engine_choice` decides with the process's settings, read from the environment: what this test
    sets there (the suite turns ONNX Runtime and vLLM off, tests/__init__.py), read again."""
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def serve_replica_pids(app: str) -> list[int]:
    """PIDs of the application's live Serve replica actors, from the GCS actor table (no dashboard)."""
    from ray._private import state

    prefix = f"SERVE_REPLICA::{app}#"
    actors = state.actors(actor_state_name="ALIVE").values()
    return [int(actor["Pid"]) for actor in actors if str(actor.get("Name", "")).startswith(prefix)]


def replica_of(served: Served, deployment_id: str) -> RayServeReplica:
    replica = served.gw.runtime(deployment_id).replicas[0]
    assert isinstance(replica, RayServeReplica)
    return replica


def running(app: str) -> int:
    """Serve replicas of `app` running now (from Serve's own status)."""
    apps = serve.status().applications
    if app not in apps:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in apps[app].deployments.values())


async def engine_holds(handle: Any, sequences: int) -> bool:
    """Whether the chat replica's engine holds `sequences` sequences (asked through Serve)."""
    return bool(await handle.running.remote() == sequences)


async def chat(served: Served, **body: Any) -> httpx.Response:
    request = {"model": "chat", "messages": MESSAGES, "temperature": 0, **body}
    return await served.gw.client.post("/v1/chat/completions", json=request, headers=bearer(served.gw.key))


def test_serve_configs_built_on_many_threads_at_once_do_not_fail() -> None:
    """Every Serve config registers and unregisters a module for pickling by value in one process-wide
    set; on four threads at once, unpatched, some of them fail with "not registered for pickle by
    value" (it failed a cold deploy in CI). Importing the backend makes that registry count users."""
    from ray.serve.config import RequestRouterConfig

    errors: list[Exception] = []

    def build_configs() -> None:
        try:
            for _ in range(60):
                RequestRouterConfig()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build_configs) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_replica_declares_its_footprint_as_ray_memory_and_its_gpu_memory_as_a_share_of_a_gpu() -> None:
    assert actor_resources(Footprint(300 * MB), threads=2, largest_gpu=0) == {
        "num_cpus": 2,
        "memory": 300 * MB,
    }
    on_gpu = actor_resources(Footprint(600 * MB, 8 * 1024 * MB), threads=1, largest_gpu=80 * 1024 * MB)
    assert on_gpu == {"num_cpus": 1, "memory": 600 * MB, "num_gpus": 0.1}
    assert gpu_share(3 * MB, 80 * 1024 * MB) == 0.0001  # rounded up to Ray's resolution, never to 0
    assert gpu_share(100 * 1024 * MB, 80 * 1024 * MB) == 1.0  # more than the largest GPU: a whole one
    assert gpu_share(8 * 1024 * MB, 0) == 1.0  # the GPUs' memory unknown: a whole one
    assert actor_resources(None, threads=1, largest_gpu=0) == {"num_cpus": 1}  # never placed: CPUs only


def test_a_footprint_that_no_alive_node_can_hold_is_refused_naming_the_largest_node() -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 4.0, "memory": 8192.0 * MB}},
        {"Alive": True, "Resources": {"CPU": 4.0, "memory": 4096.0 * MB, "GPU": 1.0}},
        {"Alive": False, "Resources": {"CPU": 64.0, "memory": 65536.0 * MB, "GPU": 8.0}},  # gone
    ]
    assert no_room({"num_cpus": 1, "memory": 8192 * MB}, nodes) is None
    assert no_room({"num_cpus": 1, "memory": 4096 * MB, "num_gpus": 0.5}, nodes) is None
    assert no_room({"num_cpus": 1, "memory": 9000 * MB}, nodes) == (
        "no node of the Ray cluster can hold its footprint: it needs 9000 MiB of memory, "
        "the largest node has 8192 MiB"
    )
    assert no_room({"num_cpus": 1, "memory": 5000 * MB, "num_gpus": 0.5}, nodes) == (
        "no node of the Ray cluster can hold its footprint: it needs 5000 MiB of memory and 0.5 of a GPU, "
        "and no node with that much memory has a GPU"
    )


async def test_embeddings_equal_sentence_transformers_and_a_cold_deployment_starts_from_zero(
    served: Served, recipes: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    assert running(served.embeddings) == 0  # cold: no Serve application before the first request
    texts = ["cats sit on mats", "dogs chase cats", "the quick brown fox"]
    answers = await asyncio.gather(*(served.gw.embed(text) for text in texts))
    expected = SentenceTransformer(str(recipes.joinpath(*ST_RECIPE)), device="cpu").encode(texts)
    for answer, vector in zip(answers, expected, strict=True):
        np.testing.assert_allclose(ok(answer)["data"][0]["embedding"], vector, atol=1e-5)
    assert running(served.embeddings) == 1
    # the view counts the replicas that have reported their footprint (read every REFRESH_SECONDS)
    assert await until(lambda: replica_of(served, served.embeddings).stats().memory_bytes > 0, timeout=10)
    view = await served.gw.show(served.embeddings)
    assert (view["state"], view["replicas"]) == ("ready", 1), view


async def test_chat_greedy_output_equals_the_model_and_streaming_gives_the_same_text(
    served: Served, recipes: Path
) -> None:
    expected = greedy_reference(recipes, MESSAGES, 12)  # what the local backend's test checks too
    whole = ok(await chat(served, max_tokens=12, min_tokens=12))
    assert whole["choices"][0]["message"]["content"] == expected
    assert whole["usage"]["completion_tokens"] == 12
    streamed = await chat(served, max_tokens=12, min_tokens=12, stream=True)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == expected


async def test_serve_replicas_reserve_their_placed_footprint_as_ray_memory(served: Served) -> None:
    """Ray places replicas by the memory they declare: the warm chat replica holds its footprint of the
    cluster's `memory` resource while it runs."""
    reservation = served.gw.runtime(served.chat).reservation
    assert reservation is not None and reservation.spec.footprint is not None
    footprint = reservation.spec.footprint
    assert footprint.host > 0 and footprint.gpu == 0  # no GPU here: no `num_gpus` asked
    assert replica_of(served, served.chat).actor_options == {"num_cpus": 1, "memory": footprint.host}
    definition = running_definition(served.chat)  # what Serve runs the replicas with
    assert definition is not None and definition[1]["memory"] == footprint.host
    assert running(served.chat) == 1
    held = ray.cluster_resources()["memory"] - ray.available_resources().get("memory", 0)
    assert held >= footprint.host


async def test_tokens_per_minute_count_the_prompt_and_completion_of_chat_on_serve_replicas(
    served: Served,
) -> None:
    """Rate limits count tokens in the gateway, whichever backend runs the replica (docs/limits.md)."""
    usage = ok(await chat(served, max_tokens=4, min_tokens=4))["usage"]
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    limit = tokens + tokens // 2  # one answer, then half of one: below zero after the second
    made = await served.gw.client.post(
        "/v1/keys", json={"limits": {"tokens_per_minute": limit}}, headers=bearer(served.gw.key)
    )
    key = ok(made, 201)["api_key"]
    request = {"model": "chat", "messages": MESSAGES, "temperature": 0, "max_tokens": 4, "min_tokens": 4}
    first = await served.gw.client.post("/v1/chat/completions", json=request, headers=bearer(key))
    assert ok(first)["usage"]["total_tokens"] == tokens
    assert first.headers["x-ratelimit-remaining-tokens"] == str(limit)
    streamed = await served.gw.client.post(
        "/v1/chat/completions", json={**request, "stream": True}, headers=bearer(key)
    )
    assert streamed.status_code == 200 and int(streamed.headers["x-ratelimit-remaining-tokens"]) < tokens
    third = await served.gw.client.post("/v1/chat/completions", json=request, headers=bearer(key))
    assert_error(third, 429, code="rate_limit_exceeded")
    assert third.json()["error"]["type"] == "tokens"


async def test_closing_a_generation_cancels_it_in_the_serve_replica(served: Served) -> None:
    assert served.gw.services is not None
    tokens = 1900  # about 2 s of this engine on a fast CPU: a generation cancelled in time computes fewer
    item = GenerationRequest(
        prompt="tell me a story", params=Sampling(max_tokens=tokens, min_tokens=tokens, temperature=0)
    )
    handle = serve.get_app_handle(served.chat)
    computed = _tokens_computed(served.chat)
    async with contextlib.aclosing(served.gw.services.runtime.stream(served.chat, item)) as events:
        for _ in range(3):
            await anext(events)
    assert await until(lambda: engine_holds(handle, 0), timeout=15)
    assert 0 < _tokens_computed(served.chat) - computed < tokens


def _tokens_computed(deployment_id: str) -> float:
    """The deployment's `modelhost_generation_tokens_total`: Serve's replicas write to this process's
    metrics folder (they inherit its environment)."""
    return sample("modelhost_generation_tokens_total", {"deployment": deployment_id}) or 0.0


async def test_a_replica_killed_mid_generation_moves_it_to_the_replica_serve_starts_again(
    served: Served,
) -> None:
    """Issue 73 on Ray Serve: the replica had begun it and sent tokens, so it goes on on the restarted
    replica from the tokens sent, counted once (one still waiting is simply sent again:
    tests/test_replica_host; one with no token yet is a 502: tests/test_faults)."""
    [pid] = serve_replica_pids(served.chat)
    item = GenerationRequest(
        prompt="tell me a story", params=Sampling(max_tokens=800, min_tokens=800, temperature=0)
    )
    texts: list[Text] = []
    async with contextlib.aclosing(served.gw.services.runtime.stream(served.chat, item)) as events:
        async for event in events:
            if isinstance(event, Text):
                texts.append(event)
                if len(texts) == 1:  # decoding: about a second more
                    os.kill(pid, signal.SIGKILL)
    assert (texts[-1].completion_tokens, texts[-1].finish) == (800, "length")
    ids = [t for event in texts for t in event.token_ids or []]
    assert len(ids) == 800  # none repeated, none missing
    assert pid not in serve_replica_pids(served.chat)
    answer = ok(await chat(served, max_tokens=4))  # waits in Serve's router for the restarted replica
    assert answer["usage"]["completion_tokens"] <= 4
    assert pid not in serve_replica_pids(served.chat)


async def test_serve_replicas_join_the_trace_of_the_request_they_serve(
    served: Served, receiver: Receiver
) -> None:
    assert tracing.start("gateway")  # the in-process gateway runs no lifespan, which would start it
    try:
        for body, path, replica_span in (
            ({"model": "m", "input": "a traced sentence"}, "/v1/embeddings", "replica"),
            (
                {"model": "chat", "messages": MESSAGES, "max_tokens": 3, "temperature": 0},
                "/v1/chat/completions",
                "generate",
            ),
        ):
            header, trace_id, _ = client_traceparent()
            headers = {**bearer(served.gw.key), "traceparent": header}
            ok(await asyncio.wait_for(served.gw.client.post(path, json=body, headers=headers), 120))
            spans = await asyncio.to_thread(receiver.wait_for, trace_id, {"dispatch", replica_span})
            resource, replica = spans[replica_span]
            assert resource["modelhost.process"] == "replica"  # a Serve replica's actor
            assert replica.parent_span_id == spans["dispatch"][1].span_id, path
            assert attributes_of(replica)["modelhost.deployment"]
    finally:
        tracing.stop()


async def test_a_cold_deployment_scales_to_zero_when_idle_and_from_zero_on_a_request(served: Served) -> None:
    if served.embeddings not in serve.status().applications:  # run alone: no request has loaded it yet
        ok(await served.gw.embed("load it"))
    await until(lambda: running(served.embeddings) == 0, timeout=60)  # Serve's downscale, not the reaper
    assert (await served.gw.show(served.embeddings))["state"] == "ready"  # the application stays
    answer = ok(await served.gw.embed("scaled from zero"))
    assert len(answer["data"][0]["embedding"]) == 32  # a replica started for it, from zero
    # no more than one (it may be idle again already: the idle window is 2 s, a busy machine's
    # status call can take that long)
    assert running(served.embeddings) <= 1


async def test_two_gateways_share_one_serve_application_billed_once_and_it_outlives_either(
    served: Served,
) -> None:
    gw, app = served.gw, served.chat
    assert gw.services is not None
    request = {"model": "chat", "messages": MESSAGES, "max_tokens": 2}
    pids = serve_replica_pids(app)
    async with second_gateway(served) as (client, second):
        ok(await client.post("/v1/chat/completions", json=request, headers=bearer(gw.key)))
        assert serve_replica_pids(app) == pids  # it deployed the same application: the replica carried on
        theirs = next(rt for rt in second.manager.tenants() if rt.spec.id == app)
        replicas = [replica_of(served, app), theirs.replicas[0]]
        for replica in replicas:  # both read the replica's own report, whichever node it runs on
            assert await until(lambda r=replica: r.stats().memory_bytes > 0, timeout=10)  # type: ignore[misc]
        for _ in range(2):
            for services in (gw.services, second):
                services.billing.meter.tick()
                await asyncio.sleep(0.05)
    with gw.services.database.transaction() as session:
        meters = session.scalars(select(Meter).where(Meter.deployment_id == app)).all()
        entries = session.scalars(
            select(LedgerEntry).where(LedgerEntry.deployment_id == app).order_by(LedgerEntry.period_start_ms)
        ).all()
    assert [(m.id, m.ended_ms) for m in meters] == [(shared_meter_id(f"serve:{app}"), None)]  # still open
    assert len(entries) >= 4 and all(e.bytes > 0 for e in entries)
    for before, after in itertools.pairwise(entries):  # every millisecond billed once, by either
        assert before.period_end_ms == after.period_start_ms
    assert serve_replica_pids(app) == pids  # the second gateway's exit left the application running
    ok(await chat(served, max_tokens=2))


async def test_every_gateway_sends_a_prompts_prefix_to_the_same_serve_replica(served: Served) -> None:
    """Serve's router in each gateway's handle ranks the actors by the prompt's affinity
    (`serve_router.AffinityRouter`): a system prompt first sent through one gateway is found in the KV
    cache of the replica that the other gateway sends it to, for every prompt (Serve's default router,
    random between two, would find about half of them)."""
    gw, app = served.gw, served.chat
    bounds = {"min_replicas": 2, "max_replicas": 2}
    ok(await gw.client.patch(f"/v1/deployments/{app}", json=bounds, headers=bearer(gw.key)))
    try:
        await until(lambda: running(app) == 2, timeout=300)  # a vLLM replica: 132 s once in CI's full run
        async with second_gateway(served) as (client, _):
            probes = itertools.count()

            async def both_handles_know_both_actors() -> bool:
                """Three fresh prompts through each gateway land on one actor each: the first gateway's
                handle has heard of the second actor from Serve's controller (a handle hears of new actors
                a moment after they run; until then it sends everything to the one it knows, and a prompt
                whose actor is that one agrees by chance, 1 in 2)."""
                for _ in range(3):
                    system = {"role": "system", "content": f"Probe {next(probes)} only. " * 40}
                    request = {"model": "chat", "messages": [system], "max_tokens": 1, "temperature": 0}
                    headers = bearer(gw.key)
                    ok(await gw.client.post("/v1/chat/completions", json=request, headers=headers))
                    again = ok(await client.post("/v1/chat/completions", json=request, headers=headers))
                    if not again["usage"]["prompt_tokens_details"]["cached_tokens"]:
                        return False
                return True

            await until(both_handles_know_both_actors, timeout=120)
            for city in ("berlin", "paris", "vienna", "madrid", "lisbon", "oslo"):
                system = {"role": "system", "content": f"You only talk about {city} and its rivers. " * 12}
                request = {
                    "model": "chat", "messages": [system, {"role": "user", "content": "hello"}],
                    "max_tokens": 1, "temperature": 0,
                }  # fmt: skip
                first = ok(await gw.client.post("/v1/chat/completions", json=request, headers=bearer(gw.key)))
                second = ok(await client.post("/v1/chat/completions", json=request, headers=bearer(gw.key)))
                prompt = first["usage"]["prompt_tokens"]
                assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt // 2, city  # new
                assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1, city
    finally:
        bounds = {"min_replicas": 1, "max_replicas": 1}
        ok(await gw.client.patch(f"/v1/deployments/{app}", json=bounds, headers=bearer(gw.key)))
        await until(lambda: running(app) == 1 and len(serve_replica_pids(app)) == 1, timeout=120)  # gone


async def test_patching_readiness_rescales_the_serve_application_in_place(served: Served) -> None:
    gw, app = served.gw, served.chat
    assert running(app) == 1  # warm: Serve keeps one replica however long it idles
    seen = set(serve_replica_pids(app))
    cold = {"readiness": "cold"}
    ok(await gw.client.patch(f"/v1/deployments/{app}", json=cold, headers=bearer(gw.key)))

    def scaled_to_zero() -> bool:  # no replica left in any state (starting, running, stopping)
        seen.update(serve_replica_pids(app))
        return not any(d.replica_states for d in serve.status().applications[app].deployments.values())

    await until(scaled_to_zero, timeout=60)  # the new `min_replicas: 0`
    assert len(seen) == 1  # applied in place: the replica was never restarted
    assert (await gw.show(app))["state"] == "ready"


async def test_an_encoder_on_onnxruntime_runs_it_in_its_serve_replica_with_torchs_embeddings(
    served: Served, recipes: Path, engine_settings: pytest.MonkeyPatch
) -> None:
    """The Serve replica chooses an encoder's runtime at load as a local worker does, with the export
    and the decision in the gateway's data folder, and the deployment shows what it chose."""
    from sentence_transformers import SentenceTransformer

    engine_settings.setenv("MODELHOST_ENCODER_RUNTIMES", "true")
    gw = served.gw
    body = {"model": "m-onnx", "artifact_id": gw.artifact_id, "engine": "onnxruntime"}
    created = ok(await gw.client.post("/v1/deployments", json=body, headers=bearer(gw.key)), 201)
    try:
        texts = ["cats sit on mats", "a longer sentence that pads the others in its batch", "dogs"]
        request = {"model": "m-onnx", "input": texts}
        answer = ok(await gw.client.post("/v1/embeddings", json=request, headers=bearer(gw.key)))
        expected = SentenceTransformer(str(recipes.joinpath(*ST_RECIPE)), device="cpu").encode(texts)
        vectors = np.array([row["embedding"] for row in answer["data"]])
        np.testing.assert_allclose(vectors, expected, atol=1e-4)
        view = await gw.show(created["id"])
        assert (view["state"], view["engine_in_use"]) == ("ready", "onnxruntime"), view
        assert replica_of(served, created["id"]).engine_choice is not None
        assert list((served.root / "data" / "encoder-runtimes").glob("*/model.onnx"))  # the data folder's
    finally:
        await gw.client.delete(f"/v1/deployments/{created['id']}", headers=bearer(gw.key))
    await until(lambda: created["id"] not in serve.status().applications, timeout=30)


async def test_a_footprint_no_node_can_hold_fails_the_load_with_that_reason_and_deploys_nothing(
    served: Served, recipes: Path
) -> None:
    """A KV cache larger than the cluster's largest node: the deployment fails at once with the reason,
    instead of a Serve replica pending until the load times out."""
    largest = max(int(node["Resources"].get("memory", 0)) for node in ray.nodes() if node["Alive"])
    kv_cache_mb = largest // MB + 1024
    async with second_gateway(served, kv_cache_mb=kv_cache_mb) as (client, _):
        pushed = await push_folder(
            client, served.gw.key, recipes / "t11_text_generation_chat", "text-generation"
        )
        body = {"model": "chat-huge", "artifact_id": pushed["artifact"]["id"]}
        created = ok(await client.post("/v1/deployments", json=body, headers=bearer(served.gw.key)), 201)
        request = {"model": "chat-huge", "messages": MESSAGES, "max_tokens": 2}
        answer = await client.post("/v1/chat/completions", json=request, headers=bearer(served.gw.key))
        assert_error(answer, 503, "deployment_unavailable")
        view = ok(await client.get(f"/v1/deployments/{created['id']}", headers=bearer(served.gw.key)))
        reason = view["state_reason"]
        assert view["state"] == "failed" and reason in answer.json()["error"]["message"], view
        needs = "no node of the Ray cluster can hold its footprint: it needs "
        assert reason.startswith(needs) and reason.endswith(f", the largest node has {largest // MB} MiB")
        assert int(reason.removeprefix(needs).split(" MiB")[0]) > kv_cache_mb  # the KV cache and the model
        assert created["id"] not in serve.status().applications  # nothing was deployed, nothing is pending
        await client.delete(f"/v1/deployments/{created['id']}", headers=bearer(served.gw.key))


async def test_an_embedding_gguf_answers_from_llamacpps_worker_in_its_serve_replica(
    served: Served, recipes: Path
) -> None:
    """The llama.cpp worker runs as the Serve actor's child, as vLLM's does, and answers the batch
    requests the actor forwards (`VllmServer.run_many`)."""
    client, key = served.gw.client, served.gw.key
    pushed = await push_folder(client, key, recipes / GGUF_FOLDER / EMBEDDING, "feature-extraction")
    body = {"model": "minilm-gguf", "artifact_id": pushed["artifact"]["id"], "readiness": "warm"}
    created = ok(await client.post("/v1/deployments", json=body, headers=bearer(key)), 201)
    assert created["engine_in_use"] == "llamacpp"
    try:
        assert await until(lambda: served.gw.show(created["id"], "ready"), timeout=120)
        request = {"model": "minilm-gguf", "input": ["cats sit on mats", "the quick brown fox"]}
        answer = ok(await client.post("/v1/embeddings", json=request, headers=bearer(key)))
        assert [len(item["embedding"]) for item in answer["data"]] == [384, 384]
        too_long = {"model": "minilm-gguf", "input": "word " * 600}
        assert_error(await client.post("/v1/embeddings", json=too_long, headers=bearer(key)), 400)
    finally:
        await client.delete(f"/v1/deployments/{created['id']}", headers=bearer(key))


async def test_a_vllm_deployment_answers_from_vllms_worker_which_lives_and_dies_with_its_serve_replica(
    served: Served, tmp_path: Path, engine_settings: pytest.MonkeyPatch
) -> None:
    """The Serve replica starts vLLM's replica worker as its child, under vLLM's own Python, and forwards
    generations to it. A worker that exits fails its requests with 503 and Serve replaces the replica; a
    replica killed takes its worker and vLLM's engine processes along; deleting the deployment too."""
    python, why = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {why}")
    from tests.tiny_models.chat import build_chat_for_vllm

    engine_settings.setenv("MODELHOST_VLLM_PYTHON", python)
    build_chat_for_vllm(tmp_path / "chat-vllm")
    key = served.gw.key
    # eager: vLLM's compiled mode adds about a minute to a first start (as in tests/test_vllm.py)
    async with second_gateway(served, kv_cache_mb=64, vllm_compile=False) as (client, _):
        pushed = await push_folder(client, key, tmp_path / "chat-vllm", "text-generation")
        body = {"model": "chat-vllm", "artifact_id": pushed["artifact"]["id"], "engine": "vllm"}
        created = ok(
            await client.post("/v1/deployments", json={**body, "readiness": "warm"}, headers=bearer(key)), 201
        )
        app = created["id"]
        request = {"model": "chat-vllm", "messages": MESSAGES, "max_tokens": 4, "min_tokens": 4}

        async def answers() -> bool:
            view = ok(await client.get(f"/v1/deployments/{app}", headers=bearer(key)))
            assert view["state"] != "failed", view
            answer = await client.post("/v1/chat/completions", json=request, headers=bearer(key))
            return answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4

        try:
            assert created["engine_in_use"] == "vllm"
            await until(answers, timeout=300)
            streamed = await client.post(
                "/v1/chat/completions", json={**request, "stream": True}, headers=bearer(key)
            )
            assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
            [worker] = vllm_workers(app)
            [actor] = serve_replica_pids(app)
            assert _parent(worker) == actor  # the Serve replica's own child
            assert Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")[0] == python.encode()

            os.kill(worker, signal.SIGKILL)  # the worker exits on its own (vLLM's engine died, say)
            await until(lambda: not alive(worker), timeout=10)
            failed = await client.post("/v1/chat/completions", json=request, headers=bearer(key))
            assert_error(failed, 503, "deployment_unavailable")
            old_actor = actor

            def replaced() -> bool:
                """Serve's health check replaced the replica, whose new worker started vLLM's engine
                (not waited for until it answers: the first start proved that, and a second costs ~40 s)."""
                actors = serve_replica_pids(app)
                workers = vllm_workers(app)
                return (
                    len(actors) == 1
                    and actors[0] != old_actor
                    and len(workers) == 1
                    and _parent(workers[0]) == actors[0]
                    and len(tree(workers[0])) > 1
                )

            await until(replaced, timeout=300)
            [worker] = vllm_workers(app)
            [actor] = serve_replica_pids(app)
            engine = tree(worker)  # the worker and vLLM's engine processes
            os.kill(actor, signal.SIGKILL)  # the replica dies: its worker and engine go with it
            await until(lambda: not any(alive(pid) for pid in engine), timeout=30)
        finally:
            await client.delete(f"/v1/deployments/{app}", headers=bearer(key))
    await until(lambda: not processes("modelhost.runtime.worker.vllm_worker", app), timeout=60)
    assert app not in serve.status().applications


def vllm_workers(app: str) -> list[int]:
    """The application's vLLM replica workers. A process vLLM forks (its engine) shows its worker's
    command line until it names itself: those, children of a worker, are not counted."""
    found = processes("modelhost.runtime.worker.vllm_worker", app)
    workers = []
    for pid in found:
        with contextlib.suppress(OSError):  # gone since it was listed
            if _parent(pid) not in found:
                workers.append(pid)
    return workers


def _parent(pid: int) -> int:
    """The parent of process `pid`, from /proc (its command name may hold spaces and parentheses)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_rollout_runs_the_new_version_as_a_serve_application_of_its_own_and_drops_the_old(
    served: Served, recipes: Path
) -> None:
    gw = served.gw
    first = await push_folder(gw.client, gw.key, recipes.joinpath(*ST_RECIPE), "feature-extraction")
    body = {"model": "roll", "artifact_id": first["artifact"]["id"], "readiness": "warm"}
    deployment_id = ok(await gw.client.post("/v1/deployments", json=body, headers=bearer(gw.key)), 201)["id"]
    await until(lambda: gw.show(deployment_id, "ready"), timeout=120)
    assert running(deployment_id) == 1
    pushed = await push_folder(gw.client, gw.key, recipes.joinpath(*ST_RECIPE), "feature-extraction")
    new = pushed["artifact"]["id"]
    patch = {"artifact_id": new, "strategy": "replace"}  # the module's Ray has 2 CPUs: chat and this one
    ok(await gw.client.patch(f"/v1/deployments/{deployment_id}", json=patch, headers=bearer(gw.key)))

    async def rolled() -> bool:
        view = await gw.show(deployment_id)
        return [(v["artifact_id"], v["state"]) for v in view["versions"]] == [(new, "active")]

    await until(rolled, timeout=120)
    assert running(f"{deployment_id}@{new}") == 1 and running(deployment_id) == 0  # the old one deleted
    request = {"model": "roll", "input": "cats sit on mats"}
    answer = await gw.client.post("/v1/embeddings", json=request, headers=bearer(gw.key))
    assert ok(answer) and answer.headers["x-modelhost-artifact"] == new
    ok(await gw.client.delete(f"/v1/deployments/{deployment_id}", headers=bearer(gw.key)))
    assert await until(lambda: running(f"{deployment_id}@{new}") == 0, timeout=30)


async def test_a_cold_deployment_that_cannot_start_again_from_zero_answers_503_and_shows_failed(
    served: Served,
) -> None:
    """Last in the module: it breaks the embeddings deployment's files."""
    gw, app = served.gw, served.embeddings
    if app not in serve.status().applications:  # run alone: no request has loaded it yet
        ok(await gw.embed("load it"))
    await until(lambda: running(app) == 0, timeout=60)
    shutil.rmtree(gw.runtime(app).spec.model_dir)  # the files are gone: no replica can load the model
    answer = await gw.client.post("/v1/embeddings", json={"model": "m", "input": "x"}, headers=bearer(gw.key))
    assert_error(answer, 503, "deployment_unavailable")  # not held until the 90 s request timeout
    # the reason, whether the request met the failed start or, sent once more, the load that followed
    assert "files are not on this node" in answer.json()["error"]["message"]
    view = await gw.show(app)
    assert view["state"] == "failed" and "files are not on this node" in view["state_reason"], view
    await until(lambda: app not in serve.status().applications, timeout=30)  # nothing left retrying
