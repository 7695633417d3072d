"""Autoscaling in the local backend (docs/runtime.md, "Autoscaling (local backend)"): a deployment gets
another replica under load, gives it back once idle, and never goes past the memory budget for it.

The rule itself is `ScalingPolicy`'s, tested in plain Python; the live tests run one real server (one
gateway process) with short windows and the tiny chat model."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.runtime.supervisor.autoscale import Sample, ScalingPolicy
from tests.helpers import ADMIN_KEY, bearer
from tests.server_process import Server, server_with, until

# ---------------------------------------------------------------- the policy


def policy() -> ScalingPolicy:
    return ScalingPolicy(target=2, ttft_seconds=2.0, window=1.0, idle_seconds=3.0)


def feed(rule: ScalingPolicy, start: float, end: float, in_flight: int, replicas: int, **kw: Any) -> int:
    """Samples every 0.2 s from `start` to `end`: the last decision's desired count."""
    desired = replicas
    for step in range(round((end - start) / 0.2) + 1):
        sample = Sample(start + step * 0.2, in_flight, kw.get("first_token"))
        desired = rule.observe(sample, replicas, 1, kw.get("ceiling", 2)).desired
    return desired


def test_more_than_the_target_in_flight_per_replica_over_a_whole_window_asks_for_one_more() -> None:
    rule = policy()
    assert feed(rule, 0.0, 0.6, in_flight=5, replicas=1) == 1  # not a whole window yet
    assert feed(rule, 0.8, 1.2, in_flight=5, replicas=1) == 2
    decision = rule.observe(Sample(1.4, 5), 1, 1, 2)
    assert "5.0 requests in flight per replica" in decision.reason and "target of 2" in decision.reason
    assert feed(policy(), 0.0, 3.0, in_flight=2, replicas=1) == 1  # at the target is not above it


def test_a_slow_first_token_is_load_even_with_few_requests_in_flight() -> None:
    rule = policy()
    assert feed(rule, 0.0, 1.2, in_flight=1, replicas=1, first_token=3.5) == 2
    assert "time to first token 3.50 s" in rule.observe(Sample(1.4, 1, 3.5), 1, 1, 2).reason


def test_never_past_max_replicas_and_back_to_the_bounds_when_they_move() -> None:
    assert feed(policy(), 0.0, 3.0, in_flight=9, replicas=2, ceiling=2) == 2
    assert policy().observe(Sample(0.0, 0), 3, 1, 2).desired == 2
    assert policy().observe(Sample(0.0, 0), 1, 2, 3).desired == 2


def test_a_replica_goes_once_the_load_fitted_in_one_fewer_for_the_idle_window() -> None:
    rule = policy()
    rule.reset(0.0)
    assert feed(rule, 0.0, 2.0, in_flight=3, replicas=2) == 2  # 3 do not fit in one replica
    assert feed(rule, 2.2, 4.8, in_flight=2, replicas=2) == 2  # they do: the idle window runs
    assert feed(rule, 5.0, 5.4, in_flight=3, replicas=2) == 2  # a burst: it starts again
    assert feed(rule, 5.6, 8.4, in_flight=0, replicas=2) == 2
    decision = rule.observe(Sample(9.0, 0), 2, 1, 2)
    assert decision.desired == 1 and "fitted in 1 replica for 3 s" in decision.reason
    assert feed(policy(), 0.0, 10.0, in_flight=0, replicas=1) == 1  # never below the floor


# ---------------------------------------------------------------- live

WINDOWS = {
    "MODELHOST_AUTOSCALE_WINDOW_SECONDS": "1",
    "MODELHOST_SCALE_DOWN_IDLE_SECONDS": "3",
    "MODELHOST_AUTOSCALE_INTERVAL_SECONDS": "0.2",
    "MODELHOST_MEMORY_CHECK_SECONDS": "0.5",
}
LONG = {"max_tokens": 1500, "min_tokens": 1500, "temperature": 0, "stream": True}


@dataclass
class Scaled:
    server: Server
    deployment_id: str
    one_replica_bytes: list[int] = field(default_factory=list)  # each replica's memory, as seen


@pytest.fixture(scope="module")
async def scaled(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> AsyncIterator[Scaled]:
    """One gateway process, short windows, and a warm chat deployment of 1 to 2 replicas."""
    from tests.chat_model import long_context_copy

    root = tmp_path_factory.mktemp("autoscale")
    async with server_with(root, 1, **WINDOWS) as server:
        folder = long_context_copy(recipes, root)
        bounds = {"readiness": "warm", "min_replicas": 1, "max_replicas": 2}
        deployment_id = await server.deploy(folder, "text-generation", "chat", **bounds)
        await server.ready(deployment_id)
        yield Scaled(server, deployment_id)


async def view(scaled: Scaled) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=scaled.server.url, timeout=10) as client:
        answer = await client.get(
            f"/v1/deployments/{scaled.deployment_id}", headers=bearer(scaled.server.key)
        )
        body: dict[str, Any] = answer.json()
        if body["replicas"]:
            scaled.one_replica_bytes.append(math.ceil(body["memory_gb"] * 1e9 / body["replicas"]))
        return body


async def generate(server: Server, question: str) -> str:
    """One long streamed generation: its finish reason (any failure fails the test)."""
    body = {"model": "chat", "messages": [{"role": "user", "content": question}], **LONG}
    finish = ""
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=300) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(server.key)) as answer,
    ):
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                finish = chunk["choices"][0]["finish_reason"] or finish if chunk["choices"] else finish
    return finish


