"""Billing end to end: real replicas on the recipe embedding model, a clock the tests move.

Every replica bills at least 64 GB (`billing_min_memory_gb`), more than the tiny model measures, so
expected ledgers are exact: 64 GB × 0.001 credits per GB-second = 64_000 micro-credits per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from modelhost.api.app import create_app
from modelhost.batches.files import Owner
from modelhost.billing.ledger import ComputeReading
from modelhost.container import Services
from modelhost.errors import InsufficientCredits
from modelhost.fine_tuning.dataset import resolve
from modelhost.fine_tuning.runner import FineTuningRunner, checkpoints_prefix
from modelhost.fine_tuning.store import NewJob
from modelhost.runtime.spec import AttachedAdapter, DeploymentSpec
from modelhost.store.db import Database
from modelhost.store.models import LedgerEntry, Meter, ModelArtifact
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, ManualClock, assert_error, bearer, push_folder, push_folder_sync
from tests.server_process import ServerProcess

T0 = 1_795_305_600_000  # 2026-11-22T00:00:00Z
PER_SECOND = 64_000  # micro-credits of one replica-second
BILLING: dict[str, Any] = {
    "worker_threads": 1,
    "cold_idle_seconds": 300,
    "billing_min_memory_gb": Decimal(64),
    "billing_compute_credits_per_gb_second": Decimal("0.001"),
    "billing_storage_credits_per_gb_hour": Decimal("0.0036"),  # 1 micro-credit per GB-second
    "billing_tick_seconds": 86_400,  # the background loop stays out of the way: tests tick
}


@pytest.fixture
def model_dir(recipes: Path) -> Path:
    return recipes / "t03_feature_extraction" / "st"


@contextlib.asynccontextmanager
async def gateway(root: Path, clock: ManualClock, **overrides: Any) -> AsyncIterator[Gateway]:
    """An in-process gateway on `root`'s database, started as the app's lifespan starts it."""
    settings = make_settings(root, f"sqlite:///{root / 'billing.db'}", **{**BILLING, **overrides})
    services = Services.build(settings, clock=clock)
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as client:
        services.billing.close_stale()
        await services.manager.start()
        try:
            yield Gateway(services, client, clock)
        finally:
            await services.manager.shutdown()  # bills every replica up to now
            services.close()


class Gateway:
    def __init__(self, services: Services, client: httpx.AsyncClient, clock: ManualClock) -> None:
        self.services, self.client, self.clock = services, client, clock
        self.key = ""

    async def account(self, model_dir: Path, credits: float) -> tuple[str, str]:
        made = await self.client.post(
            "/v1/admin/accounts", json={"name": "a", "credits": credits}, headers=bearer(ADMIN_KEY)
        )
        self.key = made.json()["api_key"]
        pushed = await push_folder(self.client, self.key, model_dir, "feature-extraction")
        return made.json()["id"], pushed["artifact"]["id"]

    async def deploy(self, artifact_id: str, model: str, readiness: str) -> str:
        body = {"model": model, "artifact_id": artifact_id, "readiness": readiness}
        made = await self.client.post("/v1/deployments", json=body, headers=bearer(self.key))
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    async def state(self, deployment_id: str) -> str:
        view = await self.client.get(f"/v1/deployments/{deployment_id}", headers=bearer(self.key))
        return str(view.json()["state"])

    async def until_ready(self, *deployment_ids: str) -> None:
        deadline = time.monotonic() + 60
        while [await self.state(d) for d in deployment_ids] != ["ready"] * len(deployment_ids):
            assert time.monotonic() < deadline, "deployments did not load"
            await asyncio.sleep(0.05)

    async def embed(self, model: str) -> httpx.Response:
        body = {"model": model, "input": "how much does this cost?"}
        return await asyncio.wait_for(
            self.client.post("/v1/embeddings", json=body, headers=bearer(self.key)), 60
        )

    async def idle(self, seconds: int, step: int = 60) -> None:
        """Let `seconds` pass: a billing tick (with enforcement) and the idle reaper every `step`."""
        for _ in range(seconds // step):
            self.clock.advance(step)
            await self.services.billing.tick_and_enforce(self.services.manager.unload_account)
            await self.services.manager.reap_idle()

    async def usage(self, **params: Any) -> dict[str, Any]:
        response = await self.client.get("/v1/usage", params=params, headers=bearer(self.key))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


def micro(credits: float) -> int:
    return round(credits * 1_000_000)


def credits_counter(account_id: str, kind: str) -> float:
    value = REGISTRY.get_sample_value("modelhost_credits_billed_total", {"account": account_id, "kind": kind})
    return value or 0.0


async def test_idle_hours_cost_what_the_readiness_level_says_with_bursts_and_a_restart_mid_tick(
    tmp_path: Path, model_dir: Path
) -> None:
    """DESIGN.md: cold is billed while loaded (its idle window included), warm while loaded (not
    reloaded after a restart until asked), hot always (reloaded at start). Concurrent bursts load no
    second replica; a restart half-way through a tick bills every second exactly once."""
    clock = ManualClock(T0)
    async with gateway(tmp_path, clock) as gw:
        account_id, artifact_id = await gw.account(model_dir, credits=10_000)
        ids = {level: await gw.deploy(artifact_id, level, level) for level in ("cold", "warm", "hot")}
        await gw.until_ready(ids["warm"], ids["hot"])
        burst = await asyncio.gather(*(gw.embed(level) for level in ("cold",) * 8 + ("warm", "hot") * 4))
        assert [r.status_code for r in burst] == [200] * 16
        await gw.idle(1800, step=300)  # cold unloads after its 300 s idle window
        assert [await gw.state(ids[level]) for level in ("cold", "warm", "hot")] == [
            "unloaded",
            "ready",
            "ready",
        ]
        burst = await asyncio.gather(*(gw.embed(level) for level in ("warm", "hot") * 8))
        assert [r.status_code for r in burst] == [200] * 16
        await gw.idle(1800, step=300)
        clock.advance(30)  # the restart falls half-way through a tick
        key = gw.key
    async with gateway(tmp_path, clock) as gw:
        gw.key = key
        await gw.until_ready(ids["hot"])
        assert await gw.state(ids["warm"]) == "unloaded"  # warm: loaded again on demand only
        await gw.idle(3600, step=300)
        usage = await gw.usage()
        database = gw.services.database
        with database.transaction() as session:
            size = session.get(ModelArtifact, artifact_id).size_bytes  # type: ignore[union-attr]
            meters = session.scalars(select(Meter.deployment_id).where(Meter.kind == "compute")).all()

    compute = {line["model"]: micro(line["compute_credits"]) for line in usage["by_deployment"]}
    assert compute == {"cold": 300 * PER_SECOND, "warm": 3630 * PER_SECOND, "hot": 7230 * PER_SECOND}
    assert sorted(meters) == sorted([ids["cold"], ids["warm"], ids["hot"], ids["hot"]])  # one load each
    storage = size * 7230 // 10**9  # stored since its upload at T0: 1 micro-credit per GB-second
    assert micro(usage["storage_credits"]) == storage
    assert micro(usage["compute_credits"]) == sum(compute.values())
    assert [(a["artifact_id"], micro(a["storage_credits"])) for a in usage["by_artifact"]] == [
        (artifact_id, storage)
    ]
    assert micro(usage["credits_balance"]) == micro(10_000) - sum(compute.values()) - storage
    assert [day["date"] for day in usage["by_day"]] == ["2026-11-22"]
    assert credits_counter(account_id, "compute") == pytest.approx(sum(compute.values()) / 1e6)


async def test_an_account_out_of_credits_gets_402_and_its_replicas_unload_until_a_top_up(
    tmp_path: Path, model_dir: Path
) -> None:
    clock = ManualClock(T0)
    async with gateway(tmp_path, clock, billing_storage=False) as gw:
        account_id, artifact_id = await gw.account(model_dir, credits=10)  # 156.25 replica-seconds
        hot, _cold = await gw.deploy(artifact_id, "h", "hot"), await gw.deploy(artifact_id, "c", "cold")
        await gw.until_ready(hot)
        await gw.idle(120)
        assert (await gw.embed("h")).status_code == 200
        assert micro((await gw.usage())["credits_balance"]) == micro(10) - 120 * PER_SECOND
        await gw.idle(60)  # 180 s: the balance goes below zero at this tick
        assert await gw.state(hot) == "unloaded"
        assert (await gw.services.runtime.status(hot)).reason == "the account is out of credits"
        for model in ("h", "c"):
            assert_error(await gw.embed(model), 402, "insufficient_credits", "insufficient_credits_error")
        await gw.services.runtime.apply(hot)  # what a restart or a patch asks: the load is refused too
        await asyncio.sleep(0.2)
        assert await gw.state(hot) == "unloaded"
        usage = await gw.usage()  # management keeps working
        assert micro(usage["credits_balance"]) == micro(10) - 180 * PER_SECOND < 0
        assert (
            await gw.client.post("/v1/keys", json={"name": "still"}, headers=bearer(gw.key))
        ).status_code == 201
        await gw.idle(600)  # nothing loaded: nothing billed
        assert micro((await gw.usage())["credits_balance"]) == micro(10) - 180 * PER_SECOND

        topped = await gw.client.post(
            f"/v1/admin/accounts/{account_id}/credits", json={"credits": 100}, headers=bearer(ADMIN_KEY)
        )
        assert micro(topped.json()["credits"]) == micro(110) - 180 * PER_SECOND
        assert micro(topped.json()["credits_used"]) == 180 * PER_SECOND
        assert (await gw.embed("c")).status_code == 200  # at once, no cache to wait for
        assert (await gw.embed("h")).status_code == 200
        await gw.until_ready(hot)


async def test_a_shared_base_whose_owner_is_out_of_credits_shows_its_adapters_accounts_no_balance(
    tmp_path: Path,
) -> None:
    """A shared base's refusal to load and its `state_reason` reach the accounts of the adapters it
    serves too (docs/api-decisions.md, "What one tenant can see of another: nothing")."""
    async with gateway(tmp_path, ManualClock(T0)) as gw:
        made = await gw.client.post(
            "/v1/admin/accounts", json={"name": "owner", "credits": 0}, headers=bearer(ADMIN_KEY)
        )
        owner = made.json()["id"]
        base = DeploymentSpec(
            id="dep_base", pipeline="text-generation", readiness="warm", min_replicas=1, max_replicas=1,
            model_dir=tmp_path, account_id=owner, model="base", artifact_id="art_base",
        )  # fmt: skip
        with pytest.raises(InsufficientCredits) as refused:
            gw.services.billing.check_can_load(base)
        assert "(balance 0.000000)" in refused.value.message  # its owner alone reads it
        theirs = AttachedAdapter("dep_theirs", "acct_other", "tuned", "art_tuned", 1000, 8)
        shared = replace(base, adapters=(theirs,))
        with pytest.raises(InsufficientCredits) as refused:
            gw.services.billing.check_can_load(shared)
        assert "balance" not in refused.value.message and "out of credits" in refused.value.message
        runtime = gw.services.manager._runtime_for(shared)
        await gw.services.manager.unload_account(owner)
        assert runtime.status().reason == "the account that owns it is out of credits"


async def test_usage_range_and_errors(tmp_path: Path, model_dir: Path) -> None:
    """The report's range and validation (the ledger is written directly: no replica is needed)."""
    clock = ManualClock(T0)
    async with gateway(tmp_path, clock, billing_storage=False) as gw:
        account_id, artifact_id = await gw.account(model_dir, credits=5)
        deployment = await gw.deploy(artifact_id, "c", "cold")
        ledger = gw.services.billing.ledger
        meter = ledger.open_compute(
            owner="gw_test",
            account_id=account_id,
            deployment_id=deployment,
            model="c",
            artifact_id=artifact_id,
            now_ms=T0,
        )
        ledger.bill_compute([ComputeReading(meter, T0 + 120_000, 10**9)], close=True)  # the 64 GB minimum
        month = await gw.usage()
        assert (month["start"], month["end"], month["account_id"]) == (
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z",
            account_id,
        )
        assert micro(month["compute_credits"]) == 120 * PER_SECOND
        assert micro(month["credits_balance"]) == micro(5) - 120 * PER_SECOND
        assert [(d["deployment_id"], d["model"]) for d in month["by_deployment"]] == [(deployment, "c")]
        later = await gw.usage(start="2026-11-23", end=1_795_564_800)
        assert (later["credits"], later["by_day"], later["by_deployment"]) == (0, [], [])
        assert later["credits_balance"] == month["credits_balance"]  # the balance is all time
        headers = bearer(gw.key)
        bad = await gw.client.get(
            "/v1/usage", params={"start": "2026-11-23", "end": "2026-11-22"}, headers=headers
        )
        assert_error(bad, 400, "invalid_request", param="end")
        for params, param in (
            ({"start": "soon"}, "start"),
            ({"end": 1174}, "end"),
            ({"start": 10**30}, "start"),
        ):
            assert_error(await gw.client.get("/v1/usage", params=params, headers=headers), 400, param=param)
        scoped = await gw.client.post("/v1/keys", json={"deployments": [deployment]}, headers=headers)
        denied = await gw.client.get("/v1/usage", headers=bearer(scoped.json()["api_key"]))
        assert_error(denied, 401, type_="InvalidAPIKeyError")


