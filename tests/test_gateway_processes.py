"""Several gateway processes on one port (`modelhost serve --workers N`), sharing every replica.

The real `modelhost serve` runs here with 1 to 3 gateway processes, all started by the supervisor, which
serves no HTTP itself. Which process serves a request is made certain by SIGSTOP-ing the others: a stopped
process cannot accept, so the connection goes to the one left running (`Server.via`). Requests are held
in a replica the same way (its socket buffers them until SIGCONT), so what the replica then reads in
one go shows which requests meet in one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import itertools
import json
import os
import re
import signal
import socket
import sqlite3
import struct
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers import ADMIN_KEY, bearer, push_folder
from tests.hostile import gbnf_wide, lark_chain, nested_schema, ref_chain
from tests.remote_servers import RemoteServer, TestCA
from tests.server_process import (
    ST_RECIPE,
    Server,
    accepted,
    alive,
    descends_from,
    processes,
    server_with,
    stopped,
    until,
)

TEXTS = [f"request {i} is about " + " ".join(["cats", "dogs", "birds"][: 1 + i % 3]) for i in range(8)]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[RemoteServer]:
    """An HTTPS server with the tiny sentence-transformers model's files, to import from."""
    server = RemoteServer(TestCA(tmp_path_factory.mktemp("ca")))
    folder = recipes.joinpath(*ST_RECIPE)
    server.files |= {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    yield server
    server.gate.set()
    server.close()


@pytest.fixture(scope="module")
async def two(
    tmp_path_factory: pytest.TempPathFactory, recipes: Path, remote: RemoteServer
) -> AsyncIterator[tuple[Server, str]]:
    """Two gateway processes and a warm deployment of the tiny sentence-transformers recipe; imports
    from `remote` are trusted."""
    env = {
        "SSL_CERT_FILE": str(remote.ca.ca_file),
        "MODELHOST_MEDIA_ALLOW_NETWORKS": '["127.0.0.0/8"]',
        "MODELHOST_BATCH_POLL_SECONDS": "0.2",
        "MODELHOST_IMPORT_POLL_SECONDS": "0.2",
    }
    async with server_with(tmp_path_factory.mktemp("two"), 2, **env) as server:
        deployment_id = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "m", readiness="warm"
        )
        await server.ready(deployment_id)
        assert (await server.embed("warm up")).status_code == 200
        yield server, deployment_id


def reference(recipes: Path, texts: list[str]) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(recipes.joinpath(*ST_RECIPE)), device="cpu").encode(texts)


async def test_serve_runs_the_asked_number_of_gateway_processes_on_one_port(two: tuple[Server, str]) -> None:
    server, deployment_id = two
    first, second = server.gateways()
    assert first != second and server.supervisor not in (first, second)
    for pid in (first, second):  # each answers on the same port, live state included
        task = await server.via(pid, lambda: server.embed("hello"))
        assert (await task).status_code == 200
        assert await (await server.via(pid, lambda: server.state(deployment_id))) == "ready"
    assert len(server.replicas(deployment_id)) == 1  # one replica serves both


async def test_requests_from_two_gateway_processes_meet_in_one_batch_of_the_one_replica(
    two: tuple[Server, str], recipes: Path
) -> None:
    server, deployment_id = two
    first, second = server.gateways()
    [replica] = server.replicas(deployment_id)
    calls, carried = server.batches(deployment_id)
    with stopped(replica):  # what both send waits in its sockets
        one = [await server.via(first, lambda t=t: server.embed(t)) for t in TEXTS[:4]]
        other = [await server.via(second, lambda t=t: server.embed(t)) for t in TEXTS[4:]]
        await until(lambda: server.in_flight(deployment_id) == {first: 4.0, second: 4.0}, timeout=60)
    answers = await asyncio.gather(*one, *other)
    for answer, vector in zip(answers, reference(recipes, TEXTS), strict=True):
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["data"][0]["embedding"], vector, atol=1e-5)
    assert server.batches(deployment_id) == (calls + 1, carried + 8)  # one model call for all eight


async def test_a_killed_gateway_process_loses_only_its_own_requests_and_is_started_again(
    two: tuple[Server, str],
) -> None:
    server, deployment_id = two
    first, second = server.gateways()
    [replica] = server.replicas(deployment_id)
    calls, carried = server.batches(deployment_id)
    with stopped(replica):
        own = [await server.via(first, lambda t=t: server.embed(t)) for t in TEXTS[:3]]
        lost = [await server.via(second, lambda t=t: server.embed(t)) for t in TEXTS[3:6]]
        await until(lambda: server.in_flight(deployment_id) == {first: 3.0, second: 3.0}, timeout=60)
        os.kill(second, signal.SIGKILL)
        # Reaped: every thread has exited and its connections are closed before the replica reads.
        await until(lambda: not Path(f"/proc/{second}").exists())
    assert [(await task).status_code for task in own] == [200] * 3
    for task in lost:
        with pytest.raises(httpx.TransportError):
            await task
    assert server.batches(deployment_id) == (calls + 1, carried + 3)  # its requests never ran
    new = (await until(lambda: [p for p in server.gateways() if p not in (first, second)]))[0]
    await server.serving(new)
    task = await server.via(new, lambda: server.embed("after the restart"))
    assert (await task).status_code == 200


