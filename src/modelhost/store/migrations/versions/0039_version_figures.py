"""version_figures: each server's live counts of a gated rollout's candidate, which the server driving
the gate adds up (issue 74)

Revision ID: 0039
Revises: 0038
Create Date: 2026-11-29 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "version_figures",
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("artifact_id", sa.String(length=40), nullable=False),
        sa.Column("server", sa.String(length=64), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("updated_at", modelhost.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("deployment_id", "artifact_id", "server"),
    )


def downgrade() -> None:
    op.drop_table("version_figures")
