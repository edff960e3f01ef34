"""Webhooks: subscriptions, the outbox of deliveries, and every attempt of each.

``registry_webhooks`` holds subscriptions (their secrets sealed with a key kept outside the
catalog, registry/webhooks/sealing.py); ``registry_webhook_deliveries`` is the outbox, one row
per event and matching webhook, written in the event's transaction, claimed by a delivery
worker through its lease columns; ``registry_webhook_attempts`` records each POST.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_webhooks",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.Text(), nullable=False),
        sa.Column("models", sa.Text(), nullable=True),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "registry_webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(40), nullable=False, unique=True),
        sa.Column("webhook_id", sa.String(32),
                  sa.ForeignKey("registry_webhooks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_registry_webhook_deliveries_due", "registry_webhook_deliveries",
                    ["state", "next_attempt_at"])
    op.create_index("ix_registry_webhook_deliveries_order", "registry_webhook_deliveries",
                    ["webhook_id", "model", "state", "id"])
    op.create_table(
        "registry_webhook_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("delivery", sa.Integer(),
                  sa.ForeignKey("registry_webhook_deliveries.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_registry_webhook_attempts_delivery", "registry_webhook_attempts",
                    ["delivery"])


def downgrade() -> None:
    op.drop_index("ix_registry_webhook_attempts_delivery", table_name="registry_webhook_attempts")
    op.drop_table("registry_webhook_attempts")
    op.drop_index("ix_registry_webhook_deliveries_order",
                  table_name="registry_webhook_deliveries")
    op.drop_index("ix_registry_webhook_deliveries_due", table_name="registry_webhook_deliveries")
    op.drop_table("registry_webhook_deliveries")
    op.drop_table("registry_webhooks")
