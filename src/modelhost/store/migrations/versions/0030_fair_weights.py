"""accounts.weight and api_keys.weight: fair shares of a shared model (issue 72)

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-29 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # 1 for every account and key made before: equal shares, as the engines' counters gave them.
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("weight", sa.Float(), nullable=False, server_default="1"))
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("weight", sa.Float(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("weight")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("weight")
