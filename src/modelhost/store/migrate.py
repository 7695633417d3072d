"""Alembic, driven from code: `upgrade` at start and by `modelhost db upgrade`, `is_current` for /ready."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from modelhost.store.db import Database

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(database: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # `%` must be escaped for configparser; the engine itself is handed over directly.
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    config.attributes["engine"] = database.engine
    return config


# The key of the PostgreSQL advisory lock that migrations hold (any constant: "modelhost" in ASCII).
MIGRATION_LOCK_KEY = 0x6D6F64656C686F73


def upgrade(database: Database, revision: str = "head") -> None:
    """Migrate to `revision`. On PostgreSQL under a session advisory lock: several gateways starting at
    once (a Deployment's pods, compose replicas) each apply migrations at start, and the lock makes them
    take turns, so the second finds the schema current instead of racing the first's DDL."""
    if database.is_sqlite:
        command.upgrade(alembic_config(database), revision)
        return
    with database.engine.connect() as lock:
        lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        try:
            command.upgrade(alembic_config(database), revision)
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})


def head_revision() -> str | None:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    return script.get_current_head()


def current_revision(database: Database) -> str | None:
    with database.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(database: Database) -> bool:
    try:
        return current_revision(database) == head_revision()
    except Exception:
        return False
