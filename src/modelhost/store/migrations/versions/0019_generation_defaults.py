"""deployments: generation_defaults (the sampling defaults of a deployment's requests, before the
model's generation_config.json) (issue 50)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26 18:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("generation_defaults", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("generation_defaults")
