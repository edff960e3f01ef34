"""SQLAlchemy 2.0 tables of the catalog. Every table is prefixed ``registry_`` so the catalog
can share a database with other applications (MLflow keeps its own database regardless)."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

PENDING, READY, DELETED = "pending", "ready", "deleted"
# A deleted version in the trash: invisible, restorable until gc purges it (DELETED).
TRASHED = "trashed"


def aware(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime: SQLite hands back naive datetimes even for
    ``timezone=True`` columns."""
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    pass


class ModelRow(Base):
    __tablename__ = "registry_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # The highest number ever handed out: numbers of deleted versions are never reused.
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The retention policy gc applies ({"keep_last": N, "max_age_s": S}), or NULL for none.
    retention: Mapped[str | None] = mapped_column(Text, nullable=True)


class VersionRow(Base):
    __tablename__ = "registry_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "version", name="uq_registry_versions_model_version"),
        Index("ix_registry_versions_digest", "digest"),
        Index("ix_registry_versions_state", "state"),
        Index("ix_registry_versions_model_digest", "model_id", "digest", "version"),
        Index("ix_registry_versions_push_key", "model_id", "push_key", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registry_models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    # pending: reserved by a push in progress (invisible); ready: visible; trashed: deleted but
    # restorable until gc purges it; deleted: a tombstone that keeps the number retired.
    state: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(71))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    manifest: Mapped[str | None] = mapped_column(Text, nullable=True)
    tags: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # What the MLflow mirror last wrote for this version (a fingerprint of its visible state);
    # NULL means pending: never mirrored, or changed since (registry/mirror/mirror_mlflow.py).
    mlflow_synced: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The idempotency key of the push that reserved this version (catalog/pushes.py).
    push_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # A hold ({"reason", "actor", "at"}): nobody may delete, trash or expire the version.
    hold: Mapped[str | None] = mapped_column(Text, nullable=True)


class AliasRow(Base):
    __tablename__ = "registry_aliases"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Moving or deleting it needs force (embedded) or the admin scope (server).
    protected: Mapped[bool] = mapped_column(Boolean, default=False)


class VersionFileRow(Base):
    """One blob a version owns (a weights shard, an attached file): what gc keeps and what a
    server accepts uploads for, without reading manifests."""

    __tablename__ = "registry_version_files"
    __table_args__ = (
        UniqueConstraint("version_id", "role", "name", name="uq_registry_version_files_name"),
        Index("ix_registry_version_files_digest", "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("registry_versions.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    digest: Mapped[str] = mapped_column(String(71))
    size: Mapped[int] = mapped_column(BigInteger)


class ExportRow(Base):
    """An export of a version (ONNX, pt2, TorchScript): a blob plus the parameters it was made
    with. ``key`` (sha256 of the canonical parameters) makes the same request find it again."""

    __tablename__ = "registry_exports"
    __table_args__ = (
        UniqueConstraint("version_id", "key", name="uq_registry_exports_version_key"),
        Index("ix_registry_exports_digest", "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("registry_versions.id", ondelete="CASCADE"), index=True)
    format: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(71))
    size: Mapped[int] = mapped_column(BigInteger)
    record: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class EventRow(Base):
    """One change of the catalog (registry/events.py): appended in the change's transaction,
    never updated or deleted. ``id`` increases in commit order: every append takes one lock
    first (catalog/events.py)."""

    __tablename__ = "registry_events"
    __table_args__ = (
        Index("ix_registry_events_name_id", "name", "id"),
        Index("ix_registry_events_name_alias_id", "name", "alias", "id"),
        {"sqlite_autoincrement": True},
    )

    # 64-bit on PostgreSQL; SQLite's INTEGER PRIMARY KEY is its 64-bit rowid already.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    alias: Mapped[str | None] = mapped_column(String(63), nullable=True)
    previous: Mapped[int | None] = mapped_column(Integer, nullable=True)
    details: Mapped[str] = mapped_column(Text, default="{}")


def live_version_id(s: Session, name: str, version: int) -> int | None:
    """The row id of version ``name:vN`` if it is live or in the trash (restorable), or None:
    what a rebuild's restore of export and signature rows attaches them to."""
    return s.scalar(select(VersionRow.id)
                    .join(ModelRow, ModelRow.id == VersionRow.model_id)
                    .where(ModelRow.name == name, VersionRow.version == version,
                           VersionRow.state.in_((READY, TRASHED))))
