"""What a push's commit request must be: the manifest of exactly the push the server reserved,
or a repeat of a commit that already went through (its answer lost), which gets the same answer.
"""

from __future__ import annotations

from typing import Any

from registry import manifest as mf
from registry.backends import LocalBackend
from registry.catalog.pushes import Reservation
from registry.catalog.records import VersionRecord
from registry.errors import ManifestError, RegistryError
from registry.files import version_files
from registry.refs import validate_push_key


def push_key(header: str | None) -> str | None:
    """The push's idempotency key from its ``Idempotency-Key`` header (None without one)."""
    return None if header is None else validate_push_key(header)


def repeated_commit(local: LocalBackend, name: str, number: int, manifest: dict[str, Any],
                    tags: dict[str, str], key: str | None = None) -> VersionRecord | None:
    """The version a commit of exactly this manifest, or of the push with idempotency ``key``,
    made visible as ``name:vN``, or None."""
    if key is not None:
        done = local.catalog.keyed_version(name, key)
        if done is not None and done.version == number:
            return done
    try:
        checked = mf.validate(manifest, origin=f"manifest of {name}:v{number}")
    except RegistryError:
        return None
    return local.committed_push(name, number, {**checked, "tags": tags})


def checked_manifest(manifest: dict[str, Any], name: str, number: int,
                      reserved: Reservation, tags: dict[str, str]) -> dict[str, Any]:
    """The client's manifest, refused unless it is valid and describes exactly the reserved
    push: its name, number, weights digest and the very files the reservation lists."""
    origin = f"{name}:v{number}"
    checked = mf.validate(manifest, origin=f"manifest of {origin}")
    listed = sorted((f.role, f.name, f.digest, f.size) for f in version_files(checked))
    expected = sorted((f.role, f.name, f.digest, f.size) for f in reserved.files)
    if (checked["name"], checked["version"], checked["digest"]) != (name, number,
                                                                    reserved.digest) \
            or listed != expected:
        raise ManifestError(f"manifest of {origin} does not describe the reserved push (name, "
                            f"version, digest {reserved.digest} and its {len(expected)} files "
                            "must match what the push began with)")
    checked["tags"] = tags
    return checked
