"""audit_log and audit_head: the hash-chained audit log of every management change; api_keys.expires_at:
keys that expire (issue 49)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import modelhost.store.types

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

WHEN = modelhost.store.types.UTCDateTime
GENESIS = "0" * 64


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", WHEN(), nullable=False),
        sa.Column("actor_kind", sa.String(length=16), nullable=False),
        sa.Column("actor_key_id", sa.String(length=40), nullable=True),
        sa.Column("actor_account_id", sa.String(length=40), nullable=True),
        sa.Column("client_address", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        sa.UniqueConstraint("seq", name=op.f("uq_audit_log_seq")),
    )
    op.create_index(op.f("ix_audit_log_created_at"), "audit_log", ["created_at"])
    op.create_index(op.f("ix_audit_log_actor_key_id"), "audit_log", ["actor_key_id"])
    op.create_index("ix_audit_log_account_created", "audit_log", ["account_id", "created_at"])
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("pruned_seq", sa.BigInteger(), nullable=False),
        sa.Column("pruned_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_head")),
    )
    # The one head row every append updates: the chain starts empty, after the genesis hash.
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS, "pruned_seq": 0, "pruned_hash": GENESIS}])
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("expires_at", WHEN(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("expires_at")
    op.drop_table("audit_head")
    op.drop_index("ix_audit_log_account_created", table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_actor_key_id"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_created_at"), table_name="audit_log")
    op.drop_table("audit_log")
