"""Runtime: readiness levels, worker processes, batching, in-flight bounds, faults, shutdown, disconnects.

The tiny sentence-transformers recipe is served through the real path (push, deploy, `/v1/embeddings`).
Requests are held deterministically by SIGSTOP-ing the worker: they wait in its socket until SIGCONT,
when it reads everything that arrived at once. Loads take seconds, so tests that leave their
deployment healthy share one (module fixtures `served` and `tight`). The replica's own batching logic
is tested without processes in tests/test_replica_host.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from modelhost.api.app import create_app
from modelhost.cache import SingleFlight, TTLCache
from modelhost.config import Settings, get_settings
from modelhost.container import Services
from modelhost.metrics import sample
from modelhost.runtime.replica import ReplicaSpec
from modelhost.runtime.supervisor.launch import worker_launch
from modelhost.runtime.supervisor.manager import DeploymentRuntime
from modelhost.runtime.worker.spawn import sync_worker_env
from tests import live
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder
from tests.server_process import ServerProcess, alive, descends_from, processes, stat

Json = dict[str, Any]
LONG = "the quick brown fox jumps over the lazy dog and keeps running " * 2  # ~46 tokens (limit 64)
ST_RECIPE = ("t03_feature_extraction", "st")
Loaded = tuple["Gateway", str]
OpenGateway = Callable[..., Awaitable["Gateway"]]


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The runtime does not depend on the database kind; SQLite keeps these tests fast."""
    return sqlite_url


@pytest.fixture
def model_dir(recipes: Path) -> Path:
    return recipes.joinpath(*ST_RECIPE)


