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

``mlflow`` is imported only inside these functions (it takes seconds to import).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .catalog.mirror import claim_token, live_claim
from .catalog.records import VersionRecord
from .errors import MlflowUnavailableError, NotFoundError, RegistryError
from .mlflow_view import (
    MODEL_TAGS,
    describe,
    model_description,
    source_key,
    version_tags,
)
from .settings import redact_url

if TYPE_CHECKING:
    from .backends import LocalBackend
    from .settings import Settings

log = logging.getLogger(__name__)

_MAX_PLACEHOLDERS = 10_000
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
                exports: list[dict[str, Any]] | None = None, signatures: str = "") -> str:
    """What a mirror of ``record`` into ``tracking_uri`` looks like; changes force a re-mirror."""
    state: dict[str, Any] = {"uri": tracking_uri, "digest": record.digest, "tags": record.tags,
                             "aliases": sorted(record.aliases), "format": 2}
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
    client = _client(tracking_uri)
    claim = claim_token(uuid.uuid4().hex[:8])
    names = sorted({name for name, *_ in states})
    for name in names:
        rows = [r for r in states if r[0] == name]
        try:
            records = {r.version: r for r in catalog.list_versions(name)}
        except NotFoundError:
            records = {}  # every version of the model was deleted
        busy = report.busy
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
                with _released(catalog, name, version, claim, synced), _mapped(tracking_uri):
                    _remove_version(client, name, version)
                catalog.swap_mirror_state(name, version, claim, None)
                report.removed.append(f"{name}:v{version}")
                continue
            formats = export_records(backend, name, version)
            signed = signature_tag(backend.signatures.listed(name, version))
            wanted = fingerprint(record, tracking_uri, formats, signed)
            if synced == wanted and not full:
                report.unchanged += 1
                continue
            if not catalog.swap_mirror_state(name, version, synced, claim):
                report.busy += 1
                break
            with _released(catalog, name, version, claim, synced), _mapped(tracking_uri):
                _mirror_version(client, record, *_view(backend, record, formats, signed))
            catalog.swap_mirror_state(name, version, claim, wanted)
            report.mirrored.append(f"{name}:v{version}")
        if full:
            with _mapped(tracking_uri):
                report.removed += _remove_strays(client, name, set(records))
        if records and report.busy == busy:
            with _mapped(tracking_uri):
                report.repaired.update(_repair(client, backend, name, records))
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


# -- one version ------------------------------------------------------------------------------

def source_uri(backend: LocalBackend, record: VersionRecord) -> str:
    """What MLflow's ``source`` names: the store URI of ``mlflow_view.source_key``."""
    return backend.store.uri(source_key(record))


def export_records(backend: LocalBackend, name: str, version: int) -> list[dict[str, Any]]:
    """The stored exports of ``name:vN`` (the ``registry.exports`` tag and description rows)."""
    return list(backend.exports.list_exports(name, version))


def signature_tag(listed: list[dict[str, Any]]) -> str:
    """The ``registry.signatures`` tag: ``method signer`` of each signature, as listed (the
    registry verifies them on pull; MLflow only shows them)."""
    return ", ".join(f"{r['method']} {r['signer']}" for r in listed)[:4000]


def _view(backend: LocalBackend, record: VersionRecord,
          exports: list[dict[str, Any]] | None = None,
          signed: str | None = None) -> tuple[str, dict[str, str], str]:
    """How MLflow shows ``record``: its source, tags and description (every sync, mirror and
    repair compares against this one answer)."""
    if exports is None:
        exports = export_records(backend, record.name, record.version)
    if signed is None:
        signed = signature_tag(backend.signatures.listed(record.name, record.version))
    source = source_uri(backend, record)
    tags = version_tags(record, source, exports)
    if signed:
        tags["registry.signatures"] = signed
    return source, tags, describe(record, exports)


