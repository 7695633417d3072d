"""Alembic environment: uses the engine handed over by `modelhost.store.migrate`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from modelhost.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        context.run_migrations()


run_migrations()
