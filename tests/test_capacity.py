"""Capacity, through HTTP on a real `modelhost serve` with real worker processes: a memory budget that
replicas share, deployments evicted (least recently used, cold before warm, hot pinned), refused (409 for
hot beyond the budget, 503 with `Retry-After` after a wait), and the budget read from a cgroup limit.

A tiny sentence-transformers model's replica takes about 35 MiB (its footprint: what it adds to the
machine, runtime/memory.py). The budget is set from the footprint a first server measured (`footprint`,
once per module), so that no test depends on what this machine's processes happen to take, or on its
memory size.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.runtime.memory import parents, tree
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account, push_folder
from tests.server_process import ST_RECIPE, Server, server_with, until

GiB = 1 << 30
MiB = 1 << 20


def capacity(server: Server) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/v1/admin/capacity", headers=bearer(ADMIN_KEY), timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def view(server: Server, deployment_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/v1/deployments/{deployment_id}", headers=bearer(server.key), timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def deploy_many(server: Server, folder: Path, models: list[str], **extra: Any) -> dict[str, str]:
    """One artifact pushed once, deployed under each model name: {model: deployment ID}."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        pushed = await push_folder(client, server.key, folder, "feature-extraction")
        ids = {}
        for model in models:
            body = {"model": model, "artifact_id": pushed["artifact"]["id"], **extra}
            created = await client.post("/v1/deployments", json=body, headers=bearer(server.key))
            assert created.status_code == 201, created.text
            ids[model] = created.json()["id"]
        return ids


async def second_tenant(server: Server) -> Server:
    """The same server as a second account uses it (a key of its own)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        account = await new_account(client, "bravo")
    return replace(server, key=account["api_key"])


def seen(server: Server) -> str:
    """What the server's account reads of its own: its deployments (their `state_reason`), models, usage."""
    paths = ("/v1/deployments", "/v1/models", "/v1/usage")
    return "\n".join(
        httpx.get(f"{server.url}{p}", headers=bearer(server.key), timeout=10).text for p in paths
    )


def assert_names_none_of(text: str, foreign: dict[str, str]) -> None:
    """No model name or deployment ID of another account's deployments (`foreign`: {model: ID}) in
    `text`."""
    for model, deployment_id in foreign.items():
        assert deployment_id not in text, (deployment_id, text)
        assert not re.search(rf"(?<![\w-]){re.escape(model)}(?![\w-])", text), (model, text)


def loaded(server: Server, ids: dict[str, str]) -> list[str]:
    """The models whose replica worker runs now."""
    return [model for model, deployment_id in ids.items() if server.replicas(deployment_id)]


@contextlib.asynccontextmanager
async def watching(server: Server, ids: dict[str, str]) -> AsyncIterator[list[int]]:
    """The most replica workers alive at once while the block runs, sampled every 20 ms."""
    most = [0]

    async def sample() -> None:
        while True:
            most[0] = max(most[0], len(loaded(server, ids)))
            await asyncio.sleep(0.02)

    task = asyncio.create_task(sample())
    try:
        yield most
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture(scope="module")
def footprint(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> int:
    """One replica's measured footprint (bytes), on a server of its own: loaded, used, measured."""

    async def measure() -> int:
        async with server_with(
            tmp_path_factory.mktemp("measure"), 1, MODELHOST_MEMORY_CHECK_SECONDS="0.5"
        ) as server:
            ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["m"], readiness="warm")
            await server.ready(ids["m"])
            assert (await server.embed("hello")).status_code == 200

            def measured() -> int:
                [entry] = capacity(server)["deployments"]
                return int(entry["footprint_bytes"]) if entry["footprint_measured"] else 0

            first = await until(measured)
            await asyncio.sleep(1.5)  # measured again since the request
            return max(first, measured())

    size = asyncio.run(measure())
    assert 8 * MiB < size < 400 * MiB, size  # a forked worker: its own pages, not torch's
    return size