async def until(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; fail after `timeout`.

    The limits are generous: they only bound a failing test, and a loaded 2-core machine (the suite runs
    several test processes at once) can take tens of seconds to start a worker that loads a model."""
    deadline = time.monotonic() + timeout
    while not (result := await r if asyncio.iscoroutine(r := check()) else r):
        if time.monotonic() > deadline:
            pytest.fail(f"not true within {timeout}s: {check.__qualname__}")
        await asyncio.sleep(0.01)
    return result


def workers(marker: str) -> list[int]:
    """Live replica workers whose command line mentions `marker` (a deployment ID)."""
    return processes("modelhost.runtime.worker.sync_worker", marker)


def batches(deployment_id: str) -> tuple[float, float]:
    """(model calls, requests they carried) from the `modelhost_batch_size` histogram."""
    labels = {"deployment": deployment_id}
    count = sample("modelhost_batch_size_count", labels) or 0.0
    return count, sample("modelhost_batch_size_sum", labels) or 0.0


def ok(response: httpx.Response, status: int = 200) -> Json:
    assert response.status_code == status, response.text
    return dict(response.json())


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP a worker: what it was sent stays in flight until the block ends (SIGCONT)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@dataclass
class Gateway:
    """An account with the recipe model pushed, on a gateway reached through `client`."""

    client: httpx.AsyncClient
    services: Services | None
    account_id: str
    key: str
    artifact_id: str

    @classmethod
    async def prepare(cls, client: httpx.AsyncClient, services: Services | None, model: Path) -> Gateway:
        made = ok(await client.post("/v1/admin/accounts", json={"name": "a"}, headers=bearer(ADMIN_KEY)), 201)
        pushed = await push_folder(client, made["api_key"], model, "feature-extraction")
        assert pushed["artifact"]["status"] == "ready", pushed
        return cls(client, services, made["id"], made["api_key"], pushed["artifact"]["id"])

    async def deploy(self, **extra: Any) -> Json:
        body = {"model": "m", "artifact_id": self.artifact_id, **extra}
        return ok(await self.client.post("/v1/deployments", json=body, headers=bearer(self.key)), 201)

    async def show(self, deployment_id: str, state: str | None = None) -> Json:
        """The deployment's view; `{}` when `state` is given and it is in another one."""
        view = ok(await self.client.get(f"/v1/deployments/{deployment_id}", headers=bearer(self.key)))
        return view if state in (None, view["state"]) else {}

    async def embed(self, text: str) -> httpx.Response:
        body = {"model": "m", "input": text}
        request = self.client.post("/v1/embeddings", json=body, headers=bearer(self.key))
        return await asyncio.wait_for(request, 60)  # in-process transports have no timeout of their own

    def runtime(self, deployment_id: str) -> DeploymentRuntime:
        assert self.services is not None
        return next(rt for rt in self.services.manager.tenants() if rt.spec.id == deployment_id)

    def pid(self, deployment_id: str) -> int:
        pid = self.runtime(deployment_id).replicas[0].pid
        assert pid is not None
        return pid


async def loaded(gw: Gateway) -> str:
    """Deploy (cold) and load with one request; the deployment ID."""
    dep = await gw.deploy()
    ok(await gw.embed("warm up"))
    return str(dep["id"])


@contextlib.asynccontextmanager
async def in_process(root: Path, database_url: str, model: Path, **overrides: Any) -> AsyncIterator[Gateway]:
    """A gateway served through `httpx.ASGITransport`; its workers are stopped when the block ends."""
    services = Services.build(make_settings(root, database_url, worker_threads=1, **overrides))
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as client:
        await services.manager.start()  # what the app's lifespan does: hot loads, idle reaper
        try:
            yield await Gateway.prepare(client, services, model)
        finally:
            await services.manager.shutdown()
            services.close()


@pytest.fixture
async def gateway(tmp_path: Path, sqlite_url: str, model_dir: Path) -> AsyncIterator[OpenGateway]:
    """Opens an in-process gateway with settings overrides, closed at test end."""
    async with contextlib.AsyncExitStack() as stack:

        async def open_gateway(**overrides: Any) -> Gateway:
            return await stack.enter_async_context(in_process(tmp_path, sqlite_url, model_dir, **overrides))

        yield open_gateway


@pytest.fixture(scope="module")
async def tight(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> AsyncIterator[Loaded]:
    """In process, loaded: one request in flight at most, a 2 s request timeout."""
    root, model = tmp_path_factory.mktemp("tight"), recipes.joinpath(*ST_RECIPE)
    limits = {"max_queue_size": 1, "request_timeout_seconds": 2}
    async with in_process(root, f"sqlite:///{root / 'test.db'}", model, **limits) as gw:
        yield gw, await loaded(gw)


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> AsyncIterator[Loaded]:
    """A live server (real sockets), loaded; tests leave it healthy."""
    root, apps = tmp_path_factory.mktemp("live"), []

    def build(settings: Settings) -> Any:  # `live_server`'s app, kept to see its replicas
        apps.append(create_app(settings))
        return apps[-1]

    database = f"sqlite:///{root / 'test.db'}"
    settings = make_settings(root, database, worker_threads=1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(live, "create_app", build)
        with live.live_server(settings) as url:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                gw = await Gateway.prepare(client, apps[-1].state.services, recipes.joinpath(*ST_RECIPE))
                yield gw, await loaded(gw)


async def test_cold_deployment_loads_on_first_request_and_unloads_when_idle(gateway: OpenGateway) -> None:
    gw = await gateway(cold_idle_seconds=1)
    dep = await gw.deploy()
    assert (dep["readiness"], dep["state"], dep["replicas"]) == ("cold", "unloaded", 0)
    assert len(ok(await gw.embed("hello"))["data"][0]["embedding"]) == 32
    view = await gw.show(dep["id"])
    assert (view["state"], view["replicas"]) == ("ready", 1), view
    assert view["memory_gb"] > 0 and view["last_cold_start_seconds"] > 0, view
    pid = gw.pid(dep["id"])
    assert alive(pid)
    view = await until(lambda: gw.show(dep["id"], "unloaded"))
    assert (view["replicas"], view["memory_gb"]) == (0, 0), view
    await until(lambda: not alive(pid), timeout=30)


async def test_warm_deployment_starts_loading_at_creation_without_any_request(gateway: OpenGateway) -> None:
    gw = await gateway()
    dep = await gw.deploy(readiness="warm")
    assert dep["state"] in ("loading", "ready"), dep
    view = await until(lambda: gw.show(dep["id"], "ready"))
    assert view["replicas"] == 1
    assert batches(dep["id"]) == (0, 0)  # no request ran


async def test_patching_a_cold_deployment_to_warm_loads_it_without_a_restart(gateway: OpenGateway) -> None:
    gw = await gateway()
    dep = await gw.deploy()
    warm = {"readiness": "warm"}
    patched = ok(await gw.client.patch(f"/v1/deployments/{dep['id']}", json=warm, headers=bearer(gw.key)))
    assert (dep["state"], patched["readiness"]) == ("unloaded", "warm")
    assert patched["state"] in ("loading", "ready"), patched
    await until(lambda: gw.show(dep["id"], "ready"))
    assert batches(dep["id"]) == (0, 0)


async def test_hot_deployment_is_loaded_at_server_start_without_any_request(
    gateway: OpenGateway, tmp_path: Path, sqlite_url: str
) -> None:
    offline = await gateway()  # same data and database as the server started below
    dep = await offline.deploy()
    assert offline.services is not None  # marked hot in the store: nothing loads it before the start
    offline.services.deployments.update(offline.account_id, dep["id"], "hot", None, None)
    assert (await offline.show(dep["id"]))["state"] == "unloaded"
    with live.live_server(make_settings(tmp_path, sqlite_url, worker_threads=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            gw = Gateway(client, None, offline.account_id, offline.key, offline.artifact_id)
            view = await until(lambda: gw.show(dep["id"], "ready"))
            assert (view["readiness"], view["replicas"]) == ("hot", 1) and view["memory_gb"] > 0, view
            assert batches(dep["id"]) == (0, 0)  # loaded (and warmed up) by the start, not a request
            assert len(workers(dep["id"])) == 1


async def test_each_deployment_runs_in_a_separate_worker_process(served: Loaded) -> None:
    gw, deployment_id = served
    ok(await gw.embed("hello"))
    pid = gw.pid(deployment_id)
    assert pid != os.getpid() and alive(pid)
    assert descends_from(pid, os.getpid())  # started by this (gateway) process
    assert workers(deployment_id) == [pid]


async def test_health_answers_within_100ms_while_every_worker_is_busy(served: Loaded) -> None:
    gw, deployment_id = served
    url, runtime = str(gw.client.base_url).rstrip("/"), gw.runtime(deployment_id)
    # Three 2048-input requests keep the only worker computing for a second or so; base64 answers
    # keep this process's client threads light (they share the live server's GIL).
    body = orjson.dumps({"model": "m", "input": [LONG] * 2048, "encoding_format": "base64"})
    headers = {**bearer(gw.key), "Content-Type": "application/json"}

    def busy() -> int:
        return httpx.post(f"{url}/v1/embeddings", content=body, headers=headers, timeout=120).status_code

    times = []
    with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=url, timeout=30) as http:
        senders = [pool.submit(busy) for _ in range(3)]
        await until(lambda: runtime.replicas[0].in_flight > 0 or any(f.done() for f in senders))
        while not all(f.done() for f in senders):
            busy_before = runtime.replicas[0].in_flight > 0
            started = time.perf_counter()
            ok(http.get("/health"))
            took = time.perf_counter() - started
            if busy_before and runtime.replicas[0].in_flight > 0:
                times.append(took)
            time.sleep(0.005)
    assert [f.result() for f in senders] == [200] * 3
    assert len(times) >= 20, times  # samples taken while the worker had a batch
    # Nine in ten within 100 ms, none near the second a model call takes: a health check queued behind
    # the model would fail both; the tail allows for the other test processes sharing the cores.
    times.sort()
    assert times[int(len(times) * 0.9)] < 0.1 and times[-1] < 1.0, times[-5:]


async def test_concurrent_requests_are_batched_into_one_model_call_each_getting_its_own_answer(
    served: Loaded, model_dir: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    gw, deployment_id = served
    runtime = gw.runtime(deployment_id)
    topics = ["cats", "dogs", "birds", "fish"]
    texts = [f"request {i} is about " + " ".join(topics[: 1 + i % 4]) for i in range(16)]
    expected = SentenceTransformer(str(model_dir), device="cpu").encode(texts)  # each one alone
    assert min(np.linalg.norm(a - b) for i, a in enumerate(expected) for b in expected[i + 1 :]) > 1e-3
    calls, carried = batches(deployment_id)
    with stopped(gw.pid(deployment_id)):
        answers = asyncio.gather(*(gw.embed(text) for text in texts))
        await until(lambda: runtime.replicas[0].in_flight == 16)  # all sent, waiting in its socket
    for answer, vector in zip(await answers, expected, strict=True):
        assert answer.status_code == 200, answer.text
        data = answer.json()["data"]
        assert len(data) == 1 and data[0]["index"] == 0
        np.testing.assert_allclose(data[0]["embedding"], vector, atol=1e-5)
    assert batches(deployment_id) == (calls + 1, carried + 16)  # all 16 in one model call


async def test_a_request_beyond_the_in_flight_limit_answers_429_overloaded_with_retry_after(
    tight: Loaded,
) -> None:
    gw, deployment_id = tight  # max_queue_size=1: one request in flight per gateway process
    runtime = gw.runtime(deployment_id)
    with stopped(gw.pid(deployment_id)):
        waiting = asyncio.create_task(gw.embed("waiting"))
        await until(lambda: runtime.replicas[0].in_flight == 1)
        refused = await gw.embed("refused")
        assert_error(refused, 429, "overloaded")
        assert int(refused.headers["Retry-After"]) > 0
    ok(await waiting)
    ok(await gw.embed("room again"))


async def test_request_not_answered_within_the_timeout_gets_504(tight: Loaded) -> None:
    gw, deployment_id = tight  # request_timeout_seconds=2
    with stopped(gw.pid(deployment_id)):
        started = time.monotonic()
        assert_error(await gw.embed("too slow"), 504, "timeout")
        assert 2 <= time.monotonic() - started < 10
    ok(await gw.embed("on time"))


async def test_a_request_waiting_in_a_killed_worker_is_answered_by_the_replica_that_replaces_it(
    served: Loaded,
) -> None:
    """The worker is held (SIGSTOP) before it reads the request, so the model never saw it: it goes to
    the replacement (one of the batch the worker was running is not: tests/test_faults)."""
    gw, deployment_id = served
    runtime, old = gw.runtime(deployment_id), gw.pid(deployment_id)
    labels = {"deployment": deployment_id, "reason": "exited"}
    restarts = sample("modelhost_replica_restarts_total", labels) or 0
    with stopped(old):
        in_flight = asyncio.create_task(gw.embed("in flight"))
        await until(lambda: runtime.replicas[0].in_flight == 1)
        os.kill(old, signal.SIGKILL)
    ok(await in_flight)
    ok(await gw.embed("next"))
    view = await gw.show(deployment_id)
    assert (view["state"], view["replicas"]) == ("ready", 1), view
    new = gw.pid(deployment_id)
    assert new != old and alive(new) and not alive(old)
    assert sample("modelhost_replica_restarts_total", labels) == restarts + 1


async def test_a_worker_template_that_dies_takes_its_workers_along_and_a_new_one_serves_the_restart(
    served: Loaded,
) -> None:
    gw, deployment_id = served
    old = gw.pid(deployment_id)
    template = int(stat(old)[1])  # the worker was forked by the template, a child of this process
    assert (
        "-m modelhost.runtime.worker.template "
        in Path(f"/proc/{template}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    )
    assert int(stat(template)[1]) == os.getpid()
    os.kill(template, signal.SIGKILL)
    await until(lambda: not alive(old))  # PR_SET_PDEATHSIG: it dies with the template
    await until(lambda: gw.runtime(deployment_id).replicas and gw.pid(deployment_id) != old)
    ok(await gw.embed("after"))  # the replacement was forked by a new template
    new = gw.pid(deployment_id)
    assert alive(new) and int(stat(new)[1]) not in (template, os.getpid())


async def test_an_executed_worker_answers_exactly_as_a_forked_one(
    gateway: OpenGateway, served: Loaded
) -> None:
    forked, forked_deployment = served
    executed = await gateway(worker_preload=False)
    dep = await executed.deploy()
    answers = [ok(await gw.embed("same words")) for gw in (forked, executed)]
    assert answers[0]["data"] == answers[1]["data"]
    pid = executed.pid(dep["id"])
    assert int(stat(pid)[1]) == os.getpid()  # executed by this process itself, not the template
    assert workers(dep["id"]) == [pid]  # and `ps` shows both alike
    assert workers(forked_deployment) == [forked.pid(forked_deployment)]


def test_our_workers_openmp_threads_sleep_between_calls_unless_the_operator_says_otherwise(
    tmp_path: Path,
) -> None:
    # spinning after each parallel region, torch's threads burned the cores other tenants needed
    spec = ReplicaSpec("dep_x", "feature-extraction", tmp_path, 2, "cpu", engine="transformers")
    launch = worker_launch(spec, get_settings(), {"PATH": "/usr/bin"}, warmup=False)
    assert launch.command == () and launch.env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert launch.env["GOMP_SPINCOUNT"] == "10000"  # a bounded wait inside a forward pass
    own = worker_launch(spec, get_settings(), {"OMP_WAIT_POLICY": "ACTIVE"}, warmup=False)
    assert own.env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert sync_worker_env({})["OMP_WAIT_POLICY"] == "PASSIVE"  # the template's, which its forks keep


async def test_unloadable_model_marks_the_deployment_failed_and_answers_503(gateway: OpenGateway) -> None:
    gw = await gateway()
    dep = await gw.deploy()
    spec = gw.services.deployments.runtime_spec(dep["id"]) if gw.services else None
    assert spec is not None and (spec.model_dir / "model.safetensors").is_file()
    (spec.model_dir / "model.safetensors").unlink()  # replace, not rewrite: it may be read-only
    (spec.model_dir / "model.safetensors").write_bytes(b"these bytes are not a safetensors file")
    assert_error(await gw.embed("hello"), 503, "deployment_unavailable")
    view = await gw.show(dep["id"])
    assert (view["state"], view["replicas"]) == ("failed", 0), view
    assert isinstance(view["state_reason"], str) and view["state_reason"], view
    assert_error(await gw.embed("again"), 503, "deployment_unavailable")
    assert workers(dep["id"]) == []
    assert (await gw.client.get("/health")).status_code == 200


async def test_deleting_a_deployment_while_it_loads_stops_its_worker(gateway: OpenGateway) -> None:
    # an executed worker (no template to fork from) spends a second or more importing before it loads:
    # long enough to be deleted while loading
    gw = await gateway(worker_preload=False)
    dep = await gw.deploy(readiness="warm")
    try:
        await until(lambda: workers(dep["id"]))  # its worker process has started loading
        assert (await gw.show(dep["id"]))["state"] == "loading"
        ok(await gw.client.delete(f"/v1/deployments/{dep['id']}", headers=bearer(gw.key)))
        assert workers(dep["id"]) == []  # DELETE answers once its workers are gone
    finally:
        for pid in workers(dep["id"]):  # an orphan would outlive the test (started by this test)
            os.kill(pid, signal.SIGKILL)


OnServer = tuple[ServerProcess, str, str, int]


@pytest.fixture
async def on_server(tmp_path: Path, sqlite_url: str, model_dir: Path) -> AsyncIterator[OnServer]:
    """A `modelhost serve` process with a loaded deployment: (server, key, deployment ID, worker pid)."""
    server = ServerProcess(tmp_path / "data", sqlite_url, MODELHOST_WORKER_THREADS="1")
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            gw = await Gateway.prepare(client, None, model_dir)
            deployment_id = await loaded(gw)
        [pid] = workers(deployment_id)
        assert server.process is not None and descends_from(pid, server.process.pid)
        yield server, gw.key, deployment_id, pid
    finally:
        server.stop()


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_sigterm_drains_in_flight_work_then_exits_leaving_no_worker_behind(on_server: OnServer) -> None:
    server, key, deployment_id, pid = on_server
    assert server.process is not None
    body = {"model": "m", "input": "at SIGTERM"}
    queued = re.compile(rf'modelhost_requests_in_flight{{deployment="{deployment_id}",pid="\d+"}} 1.0')
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        with stopped(pid):
            in_flight = asyncio.create_task(client.post("/v1/embeddings", json=body, headers=bearer(key)))
            await until(lambda: queued.search(httpx.get(f"{server.url}/metrics").text))  # a gateway has it
            server.process.send_signal(signal.SIGTERM)
            await until(lambda: refused(server.port))  # shutdown has begun: no new connections
        ok(await in_flight)
    # uvicorn re-raises the signal once its graceful shutdown is done: "killed by SIGTERM" is clean.
    assert server.process.wait(30) in (0, -signal.SIGTERM)
    assert not alive(pid)  # stopped and reaped by the supervisor itself, before it exited
    assert workers(deployment_id) == []


async def test_gateway_killed_with_sigkill_takes_its_worker_down(on_server: OnServer) -> None:
    server, _, deployment_id, pid = on_server
    assert server.process is not None
    with stopped(pid):  # a stopped worker cannot notice anything: only PR_SET_PDEATHSIG's SIGKILL ends it
        os.kill(server.process.pid, signal.SIGKILL)  # the gateway alone, not its process group
        server.process.wait(10)
        await until(lambda: not alive(pid), timeout=30)
    assert workers(deployment_id) == []


async def test_client_disconnect_drops_its_queued_work_before_it_reaches_the_model(served: Loaded) -> None:
    gw, deployment_id = served  # a live server: the disconnect is a real socket close
    runtime = gw.runtime(deployment_id)
    calls, carried = batches(deployment_id)
    with stopped(gw.pid(deployment_id)):
        running = asyncio.create_task(gw.embed("running"))
        await until(lambda: runtime.replicas[0].in_flight == 1)
        async with httpx.AsyncClient(base_url=gw.client.base_url, timeout=120) as other:
            body = {"model": "m", "input": "abandoned"}
            abandoned = asyncio.create_task(other.post("/v1/embeddings", json=body, headers=bearer(gw.key)))
            await until(lambda: runtime.replicas[0].in_flight == 2)
            abandoned.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await abandoned
        await until(lambda: runtime.replicas[0].in_flight == 1, timeout=30)  # its `Cancel` is sent
    ok(await running)  # the replica read both and the cancel at once: "running" went alone
    ok(await gw.embed("last"))  # would have shared a batch with a leftover
    assert batches(deployment_id) == (calls + 2, carried + 2)


async def test_concurrent_cache_misses_of_one_key_share_one_load() -> None:
    calls: list[str] = []
    release = threading.Event()

    def load() -> str:
        calls.append("load")
        release.wait(5)
        return "principal"

    flight: SingleFlight[str] = SingleFlight()
    waiting = [asyncio.create_task(flight.load("key", load)) for _ in range(20)]
    await until(lambda: calls == ["load"])
    waiting[0].cancel()  # one caller giving up does not cancel the others' load
    release.set()
    results = await asyncio.gather(*waiting[1:])
    assert results == ["principal"] * 19 and calls == ["load"]
    assert await flight.load("key", lambda: "reloaded") == "reloaded"  # nothing cached by it


async def test_a_load_that_began_before_a_forget_is_neither_kept_nor_shared_with_later_misses() -> None:
    """A deployment changed (or a key revoked) while a request was reading the rows: the change forgets
    the cache entry after its commit, and the read that began before it may hold the old rows. It must
    not put them back for the TTL, nor answer the requests that arrive after the change."""
    cache: TTLCache[str] = TTLCache(ttl=60, max_entries=10)
    flight: SingleFlight[str] = SingleFlight(lambda: cache.generation)
    rows = ["old"]
    reading, release = threading.Event(), threading.Event()

    def slow_read() -> str | None:
        read = rows[0]  # the old rows, read before the change commits
        reading.set()
        release.wait(5)
        return read

    before = asyncio.create_task(flight.load("account", lambda: cache.fresh_or_stale("account", slow_read)))
    await until(reading.is_set)
    rows[0] = "new"  # the change commits, then forgets the entry
    cache.clear()
    after = asyncio.create_task(
        flight.load("account", lambda: cache.fresh_or_stale("account", lambda: rows[0]))
    )
    assert await after == "new"  # not the load in flight since before the change
    release.set()
    assert await before == "old"  # that request began before the change: it may see the old rows
    assert cache.get("account") == (True, "new")  # but they are not kept over the new ones
