"""Agents and runs through HTTP against a live server, on the tiny recipe chat model (api.md §2.1, §3.3,
§4.15, §6.3): runs generate in the background and store their events; deleting a run stops it first."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.chat_model import TIME, WEATHER, long_context_copy, served_chat_model
from tests.helpers import ADMIN_KEY, assert_error, bearer, deployment_metric, push_folder_sync
from tests.server_process import ServerProcess

FINISHED = ("completed", "failed", "cancelled", "requires_action")
LONG = {"max_tokens": 1500, "min_tokens": 1500, "temperature": 0}  # about 1.5 s of the engine on a fast CPU


@dataclass
class Agents:
    url: str
    key: str
    http: httpx.Client
    deployment_id: str
    database_url: str

    def call(self, method: str, path: str, body: Any = None, key: str | None = None) -> httpx.Response:
        return self.http.request(method, path, json=body, headers=bearer(key or self.key))

    def agent(self, tools: list[Any] | None = None) -> str:
        body: dict[str, Any] = {"name": "helper", "model": "chat", "instructions": "Answer briefly."}
        if tools:
            body["tools"] = tools
        created = self.call("POST", "/v1/agent", body)
        assert created.status_code == 200, created.text
        agent_id: str = created.json()["id"]
        return agent_id

    def run(self, agent_id: str, **body: Any) -> dict[str, Any]:
        created = self.call("POST", f"/v1/agent/{agent_id}/runs", {"input": "hello", **body})
        assert created.status_code == 200, created.text
        run: dict[str, Any] = created.json()
        return run

    def wait(self, agent_id: str, run_id: str, until: tuple[str, ...] = FINISHED) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            run: dict[str, Any] = self.call("GET", f"/v1/agent/{agent_id}/runs/{run_id}").json()
            if run["status"] in until:
                return run
            time.sleep(0.02)
        raise TimeoutError(run)

    def events(self, agent_id: str, run_id: str) -> list[dict[str, Any]]:
        answer = self.call("GET", f"/v1/agent/{agent_id}/runs/{run_id}/events")
        assert answer.status_code == 200, answer.text
        events: list[dict[str, Any]] = answer.json()["data"]
        return events

    def stored_events(self, run_id: str) -> int:
        """Counted in the database itself: what the HTTP answers cannot show once the run is gone."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                query = text("SELECT count(*) FROM agent_run_events WHERE run_id = :run")
                return int(connection.execute(query, {"run": run_id}).scalar_one())
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Agents]:
    root = tmp_path_factory.mktemp("agents")
    with served_chat_model(root, recipes, constrained_max_string_length=16) as server:
        yield Agents(server.url, server.key, server.http, server.deployment_id, server.database_url)


def _metric(agents: Agents, name: str) -> float:
    return deployment_metric(agents.http, name, agents.deployment_id)


