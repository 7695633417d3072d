"""Persistent state: schema (SQLAlchemy 2), sessions and Alembic migrations."""

from modelhost.store.db import Database

__all__ = ["Database"]