def scale_events(server: Server, deployment_id: str, direction: str) -> float:
    pattern = (
        rf'^modelhost_scale_events_total{{deployment="{deployment_id}",direction="{direction}"}} ([\d.e+]+)$'
    )
    match = re.search(pattern, server.metrics(), re.M)
    return float(match.group(1)) if match else 0.0


def gauge(server: Server, name: str, deployment_id: str) -> float:
    match = re.search(rf'^{name}{{deployment="{deployment_id}"}} ([\d.e+]+)$', server.metrics(), re.M)
    return float(match.group(1)) if match else math.nan


async def test_a_deployment_under_load_gets_another_replica_then_gives_it_back_when_idle(
    scaled: Scaled,
) -> None:
    server, deployment_id = scaled.server, scaled.deployment_id
    before = (await view(scaled))["replicas"], scale_events(server, deployment_id, "up")
    assert before == (1, 0.0)
    load = [asyncio.ensure_future(generate(server, f"tell me a long story, {i}")) for i in range(4)]

    async def replicas() -> int:
        return int((await view(scaled))["replicas"])

    deadline = time.monotonic() + 60
    while await replicas() < 2:  # 4 in flight on 1 replica, above the target of 2 for the window
        assert time.monotonic() < deadline and not all(t.done() for t in load)
        await asyncio.sleep(0.1)
    shown = await view(scaled)
    assert shown["desired_replicas"] == 2
    step = shown["last_scaling"]
    assert (step["from"], step["to"]) == (1, 2) and "requests in flight per replica" in step["reason"], step
    assert len(server.replicas(deployment_id)) == 2
    assert scale_events(server, deployment_id, "up") == 1
    assert re.search(
        rf'^modelhost_desired_replicas{{deployment="{deployment_id}"}} 2.0$', server.metrics(), re.M
    )

    assert await asyncio.gather(*load) == ["length"] * 4  # no request failed
    ended = time.monotonic()
    deadline = ended + 1 + 3 + 10  # the window, the idle window, a margin
    while await replicas() > 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert time.monotonic() - ended >= 3  # not before the idle window
    shown = await view(scaled)
    step = shown["last_scaling"]
    assert (step["from"], step["to"], shown["desired_replicas"]) == (2, 1, 1), shown
    assert "fitted in 1 replica for 3 s" in step["reason"]
    assert scale_events(server, deployment_id, "down") == 1
    await until(lambda: len(server.replicas(deployment_id)) == 1, timeout=10)  # stopped once empty
    assert re.search(
        rf'^modelhost_loaded_replicas{{deployment="{deployment_id}"}} 1.0$', server.metrics(), re.M
    )


async def test_scaling_up_never_goes_past_the_memory_budget(scaled: Scaled) -> None:
    """The same server again, with a budget of 1.6 replicas of the model (as measured above): under the
    same load the deployment stays at one replica and says that the budget had no room; nothing was
    evicted to make it."""
    server, deployment_id = scaled.server, scaled.deployment_id
    await view(scaled)
    one = max(scaled.one_replica_bytes)
    budget_mb = math.ceil(1.6 * one / 2**20)
    server.process.stop()
    server.process.env["MODELHOST_MEMORY_BUDGET_MB"] = str(budget_mb)
    server.process.start()
    # a warm deployment loads again on demand after a restart: the load's first request loads it
    # eight streams: their generation outlasts the restart, the load and a whole window on a busy machine
    load = [asyncio.ensure_future(generate(server, f"tell me a long story, {i}")) for i in range(8)]
    deadline = time.monotonic() + 60
    while True:
        shown = await view(scaled)
        if shown["last_scaling"] is not None and "no room" in shown["last_scaling"]["reason"]:
            break
        ended = [t.exception() or t.result() for t in load if t.done()]
        assert time.monotonic() < deadline and len(ended) < len(load), (shown, ended)
        await asyncio.sleep(0.1)
    step = shown["last_scaling"]
    assert (shown["replicas"], shown["desired_replicas"], step["from"], step["to"]) == (1, 2, 1, 1), shown
    assert "requests in flight per replica" in step["reason"]
    assert "the memory budget has no room for another replica" in step["reason"]
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        capacity = (await client.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY))).json()["memory"]
    assert capacity["reserved_bytes"] <= capacity["budget_bytes"] == budget_mb * 2**20
    assert await asyncio.gather(*load) == ["length"] * 8
    assert (await view(scaled))["replicas"] == 1 and len(server.replicas(deployment_id)) == 1
    assert scale_events(server, deployment_id, "up") == 0
    assert "modelhost_evictions_total{" not in server.metrics()


def test_ray_serve_is_given_the_same_target_and_downscale_delay(tmp_path: Path) -> None:
    config = pytest.importorskip("ray.serve.config")
    from modelhost.runtime.supervisor.ray_backend import autoscaling
    from tests.conftest import make_settings

    settings = make_settings(
        tmp_path, "sqlite://", autoscale_target_in_flight=3, scale_down_idle_seconds=45, cold_idle_seconds=300
    )
    warm = autoscaling("warm", 1, 4, settings.cold_idle_seconds, settings)
    assert (warm["target_ongoing_requests"], warm["downscale_delay_s"]) == (3, 45)
    cold = autoscaling("cold", 0, 4, settings.cold_idle_seconds, settings)
    assert (cold["min_replicas"], cold["downscale_to_zero_delay_s"]) == (0, 300)
    config.AutoscalingConfig(**warm)  # what Serve accepts
