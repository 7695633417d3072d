"""mcp_servers: each account's allow-list of MCP server URLs for hosted MCP tools (issue 63)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28 02:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelhost.store.types import UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_mcp_servers_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("account_id", "url", name=op.f("pk_mcp_servers")),
    )


def downgrade() -> None:
    op.drop_table("mcp_servers")