def _mirror_version(client: Any, record: VersionRecord, source: str, tags: dict[str, str],
                    description: str) -> None:
    name = record.name
    _ensure_registered_model(client, name)
    existing = _find_version(client, name, record.version)
    if existing is None:
        existing = _create_aligned(client, name, record.version, source, tags, description)
        if existing is None:
            return  # its number is taken: the repair after the loop recreates the model
    else:
        _put_back(client, existing, tags, description)
    ours = set(record.aliases)
    for alias in set(existing.aliases or []) - ours:
        client.delete_registered_model_alias(name, alias)
    for alias in ours:
        client.set_registered_model_alias(name, alias, existing.version)


def _create_aligned(client: Any, name: str, version: int, source: str, tags: dict[str, str],
                    description: str) -> Any:
    """Create the MLflow version numbered ``version`` (placeholders fill gaps, then go); None
    when MLflow has used that number already."""
    for _ in range(_MAX_PLACEHOLDERS):
        created = _create(client, name, source, tags, description)
        number = int(created.version)
        if number > version:
            # MLflow never reuses a number (this one was deleted there): a version mirrored
            # under another number would break "same numbers", so none is left behind.
            client.delete_model_version(name, created.version)
            return None
        if number == version:
            return created
        client.delete_model_version(name, created.version)  # a placeholder for a gap
    raise MlflowUnavailableError(f"could not align MLflow versions of {name} with v{version}")