def _wait_for_a_delta(agents: Agents, agent_id: str, run_id: str) -> None:
    """Until the run is generating: its first delta is stored."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(e["type"] == "message.delta" for e in agents.events(agent_id, run_id)):
            return
        time.sleep(0.02)
    raise TimeoutError(run_id)


def _stopped_before_its_tokens_were_done(agents: Agents, computed: float) -> bool:
    """The worker dropped the sequence (its gauge, read from the worker's metrics file, is back to 0)
    having computed fewer than the run's tokens since `computed` (the deployment's token count before)."""
    deadline = time.monotonic() + 15
    while _metric(agents, "modelhost_generation_sequences") != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    tokens = _metric(agents, "modelhost_generation_tokens_total") - computed
    return _metric(agents, "modelhost_generation_sequences") == 0 and 0 < tokens < LONG["max_tokens"]


def _sse(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


# ---------------------------------------------------------------- agents


def test_an_agent_is_created_on_a_text_generation_deployment_retrieved_and_listed(agents: Agents) -> None:
    agent_id = agents.agent([WEATHER])
    agent = agents.call("GET", f"/v1/agent/{agent_id}").json()
    assert (
        agent["object"] == "agent" and agent["model"] == "chat" and agent["instructions"] == "Answer briefly."
    )
    assert agent["tools"][0]["function"]["name"] == "get_weather" and isinstance(agent["created_at"], int)
    listed = agents.call("GET", "/v1/agent", None).json()
    assert listed["object"] == "list" and agent_id in [a["id"] for a in listed["data"]]
    unknown = agents.call("POST", "/v1/agent", {"name": "x", "model": "gpt-4o", "instructions": "x"})
    assert_error(unknown, 404, code="model_not_found", param="model")
    assert_error(agents.call("POST", "/v1/agent", {"name": "x", "model": "chat"}), 400, param="instructions")
    assert_error(agents.call("GET", "/v1/agent/agent_nope"), 404, code="agent_not_found")


def test_deployment_keys_cannot_use_agents(agents: Agents) -> None:
    scoped = agents.call("POST", "/v1/keys", {"deployments": [agents.deployment_id]}).json()["api_key"]
    agent_id = agents.agent()
    for method, path in (
        ("GET", "/v1/agent"),
        ("GET", f"/v1/agent/{agent_id}"),
        ("DELETE", f"/v1/agent/{agent_id}/runs/run_x"),
    ):
        assert_error(agents.call(method, path, key=scoped), 401, type_="InvalidAPIKeyError")
    assert_error(agents.http.delete(f"/v1/agent/{agent_id}/runs/run_x"), 401)  # no key at all


# ---------------------------------------------------------------- runs


def test_a_run_generates_in_the_background_and_stores_its_events_in_order(agents: Agents) -> None:
    agent_id = agents.agent()
    created = agents.run(agent_id, max_tokens=6, min_tokens=6, temperature=0)
    assert created["object"] == "agent.run" and created["status"] in ("queued", "in_progress")
    run = agents.wait(agent_id, created["id"])
    assert run["status"] == "completed" and run["output"] and run["completed_at"] is not None
    events = agents.events(agent_id, run["id"])
    types = [e["type"] for e in events]
    assert types[:2] == ["run.created", "run.in_progress"] and types[-2:] == [
        "message.completed",
        "run.completed",
    ]
    assert set(types[2:-2]) == {"message.delta"}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(a["created_at"] <= b["created_at"] for a, b in itertools.pairwise(events))
    text_of_deltas = "".join(e["data"]["content"] for e in events if e["type"] == "message.delta")
    assert text_of_deltas == run["output"] == events[-2]["data"]["content"]
    assert events[-2]["data"]["usage"]["completion_tokens"] == 6


def test_a_runs_tokens_count_against_the_tokens_per_minute_of_the_key_that_started_it(
    agents: Agents,
) -> None:
    """A run is answered `queued`, so its prompt and generated tokens come off the key's bucket when
    it ends (docs/limits.md)."""
    made = agents.call("POST", "/v1/keys", {"name": "limited", "limits": {"tokens_per_minute": 10}}).json()
    agent_id = agents.agent()
    body = {"input": "hello", "max_tokens": 6, "min_tokens": 6, "temperature": 0}
    created = agents.call("POST", f"/v1/agent/{agent_id}/runs", body, key=made["api_key"])
    assert created.status_code == 200, created.text
    agents.wait(agent_id, created.json()["id"])
    [completed] = [
        e for e in agents.events(agent_id, created.json()["id"]) if e["type"] == "message.completed"
    ]
    usage = completed["data"]["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] > 10  # more than the minute's bucket

    def tokens_left() -> int:
        [key] = [k for k in agents.call("GET", "/v1/keys").json()["data"] if k["id"] == made["id"]]
        left: int = key["use"]["tokens_remaining"]
        return left

    deadline = time.monotonic() + 30
    while tokens_left() != 0:  # taken once the run ended
        assert time.monotonic() < deadline, "the run's tokens were never taken"
        time.sleep(0.05)
    refused = agents.call("POST", f"/v1/agent/{agent_id}/runs", body, key=made["api_key"])
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens", refused.text


def test_the_instructions_are_the_system_message_before_the_input(agents: Agents) -> None:
    """The run's prompt is exactly that of a chat completion of [system: instructions, user: input]."""
    instructions = "You are a pirate who talks about the sea all day long."
    body = {"name": "i", "model": "chat", "instructions": instructions}
    agent_id = agents.call("POST", "/v1/agent", body).json()["id"]
    run = agents.run(agent_id, input="hello there", max_tokens=1)
    agents.wait(agent_id, run["id"])
    completed = [e for e in agents.events(agent_id, run["id"]) if e["type"] == "message.completed"]
    messages = [{"role": "system", "content": instructions}, {"role": "user", "content": "hello there"}]
    chat = agents.call(
        "POST", "/v1/chat/completions", {"model": "chat", "messages": messages, "max_tokens": 1}
    )
    assert completed[0]["data"]["usage"]["prompt_tokens"] == chat.json()["usage"]["prompt_tokens"] > 10


