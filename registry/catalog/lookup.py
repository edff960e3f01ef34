"""Resolving a ref in one read-only snapshot: the catalog round trip of every pull.

``Catalog.resolve`` asks here first: one Core query for the ready version row (joined to its
model, and to the alias for ``name@alias``) and one for the aliases pointing at it, in a
transaction that takes no write lock. The ORM path it replaces ran four ORM queries in a
write-locking transaction (about 2 ms of a 200 MB pull). A ref that does not resolve gives None,
and the ORM path then raises the error that says why (deleted, no such alias, latest is ...):
there is one place for those messages. On SQLite the row found is kept while the file is
unchanged (:mod:`registry.catalog.warm`), so a deleted version or a moved alias is still seen by
the very next resolve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select

from ..errors import NotFoundError, RefError
from ..refs import Ref
from .models import READY, AliasRow, ModelRow, VersionRow
from .records import VersionRecord

_models = ModelRow.__table__
_versions = VersionRow.__table__
_aliases = AliasRow.__table__
_m, _v, _a = _models.c, _versions.c, _aliases.c

# Built once: building a Core statement costs more than running it on SQLite.
# The model's id as a scalar subquery rather than a join: PostgreSQL then plans it as a
# parameter known before the scan and walks the (model_id, version) index backwards for the
# latest version (one row) instead of joining all of the model's versions and sorting them
# (15 ms at 10,000 versions, benchmark row 9).
_MODEL_ID = select(_m.id).where(_m.name == bindparam("name")).scalar_subquery()
_READY = (select(_v.model_id.label("id"), _v.version, _v.digest, _v.size_bytes, _v.manifest,
                 _v.tags)
          .where(_v.model_id == _MODEL_ID, _v.state == READY))
_BY_VERSION = _READY.where(_v.version == bindparam("version"))
_BY_ALIAS = _READY.join(_aliases, (_a.model_id == _v.model_id) & (_a.version == _v.version)) \
    .where(_a.alias == bindparam("alias"))
_BY_DIGEST = _READY.where(_v.digest == bindparam("digest")).order_by(_v.version.desc()).limit(1)
# A digest prefix (hex only, so no LIKE wildcard): the newest version of each distinct digest;
# two distinct digests make the prefix ambiguous.
_DIGESTS_LIKE = (select(_v.digest).distinct()
                 .where(_v.model_id == _MODEL_ID, _v.state == READY,
                        _v.digest.like(bindparam("pattern")))
                 .order_by(_v.digest).limit(bindparam("limit")))
_LATEST = _READY.order_by(_v.version.desc()).limit(1)
_ALIASES_OF = (select(_a.alias)
               .where(_a.model_id == bindparam("model_id"), _a.version == bindparam("version"))
               .order_by(_a.alias))


@dataclass(frozen=True)
class Found:
    """The catalog's row for a ready version, as text: each record made from it parses its
    own manifest and tags, so no caller can edit what another one is given."""

    version: int
    digest: str
    size_bytes: int
    manifest: str | None
    tags: str
    aliases: tuple[str, ...]

    def record(self, name: str) -> VersionRecord:
        return VersionRecord(
            name=name, version=self.version, digest=self.digest, size_bytes=self.size_bytes,
            manifest=json.loads(self.manifest) if self.manifest else {},
            tags=json.loads(self.tags), aliases=list(self.aliases),
            manifest_text=self.manifest,
        )


def find_ready(conn: Connection, ref: Ref) -> Found | None:
    """The row of the ready version ``ref`` names, or None when it names none."""
    if ref.alias is not None:
        row = conn.execute(_BY_ALIAS, {"name": ref.name, "alias": ref.alias}).first()
    elif ref.digest is not None:
        digest = ref.digest
        if ref.is_digest_prefix:
            matches = digests_with_prefix(conn, ref.name, digest, limit=2)
            if len(matches) != 1:
                return None  # none, or ambiguous: the ORM path says which
            digest = matches[0]
        row = conn.execute(_BY_DIGEST, {"name": ref.name, "digest": digest}).first()
    elif ref.version is not None:
        row = conn.execute(_BY_VERSION, {"name": ref.name, "version": ref.version}).first()
    else:
        row = conn.execute(_LATEST, {"name": ref.name}).first()
    if row is None:
        return None
    aliases = conn.execute(_ALIASES_OF, {"model_id": row.id, "version": row.version}).scalars()
    return Found(version=row.version, digest=row.digest, size_bytes=row.size_bytes,
                 manifest=row.manifest, tags=row.tags, aliases=tuple(aliases))


def digests_with_prefix(conn: Connection, name: str, prefix: str, *, limit: int) -> list[str]:
    """Up to ``limit`` distinct digests of ready versions of ``name`` starting with ``prefix``
    (a checked ``sha256:<hex>`` prefix), sorted."""
    return list(conn.execute(_DIGESTS_LIKE, {"name": name, "pattern": prefix + "%",
                                             "limit": limit}).scalars())


def unique_digest(conn: Connection, ref: Ref, *, shown: int = 10) -> str:
    """The one digest ``ref``'s digest prefix names: NotFoundError if none, RefError listing
    them if several."""
    assert ref.digest is not None
    found = digests_with_prefix(conn, ref.name, ref.digest, limit=shown + 1)
    if not found:
        raise NotFoundError(f"{ref} not found: no version of {ref.name} has a digest starting "
                            "with that prefix")
    if len(found) > 1:
        more = " and more" if len(found) > shown else ""
        raise RefError(f"digest prefix {ref.digest} in {ref} is ambiguous: versions of {ref.name} "
                       f"have digests {', '.join(found[:shown])}{more}; give more hex digits")
    return found[0]
