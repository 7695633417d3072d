"""Conversations in the database (SQLite and PostgreSQL): items in order and paged, per-account and
per-deployment visibility, the item limit held by the guarded append, duplicates refused, a turn appended
after the limit, deletion erasing the items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from modelhost.errors import InvalidRequest, NotFound
from modelhost.serving.responses.conversations import ConversationStore
from modelhost.serving.responses.store import Scope
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, ConversationItem


def message(number: int) -> dict[str, Any]:
    text = {"type": "input_text", "text": f"m{number}"}
    return {
        "id": f"msg_{number}",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [text],
    }


@pytest.fixture
def store(database_url: str) -> ConversationStore:
    database = Database(database_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add_all([Account(id="acct_a", name="a"), Account(id="acct_b", name="b")])
    return ConversationStore(database, max_items=5, max_item_bytes=2048)


def test_items_keep_their_order_and_page_both_ways(store: ConversationStore) -> None:
    conversation = store.create("acct_a", None, {"k": "v"}, [message(0), message(1)])
    assert conversation["object"] == "conversation" and conversation["metadata"] == {"k": "v"}
    store.add("acct_a", None, conversation["id"], [message(2)])
    assert store.append(conversation["id"], [message(3)])
    page, more = store.list_items("acct_a", None, conversation["id"], None, 2, "asc")
    assert [i["id"] for i in page] == ["msg_0", "msg_1"] and more
    page, more = store.list_items("acct_a", None, conversation["id"], "msg_1", 2, "asc")
    assert [i["id"] for i in page] == ["msg_2", "msg_3"] and not more
    page, more = store.list_items("acct_a", None, conversation["id"], "msg_2", 5, "desc")
    assert [i["id"] for i in page] == ["msg_1", "msg_0"] and not more
    assert store.context("acct_a", None, conversation["id"], []) == [message(n) for n in range(4)]
    with pytest.raises(InvalidRequest) as missing:
        store.list_items("acct_a", None, conversation["id"], "msg_9", 2, "asc")
    assert missing.value.param == "after"


def test_another_account_and_another_deployments_key_get_a_404(store: ConversationStore) -> None:
    own = store.create("acct_a", frozenset({"dep_1"}), None, [message(0)])["id"]
    wide = store.create("acct_a", None, None, [])["id"]
    assert store.get("acct_a", frozenset({"dep_1", "dep_2"}), own)["id"] == own
    assert store.get("acct_a", None, own)["id"] == own  # the account key sees all its conversations
    calls: tuple[Callable[[str, Scope, str], object], ...] = (
        store.get,
        lambda a, s, c: store.update(a, s, c, {}),
        store.delete,
        lambda a, s, c: store.add(a, s, c, [message(5)]),
        lambda a, s, c: store.list_items(a, s, c, None, 5, "asc"),
        lambda a, s, c: store.get_item(a, s, c, "msg_0"),
        lambda a, s, c: store.delete_item(a, s, c, "msg_0"),
    )
    for account, scope, conversation in (
        ("acct_b", None, own),
        ("acct_a", frozenset({"dep_2"}), own),
        ("acct_a", frozenset({"dep_1"}), wide),  # an account key's conversation: any deployment's turns
    ):
        for call in calls:
            with pytest.raises(NotFound):
                call(account, scope, conversation)
        with pytest.raises(NotFound) as refused:
            store.context(account, scope, conversation, [])
        assert refused.value.param == "conversation"
    assert store.get_item("acct_a", None, own, "msg_0") == message(0)  # nothing was added or deleted


def test_the_item_limit_holds_for_adds_and_turns_but_a_finished_turn_is_appended(
    store: ConversationStore,
) -> None:
    conversation = store.create("acct_a", None, None, [message(n) for n in range(4)])["id"]
    with pytest.raises(InvalidRequest) as full:
        store.add("acct_a", None, conversation, [message(4), message(5)])
    assert full.value.code == "conversation_full" and full.value.param == "items"
    with pytest.raises(InvalidRequest) as turn:
        store.context("acct_a", None, conversation, [message(4), message(5)])
    assert turn.value.code == "conversation_full" and turn.value.param == "input"
    store.context("acct_a", None, conversation, [message(4)])
    assert store.append(conversation, [message(4), message(5)])  # its output came after the check
    page, _ = store.list_items("acct_a", None, conversation, None, 10, "asc")
    assert [i["id"] for i in page] == [f"msg_{n}" for n in range(6)]
    store.delete_item("acct_a", None, conversation, "msg_5")
    store.delete_item("acct_a", None, conversation, "msg_4")
    store.add("acct_a", None, conversation, [message(6)])  # room again
    with pytest.raises(NotFound):
        store.delete_item("acct_a", None, conversation, "msg_4")


def test_an_item_larger_than_the_limit_is_refused(store: ConversationStore) -> None:
    big = {**message(1), "content": [{"type": "input_text", "text": "x" * 4096}]}
    with pytest.raises(InvalidRequest) as refused:
        store.create("acct_a", None, None, [message(0), big])
    assert refused.value.code == "item_too_large" and refused.value.param == "items[1]"
    with pytest.raises(InvalidRequest) as long_id:  # a client's function call id: PostgreSQL's column
        store.create("acct_a", None, None, [{**message(0), "id": "fc_" + "x" * 62}])
    assert long_id.value.param == "items[0].id"


def test_an_id_already_in_the_conversation_is_refused_and_a_turn_gets_a_fresh_one(
    store: ConversationStore,
) -> None:
    conversation = store.create("acct_a", None, None, [message(0)])["id"]
    for given in ([message(0)], [message(1), message(1)]):
        with pytest.raises(InvalidRequest) as refused:
            store.add("acct_a", None, conversation, given)
        assert refused.value.code == "duplicate_item"
    with pytest.raises(InvalidRequest):
        store.context("acct_a", None, conversation, [message(0)])
    assert store.append(conversation, [message(0)])  # taken meanwhile: renamed, not lost
    ids = [i["id"] for i in store.context("acct_a", None, conversation, [])]
    assert ids[0] == "msg_0" and ids[1].startswith("msg_") and ids[1] != "msg_0"


def test_deleting_a_conversation_erases_its_items(store: ConversationStore, database_url: str) -> None:
    conversation = store.create("acct_a", None, None, [message(0), message(1)])["id"]
    store.delete("acct_a", None, conversation)
    with pytest.raises(NotFound):
        store.get("acct_a", None, conversation)
    assert not store.append(conversation, [message(2)])  # a turn that finished after the delete
    database = Database(database_url)
    with database.transaction() as session:
        assert session.execute(select(func.count()).select_from(ConversationItem)).scalar_one() == 0
    database.dispose()
