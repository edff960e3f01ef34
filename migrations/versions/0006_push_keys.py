"""The idempotency key of the push that made a version (registry_versions.push_key).

A client sends one key per push (the ``Idempotency-Key`` header, or ``Registry.push``'s
``idempotency_key``) and the same key on each retry of it: a begin with a key the model already
holds answers that push's version (the reservation in progress, or the committed version)
instead of reserving another, so a push retried after an unknown outcome never makes a
duplicate. NULL for versions pushed without one (old clients, versions restored by ``db
rebuild``); unique per model otherwise.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("registry_versions", sa.Column("push_key", sa.String(64), nullable=True))
    # NULLs never collide, on SQLite as on PostgreSQL: keyless versions are unconstrained.
    op.create_index("ix_registry_versions_push_key", "registry_versions",
                    ["model_id", "push_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_registry_versions_push_key", table_name="registry_versions")
    with op.batch_alter_table("registry_versions") as batch:
        batch.drop_column("push_key")
