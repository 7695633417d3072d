"""Agents, runs and events in the database (SQLite and PostgreSQL): guarded event writes, deletion that
no writer can outrun, stale runs failed as interrupted."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from modelhost.agents.store import AgentStore
from modelhost.errors import Conflict, NotFound
from modelhost.frontend import Target
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, AgentRun, AgentRunEvent
from modelhost.store.types import utcnow

RUNNER = "gw-test"


@pytest.fixture
def store(database_url: str) -> AgentStore:
    database = Database(database_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add_all([Account(id="acct_a", name="a"), Account(id="acct_b", name="b")])
    return AgentStore(database)


def agent(store: AgentStore, account: str = "acct_a") -> str:
    agent_id: str = store.create_agent(account, "helper", "chat", "Be brief.", None)["id"]
    return agent_id


def run(store: AgentStore, agent_id: str, account: str = "acct_a") -> str:
    view, job = store.create_run(
        account, agent_id, Target("dep_1"), {"input": [{"role": "user", "content": "hi"}]}, RUNNER
    )
    assert view["status"] == "queued" and job.id == view["id"]
    return job.id


def stored_events(store: AgentStore, run_id: str) -> int:
    with store._database.transaction() as session:
        return int(session.scalar(select(func.count()).where(AgentRunEvent.run_id == run_id)) or 0)


def test_events_are_numbered_in_order_and_move_the_run(store: AgentStore) -> None:
    agent_id = agent(store)
    run_id = run(store, agent_id)
    assert store.append(run_id, RUNNER, "run.in_progress", {}, {"status": "in_progress"})
    assert store.append(run_id, RUNNER, "message.delta", {"content": "he"})
    done = {"status": "completed", "output": {"content": "he", "tool_calls": []}, "completed_at": utcnow()}
    assert store.append(run_id, RUNNER, "run.completed", {}, done)
    events, status = store.events("acct_a", agent_id, run_id)
    assert [e["seq"] for e in events] == [1, 2, 3, 4] and status == "completed"
    assert [e["type"] for e in events] == ["run.created", "run.in_progress", "message.delta", "run.completed"]
    assert all(isinstance(e["created_at"], float) for e in events)
    assert store.events("acct_a", agent_id, run_id, after_seq=2)[0][0]["seq"] == 3
    finished = store.get_run("acct_a", agent_id, run_id)
    assert finished["output"] == "he" and finished["completed_at"] is not None
    # A finished run takes no more events, nor does another runner's.
    assert not store.append(run_id, RUNNER, "message.delta", {"content": "late"})
    other = run(store, agent_id)
    assert not store.append(other, "gw-other", "message.delta", {"content": "x"})


def test_a_deleted_run_takes_no_events_and_its_events_are_erased(store: AgentStore) -> None:
    agent_id = agent(store)
    run_id = run(store, agent_id)
    assert store.append(run_id, RUNNER, "run.in_progress", {}, {"status": "in_progress"})
    store.begin_delete_run("acct_a", agent_id, run_id)
    assert not store.append(run_id, RUNNER, "message.delta", {"content": "x"})
    with pytest.raises(NotFound):
        store.get_run("acct_a", agent_id, run_id)
    with pytest.raises(NotFound):  # a second delete while the first is finishing
        store.begin_delete_run("acct_a", agent_id, run_id)
    store.finish_delete_run(run_id)
    assert stored_events(store, run_id) == 0
    with pytest.raises(NotFound) as second:
        store.begin_delete_run("acct_a", agent_id, run_id)
    assert second.value.code == "run_not_found" and second.value.message == "Run not found"


def test_runs_of_another_agent_or_account_are_not_found(store: AgentStore) -> None:
    mine, theirs = agent(store), agent(store, "acct_b")
    other_agent = agent(store)
    run_id = run(store, mine)
    for account, agent_id in (("acct_b", mine), ("acct_a", other_agent), ("acct_b", theirs)):
        with pytest.raises(NotFound):
            store.begin_delete_run(account, agent_id, run_id)
        with pytest.raises(NotFound):
            store.get_run(account, agent_id, run_id)
    with pytest.raises(NotFound):
        store.get_agent("acct_b", mine)
    assert store.get_run("acct_a", mine, run_id)["status"] == "queued"


def test_concurrent_writers_never_write_after_the_delete(store: AgentStore) -> None:
    agent_id = agent(store)
    run_id = run(store, agent_id)
    store.append(run_id, RUNNER, "run.in_progress", {}, {"status": "in_progress"})
    stop = threading.Event()
    written_after: list[int] = []
    deleted = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            # Read the flag before appending: an append that started after the delete committed must
            # be refused (one that read it after could have committed just before the delete).
            started_after_delete = deleted.is_set()
            wrote = store.append(run_id, RUNNER, "message.delta", {"content": "x"})
            if wrote and started_after_delete:
                written_after.append(1)
            if not wrote:
                return

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for thread in threads:
        thread.start()
    store.begin_delete_run("acct_a", agent_id, run_id)
    deleted.set()
    store.finish_delete_run(run_id)
    stop.set()
    for thread in threads:
        thread.join()
    assert written_after == [] and stored_events(store, run_id) == 0


def test_stale_runs_fail_as_interrupted_and_can_still_be_deleted(store: AgentStore) -> None:
    agent_id = agent(store)
    stale, fresh = run(store, agent_id), run(store, agent_id)
    store.append(stale, RUNNER, "run.in_progress", {}, {"status": "in_progress"})
    with store._database.transaction() as session:
        session.execute(
            update(AgentRun).where(AgentRun.id == stale).values(updated_at=utcnow() - timedelta(seconds=60))
        )
    assert store.recover_stale(30) == 1
    failed = store.get_run("acct_a", agent_id, stale)
    assert failed["status"] == "failed" and failed["error"]["code"] == "interrupted"
    assert store.events("acct_a", agent_id, stale)[0][-1]["type"] == "run.failed"
    assert store.get_run("acct_a", agent_id, fresh)["status"] == "queued"
    store.begin_delete_run("acct_a", agent_id, stale)
    store.finish_delete_run(stale)
    assert stored_events(store, stale) == 0


def test_a_half_done_deletion_is_finished_by_recovery(store: AgentStore) -> None:
    agent_id = agent(store)
    run_id = run(store, agent_id)
    store.begin_delete_run("acct_a", agent_id, run_id)  # the gateway dies here
    with store._database.transaction() as session:
        session.execute(
            update(AgentRun).where(AgentRun.id == run_id).values(updated_at=utcnow() - timedelta(seconds=60))
        )
    store.recover_stale(30)
    assert stored_events(store, run_id) == 0
    with store._database.transaction() as session:
        assert session.get(AgentRun, run_id) is None


def test_cancel_moves_an_active_run_and_refuses_a_finished_one(store: AgentStore) -> None:
    agent_id = agent(store)
    run_id = run(store, agent_id)
    assert store.cancel_run("acct_a", agent_id, run_id)["status"] == "cancelled"
    assert store.events("acct_a", agent_id, run_id)[0][-1]["type"] == "run.cancelled"
    assert not store.append(run_id, RUNNER, "message.delta", {"content": "x"})
    with pytest.raises(Conflict):
        store.cancel_run("acct_a", agent_id, run_id)


def test_lists_page_by_creation_both_ways_and_deleting_an_agent_erases_its_runs(store: AgentStore) -> None:
    agent_id = agent(store)
    runs = [run(store, agent_id) for _ in range(5)]
    first, more = store.list_runs("acct_a", agent_id, None, 2, "asc")
    second, _ = store.list_runs("acct_a", agent_id, first[-1]["id"], 2, "asc")
    assert more and [r["id"] for r in first + second] == runs[:4]
    newest, _ = store.list_runs("acct_a", agent_id, None, 5, "desc")
    assert [r["id"] for r in newest] == runs[::-1]
    assert [a["id"] for a in store.list_agents("acct_a", None, 10, "asc")[0]] == [agent_id]
    assert set(store.begin_delete_agent("acct_a", agent_id)) == set(runs)
    assert not store.append(runs[0], RUNNER, "message.delta", {"content": "x"})
    store.finish_delete_agent(agent_id)
    assert all(stored_events(store, r) == 0 for r in runs)
    with pytest.raises(NotFound):
        store.get_agent("acct_a", agent_id)
