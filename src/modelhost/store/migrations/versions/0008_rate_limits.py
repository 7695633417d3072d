"""accounts and api_keys: rate limits (issue 31)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: unlimited, as every account and key made before limits existed
    for table in ("accounts", "api_keys"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("limits", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    for table in ("api_keys", "accounts"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("limits")
