"""artifact_imports: imports filling an artifact's upload session from S3, HTTPS or a Hub (issue 52)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27 02:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

WHEN = modelhost.store.types.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "artifact_imports",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("artifact_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("include", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("exclude", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("sealed", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False),
        sa.Column("bytes_total", sa.BigInteger(), nullable=True),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.Column("updated_at", WHEN(), nullable=False),
        sa.Column("finished_at", WHEN(), nullable=True),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["model_artifacts.id"],
            name=op.f("fk_artifact_imports_artifact_id_model_artifacts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_artifact_imports_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact_imports")),
    )
    with op.batch_alter_table("artifact_imports") as batch:
        batch.create_index(batch.f("ix_artifact_imports_artifact_id"), ["artifact_id"])
        batch.create_index(batch.f("ix_artifact_imports_status"), ["status"])


def downgrade() -> None:
    op.drop_table("artifact_imports")
