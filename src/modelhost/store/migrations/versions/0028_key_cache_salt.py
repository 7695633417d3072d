"""api_keys: cache_salt, the key's prefix-cache salt (issue 70, S12)

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null for every key made before: the deployment's prefix cache shared by all its keys, as it was.
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_salt", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("cache_salt")
