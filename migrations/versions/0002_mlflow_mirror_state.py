"""MLflow mirror state: what the mirror last wrote for each version (NULL = pending).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("registry_versions") as batch:
        batch.add_column(sa.Column("mlflow_synced", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("registry_versions") as batch:
        batch.drop_column("mlflow_synced")
