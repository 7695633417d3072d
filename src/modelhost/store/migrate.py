"""Alembic, driven from code: `upgrade` at start and by `modelhost db upgrade`, `is_current` for /ready."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from modelhost.store.db import Database

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(database: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # `%` must be escaped for configparser; the engine itself is handed over directly.
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    config.attributes["engine"] = database.engine
    return config


def upgrade(database: Database, revision: str = "head") -> None:
    command.upgrade(alembic_config(database), revision)


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
