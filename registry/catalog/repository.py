"""Catalog operations: allocate and commit versions, resolve refs, aliases, tags, deletion."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import NotFoundError, RefError, VersionAliasedError, VersionExistsError
from ..events import Event, current_actor
from ..files import VersionFile
from ..refs import MAX_TAGS, MAX_VERSION, Ref
from . import lookup, rebuild
from .aliases import Aliases, refuse_protected
from .copies import StoreCopies
from .db import READ_ONLY, ensure_schema, make_engine, mapped_errors
from .events import EventLog, after_commit, append_event
from .exports import ExportRows
from .governance import GovernanceRows, refuse_held
from .leases import Leases
from .mirror import MirrorStates
from .models import (
    DELETED,
    PENDING,
    READY,
    TRASHED,
    AliasRow,
    ModelRow,
    VersionFileRow,
    VersionRow,
    aware,
)
from .owners import BlobOwners
from .pushes import Pushes
from .rebuild import add_version_files
from .records import VersionRecord
from .signatures import SignatureFiles
from .warm import WarmResolves
from .webhooks import WebhookRows

_CLAIM_RETRIES = 5


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Catalog(MirrorStates, StoreCopies, Leases, SignatureFiles, ExportRows, Pushes,
              BlobOwners, EventLog, Aliases, GovernanceRows):
    """The SQL catalog behind a registry. Construct with a URL; schema is checked on first use."""

    def __init__(self, url: str, *, auto_migrate: bool = False, engine: Engine | None = None):
        self.url = url
        self.engine = engine or make_engine(url)
        self._auto_migrate = auto_migrate
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reader = self.engine.execution_options(**{READ_ONLY: True})
        self._checked = False
        # Called with the events a session appended, after it committed (catalog/events.py).
        self.event_sinks: list[Callable[[list[Event]], object]] = []
        # Subscriptions and the outbox of deliveries (registry/webhooks), in this catalog.
        self.webhooks = WebhookRows(self.session, self._snapshot)
        database = self.engine.url.database
        self._warm = WarmResolves(database) if self.engine.url.get_backend_name() == "sqlite" \
            and database and database != ":memory:" and not database.startswith("file:") \
            else None

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()
        self.engine.dispose()

    def _check_schema(self) -> None:
        if not self._checked:
            ensure_schema(self.engine, auto_migrate=self._auto_migrate)
            self._checked = True

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction (committed on exit, rolled back on an error); the catalog's row
        modules (exports, signatures) run their queries in it."""
        with mapped_errors(self.url):
            self._check_schema()
            with self._sessions.begin() as session:
                yield session
        after_commit(session, self.event_sinks)

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """A transaction that only reads, without the write lock (SQLite)."""
        with mapped_errors(self.url):
            self._check_schema()
            with self._reader.begin() as conn:
                yield conn

    # -- push -----------------------------------------------------------------------------

    def reserve(self, name: str, version: int | None, digest: str, size_bytes: int,
                files: Sequence[VersionFile], *, lease: timedelta | None = None,
                key: str | None = None, committed: list[VersionRecord] | None = None) -> int:
        """Allocate (or claim) a version number in one transaction; the row stays invisible.

        ``files`` are the blobs the version will own: recorded now, so gc keeps them while the
        push uploads and a server accepts uploads of exactly these. Reservations of this model
        whose ``lease`` expired are released first. A push ``key`` the model holds returns
        that push's number (its record added to ``committed`` once committed; catalog/pushes.py)."""
        # Checked here, before SQL, so that SQLite (64-bit integers) and PostgreSQL (a 32-bit
        # column that would raise DataError) refuse the same numbers with the same error.
        if version is not None and not 1 <= version <= MAX_VERSION:
            raise RefError(f"invalid version {version}: versions run from 1 to {MAX_VERSION}")
        for attempt in range(_CLAIM_RETRIES):
            try:
                with self.session() as s:
                    model = self._model_for_update(s, name)
                    if lease is not None:  # pushes of this model that died (catalog/leases.py)
                        self.release_expired(s, model.id, lease)
                    if (keyed := self.keyed(s, model, key, files, version, committed)):
                        return keyed  # this very push, retried
                    if version is None:
                        number = model.last_version + 1
                        if number > MAX_VERSION:
                            raise VersionExistsError(
                                f"{name} has used every version number up to v{MAX_VERSION} "
                                "and numbers are never reused; push under a new name")
                    else:
                        number = version
                        taken = s.scalar(select(VersionRow).where(
                            VersionRow.model_id == model.id, VersionRow.version == number))
                        if taken is not None:
                            raise VersionExistsError(_taken_message(name, number, taken.state,
                                                                    model.last_version))
                    model.last_version = max(model.last_version, number)
                    row = VersionRow(model_id=model.id, version=number, state=PENDING,
                                     digest=digest, size_bytes=size_bytes, tags="{}",
                                     created_at=_now(), push_key=key)
                    s.add(row)
                    s.flush()
                    add_version_files(s, row.id, files)
                return number
            except IntegrityError:
                # Only reachable when the database does not serialize on the model row; the
                # unique constraint caught a race, so look again.
                if attempt == _CLAIM_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _model_for_update(self, s: Session, name: str) -> ModelRow:
        dialect = s.get_bind().dialect.name
        if dialect in ("postgresql", "sqlite"):
            insert_fn: Any
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as insert_fn
            else:
                from sqlalchemy.dialects.sqlite import insert as insert_fn
            s.execute(insert_fn(ModelRow).values(name=name, last_version=0, created_at=_now())
                      .on_conflict_do_nothing(index_elements=["name"]))
        elif s.scalar(select(ModelRow.id).where(ModelRow.name == name)) is None:
            s.add(ModelRow(name=name, last_version=0, created_at=_now()))
            s.flush()
        model = s.scalar(select(ModelRow).where(ModelRow.name == name).with_for_update())
        assert model is not None
        return model

    def commit(self, name: str, version: int, manifest: dict[str, Any],
               tags: dict[str, str], aliases: Iterable[str], *,
               force: bool = False) -> VersionRecord:
        """Make a reserved version visible, with its manifest, tags and aliases (a protected
        one only with ``force``)."""
        stored = json.dumps(manifest, sort_keys=True)
        with self.session() as s:
            # Lock the model row: concurrent commits that move the same alias would otherwise
            # both insert it on PostgreSQL and one would fail on the primary key.
            model = self._model(s, name, live=False, lock=True)
            done = self.committed(name, version, manifest, session=s, model=model)
            if done is not None:  # a retry of this very commit: its outcome, not an error
                return done
            row = self._row(s, model, version, states=(PENDING,))
            refuse_protected(s, model, list(aliases := list(aliases)), force=force,
                             doing="moving")
            row.state = READY
            row.manifest = stored
            row.tags = json.dumps(tags, sort_keys=True)
            actor = current_actor()
            append_event(s, kind="version.created", name=name, version=version, actor=actor,
                         details={"digest": row.digest, "size_bytes": row.size_bytes,
                                  **({"tags": tags} if tags else {})})
            for alias in aliases:
                previous = self.put_alias(s, model, alias, version)
                append_event(s, kind="alias.set", name=name, version=version, alias=alias,
                             previous=previous, actor=actor)
            return self._record(s, model, row)

    def abort(self, name: str, version: int) -> bool:
        """Drop a reservation whose push failed; its number stays retired. Returns whether
        this call dropped it: a commit that won the race keeps its version."""
        with self.session() as s:
            model = s.scalar(select(ModelRow).where(ModelRow.name == name))
            if model is None:
                return False
            gone = s.execute(delete(VersionRow).where(
                VersionRow.model_id == model.id, VersionRow.version == version,
                VersionRow.state == PENDING))
            return bool(gone.rowcount)  # type: ignore[attr-defined]

    # -- reads ----------------------------------------------------------------------------

    def resolve(self, ref: Ref) -> VersionRecord:
        warm = self._warm
        stamp = warm.stamp() if warm is not None and self._checked else None
        found = warm.get(ref, stamp) if warm is not None else None
        if found is None:
            with self._snapshot() as conn:
                found = lookup.find_ready(conn, ref)
            if found is not None and warm is not None:
                warm.put(ref, stamp, found)
        if found is not None:
            return found.record(ref.name)
        with self.session() as s:  # it does not resolve: this path raises the right error
            model = self._model(s, ref.name, live=False)
            if ref.alias is not None:
                target = s.scalar(select(AliasRow.version).where(
                    AliasRow.model_id == model.id, AliasRow.alias == ref.alias))
                if target is None:
                    known = s.scalars(select(AliasRow.alias).where(
                        AliasRow.model_id == model.id).order_by(AliasRow.alias)).all()
                    raise NotFoundError(
                        f"{ref} not found: {ref.name} has "
                        + (f"aliases {', '.join(known)}" if known else "no aliases")
                    )
                row = self._row(s, model, target)
            elif ref.digest is not None:
                digest = ref.digest
                if ref.is_digest_prefix:
                    digest = lookup.unique_digest(s.connection(), ref)
                newest = s.scalar(select(VersionRow).where(
                    VersionRow.model_id == model.id, VersionRow.digest == digest,
                    VersionRow.state == READY).order_by(VersionRow.version.desc()).limit(1))
                if newest is None:
                    raise NotFoundError(
                        f"{ref} not found: no version of {ref.name} has that digest")
                row = newest
            elif ref.version is not None:
                row = self._row(s, model, ref.version)
            else:
                row = self._latest(s, model)
            return self._record(s, model, row)

    def list_models(self, *, limit: int | None = None, after: str | None = None) -> list[str]:
        """Names of models with a live version, sorted; a page of ``limit`` names after
        ``after`` when given."""
        with self.session() as s:
            live = select(VersionRow.model_id).where(VersionRow.state == READY)
            query = select(ModelRow.name).where(ModelRow.id.in_(live)).order_by(ModelRow.name)
            if after is not None:
                query = query.where(ModelRow.name > after)
            if limit is not None:
                query = query.limit(limit)
            return list(s.scalars(query))

    def list_versions(self, name: str, *, limit: int | None = None,
                      after: int | None = None) -> list[VersionRecord]:
        """Live versions of ``name``, oldest first; a page of ``limit`` versions numbered
        above ``after`` when given."""
        with self.session() as s:
            model = self._model(s, name)
            query = select(VersionRow).where(
                VersionRow.model_id == model.id, VersionRow.state == READY)
            if after is not None:
                query = query.where(VersionRow.version > after)
            query = query.order_by(VersionRow.version)
            if limit is not None:
                query = query.limit(limit)
            rows = s.scalars(query).all()
            aliases = self._aliases_by_version(s, model)
            return [self._record(s, model, r, aliases) for r in rows]

    # -- changes --------------------------------------------------------------------------

    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord:
        """Merge ``tags`` into the version's tags; a None value removes that key."""
        with self.session() as s:
            model = self._model(s, name, lock=True)  # serializes with publish
            row = self._row(s, model, version)
            merged = json.loads(row.tags)
            for key, value in tags.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            if len(merged) > MAX_TAGS:  # each request is bounded; so is what they add up to
                raise RefError(f"{name}:v{version} would hold {len(merged)} tags; a version "
                               f"holds at most {MAX_TAGS}: remove some first")
            row.tags = json.dumps(merged, sort_keys=True)
            append_event(s, kind="tags.set", name=name, version=version, actor=current_actor(),
                         details={"set": {k: v for k, v in tags.items() if v is not None},
                                  "removed": sorted(k for k, v in tags.items() if v is None)})
            return self._record(s, model, row)

    def delete_version(self, name: str, version: int, *, force: bool = False,
                       protected_ok: bool | None = None) -> VersionRecord:
        """Move the version to the trash: invisible, its number retired, aliases dropped, its
        files kept until gc purges it (catalog/governance.py). A version aliases point at is
        refused unless ``force`` (their consumers would break), a protected alias's unless
        ``protected_ok`` (default: ``force``), a held one always."""
        with self.session() as s:
            model = self._model(s, name, lock=True)  # serializes with publish and alias moves
            row = self._row(s, model, version)
            record = self._record(s, model, row)
            refuse_held(name, row, "delete")
            if record.aliases and not force:
                shown = ", ".join(f"{name}@{a}" for a in record.aliases)
                one = len(record.aliases) == 1
                raise VersionAliasedError(
                    f"{name}:v{version} is what {shown} point{'s' if one else ''} at; deleting "
                    f"it would leave every consumer of {'that alias' if one else 'those aliases'}"
                    f" with NotFoundError. Move the alias first (registry alias {name} "
                    f"{record.aliases[0]} vN), or delete anyway with force=True "
                    f"(registry rm --force {name}:v{version})", aliases=record.aliases)
            refuse_protected(s, model, list(record.aliases), doing="deleting",
                             force=force if protected_ok is None else protected_ok)
            row.state = TRASHED
            row.deleted_at = _now()
            s.execute(delete(AliasRow).where(AliasRow.model_id == model.id,
                                             AliasRow.version == version))
            actor = current_actor()
            append_event(s, kind="version.deleted", name=name, version=version, actor=actor,
                         details={"digest": row.digest, "force": force, "trashed": True})
            for alias in record.aliases:  # dropped with it (only with force)
                append_event(s, kind="alias.deleted", name=name, alias=alias, previous=version,
                             actor=actor, details={"reason": "version deleted"})
            return record

    # -- gc and rebuild -------------------------------------------------------------------

    def referenced_digests(self, *, pending_grace: timedelta = timedelta(hours=6)) -> set[str]:
        """Blob digests that gc must keep: every file of a ready version, and of a push still
        in progress."""
        with self.session() as s:
            cutoff = _now() - pending_grace
            rows = s.execute(select(VersionFileRow.digest, VersionRow.state,
                                    VersionRow.created_at)
                             .join(VersionRow, VersionRow.id == VersionFileRow.version_id)
                             .where(VersionRow.state.in_((READY, PENDING, TRASHED)))).all()
            return {d for d, state, created in rows
                    if state != PENDING or aware(created) >= cutoff}

    def pending_upload(self, digest: str) -> int | None:
        """The size a push in progress declared for blob ``digest``, or None if no push in
        progress lists it (a server accepts an upload only then; gc drops stale pushes)."""
        with self.session() as s:
            sizes = s.scalars(select(VersionFileRow.size)
                              .join(VersionRow, VersionRow.id == VersionFileRow.version_id)
                              .where(VersionFileRow.digest == digest,
                                     VersionRow.state == PENDING)).all()
            return max(int(size) for size in sizes) if sizes else None

    def restore(self, manifests: Iterable[dict[str, Any]], retired: Iterable[tuple[str, int]],
                aliases: dict[str, dict[str, int]],
                governance: dict[str, dict[str, Any]] | None = None) -> int:
        """Replace the catalog's contents with what the store holds (``registry db rebuild``)."""
        with self.session() as s:
            return rebuild.restore(s, manifests, retired, aliases, governance)

    def count_versions(self) -> int:
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(VersionRow).where(
                VersionRow.state == READY)) or 0

    def version_row(self, s: Session, name: str, version: int) -> VersionRow:
        """In session ``s``: the row of live version ``name:vN``; NotFoundError naming what
        exists instead."""
        return self._row(s, self._model(s, name), version)

    # -- helpers --------------------------------------------------------------------------

    def _model(self, s: Session, name: str, *, live: bool = True, lock: bool = False) -> ModelRow:
        query = select(ModelRow).where(ModelRow.name == name)
        model = s.scalar(query.with_for_update() if lock else query)
        if model is not None and not live:
            return model
        if model is None or not s.scalar(select(VersionRow.id).where(
                VersionRow.model_id == model.id, VersionRow.state == READY).limit(1)):
            known = s.scalars(select(ModelRow.name).order_by(ModelRow.name).limit(5)).all()
            if model is not None:
                raise NotFoundError(f"model {name!r} has no versions left (all were deleted)")
            raise NotFoundError(
                f"model {name!r} not found; "
                + (f"models include {', '.join(known)}" if known else "the registry is empty")
            )
        return model

    def _row(self, s: Session, model: ModelRow, version: int,
             states: tuple[str, ...] = (READY,)) -> VersionRow:
        row = s.scalar(select(VersionRow).where(
            VersionRow.model_id == model.id, VersionRow.version == version))
        if row is None or row.state not in states:
            latest = s.scalar(select(func.max(VersionRow.version)).where(
                VersionRow.model_id == model.id, VersionRow.state == READY))
            why = " (it was deleted)" if row is not None and row.state == DELETED else \
                f" (it was deleted) but is in the trash: `registry restore " \
                f"{model.name}:v{version}` brings it back" \
                if row is not None and row.state == TRASHED else ""
            raise NotFoundError(
                f"{model.name}:v{version} not found{why}; "
                + (f"latest is v{latest}" if latest else f"{model.name} has no versions")
            )
        return row

    def _latest(self, s: Session, model: ModelRow) -> VersionRow:
        row = s.scalar(select(VersionRow).where(
            VersionRow.model_id == model.id, VersionRow.state == READY)
            .order_by(VersionRow.version.desc()).limit(1))
        if row is None:
            raise NotFoundError(f"model {model.name!r} has no versions")
        return row

    def _aliases_by_version(self, s: Session, model: ModelRow) -> dict[int, list[str]]:
        table: dict[int, list[str]] = {}
        for a in s.scalars(select(AliasRow).where(AliasRow.model_id == model.id)
                           .order_by(AliasRow.alias)):
            table.setdefault(a.version, []).append(a.alias)
        return table

    def _record(self, s: Session, model: ModelRow, row: VersionRow,
                aliases: dict[int, list[str]] | None = None) -> VersionRecord:
        if aliases is None:
            aliases = self._aliases_by_version(s, model)
        return lookup.Found(version=row.version, digest=row.digest, size_bytes=row.size_bytes,
                            manifest=row.manifest, tags=row.tags,
                            aliases=tuple(aliases.get(row.version, ()))).record(model.name)


def _taken_message(name: str, number: int, state: str, last: int) -> str:
    if state in (DELETED, TRASHED):
        return (f"{name}:v{number} was deleted and its number is retired; versions are never "
                f"reused. Push without a version to get v{last + 1}")
    if state == PENDING:
        return f"{name}:v{number} is being pushed right now; push without a version instead"
    return (f"{name}:v{number} already exists and versions are immutable; push without a "
            f"version to get v{last + 1}")

