"""The store's copies of catalog facts (manifests, alias tables, tombstones): written from the
catalog, after it changed, under the model's lock, and owed when a write fails.

The catalog is the single source of truth; the store's copies exist so that ``registry db
rebuild`` can restore it. The order of a push's writes (docs/reliability.md):

1. blobs (content-addressed, immutable; a reservation keeps them from gc),
2. the catalog commit, which makes the version visible with its tags and aliases,
3. the manifest and the alias table, read back from the catalog and written while holding the
   model's row lock (:meth:`registry.catalog.copies.StoreCopies.publish`), which every change
   of a version's visibility, tags or aliases also takes.

Events (registry/events.py) are copied the same way, once each, to ``events/<id>.json`` after
the transaction that appended them committed: immutable objects keyed by id, so their order of
writing does not matter, and a copy that failed is owed like a manifest.

So the store never holds a manifest of a version that was not committed, the last alias table
written is the newest, and nothing a commit or an abort does deletes what another wrote. A
write that fails after step 2 does not fail the operation (the catalog already says it
happened): it is logged and owed, and written by the next change of that model in this
process or by ``gc`` (:meth:`Copies.reconcile`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import manifest as mf
from .errors import CheckpointError, RegistryError
from .events import MAX_DETAILS_BYTES, Event, iso
from .governance import governance_from_dict
from .store import ObjectStore, layout
from .trust import validate

if TYPE_CHECKING:
    from .catalog.repository import Catalog
    from .exports.local import LocalExports
    from .signing import LocalSignatures

log = logging.getLogger(__name__)

# An event object is its details plus a few short fields.
MAX_EVENT_OBJECT = MAX_DETAILS_BYTES + 4096
_REBUILD_FIX = ("nothing was restored: remove or repair that object in the store, then run "
                "`registry db rebuild` again")
_ALIASES = 0  # stands for a model's alias table among the versions owed
_GOVERNANCE = -1  # and for its governance facts (governance/<name>.json)
# What `db rebuild` reads back: manifests, retired (name, version) pairs, alias tables, and
# governance facts by model name.
Stored = tuple[list[dict[str, Any]], list[tuple[str, int]], dict[str, dict[str, int]],
               dict[str, dict[str, Any]]]


class Copies:
    """Writes the store's copies of one catalog's facts; remembers what a failure left owed."""

    def __init__(self) -> None:
        self._owed: dict[str, set[int]] = {}
        self._owed_events: dict[int, Event] = {}
        self._lock = threading.Lock()

    def write_events(self, store: ObjectStore, events: list[Event]) -> list[str]:
        """Write the store copy of each of ``events`` (committed), with those a failure left
        owed; returns the keys still owed. Never raises: the events are in the catalog."""
        with self._lock:
            pending = {**self._owed_events, **{e.id: e for e in events}}
            self._owed_events = {}
        failed: dict[int, Event] = {}
        for ident in sorted(pending):
            try:
                store.put_bytes(layout.event_key(ident), pending[ident].to_json().encode())
            except Exception as exc:  # reported, remembered, retried
                failed[ident] = pending[ident]
                log.warning("event %d is committed, but writing it to the store failed (%s: "
                            "%s); it is written again by the next change or `registry gc`",
                            ident, type(exc).__name__, exc)
        if failed:
            with self._lock:
                self._owed_events.update(failed)
        return [layout.event_key(i) for i in sorted(failed)]

    def publish(self, catalog: Catalog, store: ObjectStore, name: str, versions: Iterable[int],
                *, aliases: bool, governance: bool = False) -> list[str]:
        """Write the manifests of ``versions`` (those ready or in the trash) and, if
        ``aliases``, the alias table of ``name`` (if ``governance``, its governance facts),
        with what was owed for it; returns the keys a failure left owed. Never raises: the
        catalog already holds the change, and it is what callers were told."""
        with self._lock:
            owed = self._owed.pop(name, set())
        wanted = set(versions) | {v for v in owed if v > 0}
        aliases = aliases or _ALIASES in owed
        governance = governance or _GOVERNANCE in owed

        def write(manifests: dict[int, dict[str, Any]], table: dict[str, int],
                  facts: dict[str, Any]) -> None:
            for version in sorted(manifests):
                store.put_bytes(mf.manifest_key(name, version), mf.dumps(manifests[version]))
            if aliases:
                store.put_bytes(mf.aliases_key(name), json.dumps(table, sort_keys=True).encode())
            if governance:
                store.put_bytes(layout.governance_key(name),
                                json.dumps(facts, sort_keys=True).encode())

        try:
            catalog.publish(name, wanted, write)
        except Exception as exc:  # reported, remembered, retried: the change itself is made
            with self._lock:
                self._owed.setdefault(name, set()).update(
                    wanted | ({_ALIASES} if aliases else set())
                    | ({_GOVERNANCE} if governance else set()))
            keys = [mf.manifest_key(name, v) for v in sorted(wanted)] + (
                [mf.aliases_key(name)] if aliases else []) + (
                [layout.governance_key(name)] if governance else [])
            log.warning("%s is committed, but writing %s to the store failed (%s: %s); it is "
                        "written again by the next change of %s or `registry gc`", name,
                        ", ".join(keys), type(exc).__name__, exc, name)
            return keys
        return []

    def owed(self) -> list[str]:
        """Store keys still owed by this process."""
        with self._lock:
            return sorted([mf.aliases_key(n) if v == _ALIASES else layout.governance_key(n)
                           if v == _GOVERNANCE else mf.manifest_key(n, v)
                           for n, vs in self._owed.items() for v in vs]
                          + [layout.event_key(i) for i in self._owed_events])

    def reconcile(self, catalog: Catalog, store: ObjectStore) -> list[str]:
        """Make the store's manifests, tombstones and alias tables say what the catalog says
        (what any process owed: one that died between its commit and its writes too); returns
        the keys written. It only writes, and removes manifests of deleted versions: a
        manifest of a version the catalog does not know is left to gc's grace."""
        from .catalog.models import DELETED, READY, TRASHED

        states = catalog.version_states()
        stored = set(store.list(layout.MANIFESTS))
        written: list[str] = []
        for name in sorted({n for n, _ in states}):
            mine = {v: state for (n, v), (state, _) in states.items() if n == name}
            missing = [v for v, state in sorted(mine.items())
                       if state in (READY, TRASHED) and mf.manifest_key(name, v) not in stored]
            if self.publish(catalog, store, name, missing, aliases=True, governance=True):
                continue
            written += [mf.manifest_key(name, v) for v in missing]
            for v, state in sorted(mine.items()):
                if state == DELETED and mf.manifest_key(name, v) in stored:
                    store.put_bytes(mf.tombstone_key(name, v), b"")
                    store.delete(mf.manifest_key(name, v))
                    written.append(mf.tombstone_key(name, v))
        written += self._reconcile_events(catalog, store)
        return written

    def _reconcile_events(self, catalog: Catalog, store: ObjectStore) -> list[str]:
        """Write the store copy of every event the catalog holds and the store lacks (a process
        that died between its commit and its write)."""
        stored = {key for key in store.list(layout.EVENTS)}
        missing = [i for i in catalog.event_ids() if layout.event_key(i) not in stored]
        if not missing:
            return []
        lowest = missing[0] - 1
        events = [e for e in catalog.events(since_id=lowest) if e.id in set(missing)]
        owed = set(self.write_events(store, events))
        return [layout.event_key(e.id) for e in events if layout.event_key(e.id) not in owed]

    def read_back(self, store: ObjectStore) -> Stored:
        """What ``db rebuild`` restores: the live manifests sorted by (name, version), the
        retired (name, version) pairs, and the alias tables, each object validated
        (registry/trust/validate.py). Nothing is written first: the catalog being replaced may be
        an old backup, and its facts must not overwrite newer copies (``registry gc`` on a
        live catalog writes what a failed write owed)."""
        manifests: list[dict[str, Any]] = []
        retired: set[tuple[str, int]] = set()
        for key in store.list(layout.MANIFESTS):
            name, version, suffix = layout.parse_manifest_key(key)
            if suffix == layout.MANIFEST:
                data = validate.stored_bytes(store.has(key), key, store.get_bytes)
                manifests.append(validate.stored_manifest(
                    mf.loads(data, origin=key), name=name, version=version, origin=key))
            elif suffix == layout.TOMBSTONE:
                retired.add((name, version))
        aliases: dict[str, dict[str, int]] = {}
        for key in store.list(layout.ALIASES):
            name = layout.parse_aliases_key(key)
            data = validate.stored_bytes(store.has(key), key, store.get_bytes)
            aliases[name] = validate.alias_table(validate.stored_json(data, key), key)
        governance: dict[str, dict[str, Any]] = {}
        for key in store.list(layout.GOVERNANCE):
            name = layout.parse_governance_key(key)
            data = validate.stored_bytes(store.has(key), key, store.get_bytes)
            governance[name] = stored_governance(validate.stored_json(data, key), key)
        # A tombstone is written before its manifest is removed: if both are there, the
        # deletion happened.
        manifests = [m for m in manifests if (m["name"], m["version"]) not in retired]
        manifests.sort(key=lambda m: (m["name"], m["version"]))
        return manifests, sorted(retired), aliases, governance


