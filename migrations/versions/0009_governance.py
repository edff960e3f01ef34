"""Governance facts: protected aliases, holds, retention policies, and the trash (a version
state, ``trashed``, that needs no column: ``deleted_at`` says since when).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("registry_aliases") as batch:
        batch.add_column(sa.Column("protected", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    op.add_column("registry_versions", sa.Column("hold", sa.Text(), nullable=True))
    op.add_column("registry_models", sa.Column("retention", sa.Text(), nullable=True))


def downgrade() -> None:
    # A trashed version becomes what it would have been before: a tombstone.
    op.execute("UPDATE registry_versions SET state = 'deleted' WHERE state = 'trashed'")
    with op.batch_alter_table("registry_models") as batch:
        batch.drop_column("retention")
    with op.batch_alter_table("registry_versions") as batch:
        batch.drop_column("hold")
    with op.batch_alter_table("registry_aliases") as batch:
        batch.drop_column("protected")
