"""model_artifacts: quantization (method, bits, group size, scheme), serving (per engine and device kind:
servable, or why not) and gguf (a GGUF model's files and header facts) (issue 51)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26 23:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_artifacts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("quantization", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("serving", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("gguf", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_artifacts", schema=None) as batch_op:
        batch_op.drop_column("gguf")
        batch_op.drop_column("serving")
        batch_op.drop_column("quantization")