def read_events(store: ObjectStore) -> list[Event]:
    """Every event the store holds, each object checked, by id (what ``db rebuild``
    restores)."""
    events: list[Event] = []
    for key in store.list(layout.EVENTS):
        ident = layout.parse_event_key(key)
        size = store.has(key)
        if size is not None and size > MAX_EVENT_OBJECT:
            raise CheckpointError(f"store object {key} holds {size} bytes, more than any "
                                  f"event ({MAX_EVENT_OBJECT}); {_REBUILD_FIX}")
        event = Event.from_json(store.get_bytes(key), origin=key)
        if event.id != ident:
            raise CheckpointError(f"store object {key} holds event {event.id}, not {ident}; "
                                  f"{_REBUILD_FIX}")
        events.append(event)
    events.sort(key=lambda e: e.id)
    return events


def stored_governance(data: object, key: str) -> dict[str, Any]:
    """A ``governance/<name>.json`` object, checked: the facts plus ``trashed``
    ({version: deleted at})."""
    facts = governance_from_dict(data, origin=f"store object {key}", error=CheckpointError)
    trashed = data.get("trashed") if isinstance(data, dict) else None
    moments: dict[int, str] = {}
    try:
        assert isinstance(trashed, dict | None) and len(trashed or {}) <= 1_000_000
        for version, at in (trashed or {}).items():
            number = validate.version_number(int(version))
            moments[number] = iso(datetime.fromisoformat(str(at)[:40]))
    except (AssertionError, ValueError, TypeError, RegistryError):
        raise CheckpointError(f"store object {key} lists malformed trashed versions; "
                              f"{_REBUILD_FIX}") from None
    return {**facts.to_dict(), "trashed": moments}


def rebuild(catalog: Catalog, store: ObjectStore, copies: Copies, exports: LocalExports,
            signatures: LocalSignatures) -> int:
    """Rebuild the catalog from the store alone; return the number of versions restored.
    Every store object is checked first; one the registry cannot have written (a key such as
    ``manifests/../../evil/v1.json``, bad JSON, a manifest failing its schema or digest, a bad
    export or signature list, a bad event or governance object) refuses the rebuild, naming it;
    the catalog is unchanged."""
    manifests, retired, aliases, governance = copies.read_back(store)
    found, signed = exports.stored(), signatures.stored()
    events = read_events(store)
    count = catalog.restore(manifests, retired, aliases, governance)
    exports.restore(found)
    signatures.restore(signed)
    catalog.restore_events(events)
    return count