async def test_a_gateway_killed_by_sigsegv_mid_traffic_costs_only_its_own_requests(
    two: tuple[Server, str], remote: RemoteServer
) -> None:
    """A tenant's request that crashes its gateway process (SIGSEGV, as a native library's stack
    overflow does) costs that process's requests in flight and nothing else: the other gateway answers
    every request of its clients, the batch running (some of its lines in the dead gateway) and the
    import running (in the supervisor) finish, and the supervisor has the gateway back (within a minute here,
    whatever the machine's load; its restart time is printed)."""
    server, deployment_id = two
    first, second = server.gateways()
    [replica] = server.replicas(deployment_id)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=bearer(server.key)) as api:
        made = await api.post(
            "/v1/model-artifacts", json={"display_name": "i", "pipeline": "feature-extraction"}
        )
        artifact = made.json()
        files = [
            {"url": remote.url(path).replace("/files/", "/gated/"), "path": path} for path in remote.files
        ]
        started = await api.post(f"/v1/model-artifacts/{artifact['id']}/imports", json={"source": files})
        assert started.status_code == 202, started.text
        lines = [
            {
                "custom_id": f"line-{n}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "m", "input": t},
            }
            for n, t in enumerate(TEXTS * 3)
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        uploaded = await api.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
        batch = (
            await api.post(
                "/v1/batches",
                json={
                    "input_file_id": uploaded.json()["id"],
                    "endpoint": "/v1/embeddings",
                    "completion_window": "24h",
                },
            )
        ).json()
        with stopped(replica):  # every request, line included, waits in flight in the gateways
            survivors = [await server.via(second, lambda t=t: server.embed(t)) for t in TEXTS[:4]]
            doomed = [await server.via(first, lambda t=t: server.embed(t)) for t in TEXTS[4:6]]

            def both_hold_lines() -> bool:  # the batch's lines go to both gateways in turn
                held = server.in_flight(deployment_id)
                return held.get(first, 0) > 2 and held.get(second, 0) > 4

            await until(both_hold_lines)
            os.kill(first, signal.SIGSEGV)
            killed_at = time.monotonic()
            await until(lambda: not alive(first))
        remote.gate.set()  # the import's files arrive now
        assert [(await task).status_code for task in survivors] == [200] * 4
        for task in doomed:
            with pytest.raises(httpx.TransportError):
                await task
        # How soon it is back is a benchmark's figure (a loaded machine can take seconds to start a
        # process): here only that it comes back, within a bound no loaded machine misses.
        new = (await until(lambda: [p for p in server.gateways() if p not in (first, second)], timeout=60))[0]
        await until(lambda: probe_accepted(server, new), timeout=max(0.1, killed_at + 60 - time.monotonic()))
        back_in = time.monotonic() - killed_at
        print(f"\nthe killed gateway was serving again {back_in:.2f} s after the kill")

        async def ended(path: str, final: tuple[str, ...]) -> dict[str, Any]:
            for _ in range(600):
                view: dict[str, Any] = (await api.get(path)).json()
                if view["status"] in final:
                    return view
                await asyncio.sleep(0.1)
            raise AssertionError(view)

        done = await ended(f"/v1/batches/{batch['id']}", ("completed", "failed", "expired", "cancelled"))
        assert done["status"] == "completed" and done["request_counts"]["failed"] == 0, done
        output = (await api.get(f"/v1/files/{done['output_file_id']}/content")).text.splitlines()
        assert sorted(json.loads(line)["response"]["status_code"] for line in output) == [200] * len(lines)
        imported = await ended(
            f"/v1/model-artifacts/{artifact['id']}/imports/{started.json()['id']}",
            ("completed", "failed", "cancelled"),
        )
        assert imported["status"] == "completed", imported
    assert back_in < 60


def probe_accepted(server: Server, pid: int) -> bool:
    """Whether gateway process `pid` takes one of a few new connections (so it serves again)."""
    probes = [socket.create_connection(("127.0.0.1", server.process.port)) for _ in range(4)]
    try:
        time.sleep(0.05)
        return accepted(pid, server.process.port) > 0
    finally:
        for probe in probes:
            probe.close()


async def test_a_rollout_reaches_every_gateway_process_and_no_request_of_either_fails(
    two: tuple[Server, str], recipes: Path
) -> None:
    server, _ = two
    first, second = server.gateways()
    folder = recipes.joinpath(*ST_RECIPE)
    deployment_id = await server.deploy(folder, "feature-extraction", "r", readiness="warm")
    await server.ready(deployment_id)
    [old_replica] = server.replicas(deployment_id)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        old = (await client.get(f"/v1/deployments/{deployment_id}", headers=bearer(server.key))).json()
        new = (await push_folder(client, server.key, folder, "feature-extraction"))["artifact"]["id"]
        answers: list[httpx.Response] = []
        rolled = asyncio.Event()

        async def load() -> None:  # new connections each time: both processes take some
            while not rolled.is_set():
                answers.append(await server.embed("during the rollout", "r"))

        loading = [asyncio.create_task(load()) for _ in range(3)]
        patch = {"artifact_id": new}
        patched = await client.patch(
            f"/v1/deployments/{deployment_id}", json=patch, headers=bearer(server.key)
        )
        assert patched.status_code == 200, patched.text

        def only_new() -> bool:
            view = httpx.get(f"{server.url}/v1/deployments/{deployment_id}", headers=bearer(server.key))
            return [(v["artifact_id"], v["state"]) for v in view.json()["versions"]] == [(new, "active")]

        await until(only_new)
        rolled.set()
        await asyncio.gather(*loading)
    assert [a.status_code for a in answers] == [200] * len(answers)
    assert {a.headers["x-modelhost-artifact"] for a in answers} <= {old["artifact_id"], new}
    for pid in (first, second):  # each process now routes to the new version's replica
        answer = await (await server.via(pid, lambda: server.embed("after", "r")))
        assert answer.status_code == 200 and answer.headers["x-modelhost-artifact"] == new
    assert old_replica not in server.replicas(deployment_id) and len(server.replicas(deployment_id)) == 1


async def test_sigterm_drains_every_gateway_process_then_stops_everything(
    tmp_path: Path, recipes: Path
) -> None:
    async with server_with(tmp_path, 2) as server:
        deployment_id = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "m", readiness="warm"
        )
        await server.ready(deployment_id)
        [replica] = server.replicas(deployment_id)
        gateways = server.gateways()
        with stopped(replica):
            held = [await server.via(pid, lambda pid=pid: server.embed(f"via {pid}")) for pid in gateways]
            await until(lambda: sorted(server.in_flight(deployment_id).values()) == [1.0, 1.0])
            assert server.process.process is not None
            server.process.process.send_signal(signal.SIGTERM)
            await until(lambda: refused(server.process.port))  # none of them accepts any more
        assert [(await task).status_code for task in held] == [200, 200]  # both drained their request
        assert server.process.process.wait(30) in (0, -signal.SIGTERM)
        assert not any(alive(pid) for pid in [*gateways, replica])


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_with_three_gateway_processes_a_cold_deployment_loads_once_is_billed_once_and_jobs_run_once(
    tmp_path: Path, recipes: Path
) -> None:
    env = {"MODELHOST_BILLING_TICK_SECONDS": "0.2", "MODELHOST_VIDEO_POLL_SECONDS": "0.05"}
    async with server_with(tmp_path, 3, **env) as server:
        deployment_id = await server.deploy(recipes.joinpath(*ST_RECIPE), "feature-extraction", "m")
        assert await server.state(deployment_id) == "unloaded"
        first = [await server.via(pid, lambda: server.embed("first")) for pid in server.gateways()]
        assert [(await task).status_code for task in first] == [200] * 3
        assert len(server.replicas(deployment_id)) == 1
        assert server.sample("modelhost_cold_starts_total", deployment_id) == 1
        started = time.time()
        await asyncio.sleep(1.5)  # several billing ticks
        with sqlite3.connect(tmp_path / "db.sqlite") as db:
            meters = db.execute(
                "SELECT id, started_ms FROM meters WHERE kind = 'compute' AND deployment_id = ?",
                (deployment_id,),
            ).fetchall()
            assert len(meters) == 1  # one replica, one meter, whichever processes used it
            periods = db.execute(
                "SELECT period_start_ms, period_end_ms FROM ledger_entries WHERE meter_id = ? "
                "ORDER BY period_start_ms",
                (meters[0][0],),
            ).fetchall()
        assert len(periods) >= 3
        assert all(a[1] == b[0] for a, b in itertools.pairwise(periods))  # contiguous, no overlap
        billed_seconds = (periods[-1][1] - periods[0][0]) / 1000
        assert billed_seconds <= time.time() - meters[0][1] / 1000 + 0.5  # at most the wall time, once
        assert time.time() - started < 60

        folder = recipes / "t14_diffusers_text_to_video" / "text_to_video_sd"
        await server.deploy(folder, "text-to-video", "t2v", readiness="warm")
        job = {
            "model": "t2v",
            "prompt": "a cat",
            "seconds": "0.25",
            "size": "32x32",
            "num_inference_steps": 1,
        }

        async def create() -> str:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                created = await client.post("/v1/videos", json=job, headers=bearer(server.key))
                assert created.status_code == 200, created.text
                return str(created.json()["id"])

        video_ids = [await (await server.via(pid, create)) for pid in server.gateways()]

        def finished() -> list[tuple[str, int, str]]:
            with sqlite3.connect(tmp_path / "db.sqlite") as db:
                rows = db.execute("SELECT status, attempts, claimed_by FROM video_jobs").fetchall()
            return rows if all(status in ("completed", "failed") for status, _, _ in rows) else []

        rows = await until(finished, timeout=120)
        assert len(rows) == len(video_ids) == 3
        assert [(status, attempts) for status, attempts, _ in rows] == [("completed", 1)] * 3  # each once
        assert len({runner for _, _, runner in rows}) == 1  # all by the supervisor's runner


