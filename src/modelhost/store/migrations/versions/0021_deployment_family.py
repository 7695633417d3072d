"""deployments: family (the model family detected from a generation deployment's files and chat template,
which names its tool and reasoning parsers) (issue 50)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26 22:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("family", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("family")
