"""conversations and their items (OpenAI's Conversations API, issue 63)

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelhost.store.types import UTCDateTime

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("scope", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("next_position", sa.BigInteger(), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_conversations_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    op.create_index(op.f("ix_conversations_account_id"), "conversations", ["account_id"], unique=False)
    op.create_table(
        "conversation_items",
        sa.Column("conversation_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("item_id", sa.String(length=64), nullable=False),
        sa.Column("item", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_conversation_items_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", "position", name=op.f("pk_conversation_items")),
        sa.UniqueConstraint("conversation_id", "item_id", name="uq_conversation_items_item"),
    )


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_index(op.f("ix_conversations_account_id"), table_name="conversations")
    op.drop_table("conversations")
