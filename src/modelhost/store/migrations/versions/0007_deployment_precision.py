"""deployments: precision (`float32` or `int8`) and the int8 quality measured at load (issue 30)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server default: deployments made before precision existed run in float32.
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("precision", sa.String(length=8), nullable=False, server_default="float32")
        )
        batch_op.add_column(sa.Column("precision_quality", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("precision_quality")
        batch_op.drop_column("precision")
