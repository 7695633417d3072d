"""deployments: generation_settings (a text-generation deployment's max_model_len, chat template, default
template arguments and parsers) (issue 50)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26 20:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("generation_settings", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("generation_settings")