# ---------------------------------------------------------------- streams, runs and caches across processes


@pytest.fixture(scope="module")
async def chat_two(
    tmp_path_factory: pytest.TempPathFactory, recipes: Path
) -> AsyncIterator[tuple[Server, str]]:
    """Two gateway processes, a warm chat deployment, keys trusted for ten minutes once looked up. A KV
    cache of 2 MiB gives each replica of the 2048-token chat model three slots (0.5 MiB each), so that a
    few requests fill it (`test_a_replicas_fair_shares_count_the_requests_of_every_gateway_process`)."""
    from tests.chat_model import long_context_copy

    root = tmp_path_factory.mktemp("chat-two")
    env = {
        "MODELHOST_KEY_CACHE_SECONDS": "600",
        "MODELHOST_GRAMMAR_COMPILE_TIMEOUT_SECONDS": "300",
        "MODELHOST_KV_CACHE_MB": "2",
        "MODELHOST_RESPONSE_STALE_SECONDS": "4",  # a background response of a killed gateway: failed soon
    }
    async with server_with(root, 2, **env) as server:  # (a compile process is held stopped below)
        deployment_id = await server.deploy(
            long_context_copy(recipes, root), "text-generation", "chat", readiness="warm"
        )
        await server.ready(deployment_id)
        yield server, deployment_id


