"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Always-aware UTC datetimes.

    SQLite drops time zones; storing naive UTC and re-attaching UTC on load makes both databases
    return the same values, so comparisons and ISO 8601 output never depend on the backend.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def unix_seconds(moment: datetime | None) -> int | None:
    """OpenAI-shaped objects give times as Unix seconds (null while unset)."""
    return None if moment is None else int(moment.timestamp())


def new_id(prefix: str) -> str:
    """Public identifiers: a type prefix plus 96 random bits, unguessable and URL-safe."""
    return f"{prefix}_{secrets.token_hex(12)}"
