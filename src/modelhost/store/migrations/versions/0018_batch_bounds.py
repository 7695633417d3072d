"""batches: output_bytes (the answers recorded so far, against MODELHOST_BATCH_MAX_OUTPUT_BYTES) and
stored_bytes (what the batch holds outside the Files API, its input copy and its answers, billed as
storage while it exists) (issue 49)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 17:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batches made before this migration count from 0: their budget starts now, their storage is
    # billed from the next recorded answer or tick.
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("stored_bytes")
        batch_op.drop_column("output_bytes")
