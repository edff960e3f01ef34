"""The append-only event log (registry_events): one row per change of the catalog, written in
the change's own transaction (registry/catalog/events.py) and copied to the store as
``events/<id>.json``. No foreign key to the models: an event outlives what it describes.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("alias", sa.String(63), nullable=True),
        sa.Column("previous", sa.Integer(), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        # AUTOINCREMENT on SQLite: an id is never handed out twice, even after a rebuild.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_registry_events_name_id", "registry_events", ["name", "id"])
    op.create_index("ix_registry_events_name_alias_id", "registry_events",
                    ["name", "alias", "id"])


def downgrade() -> None:
    op.drop_index("ix_registry_events_name_alias_id", table_name="registry_events")
    op.drop_index("ix_registry_events_name_id", table_name="registry_events")
    op.drop_table("registry_events")
