"""Every key of a store, in one place: how each is written and how it is read back.

A store (a directory, or ``s3://bucket/prefix``) holds::

    <store>/
    ├── blobs/sha256/<hex>                     every file's bytes, content-addressed, never
    │                                          changed in place (weights, files, exports, bundles)
    ├── manifests/<name>/
    │   ├── v<N>.json                          a ready version's manifest
    │   ├── v<N>.deleted                       empty: version N was deleted (its number retired)
    │   ├── v<N>.exports.json                  the version's export records
    │   └── v<N>.signatures.json               the version's signature records
    ├── aliases/<name>.json                    the model's alias table {alias: version}
    ├── governance/<name>.json                 the model's protected aliases, holds, retention
    │                                          policy and trashed versions (registry/governance.py)
    ├── events/<id, 20 digits>.json            one event of the log (registry/events.py),
    │                                          written once, never changed
    ├── checked/sha256/<hex>                   the server hashed this blob, uploaded straight to
    │                                          the store, and found it whole (its size)
    ├── exports-pending/sha256/<hex>           an export registration awaits this blob (its size)
    ├── proved/sha256/<hex>                    a token limited to some models uploaded these
    │                                          bytes for a push of those models (their names)
    ├── touched/sha256/<hex>                   S3 only: empty; when gc last saw the blob in use
    └── tmp/                                   file store only: a push's staging files, renamed
                                               into blobs/ when they are whole

The keys are an on-disk format: a store written by any release reads back with any later one,
so nothing here changes a byte of a key. Parsers accept exactly what the writers produce (a
name by the name grammar, a version in range), so a stray object never names a model.
"""

from __future__ import annotations

import re

from ..errors import CheckpointError, quoted
from ..io.digests import PATTERN, hexdigest
from ..refs import MAX_VERSION, NAME_PATTERN

# Store keys (S3 allows 1024 bytes); anything longer is not one the registry wrote.
MAX_KEY_LENGTH = 1024

BLOBS = "blobs/"
MANIFESTS = "manifests/"
ALIASES = "aliases/"
EVENTS = "events/"
GOVERNANCE = "governance/"
CHECKED = "checked/sha256/"
EXPORTS_PENDING = "exports-pending/sha256/"
PROVED = "proved/sha256/"
TOUCHED = "touched/"
STAGING = "tmp"  # a directory of the file store, not a key

# The suffixes of the objects under manifests/<name>/ (parse_manifest_key's third value).
MANIFEST = ".json"
TOMBSTONE = ".deleted"
EXPORTS = ".exports.json"
SIGNATURES = ".signatures.json"

_MANIFEST_KEY_RE = re.compile(rf"manifests/(?P<name>{NAME_PATTERN})/v(?P<version>[1-9][0-9]{{0,9}})"
                              r"(?P<suffix>(?:\.[a-z]+)+)")
_ALIASES_KEY_RE = re.compile(rf"aliases/(?P<name>{NAME_PATTERN})\.json")
_GOVERNANCE_KEY_RE = re.compile(rf"governance/(?P<name>{NAME_PATTERN})\.json")
_EVENT_KEY_RE = re.compile(r"events/(?P<id>[0-9]{20})\.json")
_EVENT_ID_DIGITS = 20  # 2**63 - 1 has 19: zero-padded, the keys list in id order
_REBUILD_FIX = ("nothing was restored: remove or repair that object in the store, then run "
                "`registry db rebuild` again")


# -- blobs -----------------------------------------------------------------------------------

def blob_key(digest: str) -> str:
    """Store key of a blob: ``blobs/sha256/<hex>`` (the digest is checked first)."""
    return f"{BLOBS}sha256/{hexdigest(digest)}"


def blob_digest(key: str) -> str:
    """``blobs/sha256/<hex>`` -> ``sha256:<hex>`` (of a key already known to be a blob's)."""
    _, algorithm, digest = key.split("/", 2)
    return f"{algorithm}:{digest}"


