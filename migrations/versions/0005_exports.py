"""A row per export of a version (registry_exports): ONNX, pt2 and TorchScript artifacts with the
parameters they were made with. Exports are added after a version exists, so they live beside
the immutable manifest (and in the store as ``manifests/<name>/v<N>.exports.json``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_exports",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version_id", sa.Integer,
                  sa.ForeignKey("registry_versions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("version_id", "key", name="uq_registry_exports_version_key"),
    )
    op.create_index("ix_registry_exports_digest", "registry_exports", ["digest"])
    op.create_index("ix_registry_exports_version_id", "registry_exports", ["version_id"])


def downgrade() -> None:
    op.drop_index("ix_registry_exports_version_id", table_name="registry_exports")
    op.drop_index("ix_registry_exports_digest", table_name="registry_exports")
    op.drop_table("registry_exports")
