"""Mirroring the catalog into MLflow's Model Registry, so people browse versions in its UI.

Each model becomes a registered model; each version a model version whose ``source`` is the
blob's store URI, tagged with the registry ref, digest, training devices, dtypes, wrapping,
precision, parameters and size, described by a readable table (``mlflow_view.py``), and carrying
our aliases. MLflow version numbers match ours: gaps (deleted or retired numbers) are skipped by
creating and at once deleting placeholder versions, because MLflow never reuses a number either.

MLflow is a view, but its UI can edit it. Every sync compares what MLflow shows for each live
version with what it should show and puts back edited tags, descriptions and aliases; a version
deleted in MLflow is restored under its own number by recreating the registered model (MLflow
cannot reuse a deleted number). The report lists what was repaired.

The catalog remembers, per version, a fingerprint of what was last mirrored (column
``mlflow_synced``; NULL = pending). :func:`sync` compares fingerprints and touches MLflow only for
versions that changed or were deleted, so it is incremental and idempotent. A push never waits
for MLflow: the server mirrors from a background thread (:class:`MirrorWorker`), and a version
whose mirroring failed simply stays pending until the next sync.

The MLflow client's operations (create under our number, find, remove, put back, recreate) are
``mlflow_client.py``'s; what a version should look like there is ``mlflow_view.py``'s. This
module never imports ``mlflow`` itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..catalog.mirror import claim_token, live_claim
from ..catalog.records import VersionRecord
from ..errors import NotFoundError
from ..io.background import Background
from .mlflow_client import (
    mapped_errors,
    mirror_version,
    open_client,
    remove_strays,
    remove_version,
    repair,
)
from .mlflow_view import export_records, governance_tags, signature_tag, view

if TYPE_CHECKING:
    from ..backends import LocalBackend
    from ..settings import Settings

log = logging.getLogger(__name__)

# How soon a mirror looks again at versions another replica was mirroring (it may have mirrored
# an older state of them).
BUSY_RETRY_S = 2.0


@dataclass
class SyncReport:
    """What one sync did."""

    tracking_uri: str
    mirrored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    # What was put back after an edit in MLflow's UI: ref (or name, name@alias) -> what.
    repaired: dict[str, list[str]] = field(default_factory=dict)
    # Versions another replica's mirror was working on: a later sync looks at them again.
    busy: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tracking_uri_for(settings: Settings) -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///$REGISTRY_HOME/mlflow.db`` (own database)."""
    if not settings.mlflow_tracking_uri:
        settings.home.mkdir(parents=True, exist_ok=True)
    return settings.mlflow_uri


def fingerprint(record: VersionRecord, tracking_uri: str,
                exports: list[dict[str, Any]] | None = None, signatures: str = "",
                governed: dict[str, str] | None = None) -> str:
    """What a mirror of ``record`` into ``tracking_uri`` looks like; changes force a re-mirror."""
    state: dict[str, Any] = {"uri": tracking_uri, "digest": record.digest, "tags": record.tags,
                             "aliases": sorted(record.aliases), "format": 2}
    if governed:  # protection, a hold, the last alias change (mlflow_view.governance_tags)
        state["governance"] = governed
    if exports:
        state["exports"] = sorted(f"{e['format']}:{e['digest']}" for e in exports)
    if signatures:
        state["signatures"] = signatures
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def sync(backend: LocalBackend, tracking_uri: str, *, full: bool = False) -> SyncReport:
    """Bring MLflow up to date with the catalog: mirror new or changed versions, remove deleted
    ones. ``full`` re-mirrors everything and also removes MLflow versions the catalog lacks."""
    report = SyncReport(tracking_uri)
    catalog = backend.catalog
    states = catalog.mirror_states()
    client = open_client(tracking_uri)
    claim = claim_token(uuid.uuid4().hex[:8])
    names = sorted({name for name, *_ in states})
    for name in names:
        rows = [r for r in states if r[0] == name]
        try:
            records = {r.version: r for r in catalog.list_versions(name)}
        except NotFoundError:
            records = {}  # every version of the model was deleted
        busy = report.busy
        marks = governance_tags(backend, name, records) if records else {}
        for _, version, state, synced in rows:
            if state == "pending":
                report.busy += 1  # its push is still running: wait for it, to keep order
                break
            # Another replica is mirroring this version right now: leave the rest of this model
            # to it too, so MLflow creates the model's versions in order and numbers stay
            # aligned (a later sync looks again).
            if live_claim(synced):
                report.busy += 1
                break
            record = records.get(version)
            if record is None:
                if synced is None and not full:
                    continue
                if not catalog.swap_mirror_state(name, version, synced, claim):
                    report.busy += 1
                    break
                with _released(catalog, name, version, claim, synced), mapped_errors(tracking_uri):
                    remove_version(client, name, version)
                catalog.swap_mirror_state(name, version, claim, None)
                report.removed.append(f"{name}:v{version}")
                continue
            formats = export_records(backend, name, version)
            signed = signature_tag(backend.signatures.listed(name, version))
            wanted = fingerprint(record, tracking_uri, formats, signed, marks.get(version))
            if synced == wanted and not full:
                report.unchanged += 1
                continue
            if not catalog.swap_mirror_state(name, version, synced, claim):
                report.busy += 1
                break
            with _released(catalog, name, version, claim, synced), mapped_errors(tracking_uri):
                mirror_version(client, record, *view(backend, record, formats, signed,
                                                     marks.get(version, {})))
            catalog.swap_mirror_state(name, version, claim, wanted)
            report.mirrored.append(f"{name}:v{version}")
        if full:
            with mapped_errors(tracking_uri):
                report.removed += remove_strays(client, name, set(records))
        if records and report.busy == busy:
            with mapped_errors(tracking_uri):
                views = {v: view(backend, r, governed=marks.get(v, {}))
                         for v, r in records.items()}
                report.repaired.update(repair(client, name, records, views))
    log.info("mlflow sync to %s: %d mirrored, %d removed, %d unchanged, %d repaired",
             tracking_uri, len(report.mirrored), len(report.removed), report.unchanged,
             len(report.repaired))
    return report


@contextlib.contextmanager
def _released(catalog: Any, name: str, version: int, claim: str,
              before: str | None) -> Iterator[None]:
    """Give a claimed version back as it was when mirroring it fails."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            catalog.swap_mirror_state(name, version, claim,
                                      None if before and before.startswith("claim:") else before)
        raise


class MirrorWorker:
    """A background thread that syncs after every change; the server never waits for it."""

    def __init__(self, backend: LocalBackend, tracking_uri: str, *,
                 retry_seconds: float = 30.0) -> None:
        self.backend = backend
        self.tracking_uri = tracking_uri
        self.retry_seconds = retry_seconds
        self._loop = Background("mlflow-mirror", self._run, join_s=10)
        self.last_error: str | None = None
        self.syncs = 0

    def start(self) -> None:
        self._loop.start()
        self.poke()  # catch up on whatever changed while no server ran

    def poke(self) -> None:
        self._loop.poke()

    def stop(self) -> None:
        self._loop.stop()

    def _run(self) -> None:
        busy = False
        while not self._loop.stopped:
            self._loop.sleep(self.retry_seconds if self.last_error
                             else BUSY_RETRY_S if busy else None)
            if self._loop.stopped:
                return
            try:
                busy = sync(self.backend, self.tracking_uri).busy > 0
                self.last_error = None
            except Exception as exc:  # the mirror must never take the server down
                self.last_error = str(exc)
                log.warning("%s", exc)
                time.sleep(0.5)
            self.syncs += 1
