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
        sa.Column("subject", sa.String(length=255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
        sa.UniqueConstraint("subject", name=op.f("uq_users_subject")),
    )
    op.create_table(
        "memberships",
        sa.Column("user_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("disabled_at", UTCDateTime(), nullable=True),
        sa.Column("source", sa.String(length=8), nullable=False),
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
    op.create_table(
        "sso_logins",
        sa.Column("state_hash", sa.String(length=64), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("code_verifier", sa.String(length=128), nullable=False),
        sa.Column("return_to", sa.String(length=500), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("state_hash", name=op.f("pk_sso_logins")),
    )
    op.create_index(op.f("ix_sso_logins_created_at"), "sso_logins", ["created_at"], unique=False)
    op.create_table(
        "sso_handoffs",
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("code_hash", name=op.f("pk_sso_handoffs")),
    )
    op.create_table(
        "sso_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=True),
        sa.Column("operator", sa.Boolean(), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("id_token", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_sso_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sso_sessions")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_sso_sessions_secret_hash")),
    )
    op.create_index(op.f("ix_sso_sessions_user_id"), "sso_sessions", ["user_id"], unique=False)
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("role", sa.String(length=16), nullable=True))
        batch_op.create_index(batch_op.f("ix_api_keys_user_id"), ["user_id"], unique=False)
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("actor_user_id", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("actor_email", sa.String(length=320), nullable=True))
        batch_op.add_column(sa.Column("actor_subject", sa.String(length=255), nullable=True))


def downgrade() -> None:
    for column in ("actor_subject", "actor_email", "actor_user_id"):
        op.drop_column("audit_log", column)
    op.drop_index(op.f("ix_api_keys_user_id"), table_name="api_keys")
    for column in ("role", "user_id"):
        op.drop_column("api_keys", column)
    op.drop_table("sso_sessions")
    op.drop_table("sso_handoffs")
    op.drop_table("sso_logins")
    op.drop_index(op.f("ix_memberships_account_id"), table_name="memberships")
    op.drop_table("memberships")
    op.drop_table("users")