def generating(server: Server, deployment_id: str) -> float:
    return server.sample("modelhost_generation_sequences", deployment_id)


TOKENS = 1900  # about 2 s of this engine on a fast CPU: a stream stopped early computed fewer
LONG = {"max_tokens": TOKENS, "min_tokens": TOKENS, "temperature": 0}


async def test_a_chat_stream_through_another_gateway_process_stops_when_its_client_leaves(
    chat_two: tuple[Server, str],
) -> None:
    server, deployment_id = chat_two
    helper = server.gateways()[1]
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True, **LONG}
    chunks: list[str] = []
    three = asyncio.Event()

    async def stream() -> None:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(server.key)) as answer,
        ):
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    chunks.append(line)
                    if len(chunks) == 3:
                        three.set()
                        await asyncio.sleep(3600)  # the client stays, reading nothing more

    computed = server.sample("modelhost_generation_tokens_total", deployment_id)
    task = await server.via(helper, stream)
    await asyncio.wait_for(three.wait(), 60)
    await until(lambda: server.in_flight(deployment_id).get(helper) == 1.0, timeout=5)  # the helper holds it
    task.cancel()  # the client leaves
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await until(lambda: generating(server, deployment_id) == 0, timeout=15)
    assert 0 < server.sample("modelhost_generation_tokens_total", deployment_id) - computed < TOKENS


async def test_a_replicas_fair_shares_count_the_requests_of_every_gateway_process(
    chat_two: tuple[Server, str],
) -> None:
    """Issue 72: a generating replica's counters (`generation.fairness`) count every gateway process's
    requests. Key A's five requests, sent through both processes, take the replica's three slots and two
    wait; key B's one, sent after them through either, gets the first slot that frees (A's shortest
    ends first), ahead of A's two waiting ones: first come, first served would give it the third."""
    server, deployment_id = chat_two
    first, second = server.gateways()
    made = [
        httpx.post(f"{server.url}/v1/keys", json={"name": name}, headers=bearer(server.key), timeout=30)
        for name in ("heavy", "light")
    ]
    heavy, light = (m.json()["api_key"] for m in made)
    started: dict[str, float] = {}  # when each request's first token came

    async def stream(name: str, key: str, tokens: int) -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"job {name}"}],
            "stream": True,
            "max_tokens": tokens,
            "min_tokens": tokens,
            "temperature": 0,
        }
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(key)) as answer,
        ):
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                if name in started or not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    started[name] = time.monotonic()

    tasks = []
    lengths = {"a1": 1200, "a2": 1600, "a3": 1900, "a4": 100, "a5": 100}  # a1 still runs when b comes
    for index, (name, tokens) in enumerate(lengths.items()):
        request = functools.partial(stream, name, heavy, tokens)
        tasks.append(await server.via((first, second)[index % 2], request))
        await until(
            lambda count=index + 1: sum(server.in_flight(deployment_id).values()) >= count, timeout=30
        )
    await until(lambda: {"a1", "a2", "a3"} <= started.keys(), timeout=60)  # running; a4 and a5 wait
    tasks.append(await server.via(second, functools.partial(stream, "b", light, 4)))
    await asyncio.gather(*tasks)
    assert started["b"] < started["a4"] < started["a5"], started


async def test_a_conversation_made_through_one_gateway_process_is_continued_through_the_other(
    chat_two: tuple[Server, str],
) -> None:
    server, _ = chat_two
    first, second = server.gateways()

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Callable[[], Awaitable[Any]]:
        async def request() -> httpx.Response:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await client.request(method, path, json=body, headers=bearer(server.key))

        return request

    made = await (await server.via(first, call("POST", "/v1/conversations", {"items": [TURN]})))
    conversation = made.json()["id"]
    turn = {"model": "chat", "conversation": conversation, "input": "and you?", "max_output_tokens": 2}
    answer = await (await server.via(second, call("POST", "/v1/responses", turn)))
    assert answer.status_code == 200, answer.text
    listed = await (await server.via(first, call("GET", f"/v1/conversations/{conversation}/items?order=asc")))
    ids, output = (
        [item["id"] for item in listed.json()["data"]],
        [item["id"] for item in answer.json()["output"]],
    )
    assert len(ids) == 2 + len(output) and ids[2:] == output  # the first item, this input, its output


TURN = {"role": "user", "content": "hello"}


async def _events(
    server: Server, method: str, path: str, body: dict[str, Any] | None = None, count: int | None = None
) -> list[dict[str, Any]]:
    """A Responses stream's events: `count` of them (then the client leaves), or all until it closes."""
    events: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        client.stream(method, path, json=body, headers=bearer(server.key)) as answer,
    ):
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == count:
                    break
    return events