def budget_env(footprint: int, footprints: float, **extra: str) -> dict[str, str]:
    return {
        "MODELHOST_MEMORY_BUDGET_MB": str(int(footprint * footprints / MiB)),
        "MODELHOST_MIN_RESIDENCY_SECONDS": "0",
        "MODELHOST_MEMORY_CHECK_SECONDS": "0.5",
        **extra,
    }


async def test_cold_deployments_take_turns_within_a_budget_of_two_and_a_half_footprints(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    async with server_with(tmp_path, 1, **budget_env(footprint, 2.5)) as server:
        models = ["a", "b", "c", "d", "e"]
        ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), models)
        async with watching(server, ids) as most:
            for _ in range(2):
                for model in models:
                    answer = await server.embed(f"hello {model}", model)
                    assert answer.status_code == 200, answer.text
        assert most[0] == 2, most  # two fit, never a third beside them
        state = capacity(server)
        assert len(state["deployments"]) <= 2
        assert state["memory"]["reserved_bytes"] <= state["memory"]["budget_bytes"]
        evictions = re.search(
            r'^modelhost_evictions_total\{reason="load"\} ([\d.]+)$', server.metrics(), re.M
        )
        assert evictions and float(evictions.group(1)) >= 8, server.metrics()[-2000:]
        reason = view(server, ids["a"])["state_reason"]
        assert re.fullmatch(r"evicted to make room for \w at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", reason), reason


