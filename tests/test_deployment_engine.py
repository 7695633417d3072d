"""A deployment's engine (issue 29): asked for with `engine`, chosen by `runtime.engine_choice` when the
deployment is created or its engine changed, shown as `engine_in_use` and `engine_reason`, and run by the
runtime.

The suite turns vLLM off (tests/__init__.py); tests that want it installed name a fake environment whose
architecture listing (written by setup.sh beside a real one) is read, and whose Python is never run: a
deployment chosen onto it is never loaded here. The runtime's reload on a new engine is tested on the
manager with a backend of fake replicas."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command

from modelhost.artifacts.service import version_prefix
from modelhost.config import get_settings
from modelhost.container import Services
from modelhost.runtime.capacity import Footprint
from modelhost.runtime.engine_choice import ARCHITECTURES_FILE
from modelhost.runtime.replica import Replica, ReplicaLoadFailed, ReplicaSpec, ReplicaStats
from modelhost.runtime.spec import DeploymentSpec
from modelhost.runtime.supervisor.manager import ReplicaManager
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import ModelArtifact
from modelhost.store.types import new_id
from tests.conftest import make_settings
from tests.helpers import assert_error, bearer, new_account, new_deployment, ready_artifact

LISTED = "Qwen2ForCausalLM"
UNLISTED = "GPT2LMHeadModel"


@pytest.fixture
def vllm_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """MODELHOST_VLLM_PYTHON names a fake environment whose vLLM registry lists only `LISTED`."""
    root = tmp_path / "venv-vllm"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # never run: the listing answers
    (root / ARCHITECTURES_FILE).write_text(json.dumps([LISTED]))
    monkeypatch.setenv("MODELHOST_VLLM_PYTHON", str(root / "bin" / "python"))
    get_settings.cache_clear()  # runtime.engine_choice reads the process's settings
    yield
    get_settings.cache_clear()


def generator_artifact(services: Services, account_id: str, architecture: str) -> str:
    """A ready text-generation artifact whose published files are just a config.json naming
    `architecture`: all the engine choice reads."""
    artifact_id = new_id("art")
    folder = services.blobs.local_dir(version_prefix(artifact_id, "v1"))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    with services.database.transaction() as session:
        session.add(
            ModelArtifact(
                id=artifact_id,
                account_id=account_id,
                display_name=architecture,
                pipeline="text-generation",
                status="ready",
                published_version="v1",
            )
        )
    return artifact_id


async def deploy(
    client: httpx.AsyncClient, account: dict[str, Any], artifact_id: str, **extra: Any
) -> httpx.Response:
    body = {"model": f"m-{new_id('x')[2:10]}", "artifact_id": artifact_id, **extra}
    return await client.post("/v1/deployments", json=body, headers=bearer(account["api_key"]))


def engine_of(deployment: dict[str, Any]) -> tuple[str, str, str | None]:
    return deployment["engine"], deployment["engine_in_use"], deployment["engine_reason"]


# ------------------------------------------------------------------------------------ vLLM turned off


async def test_text_generation_defaults_to_auto_and_runs_on_transformers_saying_why(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    deployment = await new_deployment(client, services, account, "chat", pipeline="text-generation")
    engine, in_use, reason = engine_of(deployment)
    assert (engine, in_use) == ("auto", "transformers")
    assert reason is not None and "vLLM is turned off" in reason


async def test_asking_for_vllm_where_it_is_turned_off_is_400_engine_not_supported(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    response = await deploy(
        client, account, ready_artifact(services, account["id"], "text-generation"), engine="vllm"
    )
    error = assert_error(response, 400, "engine_not_supported", "invalid_request_error", param="engine")
    assert "vLLM is turned off" in error["message"]
    listed = await client.get("/v1/deployments", headers=bearer(account["api_key"]))
    assert listed.json()["data"] == []  # nothing was created


async def test_an_encoder_task_refuses_vllm_and_takes_transformers_without_a_reason(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    artifact_id = ready_artifact(services, account["id"], "text-classification")
    refused = await deploy(client, account, artifact_id, engine="vllm")
    error = assert_error(refused, 400, "engine_not_supported", param="engine")
    assert "text-classification" in error["message"]
    created = await deploy(client, account, artifact_id, engine="transformers")
    assert created.status_code == 201, created.text
    assert engine_of(created.json()) == ("transformers", "transformers", None)


async def test_an_unknown_engine_is_refused_by_validation(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    response = await deploy(client, account, ready_artifact(services, account["id"]), engine="onnx")
    assert_error(response, 400, "invalid_request", param="engine")


# ------------------------------------------------------------------------------------ vLLM installed


async def test_auto_takes_vllm_for_an_architecture_its_registry_lists(
    client: httpx.AsyncClient, services: Services, vllm_installed: None
) -> None:
    account = await new_account(client)
    created = await deploy(client, account, generator_artifact(services, account["id"], LISTED))
    assert created.status_code == 201, created.text
    engine, in_use, reason = engine_of(created.json())
    assert (engine, in_use) == ("auto", "vllm")
    assert reason is not None and LISTED in reason
    assert created.json()["state"] == "unloaded"  # cold, never asked: the fake vLLM is never run


async def test_auto_keeps_transformers_for_an_architecture_vllm_does_not_list_and_vllm_is_refused(
    client: httpx.AsyncClient, services: Services, vllm_installed: None
) -> None:
    account = await new_account(client)
    artifact_id = generator_artifact(services, account["id"], UNLISTED)
    created = await deploy(client, account, artifact_id)
    assert created.status_code == 201, created.text
    assert engine_of(created.json()) == (
        "auto",
        "transformers",
        f"auto chose transformers: vLLM does not support the architecture {UNLISTED}",
    )
    refused = await deploy(client, account, artifact_id, engine="vllm")
    assert UNLISTED in assert_error(refused, 400, "engine_not_supported", param="engine")["message"]


async def test_patching_the_engine_chooses_again_and_the_fields_survive_get_and_list(
    client: httpx.AsyncClient, services: Services, vllm_installed: None
) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    created = (await deploy(client, account, generator_artifact(services, account["id"], LISTED))).json()
    path = f"/v1/deployments/{created['id']}"

    patched = await client.patch(path, json={"engine": "transformers"}, headers=owner)
    assert patched.status_code == 200, patched.text
    assert engine_of(patched.json()) == ("transformers", "transformers", None)
    assert engine_of((await client.get(path, headers=owner)).json()) == ("transformers", "transformers", None)

    back = (await client.patch(path, json={"engine": "auto", "max_replicas": 2}, headers=owner)).json()
    assert (back["engine"], back["engine_in_use"], back["max_replicas"]) == ("auto", "vllm", 2)
    listed = (await client.get("/v1/deployments", headers=owner)).json()["data"]
    assert [engine_of(d) for d in listed] == [engine_of(back)]
    assert engine_of((await client.get(path, headers=owner)).json()) == engine_of(back)

    untouched = (await client.patch(path, json={"readiness": "cold"}, headers=owner)).json()
    assert engine_of(untouched) == engine_of(back)  # no engine given: not chosen again


async def test_a_refused_engine_patch_changes_nothing(
    client: httpx.AsyncClient, services: Services, vllm_installed: None
) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    created = (await deploy(client, account, generator_artifact(services, account["id"], UNLISTED))).json()
    path = f"/v1/deployments/{created['id']}"
    refused = await client.patch(path, json={"engine": "vllm", "max_replicas": 3}, headers=owner)
    assert_error(refused, 400, "engine_not_supported", param="engine")
    now = (await client.get(path, headers=owner)).json()
    assert (now["max_replicas"], *engine_of(now)) == (1, *engine_of(created))


async def test_generation_defaults_are_set_at_creation_shown_and_replaced_by_a_patch(
    client: httpx.AsyncClient, services: Services
) -> None:
    """A deployment's sampling defaults (docs/generation.md, "The model's defaults"); that its requests
    take them is tests/test_chat.py's."""
    account = await new_account(client)
    owner = bearer(account["api_key"])
    artifact = generator_artifact(services, account["id"], UNLISTED)
    refused = await deploy(client, account, artifact, generation_defaults={"top_k": 1.5})
    assert_error(refused, 400, param="generation_defaults.top_k")
    defaults = {"temperature": 0.6, "top_k": 20, "max_tokens": 512}
    created = (await deploy(client, account, artifact, generation_defaults=defaults)).json()
    path = f"/v1/deployments/{created['id']}"
    assert created["generation_defaults"] == defaults and isinstance(
        created["generation_defaults"]["top_k"], int
    )
    assert (await client.get(path, headers=owner)).json()["generation_defaults"] == defaults
    untouched = (await client.patch(path, json={"readiness": "cold"}, headers=owner)).json()
    assert untouched["generation_defaults"] == defaults  # not given: unchanged
    replaced = (await client.patch(path, json={"generation_defaults": {"min_p": 0.1}}, headers=owner)).json()
    assert replaced["generation_defaults"] == {"min_p": 0.1}
    listed = (await client.get("/v1/deployments", headers=owner)).json()["data"]
    assert [d["generation_defaults"] for d in listed] == [{"min_p": 0.1}]


