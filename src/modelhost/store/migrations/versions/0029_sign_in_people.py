"""people who sign in apart from people an admin made (emails unique only among the latter), invitations,
removals that stick, sessions renewed against the provider, sign-outs per account, sign-in state in the
browser (issue 70:
S6, S7, S8, S11)

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelhost.store.types import UTCDateTime

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

WITHOUT_SIGN_IN = sa.text("subject IS NULL")


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_constraint("uq_users_email", type_="unique")
        batch_op.add_column(
            sa.Column("email_verified", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("signed_in_at", UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f("ix_users_email"), ["email"], unique=False)
    op.create_index(
        "uq_users_email_without_sign_in",
        "users",
        ["email"],
        unique=True,
        sqlite_where=WITHOUT_SIGN_IN,
        postgresql_where=WITHOUT_SIGN_IN,
    )
    # a person who signed in before: their last sign-in is their newest session's start
    op.execute(
        "UPDATE users SET signed_in_at = (SELECT max(created_at) FROM sso_sessions "
        "WHERE sso_sessions.user_id = users.id) WHERE subject IS NOT NULL"
    )
    op.create_table(
        "removed_memberships",
        sa.Column("user_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("removed_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_removed_memberships_user_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_removed_memberships_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_id", "account_id", name=op.f("pk_removed_memberships")),
    )
    op.create_table(
        "invitations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_invitations_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invitations")),
        sa.UniqueConstraint("account_id", "email", name=op.f("uq_invitations_account_id")),
    )
    op.create_index(op.f("ix_invitations_email"), "invitations", ["email"], unique=False)
    with op.batch_alter_table("sso_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("refresh_token", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("renewed_at", UTCDateTime(), nullable=True))
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("member_since", UTCDateTime(), nullable=True))
    with op.batch_alter_table("memberships", schema=None) as batch_op:
        batch_op.add_column(sa.Column("signed_out_at", UTCDateTime(), nullable=True))
    op.execute(
        "UPDATE api_keys SET member_since = (SELECT created_at FROM memberships WHERE memberships.user_id = "
        "api_keys.user_id AND memberships.account_id = api_keys.account_id) WHERE user_id IS NOT NULL"
    )
    # a sign-in under way is kept in the browser's sealed cookie now, not in a row per anonymous request
    op.drop_index(op.f("ix_sso_logins_created_at"), table_name="sso_logins")
    op.drop_table("sso_logins")


def downgrade() -> None:
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
    with op.batch_alter_table("memberships", schema=None) as batch_op:
        batch_op.drop_column("signed_out_at")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("member_since")
    with op.batch_alter_table("sso_sessions", schema=None) as batch_op:
        batch_op.drop_column("renewed_at")
        batch_op.drop_column("refresh_token")
    op.drop_index(op.f("ix_invitations_email"), table_name="invitations")
    op.drop_table("invitations")
    op.drop_table("removed_memberships")
    op.drop_index("uq_users_email_without_sign_in", table_name="users")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_users_email"))
        batch_op.drop_column("signed_in_at")
        batch_op.drop_column("email_verified")
        # emails unique again (fails while two people share one: people who sign in may)
        batch_op.create_unique_constraint("uq_users_email", ["email"])