async def test_a_hot_deployment_beyond_the_budget_is_409_and_nothing_changes(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    async with server_with(tmp_path, 1, **budget_env(footprint, 2.5)) as server:
        ids = {}
        for model in ("p1", "p2"):  # each measured before the next is predicted
            ids |= await deploy_many(server, recipes.joinpath(*ST_RECIPE), [model], readiness="hot")
            await server.ready(ids[model])
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            artifact_id = view(server, ids["p1"])["artifact_id"]
            third = {"model": "p3", "artifact_id": artifact_id, "readiness": "hot"}
            refused = await client.post("/v1/deployments", json=third, headers=bearer(server.key))
            assert_error(refused, 409, "insufficient_capacity")
            message = refused.json()["error"]["message"]
            assert "p1 (" in message and "p2 (" in message and "budget" in message, message
            listed = await client.get("/v1/deployments", headers=bearer(server.key))
            assert sorted(d["model"] for d in listed.json()["data"]) == ["p1", "p2"]  # p3 was not kept

            cold = {"model": "c", "artifact_id": artifact_id}
            created = await client.post("/v1/deployments", json=cold, headers=bearer(server.key))
            assert created.status_code == 201, created.text
            patched = await client.patch(
                f"/v1/deployments/{created.json()['id']}",
                json={"readiness": "hot"},
                headers=bearer(server.key),
            )
            assert_error(patched, 409, "insufficient_capacity")
            assert view(server, created.json()["id"])["readiness"] == "cold"  # as it was

            # a rollout of p1 needs its new version beside the old: no room, 409, and nothing changes
            pushed = await push_folder(client, server.key, recipes.joinpath(*ST_RECIPE), "feature-extraction")
            new = pushed["artifact"]["id"]
            rolled = await client.patch(
                f"/v1/deployments/{ids['p1']}", json={"artifact_id": new}, headers=bearer(server.key)
            )
            assert_error(rolled, 409, "insufficient_capacity")
            assert "replace" in rolled.json()["error"]["message"]
            assert [v["artifact_id"] for v in view(server, ids["p1"])["versions"]] == [artifact_id]
            # `replace`: the old version stops first, and requests meanwhile wait for the new one
            load = [asyncio.create_task(server.embed(f"hello {n}", "p1")) for n in range(4)]
            replaced = await client.patch(
                f"/v1/deployments/{ids['p1']}",
                json={"artifact_id": new, "strategy": "replace"},
                headers=bearer(server.key),
            )
            assert replaced.status_code == 200, replaced.text
            load += [asyncio.create_task(server.embed(f"again {n}", "p1")) for n in range(8)]
            answers = await asyncio.gather(*load)
            assert [a.status_code for a in answers] == [200] * len(answers), [a.text for a in answers]
            assert {a.headers["x-modelhost-artifact"] for a in answers[4:]} == {new}
            await until(
                lambda: (
                    [(v["artifact_id"], v["state"]) for v in view(server, ids["p1"])["versions"]]
                    == [(new, "active")]
                )
            )


async def test_a_request_with_no_room_waits_then_503_and_succeeds_once_a_pinned_deployment_goes_cold(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    """And a second account meets each capacity refusal the first account's deployments cause (the 409
    for a hot one, the 503 and its `state_reason`), evicts one of them, and neither reads a name or ID of
    the other's deployments anywhere (docs/api-decisions.md, "What one tenant can see of another")."""
    env = budget_env(footprint, 2.5, MODELHOST_CAPACITY_WAIT_SECONDS="4")
    async with server_with(tmp_path, 1, **env) as server:
        ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["p1", "p2", "c"])
        bravo = await second_tenant(server)
        theirs = await deploy_many(bravo, recipes.joinpath(*ST_RECIPE), ["bravo-x"])
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            for model in ("p1", "p2"):
                await client.patch(
                    f"/v1/deployments/{ids[model]}", json={"readiness": "hot"}, headers=bearer(server.key)
                )
                await server.ready(ids[model])

            # the second account cannot pin one beside them, and reads of them only what they hold together
            their_artifact = view(bravo, theirs["bravo-x"])["artifact_id"]
            hot = {"model": "bravo-hot", "artifact_id": their_artifact, "readiness": "hot"}
            for answer in (
                await client.post("/v1/deployments", json=hot, headers=bearer(bravo.key)),
                await client.patch(
                    f"/v1/deployments/{theirs['bravo-x']}",
                    json={"readiness": "hot"},
                    headers=bearer(bravo.key),
                ),
            ):
                assert_error(answer, 409, "insufficient_capacity")
                message = answer.json()["error"]["message"]
                assert "2 pinned deployments of other accounts hold" in message, message
                assert_names_none_of(message, ids)
            held = {d["model"]: d["id"] for d in capacity(server)["deployments"]}
            assert held == {"p1": ids["p1"], "p2": ids["p2"]}  # the operator sees every one, named

        started = time.monotonic()  # both accounts' loads wait for room, side by side
        refused, refused_theirs = await asyncio.gather(
            server.embed("no room", "c"), bravo.embed("no room", "bravo-x")
        )
        waited = time.monotonic() - started
        for answer in (refused, refused_theirs):
            assert_error(answer, 503, "insufficient_capacity")
            assert answer.headers["Retry-After"] == "5"
        assert 4 <= waited < 20, waited
        assert "p1 (hot" in refused.json()["error"]["message"], refused.json()
        message = refused_theirs.json()["error"]["message"]
        assert "2 deployments of other accounts hold" in message, message
        assert_names_none_of(message, ids)
        assert "2 deployments of other accounts" in view(bravo, theirs["bravo-x"])["state_reason"]
        assert_names_none_of(seen(bravo), ids)
        assert not server.replicas(ids["c"])
        assert view(server, ids["c"])["state"] == "unloaded"

        # a request waiting for room gets it when a pinned deployment becomes evictable; the evicted
        # one's owner reads that another account's load took its room, not which
        waiting = asyncio.create_task(bravo.embed("room at last", "bravo-x"))
        await until(lambda: capacity(server)["memory"]["waiting"] == 1)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            patched = await client.patch(
                f"/v1/deployments/{ids['p1']}", json={"readiness": "cold"}, headers=bearer(server.key)
            )
            assert patched.status_code == 200, patched.text
        answer = await waiting
        assert answer.status_code == 200, answer.text
        assert not server.replicas(ids["p1"])  # evicted for it
        assert server.replicas(ids["p2"])  # still pinned
        reason = view(server, ids["p1"])["state_reason"]
        assert reason.startswith("evicted to make room for a deployment of another account at "), reason
        assert_names_none_of(seen(server), theirs)
        assert_names_none_of(seen(bravo), ids)


async def test_an_evicted_warm_deployment_says_so_and_comes_back(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    async with server_with(tmp_path, 1, **budget_env(footprint, 2.5)) as server:
        ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["c"])
        for model in ("w1", "w2"):  # each measured before the next is predicted
            ids |= await deploy_many(server, recipes.joinpath(*ST_RECIPE), [model], readiness="warm")
            await server.ready(ids[model])
        assert (await server.embed("used last", "w2")).status_code == 200
        assert (
            await server.embed("needs room", "c")
        ).status_code == 200  # evicts w1, the least recently used
        evicted = view(server, ids["w1"])
        assert evicted["state"] == "unloaded", evicted
        assert evicted["state_reason"].startswith("evicted to make room for c at "), evicted
        assert view(server, ids["w2"])["state"] == "ready"

        # it loads again on its next request (making room in turn: c is cold, and idle)
        assert (await server.embed("back", "w1")).status_code == 200
        assert view(server, ids["w1"])["state"] == "ready"
        assert not server.replicas(ids["c"])  # cold goes before warm

        # and in the background once memory frees
        assert (await server.embed("room again", "c")).status_code == 200  # evicts w2 now (LRU warm)
        assert view(server, ids["w2"])["state"] == "unloaded"
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            deleted = await client.delete(f"/v1/deployments/{ids['c']}", headers=bearer(server.key))
            assert deleted.status_code == 200, deleted.text
        await until(lambda: view(server, ids["w2"])["state"] == "ready", timeout=30)
        assert view(server, ids["w2"])["state_reason"] is None


async def test_one_accounts_cold_load_never_evicts_another_accounts_warm_deployment(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    """Issue 70, S15: account bravo's cold load evicted account alpha's idle warm deployment, whose next
    request waited for a load. Now the cold load waits and gets the 503 with why; bravo's warm load takes
    room from alpha only while alpha holds more than its share (half the budget, two accounts holding
    memory), and only down to it."""
    env = budget_env(footprint, 2.5, MODELHOST_CAPACITY_WAIT_SECONDS="2")
    async with server_with(tmp_path, 1, **env) as server:
        ids: dict[str, str] = {}
        for model in ("w1", "w2"):  # each measured before the next is predicted
            ids |= await deploy_many(server, recipes.joinpath(*ST_RECIPE), [model], readiness="warm")
            await server.ready(ids[model])
        assert (await server.embed("used last", "w2")).status_code == 200
        workers = {model: server.replicas(ids[model]) for model in ids}
        bravo = await second_tenant(server)
        theirs = await deploy_many(bravo, recipes.joinpath(*ST_RECIPE), ["bravo-cold"])

        refused = await bravo.embed("needs room", "bravo-cold")
        assert_error(refused, 503, "insufficient_capacity")
        message = refused.json()["error"]["message"]
        assert "warm deployments of other accounts, which a cold deployment's load never evicts" in message
        assert_names_none_of(message, ids)
        assert {model: server.replicas(ids[model]) for model in ids} == workers  # both still loaded
        answer = await server.embed("served at once", "w1")
        assert answer.status_code == 200, answer.text
        assert server.replicas(ids["w1"]) == workers["w1"]  # the same replica: no load

        # bravo's warm deployment takes room from alpha, which holds two of 2.5 footprints (its share
        # is 1.25): w2, now the least recently used, goes; w1 stays, alpha being within its share then
        theirs |= await deploy_many(bravo, recipes.joinpath(*ST_RECIPE), ["bravo-warm"], readiness="warm")
        await bravo.ready(theirs["bravo-warm"])
        assert not server.replicas(ids["w2"])
        assert server.replicas(ids["w1"]) == workers["w1"]
        reason = view(server, ids["w2"])["state_reason"]
        assert reason.startswith("evicted to make room for a deployment of another account at "), reason


async def test_a_crashed_load_gives_its_reservation_back(
    tmp_path: Path, recipes: Path, footprint: int
) -> None:
    async with server_with(tmp_path, 1, **budget_env(footprint, 2.5)) as server:
        ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["ok"], readiness="warm")
        await server.ready(ids["ok"])
        before = capacity(server)["memory"]["reserved_bytes"]
        ids |= await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["broken"])
        # its published weights break after inspection: the worker fails while loading them
        artifact = tmp_path / "data" / "blobs" / "artifacts" / view(server, ids["broken"])["artifact_id"]
        [weights] = artifact.rglob("model.safetensors")
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        assert_error(await server.embed("fails", "broken"), 503, "deployment_unavailable")
        state = capacity(server)
        assert [d["model"] for d in state["deployments"]] == ["ok"]
        assert state["memory"]["reserved_bytes"] <= before * 1.2, (before, state)
        assert (await server.embed("still fine", "ok")).status_code == 200
        # a rollout to the broken artifact: its load fails, says why, and the old version serves on
        old, broken = view(server, ids["ok"])["artifact_id"], view(server, ids["broken"])["artifact_id"]
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            patch = {"artifact_id": broken}
            rolled = await client.patch(
                f"/v1/deployments/{ids['ok']}", json=patch, headers=bearer(server.key)
            )
            assert rolled.status_code == 200, rolled.text

        def failed() -> list[dict[str, Any]]:
            return [v for v in view(server, ids["ok"])["versions"] if v["state"] == "failed"]

        [version] = await until(failed)
        assert version["artifact_id"] == broken and version["reason"], version
        answer = await server.embed("served by the old version", "ok")
        assert answer.status_code == 200 and answer.headers["x-modelhost-artifact"] == old


