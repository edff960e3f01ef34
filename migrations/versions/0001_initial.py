"""Models, versions (with pending/ready/deleted states) and aliases.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("last_version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "registry_versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer,
                  sa.ForeignKey("registry_models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("manifest", sa.Text, nullable=True),
        sa.Column("tags", sa.Text, nullable=False, server_default="{}"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("model_id", "version", name="uq_registry_versions_model_version"),
    )
    op.create_index("ix_registry_versions_digest", "registry_versions", ["digest"])
    op.create_index("ix_registry_versions_state", "registry_versions", ["state"])
    op.create_table(
        "registry_aliases",
        sa.Column("model_id", sa.Integer,
                  sa.ForeignKey("registry_models.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("alias", sa.String(63), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registry_aliases")
    op.drop_index("ix_registry_versions_state", table_name="registry_versions")
    op.drop_index("ix_registry_versions_digest", table_name="registry_versions")
    op.drop_table("registry_versions")
    op.drop_table("registry_models")
