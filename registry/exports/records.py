"""Export records: the JSON that describes one artifact, in the catalog, in the store's
``manifests/<name>/v<N>.exports.json`` and on the wire. Every record read back (from a store, a
server or a request) passes :func:`check` before it is used: it names a blob, so its digest,
size, format and key must match their grammars."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ManifestError, RegistryError, quoted
from ..io.digests import check_digest
from ..store import layout
from ..trust import boundedjson
from .artifact import FORMATS

MAX_EXPORTS = 256
MAX_RECORD_BYTES = 64 * 1024
_KEY_RE = re.compile(r"[0-9a-f]{64}")
FIELDS = ("format", "key", "digest", "size", "max_abs_diff", "tolerance", "params",
          "versions", "created_at")


def store_key(name: str, version: int) -> str:
    """Where the store keeps a version's exports (beside its immutable manifest)."""
    return layout.exports_key(name, version)


def check(record: object, origin: str) -> dict[str, Any]:
    """``record`` if it is a well-formed export record, else ManifestError naming the field."""
    def bad(what: str, value: object) -> ManifestError:
        return ManifestError(f"export record in {origin} has an invalid {what} {quoted(value, 80)}"
                             "; it was not used")

    if not isinstance(record, Mapping) or set(record) != set(FIELDS):
        raise ManifestError(f"export record in {origin} is not an object with exactly the fields "
                            f"{', '.join(FIELDS)}; it was not used")
    if record["format"] not in FORMATS:
        raise bad("format", record["format"])
    if not isinstance(record["key"], str) or not _KEY_RE.fullmatch(record["key"]):
        raise bad("key", record["key"])
    try:
        check_digest(record["digest"])
    except RegistryError:
        raise bad("digest", record["digest"]) from None
    size = record["size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 2**50:
        raise bad("size", size)
    for name in ("max_abs_diff", "tolerance"):
        value = record[name]
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < 0:
            raise bad(name, value)
    for name in ("params", "versions"):
        if not isinstance(record[name], Mapping):
            raise bad(name, record[name])
    if not isinstance(record["created_at"], str) or len(record["created_at"]) > 64:
        raise bad("created_at", record["created_at"])
    out = dict(record)
    if len(json.dumps(out)) > MAX_RECORD_BYTES:
        raise ManifestError(f"export record in {origin} exceeds {MAX_RECORD_BYTES} bytes; it was "
                            "not used")
    return out


def check_list(data: object, origin: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or len(data) > MAX_EXPORTS:
        raise ManifestError(f"{origin} does not hold a list of at most {MAX_EXPORTS} export "
                            "records; it was not used")
    return [check(r, origin) for r in data]


def dumps(name: str, version: int, records: list[dict[str, Any]]) -> bytes:
    return json.dumps({"name": name, "version": version, "exports": records}, indent=1,
                      sort_keys=True).encode()


def loads(data: bytes, name: str, version: int, origin: str) -> list[dict[str, Any]]:
    """The records of a stored ``.exports.json``, checked, and refused if the file names
    another version than the key it was found under."""
    try:
        parsed = boundedjson.loads(data)
    except ValueError:
        raise ManifestError(f"store object {origin} is not valid JSON; remove or repair it, then "
                            "run `registry db rebuild` again") from None
    if not isinstance(parsed, dict) or parsed.get("name") != name \
            or parsed.get("version") != version:
        raise ManifestError(f"store object {origin} does not describe the exports of {name}:v"
                            f"{version}; remove or repair it, then run `registry db rebuild` "
                            "again")
    return check_list(parsed.get("exports"), origin)
