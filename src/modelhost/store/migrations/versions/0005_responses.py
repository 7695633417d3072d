"""responses (the Responses API's stored responses)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("previous_response_id", sa.String(length=40), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("output", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("incomplete_reason", sa.String(length=64), nullable=True),
        sa.Column("created_at", modelhost.store.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", modelhost.store.types.UTCDateTime(), nullable=False),
        sa.Column("completed_at", modelhost.store.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_responses_account_id_accounts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_responses")),
    )
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_responses_account_id"), ["account_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_responses_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_responses_created_at"))
        batch_op.drop_index(batch_op.f("ix_responses_account_id"))
    op.drop_table("responses")
