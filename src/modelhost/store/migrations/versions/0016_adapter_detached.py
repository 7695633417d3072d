"""adapter detached: why an adapter deployment of another account no longer runs on the base that the
operator stopped sharing (issue 49)

Revision ID: 0016
Revises: 0013
Create Date: 2026-11-26 17:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("detached_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    # in place (SQLite 3.35+ drops a column itself): recreating the table, as batch mode would, fails
    # while other deployments and footprints refer to its rows
    with op.batch_alter_table("deployments", recreate="never") as batch:
        batch.drop_column("detached_reason")