def test_a_run_with_messages_as_input_completes(agents: Agents) -> None:
    agent_id = agents.agent()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    run = agents.run(agent_id, input=messages, max_tokens=3, temperature=0)
    assert agents.wait(agent_id, run["id"])["status"] == "completed"


def test_a_forced_tool_call_is_recorded_and_the_run_requires_action(agents: Agents) -> None:
    agent_id = agents.agent([WEATHER, TIME])
    run = agents.run(agent_id, tool_choice="required", max_tokens=80, temperature=0)
    finished = agents.wait(agent_id, run["id"])
    assert finished["status"] == "requires_action" and len(finished["tool_calls"]) >= 1
    call = finished["tool_calls"][0]
    assert call["function"]["name"] in ("get_weather", "get_time") and json.loads(
        call["function"]["arguments"]
    )
    types = [e["type"] for e in agents.events(agent_id, run["id"])]
    assert "tool_call" in types and types[-1] == "run.requires_action"


def test_a_run_whose_prompt_cannot_be_generated_fails_with_a_reason(agents: Agents) -> None:
    agent_id = agents.agent()
    run = agents.run(agent_id, input="word " * 3000, max_tokens=2)  # far past the 2048-token context
    failed = agents.wait(agent_id, run["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] and failed["error"]["message"]
    assert agents.events(agent_id, run["id"])[-1]["type"] == "run.failed"


def test_a_run_takes_the_deployments_generation_defaults_as_a_chat_completion_does(agents: Agents) -> None:
    path = f"/v1/deployments/{agents.deployment_id}"
    patched = agents.call("PATCH", path, {"generation_defaults": {"temperature": 0, "max_tokens": 5}})
    assert patched.status_code == 200, patched.text
    try:
        agent_id = agents.agent()
        runs = [agents.wait(agent_id, agents.run(agent_id, min_tokens=5)["id"]) for _ in range(3)]
        chat = agents.call(
            "POST", "/v1/chat/completions", {"model": "chat", "messages": _agent_messages(), "min_tokens": 5}
        )
    finally:
        agents.call("PATCH", path, {"generation_defaults": {}})
    completed = [agents.events(agent_id, r["id"])[-2]["data"] for r in runs]
    assert [c["usage"]["completion_tokens"] for c in completed] == [5, 5, 5]  # the default max_tokens
    # the default temperature 0: one answer, the chat completion's
    assert {r["output"] for r in runs} == {chat.json()["choices"][0]["message"]["content"]}


def test_a_runs_usage_counts_the_prompt_tokens_it_took_from_the_cache(agents: Agents) -> None:
    agent_id = agents.agent()
    usages = []
    for _ in range(2):  # one after the other: the second finds the first's prompt whole in the cache
        run = agents.run(agent_id, input="cached prompt", max_tokens=2)
        assert agents.wait(agent_id, run["id"])["status"] == "completed"
        usages.append(agents.events(agent_id, run["id"])[-2]["data"]["usage"])
    assert usages[0]["prompt_tokens"] == usages[1]["prompt_tokens"] > 0
    # the second run's prompt is the first's: the prefix cache held all of it but the last token
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] >= usages[1]["prompt_tokens"] - 16 > 0
    assert usages[1]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_a_runs_images_are_read_as_a_chat_completions_and_a_text_model_refuses_them(agents: Agents) -> None:
    agent_id = agents.agent()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    content = [{"type": "text", "text": "What is this?"}, image]
    run = agents.run(agent_id, input=[{"role": "user", "content": content}], max_tokens=2)
    failed = agents.wait(agent_id, run["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_request"
    assert "reads text only" in failed["error"]["message"]


def _agent_messages() -> list[dict[str, str]]:
    """What a run of `Agents.agent` with the default input sends the model."""
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "hello"}]


def test_runs_are_listed_in_pages_both_ways(agents: Agents) -> None:
    agent_id = agents.agent()
    ids = [agents.run(agent_id, max_tokens=1)["id"] for _ in range(3)]
    first = agents.call("GET", f"/v1/agent/{agent_id}/runs?limit=2&order=asc").json()
    assert first["has_more"] and [r["id"] for r in first["data"]] == ids[:2]
    rest = agents.call("GET", f"/v1/agent/{agent_id}/runs?limit=2&order=asc&after={first['last_id']}").json()
    assert [r["id"] for r in rest["data"]] == ids[2:] and not rest["has_more"]
    newest = agents.call("GET", f"/v1/agent/{agent_id}/runs").json()
    assert [r["id"] for r in newest["data"]] == ids[::-1]
    for run_id in ids:
        agents.wait(agent_id, run_id)


def test_streamed_events_follow_the_run_live_and_end_when_it_ends(agents: Agents) -> None:
    agent_id = agents.agent()
    run = agents.run(agent_id, max_tokens=20, min_tokens=20, temperature=0)
    path = f"/v1/agent/{agent_id}/runs/{run['id']}/events?stream=true"
    with agents.http.stream("GET", path, headers=bearer(agents.key)) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        streamed = list(_sse(answer.iter_lines()))
    assert streamed[-1] == "[DONE]"
    assert streamed[:-1] == agents.events(agent_id, run["id"])
    assert streamed[-2]["type"] == "run.completed"


def test_a_cancelled_run_stops_generating_and_keeps_its_events(agents: Agents) -> None:
    agent_id = agents.agent()
    # Under a full suite's load the engine can compute all of a run's tokens while the runner is still
    # storing its first deltas (the run is active, the cancel lands after the engine is done): then the
    # experiment runs again, three times at most.
    for _attempt in range(3):
        computed = _metric(agents, "modelhost_generation_tokens_total")
        run = agents.run(agent_id, **LONG)
        _wait_for_a_delta(agents, agent_id, run["id"])
        cancelled = agents.call("POST", f"/v1/agent/{agent_id}/runs/{run['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        if _stopped_before_its_tokens_were_done(agents, computed):
            break
        assert _metric(agents, "modelhost_generation_sequences") == 0  # it ended: done before the cancel
    else:
        pytest.fail("three runs computed all their tokens before their cancel landed")
    count = len(agents.events(agent_id, run["id"]))
    time.sleep(0.3)
    events = agents.events(agent_id, run["id"])
    assert len(events) == count and events[-1]["type"] == "run.cancelled"
    assert_error(
        agents.call("POST", f"/v1/agent/{agent_id}/runs/{run['id']}/cancel"), 409, code="run_not_active"
    )


# ---------------------------------------------------------------- deleting runs (api.md §4.15)


def test_deleting_a_running_run_while_its_events_stream_stops_it_and_erases_its_events(
    agents: Agents,
) -> None:
    agent_id = agents.agent()
    computed = _metric(agents, "modelhost_generation_tokens_total")
    run = agents.run(agent_id, **LONG)
    path = f"/v1/agent/{agent_id}/runs/{run['id']}/events?stream=true"
    streamed: list[Any] = []
    first_delta = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", agents.url + path, headers=bearer(agents.key), timeout=120) as answer:
            for item in _sse(answer.iter_lines()):
                streamed.append(item)
                if isinstance(item, dict) and item.get("type") == "message.delta":
                    first_delta.set()

    follower = threading.Thread(target=follow)
    follower.start()
    assert first_delta.wait(60)
    deleted = agents.call("DELETE", f"/v1/agent/{agent_id}/runs/{run['id']}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": run["id"], "object": "agent.run.deleted", "deleted": True}
    assert _stopped_before_its_tokens_were_done(agents, computed)
    assert agents.stored_events(run["id"]) == 0
    follower.join(10)
    assert not follower.is_alive()
    time.sleep(0.3)  # a generation that was not stopped would keep writing deltas
    assert agents.stored_events(run["id"]) == 0
    assert streamed[-1]["error"]["code"] == "run_not_found"
    seqs = [e["seq"] for e in streamed[:-1]]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3
    assert_error(agents.call("GET", f"/v1/agent/{agent_id}/runs/{run['id']}"), 404, code="run_not_found")
    assert_error(agents.call("GET", path.split("?")[0]), 404, code="run_not_found")
    again = agents.call("DELETE", f"/v1/agent/{agent_id}/runs/{run['id']}")
    assert assert_error(again, 404, code="run_not_found")["message"] == "Run not found"


def test_deleting_a_finished_run_erases_its_events(agents: Agents) -> None:
    agent_id = agents.agent()
    run = agents.run(agent_id, max_tokens=2)
    agents.wait(agent_id, run["id"])
    assert agents.stored_events(run["id"]) >= 4
    deleted = agents.call("DELETE", f"/v1/agent/{agent_id}/runs/{run['id']}")
    assert deleted.json() == {"id": run["id"], "object": "agent.run.deleted", "deleted": True}
    assert agents.stored_events(run["id"]) == 0
    assert run["id"] not in [r["id"] for r in agents.call("GET", f"/v1/agent/{agent_id}/runs").json()["data"]]


def test_unknown_runs_runs_of_other_agents_and_other_accounts_are_run_not_found(agents: Agents) -> None:
    agent_id, other_agent = agents.agent(), agents.agent()
    run = agents.run(agent_id, max_tokens=1)
    stranger = agents.http.post("/v1/admin/accounts", json={"name": "s"}, headers=bearer(ADMIN_KEY)).json()
    for key, agent, run_id in (
        (agents.key, agent_id, "run_unknown"),
        (agents.key, other_agent, run["id"]),
        (stranger["api_key"], agent_id, run["id"]),
    ):
        answer = agents.call("DELETE", f"/v1/agent/{agent}/runs/{run_id}", key=key)
        assert assert_error(answer, 404, code="run_not_found")["message"] == "Run not found"
    assert agents.wait(agent_id, run["id"])["status"] == "completed"  # untouched


def test_deleting_an_agent_stops_and_deletes_its_runs(agents: Agents) -> None:
    agent_id = agents.agent()
    finished = agents.run(agent_id, max_tokens=1)
    agents.wait(agent_id, finished["id"])
    computed = _metric(agents, "modelhost_generation_tokens_total")
    running = agents.run(agent_id, **LONG)
    _wait_for_a_delta(agents, agent_id, running["id"])
    deleted = agents.call("DELETE", f"/v1/agent/{agent_id}")
    assert deleted.json() == {"id": agent_id, "object": "agent.deleted", "deleted": True}
    assert _stopped_before_its_tokens_were_done(agents, computed)
    assert agents.stored_events(running["id"]) == 0 and agents.stored_events(finished["id"]) == 0
    assert_error(agents.call("GET", f"/v1/agent/{agent_id}"), 404, code="agent_not_found")
    assert_error(
        agents.call("DELETE", f"/v1/agent/{agent_id}/runs/{running['id']}"), 404, code="run_not_found"
    )


# ---------------------------------------------------------------- restarts


def test_a_run_in_progress_at_a_crash_fails_as_interrupted_and_can_still_be_deleted(
    tmp_path: Path, recipes: Path
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        MODELHOST_AGENT_RUN_STALE_SECONDS="1",
        MODELHOST_WORKER_THREADS="1",
    )
    server.start()
    try:
        http = httpx.Client(base_url=server.url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "r"}, headers=bearer(ADMIN_KEY)).json()["api_key"]
        artifact = push_folder_sync(http, key, long_context_copy(recipes, tmp_path), "text-generation")
        created = http.post(
            "/v1/deployments", json={"model": "chat", "artifact_id": artifact}, headers=bearer(key)
        )
        assert created.status_code == 201, created.text
        view = Agents(server.url, key, http, created.json()["id"], f"sqlite:///{tmp_path / 'db.sqlite'}")
        agent_id = view.agent()
        run = view.run(agent_id, **LONG)
        view.wait(agent_id, run["id"], until=("in_progress",))
        server.kill()
        server.start()
        failed = view.wait(agent_id, run["id"])
        assert failed["status"] == "failed" and failed["error"]["code"] == "interrupted"
        assert view.events(agent_id, run["id"])[-1]["type"] == "run.failed"
        deleted = view.call("DELETE", f"/v1/agent/{agent_id}/runs/{run['id']}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert view.stored_events(run["id"]) == 0
        http.close()
    finally:
        server.stop()