def parse_blob_key(key: str) -> str | None:
    """The digest ``blobs/sha256/<hex>`` names, or None for any other key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != BLOBS[:-1]:
        return None
    digest = f"{parts[1]}:{parts[2]}"
    return digest if re.fullmatch(PATTERN, digest) else None


def checked_key(digest: str) -> str:
    """The marker of a directly uploaded blob the server verified: ``checked/sha256/<hex>``."""
    return CHECKED + hexdigest(digest)


def proved_key(digest: str) -> str:
    """The marker of a blob uploaded as proof of having its bytes: ``proved/sha256/<hex>``."""
    return PROVED + hexdigest(digest)


def pending_export_key(digest: str) -> str:
    """The marker of an export blob a registration asked for: ``exports-pending/sha256/<hex>``."""
    return EXPORTS_PENDING + hexdigest(digest)


def touched_key(key: str) -> str:
    """Where an S3 store's touch() marks ``key``: ``blobs/sha256/<hex>`` ->
    ``touched/sha256/<hex>``."""
    return TOUCHED + key.split("/", 1)[1]


# -- versions and models ---------------------------------------------------------------------

def manifest_key(name: str, version: int) -> str:
    return f"{MANIFESTS}{name}/v{version}{MANIFEST}"


def tombstone_key(name: str, version: int) -> str:
    """Marks a deleted version in the store, so a rebuilt catalog still retires its number."""
    return f"{MANIFESTS}{name}/v{version}{TOMBSTONE}"


def exports_key(name: str, version: int) -> str:
    """The export records of a version: ``manifests/<name>/v<N>.exports.json``."""
    return f"{MANIFESTS}{name}/v{version}{EXPORTS}"


def signatures_key(name: str, version: int) -> str:
    """The signature records of a version: ``manifests/<name>/v<N>.signatures.json``."""
    return f"{MANIFESTS}{name}/v{version}{SIGNATURES}"


def aliases_key(name: str) -> str:
    return f"{ALIASES}{name}.json"


def parse_manifest_key(key: object) -> tuple[str, int, str]:
    """(name, version, suffix) of a key under ``manifests/``: ``manifests/<name>/v<N><suffix>``.

    The name must match the name grammar and N the version range, so a key such as
    ``manifests/../../evil/v1.json`` never names a model.
    """
    if isinstance(key, str) and len(key) <= MAX_KEY_LENGTH and \
            (match := _MANIFEST_KEY_RE.fullmatch(key)):
        version = int(match["version"])
        if version <= MAX_VERSION:
            return match["name"], version, match["suffix"]
    raise CheckpointError(
        f"store object {quoted(key)} is not manifests/<name>/v<N>.json or .deleted with a "
        f"valid model name and version, so the registry did not write it; {_REBUILD_FIX}"
    )


def parse_aliases_key(key: object) -> str:
    """The model name of a key ``aliases/<name>.json``."""
    if isinstance(key, str) and len(key) <= MAX_KEY_LENGTH and \
            (match := _ALIASES_KEY_RE.fullmatch(key)):
        return match["name"]
    raise CheckpointError(
        f"store object {quoted(key)} is not aliases/<name>.json with a valid model name, so the "
        f"registry did not write it; {_REBUILD_FIX}"
    )


# -- the event log ---------------------------------------------------------------------------

def event_key(event_id: int) -> str:
    """The store copy of event ``event_id``: ``events/<id, zero-padded to 20 digits>.json``,
    so a listing of ``events/`` is in id order."""
    if not 1 <= event_id < 10**_EVENT_ID_DIGITS:
        raise ValueError(f"event id {event_id} out of range")
    return f"{EVENTS}{event_id:0{_EVENT_ID_DIGITS}d}.json"


def parse_event_key(key: object) -> int:
    """The event id of a key ``events/<id>.json``."""
    if isinstance(key, str) and (match := _EVENT_KEY_RE.fullmatch(key)) and int(match["id"]):
        return int(match["id"])
    raise CheckpointError(
        f"store object {quoted(key)} is not events/<20-digit id>.json, so the registry did not "
        f"write it; {_REBUILD_FIX}"
    )


# -- governance ------------------------------------------------------------------------------

def governance_key(name: str) -> str:
    """A model's governance facts: ``governance/<name>.json``."""
    return f"{GOVERNANCE}{name}.json"


def parse_governance_key(key: object) -> str:
    """The model name of a key ``governance/<name>.json``."""
    if isinstance(key, str) and len(key) <= MAX_KEY_LENGTH and \
            (match := _GOVERNANCE_KEY_RE.fullmatch(key)):
        return match["name"]
    raise CheckpointError(
        f"store object {quoted(key)} is not governance/<name>.json with a valid model name, so "
        f"the registry did not write it; {_REBUILD_FIX}"
    )
