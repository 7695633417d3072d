"""Background responses taken over from a dead gateway process (issue 73): a response's owner, its
takeovers and what a taker needs (its job); each written event's engine events; responses by status

Revision ID: 0037
Revises: 0036
Create Date: 2026-11-29 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the responses made before have no job: one whose gateway dies reads as interrupted, as before
    with op.batch_alter_table("responses") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("takeovers", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("job", sa.LargeBinary(), nullable=True))
        batch.create_index(batch.f("ix_responses_status"), ["status"], unique=False)
    with op.batch_alter_table("response_events") as batch:
        batch.add_column(sa.Column("engine", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("response_events") as batch:
        batch.drop_column("engine")
    with op.batch_alter_table("responses") as batch:
        batch.drop_index(batch.f("ix_responses_status"))
        batch.drop_column("job")
        batch.drop_column("takeovers")
        batch.drop_column("owner")
