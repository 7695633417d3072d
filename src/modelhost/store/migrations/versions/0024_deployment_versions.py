"""deployments: versions (the artifacts a deployment serves, each with its traffic and state), sticky (a
canary's caller stays on one version) and history (its last artifact switches) (issue 52)

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27 02:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("versions", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("sticky", sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column("history", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): a batch copy would drop and recreate the table,
    # which SQLite refuses while other tables' foreign keys point at it
    for column in ("history", "sticky", "versions"):
        op.drop_column("deployments", column)