# ------------------------------------------------------------------------------------ the store


def test_deployments_made_before_engines_ask_for_auto_and_run_on_transformers(database_url: str) -> None:
    database = Database(database_url)
    try:
        migrate.upgrade(database, "0005")
        now = "2026-11-20 10:00:00+00:00"
        with database.engine.begin() as conn:
            for statement in (
                f"INSERT INTO accounts VALUES ('acct_old', 'old', 0, '{now}')",
                "INSERT INTO model_artifacts (id, account_id, display_name, pipeline, status, size_bytes, "
                f"deployment_count, created_at, updated_at) VALUES ('art_old', 'acct_old', 'x', "
                f"'text-generation', 'ready', 0, 1, '{now}', '{now}')",
                "INSERT INTO deployments (id, account_id, model, artifact_id, pipeline, readiness, "
                "min_replicas, max_replicas, created_at, updated_at) VALUES ('dep_old', 'acct_old', 'm', "
                f"'art_old', 'text-generation', 'cold', 1, 1, '{now}', '{now}')",
            ):
                conn.execute(sa.text(statement))
        migrate.upgrade(database)
        columns = "engine, engine_in_use, engine_reason"
        with database.engine.connect() as conn:
            row = conn.execute(sa.text(f"SELECT {columns} FROM deployments")).one()
        assert tuple(row) == ("auto", "transformers", None)
        command.downgrade(migrate.alembic_config(database), "0005")
        with database.engine.connect() as conn:
            assert "engine" not in {c["name"] for c in sa.inspect(conn).get_columns("deployments")}
    finally:
        database.dispose()