async def test_the_default_budget_is_80_percent_of_the_cgroup_limit_less_the_server(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    (cgroup / "memory").mkdir(parents=True)
    (cgroup / "memory.max").write_text(f"{2 * GiB}\n")  # cgroup v2, at the root of the fake hierarchy
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{3 * GiB}\n")  # v1's memory controller
    async with server_with(tmp_path, 1, MODELHOST_CGROUP_ROOT=str(cgroup)) as server:

        def measured() -> dict[str, Any] | None:
            memory: dict[str, Any] = capacity(server)["memory"]
            return memory if memory["server_bytes"] else None

        memory = await until(measured)
        assert memory["limit_bytes"] == 2 * GiB  # the smaller limit wins
        assert memory["budget_bytes"] == int(2 * GiB * 0.8) - memory["server_bytes"]
        assert 50 * MiB < memory["server_bytes"] < 2 * GiB
        shown = re.search(r"^modelhost_memory_budget_bytes ([\d.e+]+)$", server.metrics(), re.M)
        assert shown and 0 < float(shown.group(1)) <= 2 * GiB * 0.8


async def test_two_gateway_processes_see_one_budget(tmp_path: Path, recipes: Path, footprint: int) -> None:
    async with server_with(tmp_path, 2, **budget_env(footprint, 2.5)) as server:
        ids = await deploy_many(server, recipes.joinpath(*ST_RECIPE), ["a", "b", "c"])
        first, other = server.gateways()

        async def embed_via(pid: int, model: str) -> httpx.Response:
            task = await server.via(pid, lambda: server.embed(f"via {pid}", model))
            answer: httpx.Response = await task
            return answer

        async def capacity_via(pid: int) -> dict[str, Any]:
            async def get() -> httpx.Response:
                async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
                    return await client.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY))

            answer = await (await server.via(pid, get))
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        async with watching(server, ids) as most:
            assert (await embed_via(other, "a")).status_code == 200

            def measured() -> bool:  # before the next loads are predicted from it (as the tests above)
                held = capacity(server)["deployments"]
                return any(d["model"] == "a" and d["footprint_measured"] for d in held)

            await until(measured)
            assert (await embed_via(first, "b")).status_code == 200
            assert (await embed_via(other, "c")).status_code == 200
        assert most[0] == 2  # loads through either process count in one budget
        seen = [await capacity_via(pid) for pid in (first, other)]
        assert seen[0]["memory"]["budget_bytes"] == seen[1]["memory"]["budget_bytes"]
        # which of a and b made room depends on when the other process last said it used a (it tells
        # the supervisor once a second), not on the budget
        held = [sorted(d["model"] for d in view["deployments"]) for view in seen]
        assert held[0] == held[1] and len(held[0]) == 2 and "c" in held[0], held