def _create(client: Any, name: str, source: str, tags: dict[str, str], description: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.create_model_version(name, source=source, run_id=None, tags=tags,
                                           description=description)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "INVALID_PARAMETER_VALUE":
            raise
        # A tracking server refuses local-path sources without a run; keep the store URI in the
        # registry.blob_uri tag and name the version by its registry ref instead.
        ref = tags["registry.ref"].replace(":", "/")
        return client.create_model_version(name, source=f"registry:/{ref}", run_id=None,
                                           tags=tags, description=description)


def _find_version(client: Any, name: str, version: int) -> Any:
    """The MLflow version mirroring ``name:v<version>`` (by its registry.ref tag), or None."""
    from mlflow.exceptions import MlflowException

    ref = f"{name}:v{version}"
    try:
        candidate = client.get_model_version(name, str(version))
        if candidate.tags.get("registry.ref") == ref:
            return candidate
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
    for candidate in client.search_model_versions(f"name='{name}'"):
        if candidate.tags.get("registry.ref") == ref:
            # Search results leave aliases out; fetch the version itself to see them.
            return client.get_model_version(name, candidate.version)
    return None


def _remove_version(client: Any, name: str, version: int) -> None:
    found = _find_version(client, name, version)
    if found is not None:
        client.delete_model_version(name, found.version)


def _remove_strays(client: Any, name: str, live: set[int]) -> list[str]:
    """MLflow versions that claim a registry ref the catalog no longer has."""
    removed = []
    for candidate in client.search_model_versions(f"name='{name}'"):
        ref = candidate.tags.get("registry.ref", "")
        number = ref.rpartition(":v")[2]
        if ref.startswith(f"{name}:v") and number.isdigit() and int(number) not in live:
            client.delete_model_version(name, candidate.version)
            removed.append(ref)
    return removed


def _put_back(client: Any, shown: Any, tags: dict[str, str], description: str) -> list[str]:
    """Make MLflow version ``shown`` carry exactly ``tags`` and ``description``; what changed."""
    changed = []
    if any(shown.tags.get(k) != v for k, v in tags.items()) or set(shown.tags) - set(tags):
        for key, value in tags.items():
            if shown.tags.get(key) != value:
                client.set_model_version_tag(shown.name, shown.version, key, value)
        for key in set(shown.tags) - set(tags):
            client.delete_model_version_tag(shown.name, shown.version, key)
        changed.append("tags")
    if (shown.description or "") != description:
        client.update_model_version(shown.name, shown.version, description=description)
        changed.append("description")
    return changed


def _repair(client: Any, backend: LocalBackend, name: str,
            records: dict[int, VersionRecord]) -> dict[str, list[str]]:
    """Put back what was edited in MLflow's UI for the live versions of ``name``: a version
    missing or under another number (the registered model is recreated, since MLflow cannot
    reuse a number), tags, descriptions, aliases, the registered model's own description."""
    shown: dict[int, list[Any]] = {}
    for candidate in client.search_model_versions(f"name='{name}'"):
        ref = candidate.tags.get("registry.ref", "")
        number = ref.rpartition(":v")[2]
        if ref.startswith(f"{name}:v") and number.isdigit():
            shown.setdefault(int(number), []).append(candidate)
    lost = [v for v in sorted(records) if [int(m.version) for m in shown.get(v, [])] != [v]]
    if lost:
        _recreate_model(client, backend, name, records)
        return {f"{name}:v{v}": ["restored"] for v in lost}
    repaired: dict[str, list[str]] = {}
    for version, record in sorted(records.items()):
        _source, tags, description = _view(backend, record)
        if changed := _put_back(client, shown[version][0], tags, description):
            repaired[f"{name}:v{version}"] = changed
    model = client.get_registered_model(name)
    wanted = {alias: v for v, r in records.items() for alias in r.aliases}
    present = {alias: int(v) for alias, v in (model.aliases or {}).items()}
    for alias in sorted(set(present) - set(wanted)):
        client.delete_registered_model_alias(name, alias)
        repaired.setdefault(f"{name}@{alias}", []).append("alias removed")
    for alias, version in sorted(wanted.items()):
        if present.get(alias) != version:
            client.set_registered_model_alias(name, alias, str(version))
            repaired.setdefault(f"{name}:v{version}", []).append(f"alias {alias}")
    if (model.description or "") != model_description(name) \
            or any((model.tags or {}).get(k) != v for k, v in MODEL_TAGS.items()):
        client.update_registered_model(name, description=model_description(name))
        for key, value in MODEL_TAGS.items():
            client.set_registered_model_tag(name, key, value)
        repaired[name] = ["model description"]
    return repaired


def _recreate_model(client: Any, backend: LocalBackend, name: str,
                    records: dict[int, VersionRecord]) -> None:
    """Delete the registered model and mirror every live version again, in number order, so
    each gets its own number back (placeholders fill the gaps)."""
    from mlflow.exceptions import MlflowException

    log.warning("MLflow lost or renumbered versions of %s: recreating its registered model", name)
    try:
        client.delete_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
    for _version, record in sorted(records.items()):
        _mirror_version(client, record, *_view(backend, record))


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(name, tags=dict(MODEL_TAGS),
                                           description=model_description(name))
        except MlflowException as again:  # created concurrently by another mirror
            if getattr(again, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise


# -- plumbing -----------------------------------------------------------------------------------

def _client(tracking_uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@contextlib.contextmanager
def _mapped(uri: str) -> Iterator[None]:
    """Turn MLflow and connection failures into MlflowUnavailableError, once, here."""
    try:
        yield
    except RegistryError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise MlflowUnavailableError(
            f"mirroring to MLflow at {redact_url(uri)} failed ({first}); versions stay "
            "pending: run `registry mlflow sync` once MLflow is reachable"
        ) from None


class MirrorWorker:
    """A background thread that syncs after every change; the server never waits for it."""

    def __init__(self, backend: LocalBackend, tracking_uri: str, *,
                 retry_seconds: float = 30.0) -> None:
        self.backend = backend
        self.tracking_uri = tracking_uri
        self.retry_seconds = retry_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.syncs = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlflow-mirror", daemon=True)
        self._thread.start()
        self.poke()  # catch up on whatever changed while no server ran

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        busy = False
        while not self._stop.is_set():
            self._wake.wait(timeout=self.retry_seconds if self.last_error
                            else BUSY_RETRY_S if busy else None)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                busy = sync(self.backend, self.tracking_uri).busy > 0
                self.last_error = None
            except Exception as exc:  # the mirror must never take the server down
                self.last_error = str(exc)
                log.warning("%s", exc)
                time.sleep(0.5)
            self.syncs += 1