# ------------------------------------------------------------------------------------ the runtime


class FakeReplica:
    """Records the engine it was made for; loads and unloads at once."""

    def __init__(
        self, deployment: DeploymentSpec, log: list[tuple[str, str]], failing: frozenset[str] = frozenset()
    ) -> None:
        self.spec = ReplicaSpec.of(deployment, 1, "cpu")
        self.failing = failing  # engines whose load fails
        self.name = f"{deployment.id}-{len(log)}"
        self.failure: str | None = None
        self.engine_choice: tuple[str, str] | None = None
        self._log = log
        self._alive = False

    async def load(self) -> None:
        if self.spec.engine in self.failing:
            self._log.append(("failed", self.spec.engine))
            raise ReplicaLoadFailed(f"{self.spec.engine} could not run it")
        self._alive = True
        self._log.append(("load", self.spec.engine))

    async def unload(self) -> None:
        self._alive = False
        self._log.append(("unload", self.spec.engine))

    async def detach(self) -> None:
        await self.unload()

    async def submit(self, item: dict[str, Any]) -> dict[str, Any]:
        return item

    async def stream(self, request: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        yield request

    async def rescale(self, deployment: DeploymentSpec) -> None:
        pass

    async def held(self) -> int:
        return 0

    def handoff(self) -> None:
        pass

    def stats(self) -> ReplicaStats:
        return ReplicaStats(pid=None, memory_bytes=0, load_seconds=0.0, in_flight=0)

    def measure(self, table: dict[int, int]) -> Footprint:
        return Footprint(0)

    shared_meter = None
    in_flight = 0
    pid = None
    address = None

    @property
    def alive(self) -> bool:
        return self._alive


class FakeBackend:
    scales_itself = False

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.log: list[tuple[str, str]] = []
        self.failing = failing

    def new_replica(
        self, deployment: DeploymentSpec, on_exit: Callable[[Replica], None], replicas: int
    ) -> Replica:
        return FakeReplica(deployment, self.log, self.failing)

    async def close(self) -> None:
        pass


async def until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def state_becomes(manager: ReplicaManager, deployment_id: str, state: str) -> None:
    """The deployment reaches `state` (a load logged by the fake backend is still finishing)."""
    for _ in range(200):
        if (await manager.status(deployment_id)).state == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{deployment_id} is {(await manager.status(deployment_id)).state}, not {state}")


def generator_spec(tmp_path: Path, **fields: Any) -> DeploymentSpec:
    return DeploymentSpec(
        id="dep_x",
        pipeline="text-generation",
        readiness="warm",
        min_replicas=1,
        max_replicas=1,
        model_dir=tmp_path,
        account_id="acct_x",
        model="m",
        artifact_id="art_x",
        **fields,
    )


async def test_a_model_vllm_cannot_load_runs_on_transformers_when_auto_chose_vllm(
    tmp_path: Path, sqlite_url: str
) -> None:
    backend = FakeBackend(failing=frozenset({"vllm"}))
    specs = {"dep_x": generator_spec(tmp_path, engine="vllm", falls_back=True)}
    manager = ReplicaManager(make_settings(tmp_path, sqlite_url), specs.get, lambda: [], backend=backend)
    fell_back: list[tuple[str, str]] = []
    manager.engine_fell_back = lambda deployment, reason: fell_back.append((deployment, reason))
    await manager.apply("dep_x")
    await until(lambda: ("load", "transformers") in backend.log)
    assert backend.log == [("failed", "vllm"), ("unload", "vllm"), ("load", "transformers")]
    assert fell_back == [("dep_x", "vllm could not run it")]
    await state_becomes(manager, "dep_x", "ready")
    await manager.shutdown()


async def test_a_model_vllm_cannot_load_fails_when_vllm_was_asked_for(
    tmp_path: Path, sqlite_url: str
) -> None:
    backend = FakeBackend(failing=frozenset({"vllm"}))
    specs = {"dep_x": generator_spec(tmp_path, engine="vllm")}
    manager = ReplicaManager(make_settings(tmp_path, sqlite_url), specs.get, lambda: [], backend=backend)
    await manager.apply("dep_x")
    await until(lambda: backend.log == [("failed", "vllm"), ("unload", "vllm")])
    for _ in range(200):
        if (status := await manager.status("dep_x")).state == "failed":
            break
        await asyncio.sleep(0.01)
    assert (status.state, status.reason) == ("failed", "vllm could not run it")
    await manager.shutdown()


async def test_the_fall_back_is_stored_with_its_reason_until_the_engine_is_patched(
    client: httpx.AsyncClient, services: Services, vllm_installed: None
) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    created = (await deploy(client, account, generator_artifact(services, account["id"], LISTED))).json()
    assert created["engine_in_use"] == "vllm"
    services.deployments.fall_back(created["id"], "vLLM loaded the model but could not run it: ...")
    path = f"/v1/deployments/{created['id']}"
    now = (await client.get(path, headers=owner)).json()
    assert engine_of(now) == (
        "auto",
        "transformers",
        "auto fell back to transformers: vLLM loaded the model but could not run it: ...",
    )
    spec = services.deployments.runtime_spec(created["id"])
    assert spec is not None and (spec.engine, spec.falls_back) == ("transformers", False)
    again = (await client.patch(path, json={"engine": "auto"}, headers=owner)).json()
    assert again["engine_in_use"] == "vllm"  # patched: chosen again


async def test_a_new_engine_unloads_a_loaded_deployment_and_loads_it_again_on_the_new_one(
    tmp_path: Path, sqlite_url: str
) -> None:
    spec = generator_spec(tmp_path, engine="transformers")
    specs = {"dep_x": spec}
    backend = FakeBackend()
    manager = ReplicaManager(make_settings(tmp_path, sqlite_url), specs.get, lambda: [], backend=backend)
    await manager.apply("dep_x")
    await until(lambda: backend.log == [("load", "transformers")])

    specs["dep_x"] = dataclasses.replace(spec, max_replicas=2)  # same engine: nothing reloads
    await manager.apply("dep_x")
    specs["dep_x"] = dataclasses.replace(spec, engine="vllm")
    await manager.apply("dep_x")
    await until(lambda: len(backend.log) == 3)
    assert backend.log == [("load", "transformers"), ("unload", "transformers"), ("load", "vllm")]
    await state_becomes(manager, "dep_x", "ready")
    await manager.shutdown()
