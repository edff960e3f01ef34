"""A row per blob a version owns (registry_version_files), filled from existing manifests.

A version is a set of files since manifest format 2 (weights shards, attached files): gc's set of
referenced blobs, a reservation's uploads and the server's upload check read these rows instead
of one digest column. Existing versions get their rows from their manifests (format 1: one
weights file); reservations without a manifest get one weights row from their digest.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    files = op.create_table(
        "registry_version_files",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version_id", sa.Integer,
                  sa.ForeignKey("registry_versions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("version_id", "role", "name", name="uq_registry_version_files_name"),
    )
    op.create_index("ix_registry_version_files_digest", "registry_version_files", ["digest"])
    op.create_index("ix_registry_version_files_version_id", "registry_version_files",
                    ["version_id"])
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, digest, size_bytes, manifest FROM registry_versions "
                                "WHERE state != 'deleted'")).all()
    values = []
    for version_id, digest, size, manifest in rows:
        for role, name, file_digest, file_size in _files(digest, size, manifest):
            values.append({"version_id": version_id, "role": role, "name": name,
                           "digest": file_digest, "size": file_size})
    if values:
        op.bulk_insert(files, values)


def _files(digest: str, size: int, manifest: str | None) -> list[tuple[str, str, str, int]]:
    if not manifest:
        return [("weights", "model.safetensors", digest, int(size))] if digest else []
    data = json.loads(manifest)
    shards = data.get("files") or []
    out = []
    for i, entry in enumerate(shards):
        name = ("model.safetensors" if len(shards) == 1
                else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        out.append(("weights", name, entry["digest"], int(entry["size"])))
    for entry in data.get("attachments") or []:
        out.append(("file", entry["name"], entry["digest"], int(entry["size"])))
    return out


def downgrade() -> None:
    op.drop_index("ix_registry_version_files_version_id", table_name="registry_version_files")
    op.drop_index("ix_registry_version_files_digest", table_name="registry_version_files")
    op.drop_table("registry_version_files")