def tree_pss(root: int) -> int:
    """The real memory of `root`'s process tree: every process's PSS (proportional set size, which
    splits a shared page among the processes that map it), summed, so each page counts once."""
    total = 0
    for pid in tree(root, parents()):
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1)) << 10  # type: ignore[union-attr]
    return total


async def settled(read: Callable[[], int]) -> int:
    """`read()` once two readings half a second apart differ by less than 2 MiB."""
    last = await asyncio.to_thread(read)
    while abs((now := await asyncio.to_thread(read)) - last) >= 2 * MiB:
        last = now
        await asyncio.sleep(0.5)
    return now


async def test_the_budget_holds_real_memory_through_loads_evictions_and_pinning_of_one_artifact(
    tmp_path: Path, minilm_dir: Path
) -> None:
    """Issue 49: replicas of one artifact share its mapped weights. Each replica's footprint counts them
    whole, so what it holds does not depend on its neighbours: the hot check refuses a third MiniLM in a
    budget for two, and the server's real memory (its tree's PSS above idle) stays within the budget."""
    # room for two all-MiniLM-L6-v2 replicas on torch (about 140 MiB each, 87 of it weights), not three
    budget = 360 * MiB
    async with server_with(tmp_path, 1, **budget_env(budget, 1)) as server:
        ids = await deploy_many(server, minilm_dir, ["a", "b", "c"], engine="transformers")
        idle = await settled(lambda: tree_pss(server.supervisor))
        peak, stop = [0], asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], await asyncio.to_thread(tree_pss, server.supervisor) - idle)
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        try:
            assert (await server.embed("hello a", "a")).status_code == 200
            await asyncio.sleep(1.0)  # measured again since the request
            [alone] = capacity(server)["deployments"]
            for model in ("b", "c"):  # c evicts a
                assert (await server.embed(f"hello {model}", model)).status_code == 200
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                for model in ("b", "c"):  # pinned where they are
                    pinned = await client.patch(
                        f"/v1/deployments/{ids[model]}", json={"readiness": "hot"}, headers=bearer(server.key)
                    )
                    assert pinned.status_code == 200, pinned.text
                held = capacity(server)
                artifact_id = view(server, ids["a"])["artifact_id"]
                third = {"model": "p3", "artifact_id": artifact_id, "readiness": "hot"}
                refused = await client.post("/v1/deployments", json=third, headers=bearer(server.key))
        finally:
            stop.set()
            await sampler
        footprints = {d["model"]: d["footprint_bytes"] for d in held["deployments"]}
        assert sorted(footprints) == ["b", "c"] and all(d["footprint_measured"] for d in held["deployments"])
        assert all(budget / 3 < size <= budget / 2 for size in footprints.values()), footprints
        # each measured beside another replica of its artifact, as it was alone
        for size in footprints.values():
            assert abs(size - alone["footprint_bytes"]) < 0.1 * alone["footprint_bytes"], (alone, held)
        assert held["memory"]["reserved_bytes"] == sum(footprints.values())
        assert_error(refused, 409, "insufficient_capacity")
        assert refused.json()["error"]["param"] == "readiness"
        assert peak[0] <= 1.1 * budget, f"{peak[0] / MiB:.0f} MiB above idle, budget {budget / MiB:.0f} MiB"
