"""Cursor pages of a table by (created_at, id): stable under inserts, one indexed query per page."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_


def keyset_page(
    session: Any, query: Any, table: Any, cursor: Any, limit: int, order: str
) -> tuple[list[Any], bool]:
    """The rows after `cursor` (a row of `table`, or None), newest first for `desc`; and whether more
    follow (one extra row is read to know)."""
    newest_first = order == "desc"
    if cursor is not None:
        later = (table.created_at, table.id)
        mark = (cursor.created_at, cursor.id)
        query = query.where(_before(later, mark) if newest_first else _before(mark, later))
    ordering = (table.created_at.desc(), table.id.desc()) if newest_first else (table.created_at, table.id)
    rows = session.scalars(query.order_by(*ordering).limit(limit + 1)).all()
    return list(rows[:limit]), len(rows) > limit


def _before(a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    """(created_at, id) of `a` sorts before that of `b`."""
    return or_(a[0] < b[0], and_(a[0] == b[0], a[1] < b[1]))
