"""footprints: the memory an artifact's replicas were measured at, for the next load's reservation (issue 38)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelhost.store.types import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "footprints",
        sa.Column("artifact_id", sa.String(length=40), nullable=False),
        sa.Column("engine", sa.String(length=16), nullable=False),
        sa.Column("precision", sa.String(length=8), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("host_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gpu_bytes", sa.BigInteger(), nullable=False),
        sa.Column("measured_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["model_artifacts.id"],
            name=op.f("fk_footprints_artifact_id_model_artifacts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", "engine", "precision", "device", name=op.f("pk_footprints")),
    )


def downgrade() -> None:
    op.drop_table("footprints")
