"""Quotas per person (issue 72): memberships.quota, accounts.role_quotas and person_usage

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-29 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # null for every membership and account made before: no quota, as before
    with op.batch_alter_table("memberships", schema=None) as batch_op:
        batch_op.add_column(sa.Column("quota", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("role_quotas", sa.JSON(none_as_null=True), nullable=True))
    op.create_table(
        "person_usage",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("user_id", sa.String(length=40), nullable=False),
        sa.Column("period", sa.String(length=10), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_person_usage_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("account_id", "user_id", "period", name=op.f("pk_person_usage")),
    )
    op.create_index(op.f("ix_person_usage_updated_ms"), "person_usage", ["updated_ms"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_person_usage_updated_ms"), table_name="person_usage")
    op.drop_table("person_usage")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("role_quotas")
    with op.batch_alter_table("memberships", schema=None) as batch_op:
        batch_op.drop_column("quota")
