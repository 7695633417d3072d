"""Evals (issue 74): OpenAI's Evals API's evals, their runs and each run's per-item results

Revision ID: 0034
Revises: 0033
Create Date: 2026-11-29 14:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

WHEN = modelhost.store.types.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "evals",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=True),
        sa.Column("data_source_config", sa.JSON(), nullable=False),
        sa.Column("testing_criteria", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_evals_account_id_accounts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evals")),
    )
    with op.batch_alter_table("evals") as batch:
        batch.create_index(batch.f("ix_evals_account_id"), ["account_id"])
        batch.create_index(batch.f("ix_evals_created_at"), ["created_at"])
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("eval_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("data_source", sa.JSON(), nullable=False),
        sa.Column("items", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("errored", sa.Integer(), nullable=False),
        sa.Column("per_criteria", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.Column("updated_at", WHEN(), nullable=False),
        sa.ForeignKeyConstraint(
            ["eval_id"], ["evals.id"], name=op.f("fk_eval_runs_eval_id_evals"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_eval_runs_account_id_accounts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    with op.batch_alter_table("eval_runs") as batch:
        batch.create_index(batch.f("ix_eval_runs_eval_id"), ["eval_id"])
        batch.create_index(batch.f("ix_eval_runs_account_id"), ["account_id"])
        batch.create_index(batch.f("ix_eval_runs_status"), ["status"])
        batch.create_index(batch.f("ix_eval_runs_created_at"), ["created_at"])
    op.create_table(
        "eval_run_items",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("item_index", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("item", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("sample", sa.JSON(), nullable=True),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["eval_runs.id"], name=op.f("fk_eval_run_items_run_id_eval_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_run_items")),
        sa.UniqueConstraint("run_id", "item_index", name=op.f("uq_eval_run_items_run_id")),
    )
    with op.batch_alter_table("eval_run_items") as batch:
        batch.create_index(batch.f("ix_eval_run_items_run_id"), ["run_id"])
        batch.create_index(batch.f("ix_eval_run_items_created_at"), ["created_at"])


def downgrade() -> None:
    op.drop_table("eval_run_items")
    op.drop_table("eval_runs")
    op.drop_table("evals")
