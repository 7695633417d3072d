"""Conversations in the database (OpenAI's Conversations API), per account; a deployment key sees only
the conversations created through keys of its own deployments.

A conversation is a list of Responses items in order. Adding items is one transaction that starts with
one guarded UPDATE of the conversation's row (`next_position`, `item_count`, and, for the Conversations
API, `item_count` within the limit): the row lock orders concurrent appends from any gateway process
and the limit cannot be raced past. A response created with `conversation` reads the items as its
context, then appends its input and output once it has finished (`append`, which does not refuse:
the turn was admitted before it was generated).
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from modelhost.errors import InvalidRequest, NotFound
from modelhost.serving.responses.items import item_id
from modelhost.serving.responses.store import Scope
from modelhost.store.db import Database
from modelhost.store.models import Conversation, ConversationItem
from modelhost.store.types import new_id, unix_seconds, utcnow

Item = dict[str, Any]
MAX_ID_LENGTH = 64  # `conversation_items.item_id`
PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


class ConversationStore:
    def __init__(self, database: Database, max_items: int, max_item_bytes: int) -> None:
        self._database = database
        self.max_items = max_items
        self.max_item_bytes = max_item_bytes

    # ---------------------------------------------------------------- conversations

    def create(
        self, account_id: str, scope: Scope, metadata: dict[str, str] | None, items: list[Item]
    ) -> dict[str, Any]:
        """A new conversation (with its first `items`); it keeps the creating key's deployments."""
        self._check(items, "items")
        with self._database.transaction() as session:
            row = Conversation(
                id=new_id("conv"),
                account_id=account_id,
                scope=sorted(scope) if scope is not None else None,
                metadata_=metadata or {},
                next_position=0,
                item_count=0,
                created_at=utcnow(),
            )
            session.add(row)
            session.flush()
            if items:
                self._add(session, account_id, scope, row.id, items, "items")
            return conversation_view(row)

    def get(self, account_id: str, scope: Scope, conversation_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return conversation_view(self._row(session, account_id, scope, conversation_id))

    def update(
        self, account_id: str, scope: Scope, conversation_id: str, metadata: dict[str, str] | None
    ) -> dict[str, Any]:
        with self._database.transaction() as session:
            row = self._row(session, account_id, scope, conversation_id)
            row.metadata_ = metadata or {}
            return conversation_view(row)

    def delete(self, account_id: str, scope: Scope, conversation_id: str) -> None:
        """Delete the conversation and erase its items."""
        with self._database.transaction() as session:
            self._row(session, account_id, scope, conversation_id)
            session.execute(
                delete(ConversationItem).where(ConversationItem.conversation_id == conversation_id)
            )
            session.execute(delete(Conversation).where(Conversation.id == conversation_id))

    # ---------------------------------------------------------------- items

    def add(self, account_id: str, scope: Scope, conversation_id: str, items: list[Item]) -> list[Item]:
        """Add items at the end (the Conversations API's add): within the limits, ids not yet used."""
        self._check(items, "items")
        with self._database.transaction() as session:
            return self._add(session, account_id, scope, conversation_id, items, "items")

    def context(self, account_id: str, scope: Scope, conversation_id: str, adding: list[Item]) -> list[Item]:
        """The items a response continuing the conversation starts from, once its input (`adding`) is
        known to fit: within the limits, its ids not already in the conversation."""
        self._check(adding, "input")
        with self._database.transaction() as session:
            try:
                row = self._row(session, account_id, scope, conversation_id)
            except NotFound:
                raise NotFound(
                    f"Conversation with id {conversation_id!r} not found.", param="conversation"
                ) from None
            if row.item_count + len(adding) > self.max_items:
                raise self._full("input")
            items = self._items(session, conversation_id)
        self._refuse_duplicates({item["id"] for item in items}, adding, "input")
        return items

    def append(self, conversation_id: str, items: list[Item]) -> bool:
        """A finished response's input and output, at the end; False when the conversation was deleted
        meanwhile (the turn is then kept by the response alone). An id taken meanwhile gets a new one."""
        with self._database.transaction() as session:
            if not self._reserve(session, conversation_id, len(items), limited=False):
                return False
            taken = self._ids(session, conversation_id, items)
            fresh = [
                {**item, "id": item_id(PREFIXES.get(item["type"], "item"))} if item["id"] in taken else item
                for item in items
            ]
            self._insert(session, conversation_id, fresh)
            return True

    def list_items(
        self,
        account_id: str,
        scope: Scope,
        conversation_id: str,
        after: str | None,
        limit: int,
        order: str,
    ) -> tuple[list[Item], bool]:
        """A page of the items, in order (`asc`) or newest first (`desc`), after the item `after`."""
        position = ConversationItem.position
        with self._database.transaction() as session:
            self._row(session, account_id, scope, conversation_id)
            query = select(ConversationItem.item).where(ConversationItem.conversation_id == conversation_id)
            if after is not None:
                mark = self._position(session, conversation_id, after)
                if mark is None:
                    raise InvalidRequest(f"No item {after!r} in this conversation.", param="after")
                query = query.where(position > mark if order == "asc" else position < mark)
            query = query.order_by(position.asc() if order == "asc" else position.desc()).limit(limit + 1)
            items = list(session.execute(query).scalars())
        return items[:limit], len(items) > limit

    def get_item(self, account_id: str, scope: Scope, conversation_id: str, item: str) -> Item:
        with self._database.transaction() as session:
            self._row(session, account_id, scope, conversation_id)
            found: Item | None = session.execute(
                select(ConversationItem.item).where(
                    ConversationItem.conversation_id == conversation_id, ConversationItem.item_id == item
                )
            ).scalar_one_or_none()
        if found is None:
            raise NotFound(f"No item {item!r} in conversation {conversation_id!r}.", param="item_id")
        return found

    def delete_item(self, account_id: str, scope: Scope, conversation_id: str, item: str) -> dict[str, Any]:
        """Delete one item; the answer is the conversation (OpenAI's shape)."""
        with self._database.transaction() as session:
            row = self._row(session, account_id, scope, conversation_id)
            gone = session.execute(
                delete(ConversationItem).where(
                    ConversationItem.conversation_id == conversation_id, ConversationItem.item_id == item
                )
            )
            if not getattr(gone, "rowcount", 0):
                raise NotFound(f"No item {item!r} in conversation {conversation_id!r}.", param="item_id")
            session.execute(
                update(Conversation)
                .where(Conversation.id == conversation_id)
                .values(item_count=Conversation.item_count - 1)
            )
            return conversation_view(row)

    # ---------------------------------------------------------------- inside a transaction

    def _add(
        self,
        session: Session,
        account_id: str,
        scope: Scope,
        conversation_id: str,
        items: list[Item],
        name: str,
    ) -> list[Item]:
        # the guarded UPDATE first: it takes the write lock before anything is read (SQLite, PostgreSQL)
        if not self._reserve(session, conversation_id, len(items), limited=True):
            self._row(session, account_id, scope, conversation_id)  # not found: 404
            raise self._full(name)
        self._row(session, account_id, scope, conversation_id)  # not visible: 404, and rolled back
        self._refuse_duplicates(self._ids(session, conversation_id, items), items, name)
        self._insert(session, conversation_id, items)
        return items

    def _reserve(self, session: Session, conversation_id: str, count: int, *, limited: bool) -> bool:
        """Move the conversation's counters by `count` items (within the limit when `limited`)."""
        query = update(Conversation).where(Conversation.id == conversation_id)
        if limited:
            query = query.where(Conversation.item_count + count <= self.max_items)
        moved = session.execute(
            query.values(
                next_position=Conversation.next_position + count, item_count=Conversation.item_count + count
            )
        )
        return bool(getattr(moved, "rowcount", 0))

    def _insert(self, session: Session, conversation_id: str, items: list[Item]) -> None:
        """Write `items` at the positions `_reserve` just took (the last ones before `next_position`)."""
        end = session.execute(
            select(Conversation.next_position).where(Conversation.id == conversation_id)
        ).scalar_one()
        start = end - len(items)
        session.add_all(
            ConversationItem(
                conversation_id=conversation_id, position=start + i, item_id=item["id"], item=item
            )
            for i, item in enumerate(items)
        )

    def _items(self, session: Session, conversation_id: str) -> list[Item]:
        return list(
            session.execute(
                select(ConversationItem.item)
                .where(ConversationItem.conversation_id == conversation_id)
                .order_by(ConversationItem.position)
            ).scalars()
        )

    def _ids(self, session: Session, conversation_id: str, items: list[Item]) -> set[str]:
        """Which of `items`' ids the conversation already holds."""
        return set(
            session.execute(
                select(ConversationItem.item_id).where(
                    ConversationItem.conversation_id == conversation_id,
                    ConversationItem.item_id.in_([item["id"] for item in items]),
                )
            ).scalars()
        )

    def _position(self, session: Session, conversation_id: str, item: str) -> int | None:
        position: int | None = session.execute(
            select(ConversationItem.position).where(
                ConversationItem.conversation_id == conversation_id, ConversationItem.item_id == item
            )
        ).scalar_one_or_none()
        return position

    def _row(self, session: Session, account_id: str, scope: Scope, conversation_id: str) -> Conversation:
        row = session.get(Conversation, conversation_id)
        if row is None or row.account_id != account_id or not _visible(row.scope, scope):
            raise NotFound(f"Conversation with id {conversation_id!r} not found.", param="conversation_id")
        return row

    # ---------------------------------------------------------------- checks

    def _check(self, items: list[Item], name: str) -> None:
        """Each item within the size limit, its id (a client's, for function calls) within the column."""
        for index, item in enumerate(items):
            if len(item["id"]) > MAX_ID_LENGTH:
                raise InvalidRequest(
                    f"{name}[{index}].id is longer than {MAX_ID_LENGTH} characters.",
                    param=f"{name}[{index}].id",
                )
            if len(orjson.dumps(item)) > self.max_item_bytes:
                raise InvalidRequest(
                    f"{name}[{index}] is larger than this server's {self.max_item_bytes} bytes per "
                    "conversation item (MODELHOST_CONVERSATION_MAX_ITEM_BYTES).",
                    param=f"{name}[{index}]",
                    code="item_too_large",
                )

    def _full(self, name: str) -> InvalidRequest:
        return InvalidRequest(
            f"The conversation would hold more than this server's {self.max_items} items "
            "(MODELHOST_CONVERSATION_MAX_ITEMS): delete items, or start a new conversation.",
            param=name,
            code="conversation_full",
        )

    @staticmethod
    def _refuse_duplicates(taken: set[str], items: list[Item], name: str) -> None:
        seen = set(taken)
        for index, item in enumerate(items):
            if item["id"] in seen:
                raise InvalidRequest(
                    f"Duplicate item found with id {item['id']!r}: remove duplicate items and try again.",
                    param=f"{name}[{index}]",
                    code="duplicate_item",
                )
            seen.add(item["id"])


def _visible(owner: list[str] | None, scope: Scope) -> bool:
    """An account key sees every conversation of its account; a deployment key those created through
    keys whose deployments are all its own (an account key's conversation may hold any deployment's
    turns, so it is not shown to a deployment key)."""
    if scope is None:
        return True
    return owner is not None and set(owner) <= scope


def conversation_view(row: Conversation) -> dict[str, Any]:
    """The conversation object of OpenAI's API."""
    return {
        "id": row.id,
        "object": "conversation",
        "created_at": unix_seconds(row.created_at),
        "metadata": row.metadata_,
    }
