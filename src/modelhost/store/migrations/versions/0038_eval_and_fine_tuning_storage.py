"""eval_runs.stored_bytes (a run's copy of its items and its recorded output items) and
fine_tuning_jobs.stored_bytes (the checkpoints it keeps in the blob store), each billed as storage
while it is held, as a batch's is (issue 74)

Revision ID: 0038
Revises: 0037
Create Date: 2026-11-29 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Runs and jobs made before this migration count from 0: a run's storage is billed from its next
    # recorded item, a job's from its next checkpoint (an ended job's checkpoints are deleted by the
    # fine-tuning runner's next sweep either way).
    with op.batch_alter_table("eval_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("fine_tuning_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("fine_tuning_jobs", schema=None) as batch_op:
        batch_op.drop_column("stored_bytes")
    with op.batch_alter_table("eval_runs", schema=None) as batch_op:
        batch_op.drop_column("stored_bytes")
