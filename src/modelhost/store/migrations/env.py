"""Alembic environment: uses the engine handed over by `modelhost.store.migrate`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from modelhost.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    """On SQLite, with foreign keys off while migrating: a batch operation rebuilds a table (a copy, the
    old one dropped), and with them on, dropping a table deletes every row of the tables that reference
    it with ON DELETE CASCADE (the pragma is a no-op inside a transaction: set before it begins)."""
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            with connection.begin():
                context.configure(
                    connection=connection,
                    target_metadata=target_metadata,
                    render_as_batch=sqlite,
                    compare_type=True,
                )
                context.run_migrations()
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()


run_migrations()