async def test_a_background_response_whose_gateway_process_is_killed_is_taken_over_and_loses_nothing(
    chat_two: tuple[Server, str],
) -> None:
    """Issue 73: the events of a background response generated in the first process are replayed and
    followed live through the second. The first is SIGKILLed mid-answer; once the stale window (4 s) has
    passed, another process takes the response over and goes on from its written events. The client that
    resumes through the second with its last sequence number gets the rest, numbered without a gap or a
    repeat; the answer is the undisturbed greedy one, each token counted once."""
    server, deployment_id = chat_two
    first, second = server.gateways()
    [replica] = server.replicas(deployment_id)
    body = {"model": "chat", "input": "hi", "background": True, "stream": True, "temperature": 0}
    body |= {"max_output_tokens": TOKENS, "min_tokens": TOKENS}
    made = await (await server.via(first, lambda: _events(server, "POST", "/v1/responses", body, count=8)))
    response_id = made[0]["response"]["id"]
    path = f"/v1/responses/{response_id}?stream=true&starting_after="
    with stopped(replica):  # held where it is: what the first process saw is written, no more comes
        replayed = await (await server.via(second, lambda: _events(server, "GET", path + "3", count=4)))
    assert replayed == made[4:8]
    live = await (await server.via(second, lambda: _events(server, "GET", path + "7", count=20)))
    assert [e["sequence_number"] for e in live] == list(range(8, 28))
    assert all(e["type"] == "response.output_text.delta" for e in live[-10:])  # generated meanwhile
    other = {**body, "input": "hello"}  # taken over too, then cancelled and deleted
    begun = await (await server.via(first, lambda: _events(server, "POST", "/v1/responses", other, count=8)))
    cancelled = begun[0]["response"]["id"]
    written = f"/v1/responses/{cancelled}?stream=true"
    with stopped(replica):  # killed mid-answer, once the second reads its first events from the database
        assert await (await server.via(second, lambda: _events(server, "GET", written, count=8))) == begun
        os.kill(first, signal.SIGKILL)
        await until(lambda: not Path(f"/proc/{first}").exists())
    started = time.monotonic()
    taken = rf'modelhost_generations_migrated_total{{deployment="{deployment_id}",reason="taken_over"}} (\S+)'
    await until(lambda: [float(n) for n in re.findall(taken, server.metrics())] == [2.0], timeout=30)
    # both taken over: the second is cancelled once its taker has written an event of its own
    await (await server.via(second, lambda: _events(server, "GET", written + "&starting_after=7", count=1)))
    with stopped(replica):
        stop = await (
            await server.via(second, lambda: _post(server, f"/v1/responses/{cancelled}/cancel", {}))
        )
    assert stop["status"] == "cancelled"
    rest = await (await server.via(second, lambda: _events(server, "GET", path + "27")))
    assert time.monotonic() - started < 40  # the stale window, a poll, and the rest of the answer
    assert [e["sequence_number"] for e in rest] == list(range(28, 28 + len(rest)))
    final = rest[-1]["response"]
    assert rest[-1]["type"] == "response.incomplete" and final["status"] == "incomplete"  # all its tokens
    whole = await (
        await server.via(second, lambda: _events(server, "GET", f"/v1/responses/{response_id}?stream=true"))
    )
    assert [e["sequence_number"] for e in whole] == list(range(len(whole))) and whole[28:] == rest
    assert whole[8:28] == live
    [message] = final["output"]
    text = message["content"][0]["text"]
    assert "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta") == text
    assert [e["item"]["id"] for e in whole if e["type"] == "response.output_item.added"] == [message["id"]]
    undisturbed = await (
        await server.via(
            second, lambda: _post(server, "/v1/responses", {**body, "background": False, "stream": False})
        )
    )
    assert text == undisturbed["output"][0]["content"][0]["text"]  # byte-identical
    counted = ("input_tokens", "output_tokens", "total_tokens")  # (the second's prompt was cached)
    assert [final["usage"][k] for k in counted] == [undisturbed["usage"][k] for k in counted]
    assert final["usage"]["output_tokens"] == TOKENS
    path = f"/v1/responses/{cancelled}?stream=true"
    ended = await (await server.via(second, lambda: _events(server, "GET", path)))
    assert [e["sequence_number"] for e in ended] == list(range(len(ended))) and len(ended) > 8
    assert all(e["type"] not in ("response.completed", "response.incomplete") for e in ended)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=bearer(server.key)) as client:
        assert (await client.delete(f"/v1/responses/{cancelled}")).status_code == 200
        assert (await client.get(f"/v1/responses/{cancelled}")).status_code == 404
    new = (await until(lambda: [p for p in server.gateways() if p not in (first, second)]))[0]
    await server.serving(new)  # for the tests after this one


async def _post(server: Server, path: str, body: dict[str, Any]) -> Any:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        answer = await client.post(path, json=body, headers=bearer(server.key))
        assert answer.status_code == 200, answer.text
        return answer.json()


