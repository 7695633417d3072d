"""deployments: engine (asked for), engine_in_use and engine_reason (issue 29)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server defaults: deployments made before engines existed asked for nothing and run on ours.
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine", sa.String(length=16), nullable=False, server_default="auto"))
        batch_op.add_column(
            sa.Column("engine_in_use", sa.String(length=16), nullable=False, server_default="transformers")
        )
        batch_op.add_column(sa.Column("engine_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("engine_reason")
        batch_op.drop_column("engine_in_use")
        batch_op.drop_column("engine")
