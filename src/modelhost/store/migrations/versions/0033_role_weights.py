"""Weights per role (issue 72): accounts.role_weights

Revision ID: 0033
Revises: 0032
Create Date: 2026-11-29 11:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # none: every role weighs 1, as before
    with op.batch_alter_table("accounts") as batch_op:
        batch_op.add_column(sa.Column("role_weights", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch_op:
        batch_op.drop_column("role_weights")