async def test_a_prompt_cache_key_reaches_the_replica_that_holds_its_prefix_from_either_gateway_process(
    chat_two: tuple[Server, str], recipes: Path, tmp_path: Path
) -> None:
    """Two replicas; a long generation holds the prefix's replica busy in the first gateway process,
    where least-in-flight would send the next requests to the other replica (and compute the prefix
    again): routed by the caller's `prompt_cache_key`, each request of either process finds it cached
    (docs/runtime.md, "Routing")."""
    from tests.chat_model import long_context_copy

    server, _ = chat_two
    pair = {"readiness": "warm", "min_replicas": 2, "max_replicas": 2}
    folder = long_context_copy(recipes, tmp_path)
    deployment_id = await server.deploy(folder, "text-generation", "pair", **pair)
    await server.ready(deployment_id)
    await until(lambda: len(server.replicas(deployment_id)) == 2, timeout=60)
    system = "You answer questions about the tide tables of the port of Bergen, in one line. " * 6
    first, second = server.gateways()

    async def ask(question: str, **extra: Any) -> dict[str, Any]:
        body = {
            "model": "pair",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 2,
            "prompt_cache_key": "bergen-tides",
            **extra,
        }
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            answer = await client.post("/v1/chat/completions", json=body, headers=bearer(server.key))
            assert answer.status_code == 200, answer.text
            usage: dict[str, Any] = answer.json()["usage"]
            return usage

    prompt = (await (await server.via(first, lambda: ask("high tide?"))))["prompt_tokens"]
    long = await server.via(first, lambda: ask("tell me everything", max_tokens=1200, min_tokens=1200))
    await until(lambda: server.in_flight(deployment_id).get(first) == 1.0, timeout=10)
    cached = []
    for index, pid in enumerate((first, second, first, second)):
        usage = await (await server.via(pid, lambda question=f"low tide, {index}?": ask(question)))
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert not long.done()  # each was routed while the long one held its replica
    assert all(c > prompt // 2 for c in cached), (prompt, cached)
    await long


async def test_a_replica_added_while_loaded_joins_every_gateway_process(
    chat_two: tuple[Server, str], recipes: Path, tmp_path: Path
) -> None:
    """The helper process reached the deployment's one replica; the deployment then grows to two (its
    `min_replicas` raised, as autoscaling adds one): the helper's next streams reach both (the second is
    connected there too), which the replicas' own KV-cache gauges, one series per replica process, show."""
    from tests.chat_model import long_context_copy

    server, _ = chat_two
    helper = server.gateways()[1]
    grow = {"readiness": "warm", "min_replicas": 1, "max_replicas": 2}
    deployment_id = await server.deploy(
        long_context_copy(recipes, tmp_path), "text-generation", "grow", **grow
    )
    await server.ready(deployment_id)
    body = {"model": "grow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def ask(extra: dict[str, Any]) -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            answer = await client.post(
                "/v1/chat/completions", json={**body, **extra}, headers=bearer(server.key)
            )
            assert answer.status_code == 200, answer.text

    await (await server.via(helper, lambda: ask({})))  # the helper connects to the one replica
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        patched = await client.patch(
            f"/v1/deployments/{deployment_id}", json={"min_replicas": 2}, headers=bearer(server.key)
        )
        assert patched.status_code == 200, patched.text
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        view = f"/v1/deployments/{deployment_id}"
        deadline = time.monotonic() + 120
        while (await client.get(view, headers=bearer(server.key))).json()["replicas"] < 2:
            assert time.monotonic() < deadline  # the second replica loaded (its address published)
            await asyncio.sleep(0.2)
    long = {"max_tokens": 1200, "min_tokens": 1200, "temperature": 0}
    streams = [await server.via(helper, lambda: ask(long)) for _ in range(4)]

    def busy_replicas() -> int:
        pattern = f'modelhost_kv_cache_usage_ratio{{deployment="{deployment_id}",pid="'
        values = [
            line.rsplit(" ", 1)[1] for line in server.metrics().splitlines() if line.startswith(pattern)
        ]
        return sum(float(v) > 0 for v in values)

    await until(lambda: busy_replicas() == 2, timeout=30)  # least busy past the bound: both replicas
    for stream in streams:
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stream


async def test_an_agent_run_accepted_by_another_gateway_process_runs_in_the_supervisor_and_delete_stops_it(
    chat_two: tuple[Server, str],
) -> None:
    server, deployment_id = chat_two
    helper = server.gateways()[1]

    async def call(method: str, path: str, body: Any = None) -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await client.request(method, path, json=body, headers=bearer(server.key))

    agent = (
        await call("POST", "/v1/agent", {"name": "a", "model": "chat", "instructions": "Be brief."})
    ).json()
    computed = server.sample("modelhost_generation_tokens_total", deployment_id)
    created = await (
        await server.via(
            helper, lambda: call("POST", f"/v1/agent/{agent['id']}/runs", {"input": "hi", **LONG})
        )
    )
    assert created.status_code == 200, created.text
    run_id = created.json()["id"]
    await until(lambda: generating(server, deployment_id) == 1, timeout=60)
    # the supervisor generates it (a gateway publishes its in-flight gauge every 50 ms, not per request)
    await until(lambda: server.in_flight(deployment_id).get(server.supervisor) == 1.0, timeout=5)
    deleted = await (
        await server.via(helper, lambda: call("DELETE", f"/v1/agent/{agent['id']}/runs/{run_id}"))
    )
    assert deleted.status_code == 200, deleted.text
    # stopped (the worker writes its gauge to its metrics file on its next step: under load, a moment later)
    await until(lambda: generating(server, deployment_id) == 0, timeout=5)
    assert 0 < server.sample("modelhost_generation_tokens_total", deployment_id) - computed < TOKENS
    assert (await call("GET", f"/v1/agent/{agent['id']}/runs/{run_id}")).status_code == 404


async def test_an_eval_run_pinned_to_a_version_runs_its_samples_in_the_gateway_processes(
    chat_two: tuple[Server, str],
) -> None:
    """An eval run created through another gateway process is graded by the supervisor's eval runner,
    each sample a batch line on the version it names (`RunLine.pinned`), run in a gateway process."""
    server, deployment_id = chat_two
    helper = server.gateways()[1]

    async def call(method: str, path: str, body: Any = None) -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await client.request(method, path, json=body, headers=bearer(server.key))

    version = (await call("GET", f"/v1/deployments/{deployment_id}")).json()["artifact_id"]
    check = {"type": "string_check", "name": "nonempty", "input": "{{sample.output_text}}", "reference": "",
             "operation": "ne"}  # fmt: skip
    config = {"type": "custom", "item_schema": {"type": "object"}}
    made = (
        await call("POST", "/v1/evals", {"data_source_config": config, "testing_criteria": [check]})
    ).json()
    source = {
        "type": "completions", "model": "chat", "artifact_id": version,
        "input_messages": {"type": "template", "template": [{"role": "user", "content": "{{item.q}}"}]},
        "sampling_params": {"temperature": 0, "max_completion_tokens": 3, "seed": 1},
        "source": {"type": "file_content", "content": [{"item": {"q": "hi"}}, {"item": {"q": "hello"}}]},
    }  # fmt: skip
    runs = f"/v1/evals/{made['id']}/runs"
    created = await (await server.via(helper, lambda: call("POST", runs, {"data_source": source})))
    assert created.status_code == 200, created.text
    run_path = f"{runs}/{created.json()['id']}"

    deadline = time.monotonic() + 30
    while (run := (await call("GET", run_path)).json())["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, run
        await asyncio.sleep(0.1)
    assert run["status"] == "completed" and run["result_counts"] == {
        "total": 2,
        "passed": 2,
        "failed": 0,
        "errored": 0,
    }
    assert run["per_model_usage"][0]["completion_tokens"] == 6


async def test_a_key_revoked_through_one_gateway_process_is_refused_at_once_by_the_others(
    chat_two: tuple[Server, str],
) -> None:
    server, _ = chat_two
    for revoked_by, used_by in (server.gateways(), reversed(server.gateways())):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            made = await client.post("/v1/keys", json={"name": "short-lived"}, headers=bearer(server.key))
        key = made.json()
        assert await (await server.via(used_by, lambda k=key: _models(server, k["api_key"]))) == 200  # cached
        assert await (await server.via(revoked_by, lambda k=key: _revoke(server, k["id"]))) == 200
        # refused now, not when its cache entry expires ten minutes later
        assert await (await server.via(used_by, lambda k=key: _models(server, k["api_key"]))) == 401


async def test_a_person_disabled_or_demoted_through_one_gateway_process_is_bounded_at_once_by_the_others(
    chat_two: tuple[Server, str],
) -> None:
    """Keys are trusted for ten minutes here: the change reaches the other process by its announcement,
    not by the cache expiring."""
    server, _ = chat_two
    owner = bearer(server.key)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        person = (
            await client.post(
                "/v1/users", json={"email": "dev@example.com", "role": "developer"}, headers=owner
            )
        ).json()
        key = (await client.post("/v1/keys", json={"user_id": person["id"]}, headers=owner)).json()["api_key"]

    async def change(body: dict[str, Any]) -> int:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return (await client.patch(f"/v1/users/{person['id']}", json=body, headers=owner)).status_code

    changed_by, used_by = server.gateways()
    assert await (await server.via(used_by, lambda: _models(server, key))) == 200  # cached there
    assert await (await server.via(changed_by, lambda: change({"disabled": True}))) == 200
    assert await (await server.via(used_by, lambda: _models(server, key))) == 401
    assert await (await server.via(changed_by, lambda: change({"disabled": False, "role": "viewer"}))) == 200
    assert await (await server.via(used_by, lambda: _models(server, key))) == 403  # a viewer calls no model


async def _models(server: Server, key: str) -> int:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        return (await client.get("/v1/models", headers=bearer(key))).status_code


async def _revoke(server: Server, key_id: str) -> int:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        return (await client.delete(f"/v1/keys/{key_id}", headers=bearer(server.key))).status_code


# ---------------------------------------------------------------- hostile grammars and schemas


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BOMB = ref_chain(3_000)  # overflowed llguidance's stack wherever it was compiled: gateway or replica
TOOL = {"type": "function", "function": {"name": "bomb", "parameters": BOMB}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "b", "schema": BOMB}}
TEXT = {"format": {"type": "json_schema", "name": "b", "schema": BOMB}}
ANY = {"tools": [{"name": "bomb", "input_schema": BOMB}], "tool_choice": {"type": "any"}}
RULES = lark_chain(2_886)  # 32,741 characters: under the 32,768 a grammar may have
BOMBS: list[tuple[str, dict[str, Any], str]] = [
    (
        "/v1/chat/completions",
        {**CHAT, "structured_outputs": {"grammar": RULES}},
        "structured_outputs.grammar",
    ),
    ("/v1/completions", {"model": "chat", "prompt": "hi", "guided_grammar": RULES}, "guided_grammar"),
    ("/v1/chat/completions", {**CHAT, "structured_outputs": {"json": BOMB}}, "structured_outputs.json"),
    ("/v1/chat/completions", {**CHAT, "response_format": SCHEMA}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "required"}, "tools"),
    ("/v1/responses", {"model": "chat", "input": "hi", "text": TEXT}, "text.format"),
    ("/v1/messages", {**CHAT, **ANY}, ""),  # Anthropic's error body: no param
]