async def test_eval_runs_and_fine_tuning_checkpoints_show_in_usage_as_storage_until_deleted(
    tmp_path: Path,
) -> None:
    """`/v1/usage` lists what an eval run and a fine-tuning job hold as storage lines of their own (in
    `by_artifact`, under their IDs); the fine-tuning runner's sweep deletes an ended job's checkpoint
    files and closes its meter, deleting the run closes the run's."""
    clock = ManualClock(T0)
    per_byte_second = {"billing_storage_credits_per_gb_hour": Decimal(3_600_000)}  # 1 micro-credit
    async with gateway(tmp_path, clock, **per_byte_second) as gw:
        made = await gw.client.post(
            "/v1/admin/accounts", json={"name": "a", "credits": 10}, headers=bearer(ADMIN_KEY)
        )
        account_id, gw.key = made.json()["id"], made.json()["api_key"]
        headers = bearer(gw.key)
        criterion = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}",
                     "reference": "{{item.ref}}", "operation": "eq"}  # fmt: skip
        config = {"type": "custom", "item_schema": {"type": "object"}}
        body = {"data_source_config": config, "testing_criteria": [criterion]}
        eval_id = (await gw.client.post("/v1/evals", json=body, headers=headers)).json()["id"]
        items = [{"item": {"ref": "x" * 200}, "sample": {"output_text": "x"}}]
        source = {"type": "jsonl", "source": {"type": "file_content", "content": items}}
        run = await gw.client.post(f"/v1/evals/{eval_id}/runs", json={"data_source": source}, headers=headers)
        run_id = run.json()["id"]

        jobs = gw.services.fine_tuning.jobs
        new = NewJob("dep_x", "base", "file_a", None, "k", None, resolve({}, 4), 8, None, 1, None, False)
        job_id = jobs.create(Owner(account_id, "key_x"), new)["id"]
        runner = FineTuningRunner(
            jobs, gw.services.artifacts, gw.services.blobs, gw.services.deployments,
            None,  # type: ignore[arg-type]  # the sweep places nothing
            gw.services.billing, gw.services.settings,
        )  # fmt: skip
        assert jobs.claim(runner.name) is not None
        key = f"{checkpoints_prefix(job_id)}/step-4"
        writer = gw.services.blobs.writer(f"{key}/adapter_model.safetensors")
        writer.write(b"0" * 5000)
        writer.commit()
        assert jobs.add_checkpoint(job_id, runner.name, 4, {"step": 4}, key, 5000)

        clock.advance(3600)
        gw.services.billing.tick()
        lines = {line["artifact_id"]: line for line in (await gw.usage())["by_artifact"]}
        copy = len(json.dumps(items, separators=(",", ":")))
        assert lines[run_id] == {
            "artifact_id": run_id, "display_name": "eval run items and results", "compute_credits": 0,
            "storage_credits": 3600 * copy / 1_000_000,
        }  # fmt: skip
        assert lines[job_id]["display_name"] == "fine-tuning checkpoints"
        assert lines[job_id]["storage_credits"] == 3600 * 5000 / 1_000_000

        assert jobs.fail(job_id, runner.name, "training_error", "it broke")
        runner._sweep()  # what the runner does at its turns
        assert not gw.services.blobs.exists(key)
        deleted = await gw.client.delete(f"/v1/evals/{eval_id}/runs/{run_id}", headers=headers)
        assert deleted.status_code == 200, deleted.text
        with gw.services.database.transaction() as session:
            still = session.scalars(
                select(Meter.artifact_id).where(Meter.kind == "storage", Meter.ended_ms.is_(None))
            )
            assert {run_id, job_id}.isdisjoint(still)
        clock.advance(3600)
        assert [
            b for b in gw.services.billing.tick() if b.kind == "storage" and b.account_id == account_id
        ] == []


