"""Stored responses in the database (SQLite and PostgreSQL): chains, guarded status moves of background
responses, stale ones failed as interrupted, per-account and per-deployment visibility."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from modelhost.errors import InvalidRequest, NotFound
from modelhost.serving.responses.store import ResponseStore
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, StoredResponse
from modelhost.store.types import utcnow

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "hi"}],
}
ANSWER = {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed", "content": []}


@pytest.fixture
def store(database_url: str) -> ResponseStore:
    database = Database(database_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add_all([Account(id="acct_a", name="a"), Account(id="acct_b", name="b")])
    return ResponseStore(database, stale_seconds=30)


def create(store: ResponseStore, status: str = "completed", **values: Any) -> str:
    response = store.create(
        "acct_a",
        values.pop("deployment_id", "dep_1"),
        "chat",
        status=status,
        background=values.pop("background", False),
        previous_response_id=values.pop("previous_response_id", None),
        settings={"metadata": {"k": "v"}, "instructions": None},
        context=values.pop("context", []),
        input_items=values.pop("input_items", [MESSAGE]),
        output=values.pop("output", [ANSWER]),
        **values,
    )
    response_id: str = response["id"]
    return response_id


def test_a_stored_response_reads_back_with_its_settings_and_chains_its_items(store: ResponseStore) -> None:
    first = create(store, usage={"input_tokens": 3})
    view = store.get("acct_a", None, first)
    assert view["status"] == "completed" and view["metadata"] == {"k": "v"} and view["completed_at"]
    assert store.chain("acct_a", None, first) == [MESSAGE, ANSWER]
    second = create(store, previous_response_id=first, context=store.chain("acct_a", None, first))
    assert store.chain("acct_a", None, second) == [MESSAGE, ANSWER, MESSAGE, ANSWER]


def test_other_accounts_and_other_deployments_keys_do_not_see_a_response(store: ResponseStore) -> None:
    response = create(store)
    assert store.get("acct_a", frozenset({"dep_1"}), response)["id"] == response
    for account, scope in (("acct_b", None), ("acct_a", frozenset({"dep_2"}))):
        with pytest.raises(NotFound):
            store.get(account, scope, response)
        with pytest.raises(InvalidRequest) as refused:
            store.chain(account, scope, response)
        assert refused.value.param == "previous_response_id"
        with pytest.raises(NotFound):
            store.delete(account, scope, response)


def test_a_background_response_moves_once_and_a_cancel_wins_over_a_later_finish(store: ResponseStore) -> None:
    response = create(store, status="queued", background=True, output=[])
    with pytest.raises(InvalidRequest):
        store.chain("acct_a", None, response)  # still running: nothing to continue from yet
    assert store.start(response) and not store.start(response)
    assert store.beat(response)
    assert store.cancel("acct_a", None, response)["status"] == "cancelled"
    assert not store.finish(response, status="completed", output=[ANSWER])
    assert not store.beat(response)  # the runner learns it was stopped
    view = store.get("acct_a", None, response)
    assert view["status"] == "cancelled" and view["output"] == []


def test_only_background_responses_can_be_cancelled(store: ResponseStore) -> None:
    with pytest.raises(InvalidRequest) as refused:
        store.cancel("acct_a", None, create(store))
    assert refused.value.param == "response_id"


def test_a_background_response_whose_runner_went_silent_reads_as_interrupted(store: ResponseStore) -> None:
    response = create(store, status="queued", background=True, output=[])
    store.start(response)
    with store._database.transaction() as session:
        session.execute(
            update(StoredResponse)
            .where(StoredResponse.id == response)
            .values(updated_at=utcnow() - timedelta(seconds=60))
        )
    view = store.get("acct_a", None, response)
    assert view["status"] == "failed" and view["error"]["code"] == "interrupted"
    assert not store.finish(response, status="completed")


def test_input_items_page_newest_first_by_default(store: ResponseStore) -> None:
    first = create(store)
    question = {**MESSAGE, "id": "msg_3"}
    second = create(store, context=store.chain("acct_a", None, first), input_items=[question])
    items, more = store.input_items("acct_a", None, second, None, 2, "desc")
    assert [i["id"] for i in items] == ["msg_3", "msg_2"] and more  # this input, then the answer before
    rest, more = store.input_items("acct_a", None, second, "msg_2", 10, "desc")
    assert [i["id"] for i in rest] == ["msg_1"] and not more
    with pytest.raises(InvalidRequest):
        store.input_items("acct_a", None, second, "msg_missing", 10, "asc")


def test_deleting_a_response_removes_it(store: ResponseStore) -> None:
    response = create(store)
    store.delete("acct_a", None, response)
    with pytest.raises(NotFound):
        store.get("acct_a", None, response)


def test_a_response_keeps_the_time_its_request_came_not_the_time_it_was_stored(store: ResponseStore) -> None:
    came = utcnow() - timedelta(minutes=5)  # a long generation: stored when it finished
    view = store.get("acct_a", None, create(store, created_at=came))
    assert view["created_at"] == int(came.timestamp()) < view["completed_at"]


def test_a_background_responses_events_read_back_in_pages_after_a_number_and_go_with_it(
    store: ResponseStore,
) -> None:
    response = create(store, status="queued", background=True, output=[])
    events = [{"type": "response.output_text.delta", "delta": str(n), "sequence_number": n} for n in range(7)]
    assert store.last_event(response) == -1 and store.events_after(response, -1, 10) == []
    assert store.add_events(response, events[:3]) and store.add_events(response, events[3:])
    assert store.events_after(response, -1, 4) == events[:4]  # a page
    assert store.events_after(response, 3, 100) == events[4:]
    assert store.events_after(response, 6, 100) == [] and store.last_event(response) == 6
    with pytest.raises(InvalidRequest) as refused:
        store.streamed("acct_a", None, create(store))  # not a background one
    assert refused.value.param == "stream"
    with pytest.raises(NotFound):
        store.streamed("acct_b", None, response)
    assert store.streamed("acct_a", None, response)["id"] == response
    store.delete("acct_a", None, response)
    assert store.events_after(response, -1, 10) == [] and store.last_event(response) == -1
    assert not store.add_events(response, events[:1])  # its runner learns it was deleted


def _silent(store: ResponseStore, response: str, seconds: float = 60) -> None:
    """Its owner stopped beating `seconds` ago."""
    with store._database.transaction() as session:
        session.execute(
            update(StoredResponse)
            .where(StoredResponse.id == response)
            .values(updated_at=utcnow() - timedelta(seconds=seconds))
        )


def test_the_migration_makes_the_takeover_columns_the_models_declare(store: ResponseStore) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from modelhost.store.models import Base

    with store._database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert [d for d in differences if "response" in str(d)] == []


def test_of_several_processes_looking_at_once_exactly_one_takes_a_silent_response_once(
    store: ResponseStore,
) -> None:
    """Issue 73: a background response whose owner went silent is claimed by one of eight processes
    claiming at once (a guarded UPDATE); the silent owner's writes are refused from then on; the taker
    reads every event written before its claim; silent again, it is not taken a second time and reads as
    interrupted (a poisoned request costs at most two owners)."""
    import threading

    response = create(store, status="queued", background=True, output=[], owner="gw-dead", job=b"job")
    assert store.start(response, "gw-dead") and store.claim("gw-early") is None  # it beats: not taken
    event = {"type": "response.created", "sequence_number": 0}
    assert store.add_events(response, [event], "gw-dead", [b"engine"])
    _silent(store, response)
    assert store.get("acct_a", None, response)["status"] == "in_progress"  # to be taken, not failed
    barrier, claims = threading.Barrier(8), dict[str, Any]()

    def claim(name: str) -> None:
        barrier.wait()
        claims[name] = store.claim(name)

    threads = [threading.Thread(target=claim, args=(f"gw-{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [(taker, claimed)] = [(name, c) for name, c in claims.items() if c is not None]
    assert claimed.id == response and claimed.died and claimed.deployment_id == "dep_1"
    assert not store.beat(response, "gw-dead") and store.beat(response, taker)
    assert not store.add_events(response, [{**event, "sequence_number": 1}], "gw-dead", [None])
    assert not store.finish(response, owner="gw-dead", status="completed")
    assert not store.release(response, "gw-dead")
    taken = store.taken(response, taker)
    assert taken is not None and taken.job == b"job" and taken.written == [(event, b"engine")]
    assert store.taken(response, "gw-dead") is None
    _silent(store, response)  # the second owner dies too
    assert store.claim("gw-late") is None
    view = store.get("acct_a", None, response)
    assert view["status"] == "failed" and view["error"]["code"] == "interrupted"


def test_a_response_handed_back_is_taken_at_once_and_not_counted_as_a_death(store: ResponseStore) -> None:
    response = create(store, status="queued", background=True, output=[], owner="gw-stopping", job=b"job")
    assert store.start(response, "gw-stopping") and store.release(response, "gw-stopping")
    assert store.get("acct_a", None, response)["status"] == "in_progress"
    claimed = store.claim("gw-next")
    assert claimed is not None and not claimed.died and store.claim("gw-other") is None
    _silent(store, response)  # its new owner dies: a first death, taken over once more
    again = store.claim("gw-last")
    assert again is not None and again.died
    assert store.finish(response, owner="gw-last", status="completed", output=[ANSWER])
    view = store.get("acct_a", None, response)
    assert view["status"] == "completed" and store.claim("gw-after") is None


def test_a_response_without_a_job_or_cancelled_is_never_taken(store: ResponseStore) -> None:
    without = create(store, status="queued", background=True, output=[], owner="gw-dead")
    cancelled = create(store, status="queued", background=True, output=[], owner="gw-dead", job=b"job")
    store.cancel("acct_a", None, cancelled)
    for response in (without, cancelled):
        _silent(store, response)
    assert store.claim("gw-any") is None
    assert store.get("acct_a", None, without)["error"]["code"] == "interrupted"
    assert store.get("acct_a", None, cancelled)["status"] == "cancelled"