async def test_a_grammar_or_schema_bomb_is_a_400_naming_its_field_and_bound_and_no_process_dies(
    chat_two: tuple[Server, str],
) -> None:
    """Each one killed the gateway process that checked it (SIGSEGV; the supervisor among them), or the
    replica it reached and the one it was sent to next. Now: a 400, from whichever gateway process
    takes it, every process the same after, and another account is answered."""
    server, deployment_id = chat_two
    gateways, replicas = server.gateways(), server.replicas(deployment_id)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=bearer(server.key)) as client:
        for path, body, param in BOMBS:
            answer = await client.post(path, json=body)
            assert answer.status_code == 400, (path, param, answer.text)
            error = answer.json()["error"]
            assert "; the limit is " in error["message"], error
            if param:  # (the Messages API answers Anthropic's error body, which has no param)
                assert error["param"] == param and error["code"] == "grammar_too_complex", error
        agent = await client.post(
            "/v1/agent", json={"name": "b", "model": "chat", "instructions": "-", "tools": [TOOL]}
        )
        runs = f"/v1/agent/{agent.json()['id']}/runs"
        run = (await client.post(runs, json={"input": "hi", "tool_choice": "required"})).json()
        failed = await until(lambda: _ended(server, f"{runs}/{run['id']}"), timeout=60)
        assert failed["status"] == "failed" and failed["error"]["code"] == "grammar_too_complex", failed
        # a schema nested 60 deep: fine, but making its grammar took 2^60 steps on the event loop
        nested = {"type": "json_schema", "json_schema": {"name": "n", "schema": nested_schema(60)}}
        assert (
            await client.post("/v1/chat/completions", json={**CHAT, "response_format": nested})
        ).status_code == 200
    assert server.gateways() == gateways and server.replicas(deployment_id) == replicas
    other = httpx.post(f"{server.url}/v1/admin/accounts", json={"name": "other"}, headers=bearer(ADMIN_KEY))
    assert httpx.get(f"{server.url}/v1/models", headers=bearer(other.json()["api_key"])).status_code == 200
    answered = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers=bearer(server.key), timeout=60
    )
    assert answered.status_code == 200, answered.text


