"""Gated rollouts (issue 74, part 3): a deployment's rollout gate, its steps and decisions, and which
server drives it

Revision ID: 0036
Revises: 0035
Create Date: 2026-11-29 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("rollout", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("rollout_claimed_by", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("rollout_beat_at", modelhost.store.types.UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("rollout_beat_at")
        batch.drop_column("rollout_claimed_by")
        batch.drop_column("rollout")
