"""A background response's stream events (issue 73): response_events

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-29 05:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # none for the background responses made before: their resumed stream is their final event alone
    op.create_table(
        "response_events",
        sa.Column("response_id", sa.String(length=40), nullable=False),
        sa.Column("sequence_number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("event", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name=op.f("fk_response_events_response_id_responses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("response_id", "sequence_number", name=op.f("pk_response_events")),
    )


def downgrade() -> None:
    op.drop_table("response_events")