def _ended(server: Server, path: str) -> dict[str, Any] | None:
    run: dict[str, Any] = httpx.get(f"{server.url}{path}", headers=bearer(server.key), timeout=10).json()
    return run if run["status"] not in ("queued", "in_progress") else None


def unread(pid: int) -> int:
    """Bytes waiting, unread, in the pipe that is process `pid`'s stdin."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])
    finally:
        os.close(fd)


async def test_a_grammar_is_compiled_off_the_event_loop_and_a_compile_process_killed_under_it_is_a_400(
    chat_two: tuple[Server, str],
) -> None:
    """A 32 KB GBNF grammar (llguidance's converter took seconds over one on the event loop, which
    served nothing else meanwhile) waits in the gateway process's stopped compile process: a request
    sent after it is answered first. Its compile process killed, it is a 400, and the next grammar
    gets a new one."""
    server, _ = chat_two
    helper = server.gateways()[1]

    async def post(path: str, body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=bearer(server.key)) as client:
            return await client.post(path, json=body)

    first = await (
        await server.via(helper, lambda: post("/v1/chat/completions", {**CHAT, "guided_regex": "[a-z]{3}"}))
    )
    assert first.status_code == 200, first.text
    (compiler,) = [p for p in processes("modelhost.generation.compile_sandbox") if descends_from(p, helper)]
    grammar = f"# {time.time_ns()}\n" + gbnf_wide(32_700)  # never seen before: not in the cache
    with stopped(compiler):
        held = await server.via(
            helper, lambda: post("/v1/chat/completions", {**CHAT, "structured_outputs": {"grammar": grammar}})
        )
        await until(lambda: unread(compiler) > 0 or held.done())  # its compile waits in the stopped process
        later = await (await server.via(helper, lambda: post("/tokenize", {"model": "chat", "prompt": "hi"})))
        assert later.status_code == 200 and not held.done()
        os.kill(compiler, signal.SIGKILL)
    refused = await held
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "structured_outputs.grammar" and error["code"] == "grammar_too_complex", error
    assert "compile process" in error["message"], error
    again = await (
        await server.via(
            helper, lambda: post("/v1/chat/completions", {**CHAT, "structured_outputs": {"grammar": grammar}})
        )
    )
    assert again.status_code == 200, again.text
    assert server.gateways()[1] == helper


# ---------------------------------------------------------------- how many processes


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (32, 8), (128, 8)])
def test_the_default_is_one_gateway_process_per_four_cores_between_one_and_eight(
    cores: int, workers: int
) -> None:
    from modelhost.server import default_workers

    assert default_workers(cores) == workers


def test_the_workers_setting_is_taken_unless_the_command_line_says_otherwise(tmp_path: Path) -> None:
    from modelhost.server import workers_for
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, "sqlite://", workers=3)
    assert (workers_for(settings, None), workers_for(settings, 5)) == (3, 5)


def test_ray_serve_replicas_are_served_by_one_gateway_process_per_server(tmp_path: Path) -> None:
    from modelhost.server import workers_for
    from tests.conftest import make_settings

    assert workers_for(make_settings(tmp_path, "sqlite://", runtime="ray"), None) == 1
    with pytest.raises(ValueError, match="several `modelhost serve`"):
        workers_for(make_settings(tmp_path, "sqlite://", runtime="ray"), 2)


async def test_a_gateway_at_rest_begins_its_drain_as_soon_as_it_is_asked() -> None:
    """A gateway process at rest wakes once a tick (not uvicorn's ten times a second); asking it to
    exit, from a signal's handler or another thread, wakes it at once, whatever the tick."""
    import uvicorn

    from modelhost.server.http import QuietServer

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return None

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = QuietServer(uvicorn.Config(app, lifespan="off", log_level="warning"))
    server.tick_seconds = 3600.0  # a wake that did not happen would wait an hour
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(setattr, server, "should_exit", True)
    await asyncio.wait_for(serving, 60)
    listener.close()
