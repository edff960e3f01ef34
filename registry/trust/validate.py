"""What crosses a trust boundary is checked here before it is used.

Three boundaries, one set of checks:

- a server's answer, in the client (``wire.record_from_wire``, ``remote.RemoteBackend``);
- a request, in the server (``server/app.py``: bodies, path and query parameters);
- a store object, in ``registry db rebuild`` (``backends.LocalBackend.rebuild``).

Names, aliases, versions and tags follow the grammar in ``refs.py``; digests follow
``digests.check_digest`` and are checked before they become a path, a store key or a SQL value;
numbers are integers (never booleans or strings) within bounds; containers have bounded sizes.
A failed check raises a :class:`RegistryError` subclass whose message quotes at most ~200
characters of the bad value (``errors.quoted``). Nothing here imports, opens or creates anything.

The manifest's schema and the recomputation of a version's digest from its files are checked
where manifests are read (``manifest.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..catalog.records import VersionRecord
from ..errors import CheckpointError, RefError, RegistryError, quoted
from ..io.digests import check_digest
from ..refs import MAX_VERSION, validate_alias, validate_name, validate_tags
from . import boundedjson

T = TypeVar("T")

# The largest blob a push may declare (1 PiB): bounds sizes read from requests and answers.
MAX_BLOB_BYTES = 2**50
# List endpoints: the page size when none is asked for, and the most one page may hold.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
# Manifests and alias tables read back from a store (a manifest of 1M tensors is ~100 MB).
MAX_STORE_OBJECT = 256 * 2**20

_REBUILD_FIX = ("nothing was restored: remove or repair that object in the store, then run "
                "`registry db rebuild` again")


# -- values --------------------------------------------------------------------------------

def strict_int(value: object, what: str, *, low: int, high: int,
               error: type[RegistryError] = RefError) -> int:
    """``value`` if it is an int (not a bool, float or string) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be an integer, got {type(value).__name__} {quoted(value)}")
    if not low <= value <= high:
        raise error(f"{what} {quoted(value)} is out of range: it runs from {low} to {high}")
    return value


def version_number(value: object, what: str = "version",
                   error: type[RegistryError] = RefError) -> int:
    return strict_int(value, what, low=1, high=MAX_VERSION, error=error)


def blob_size(value: object, what: str = "size",
              error: type[RegistryError] = RefError) -> int:
    return strict_int(value, what, low=0, high=MAX_BLOB_BYTES, error=error)


def _as(error: type[RegistryError], check: Callable[[], T], head: str, fix: str) -> T:
    """Run ``check``; re-raise a RefError from it as ``error``: "<head>: <why>; <fix>"."""
    try:
        return check()
    except RefError as exc:
        raise error(f"{head}: {exc}; {fix}") from None


# -- a server's answer (client side) ---------------------------------------------------------

class _Answer:
    """Field access on one JSON answer that fails as a RegistryError naming the field."""

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise _malformed(what, f"expected a JSON object, got {type(data).__name__}")
        self.data = data
        self.what = what

    def field(self, key: str) -> Any:
        if key not in self.data:
            raise _malformed(self.what, f"field {key!r} is missing")
        return self.data[key]

    def check(self, key: str, check: Callable[[Any], T]) -> T:
        value = self.field(key)
        try:
            return check(value)
        except RegistryError as exc:
            raise _malformed(self.what, f"field {key!r}: {exc}") from None


def _malformed(what: str, detail: str) -> RegistryError:
    return RegistryError(f"the registry server sent a malformed {what} ({detail}); is "
                         "REGISTRY_URI a registry server of this version?")


def answer_object(data: object, what: str) -> dict[str, Any]:
    """A JSON object answer, or a RegistryError if the server sent something else."""
    return _Answer(data, what).data


def answer_field(data: object, what: str, key: str, check: Callable[[Any], T]) -> T:
    """One checked field of a JSON object answer (``what`` names the answer in errors)."""
    return _Answer(data, what).check(key, check)


