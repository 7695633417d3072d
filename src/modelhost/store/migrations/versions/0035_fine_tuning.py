"""fine-tuning jobs, their events and checkpoints (issue 74)

Revision ID: 0035
Revises: 0034
Create Date: 2026-11-29 14:20:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

WHEN = modelhost.store.types.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "fine_tuning_jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=False),
        sa.Column("base_deployment_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("training_file", sa.String(length=40), nullable=False),
        sa.Column("validation_file", sa.String(length=40), nullable=True),
        sa.Column("training_key", sa.String(length=200), nullable=False),
        sa.Column("validation_key", sa.String(length=200), nullable=True),
        sa.Column("hyperparameters", sa.JSON(), nullable=False),
        sa.Column("suffix", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("deploy", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("waiting_reason", sa.Text(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_param", sa.String(length=64), nullable=True),
        sa.Column("fine_tuned_model", sa.String(length=300), nullable=True),
        sa.Column("artifact_id", sa.String(length=40), nullable=True),
        sa.Column("deployment_id", sa.String(length=40), nullable=True),
        sa.Column("compute_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.Column("updated_at", WHEN(), nullable=False),
        sa.Column("finished_at", WHEN(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_fine_tuning_jobs_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fine_tuning_jobs")),
    )
    with op.batch_alter_table("fine_tuning_jobs") as batch:
        batch.create_index(batch.f("ix_fine_tuning_jobs_account_id"), ["account_id"])
        batch.create_index(batch.f("ix_fine_tuning_jobs_status"), ["status"])
        batch.create_index(batch.f("ix_fine_tuning_jobs_created_at"), ["created_at"])
    tables: tuple[tuple[str, list[sa.Column[Any]]], ...] = (
        (
            "fine_tuning_events",
            [
                sa.Column("level", sa.String(length=8), nullable=False),
                sa.Column("message", sa.Text(), nullable=False),
                sa.Column("type", sa.String(length=16), nullable=False),
                sa.Column("data", sa.JSON(), nullable=True),
            ],
        ),
        (
            "fine_tuning_checkpoints",
            [
                sa.Column("step", sa.Integer(), nullable=False),
                sa.Column("metrics", sa.JSON(), nullable=False),
                sa.Column("blob_key", sa.String(length=200), nullable=False),
            ],
        ),
    )
    for table, columns in tables:
        op.create_table(
            table,
            sa.Column("id", sa.String(length=40), nullable=False),
            sa.Column("job_id", sa.String(length=40), nullable=False),
            *columns,
            sa.Column("created_at", WHEN(), nullable=False),
            sa.ForeignKeyConstraint(
                ["job_id"],
                ["fine_tuning_jobs.id"],
                name=op.f(f"fk_{table}_job_id_fine_tuning_jobs"),
                ondelete="CASCADE",
            ),
            sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
        )
        with op.batch_alter_table(table) as batch:
            batch.create_index(batch.f(f"ix_{table}_job_id"), ["job_id"])
            batch.create_index(batch.f(f"ix_{table}_created_at"), ["created_at"])


def downgrade() -> None:
    op.drop_table("fine_tuning_checkpoints")
    op.drop_table("fine_tuning_events")
    op.drop_table("fine_tuning_jobs")
