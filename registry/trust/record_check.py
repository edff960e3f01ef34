"""A version record checked before a byte of it is read: its manifest passes the schema and
names the digest the catalog (or an OCI artifact) shows, whoever produced the record."""

from __future__ import annotations

from .. import manifest as mf
from ..catalog.records import VersionRecord
from ..errors import DigestMismatchError

# Manifest texts that passed mf.validate in this process: a record parsed from one of them
# holds the same manifest, so only the checks against the record itself run again (0.1 ms of a
# small pull). Bounded in count and characters; cleared when full.
_VALID_TEXTS: dict[str, None] = {}
_MAX_VALID_TEXTS = 32
_MAX_VALID_CHARS = 16_000_000


def checked(record: VersionRecord) -> VersionRecord:
    """``record`` once its manifest passed the schema and names the digest the catalog shows:
    a manifest edited to list other files is refused before a byte is read."""
    origin = f"{record.name}:v{record.version}"
    text = record.manifest_text
    if text is None or text not in _VALID_TEXTS:
        mf.validate(record.manifest, origin=origin)
        if text is not None:
            if len(_VALID_TEXTS) >= _MAX_VALID_TEXTS \
                    or sum(map(len, _VALID_TEXTS)) + len(text) > _MAX_VALID_CHARS:
                _VALID_TEXTS.clear()
            _VALID_TEXTS[text] = None
    manifest = record.manifest
    if manifest["name"] != record.name or manifest["version"] != record.version:
        raise DigestMismatchError(f"the manifest of {origin} describes {manifest['name']}:v"
                                  f"{manifest['version']}; it was not used")
    if manifest["digest"] != record.digest:
        raise DigestMismatchError(
            f"{origin} is recorded with digest {record.digest} but its manifest lists files "
            f"giving {manifest['digest']}: the catalog or the manifest was tampered with; it was "
            "not used. Rebuild the catalog from the store (`registry db rebuild`) or push again")
    return record