def serve_for(http: httpx.Client, key: str, seconds: float) -> None:
    """One request to the hot deployment `h`, then let billing tick for a while."""
    assert (
        http.post("/v1/embeddings", json={"model": "h", "input": "x"}, headers=bearer(key)).status_code == 200
    )
    time.sleep(seconds)


def test_a_killed_gateway_loses_at_most_one_tick_and_its_restart_bills_nothing_twice(
    tmp_path: Path, model_dir: Path
) -> None:
    """Real processes and real time: SIGKILL mid-period, restart, stop cleanly; then read the ledger."""
    database_url = f"sqlite:///{tmp_path / 'crash.db'}"
    tick = 0.5
    server = ServerProcess(
        tmp_path / "data",
        database_url,
        MODELHOST_BILLING_TICK_SECONDS=str(tick),
        MODELHOST_BILLING_MIN_MEMORY_GB="64",
        MODELHOST_BILLING_STORAGE="false",
        MODELHOST_WORKER_THREADS="1",
    )
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            made = http.post(
                "/v1/admin/accounts", json={"name": "a", "credits": 1000}, headers=bearer(ADMIN_KEY)
            )
            key = made.json()["api_key"]
            artifact_id = push_folder_sync(http, key, model_dir, "feature-extraction")
            body = {"model": "h", "artifact_id": artifact_id, "readiness": "hot"}
            deployment = http.post("/v1/deployments", json=body, headers=bearer(key)).json()["id"]
            serve_for(http, key, seconds=4 * tick)
        killed_ms = int(time.time() * 1000)
        server.kill()
        server.start()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            serve_for(http, key, seconds=4 * tick)
        assert server.terminate() in (0, -signal.SIGTERM)  # uvicorn re-raises it once shut down
    finally:
        server.stop()

    database = Database(database_url)
    with database.transaction() as session:
        meters = session.scalars(
            select(Meter).where(Meter.deployment_id == deployment).order_by(Meter.started_ms)
        ).all()
        rows = session.scalars(select(LedgerEntry).order_by(LedgerEntry.period_start_ms)).all()
    database.dispose()
    assert len(meters) == 2 and all(m.ended_ms is not None for m in meters)
    crashed, restarted = meters
    assert killed_ms - 1000 * tick - 500 <= crashed.billed_until_ms <= killed_ms  # lost: one tick at most
    assert crashed.ended_ms == crashed.billed_until_ms  # closed by the restart, not billed on
    assert restarted.started_ms > killed_ms  # nothing billed twice
    for meter in meters:
        mine = [row for row in rows if row.meter_id == meter.id]
        assert len(mine) >= 2
        assert mine[0].period_start_ms == meter.started_ms and mine[-1].period_end_ms == meter.billed_until_ms
        assert all(a.period_end_ms == b.period_start_ms for a, b in itertools.pairwise(mine))
        assert sum(row.amount_micro for row in mine) == 64 * (meter.billed_until_ms - meter.started_ms)
