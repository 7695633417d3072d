"""batches, agent_runs, video_jobs: traceparent, the W3C traceparent of the request that created each,
so that the work's spans link to it whenever it runs, a restart later included (issue 42)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TABLES = ("batches", "agent_runs", "video_jobs")


def upgrade() -> None:
    # Nullable, no default: work created before this migration, or with tracing off, links to nothing.
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("traceparent", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("traceparent")
