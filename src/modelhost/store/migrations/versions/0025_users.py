"""users and memberships (people with a role in each account), keys owned by a person and with a role,
audit rows naming the person (issue 60)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27 21:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelhost.store.types import UTCDateTime

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
    )
    op.create_table(
        "memberships",
        sa.Column("user_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("disabled_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_memberships_user_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_memberships_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_id", "account_id", name=op.f("pk_memberships")),
    )
    op.create_index(op.f("ix_memberships_account_id"), "memberships", ["account_id"], unique=False)
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("role", sa.String(length=16), nullable=True))
        batch_op.create_index(batch_op.f("ix_api_keys_user_id"), ["user_id"], unique=False)
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("actor_user_id", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("actor_email", sa.String(length=320), nullable=True))


def downgrade() -> None:
    for column in ("actor_email", "actor_user_id"):
        op.drop_column("audit_log", column)
    op.drop_index(op.f("ix_api_keys_user_id"), table_name="api_keys")
    for column in ("role", "user_id"):
        op.drop_column("api_keys", column)
    op.drop_index(op.f("ix_memberships_account_id"), table_name="memberships")
    op.drop_table("memberships")
    op.drop_table("users")
