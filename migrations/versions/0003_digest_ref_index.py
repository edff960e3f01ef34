"""Index (model_id, digest, version) so `name@sha256:...` resolves without a scan.

Without statistics SQLite walked the (model_id, version) index through every version of the
model (18 ms at 10,000 versions); with this index the newest version of a digest is one probe.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_registry_versions_model_digest", "registry_versions",
                    ["model_id", "digest", "version"])


def downgrade() -> None:
    op.drop_index("ix_registry_versions_model_digest", table_name="registry_versions")
