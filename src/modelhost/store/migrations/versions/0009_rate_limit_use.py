"""rate_limit_use: rate-limit counts shared between servers on one database (issue 31)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_use",
        sa.Column("server", sa.String(length=80), nullable=False),
        sa.Column("subject", sa.String(length=80), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("server", "subject", name=op.f("pk_rate_limit_use")),
    )
    op.create_index(op.f("ix_rate_limit_use_updated_ms"), "rate_limit_use", ["updated_ms"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_rate_limit_use_updated_ms"), table_name="rate_limit_use")
    op.drop_table("rate_limit_use")