def answer_record(data: object) -> VersionRecord:
    """A version as a server describes it, every field checked before the client uses it."""
    answer = _Answer(data, "version record")
    tags = answer.check("tags", _answer_tags)
    aliases = answer.check("aliases", _answer_aliases)
    manifest = answer.check("manifest", lambda m: _dict(m, "manifest"))
    return VersionRecord(
        name=answer.check("name", validate_name),
        version=answer.check("version", version_number),
        digest=answer.check("digest", check_digest),
        size_bytes=answer.check("size_bytes", blob_size),
        manifest=manifest, tags=tags, aliases=aliases)


def answer_page(data: object, key: str, item: Callable[[Any], T],
                cursor: Callable[[Any], Any]) -> tuple[list[T], Any]:
    """(items, next cursor or None) of one page of a list answer."""
    answer = _Answer(data, f"list of {key}")
    raw = answer.check(key, lambda v: _list(v, key, MAX_PAGE))
    items: list[T] = []
    for position, value in enumerate(raw):
        try:
            items.append(item(value))
        except RegistryError as exc:
            raise _malformed(f"list of {key}", f"item {position}: {exc}") from None
    following = answer.data.get("next")
    if following is not None:
        following = answer.check("next", cursor)
    return items, following


def _answer_tags(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise RefError(f"expected a JSON object, got {type(value).__name__}")
    return {k: v for k, v in validate_tags(value).items() if v is not None}


def _answer_aliases(value: object) -> list[str]:
    return [validate_alias(a) for a in _list(value, "aliases", 10_000)]


def _dict(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RefError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list(value: object, what: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise RefError(f"{what} must be a JSON list, got {type(value).__name__}")
    if len(value) > most:
        raise RefError(f"{what} holds {len(value)} items; at most {most} are allowed")
    return value


# -- store objects (db rebuild) ---------------------------------------------------------------

def stored_bytes(size: int | None, key: str, read: Callable[[str], bytes]) -> bytes:
    """The bytes of a small store object (a manifest or an alias table), read only if its size
    is within bounds: a hostile multi-gigabyte object is refused, not loaded into memory."""
    if size is not None and size > MAX_STORE_OBJECT:
        raise CheckpointError(f"store object {quoted(key)} holds {size} bytes, more than any "
                              f"manifest or alias table ({MAX_STORE_OBJECT}); {_REBUILD_FIX}")
    return read(key)


def stored_json(data: bytes, origin: str) -> object:
    try:
        return boundedjson.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"store object {quoted(origin)} is not valid JSON "
                              f"({quoted(str(exc), 80)}); {_REBUILD_FIX}") from None


def alias_table(data: object, origin: str) -> dict[str, int]:
    """An ``aliases/<name>.json`` object: alias -> version number."""
    def check() -> dict[str, int]:
        table = _dict(data, "an alias table")
        if len(table) > 10_000:
            raise RefError(f"it holds {len(table)} aliases; at most 10000 are allowed")
        return {validate_alias(alias): version_number(version, f"version of alias {alias!r}")
                for alias, version in table.items()}

    return _as(CheckpointError, check, f"store object {origin} is not a valid alias table",
               _REBUILD_FIX)


def stored_manifest(manifest: dict[str, Any], *, name: str, version: int,
                    origin: str) -> dict[str, Any]:
    """A manifest that passed its schema (``manifest.loads``), checked against the object's key
    and with tags as strict as a push's.

    A manifest stored under ``manifests/<name>/v<N>.json`` must say it is ``<name>:v<N>``: a
    manifest that names another model is never restored under that name.
    """
    def check() -> dict[str, Any]:
        if manifest.get("name") != name:
            raise RefError(f"it names model {quoted(manifest.get('name'))}, not {name!r}")
        if version_number(manifest.get("version"), "its version") != version:
            raise RefError(f"it says version {quoted(manifest.get('version'))}, not {version}")
        validate_tags(_dict(manifest.get("tags") or {}, "its tags"))
        return manifest

    return _as(CheckpointError, check, f"store object {origin} cannot be restored",
               _REBUILD_FIX)
