"""adapters: an artifact's kind (a full model or a LoRA adapter) and what its adapter is; a deployment's
base (adapter deployments) and whether the operator shares it with every account (issue 40)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 04:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_artifacts") as batch:
        batch.add_column(sa.Column("kind", sa.String(length=8), server_default="model", nullable=False))
        batch.add_column(sa.Column("adapter", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("base_deployment_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("shared", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.create_index(batch.f("ix_deployments_base_deployment_id"), ["base_deployment_id"])
        batch.create_foreign_key(
            batch.f("fk_deployments_base_deployment_id_deployments"),
            "deployments",
            ["base_deployment_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_constraint(batch.f("fk_deployments_base_deployment_id_deployments"), type_="foreignkey")
        batch.drop_index(batch.f("ix_deployments_base_deployment_id"))
        batch.drop_column("shared")
        batch.drop_column("base_deployment_id")
    # in place (SQLite 3.35+ drops a column itself): recreating the table, as batch mode would, fails
    # while deployments and footprints refer to its rows
    with op.batch_alter_table("model_artifacts", recreate="never") as batch:
        batch.drop_column("adapter")
        batch.drop_column("kind")
