"""The manifest (what a version records, as JSON) and the ModelVersion handed to users.

A manifest holds everything needed to pull a version without the catalog: the blob digests and
sizes, every tensor's dtype and shape, tied aliases, extras, keep-in-fp32 prefixes, the
architecture and where the weights came from. It is written to the store at
``manifests/<name>/v<N>.json`` and kept in the catalog row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .digests import hexdigest
from .errors import CheckpointError

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ModelVersion:
    """One immutable version of a model, as the catalog knows it."""

    name: str
    version: int
    digest: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    ref: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", f"{self.name}:v{self.version}")

    def __str__(self) -> str:
        return self.ref

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``registry show --json`` prints."""
        return {
            "name": self.name,
            "version": self.version,
            "ref": self.ref,
            "digest": self.digest,
            "tags": dict(self.tags),
            "aliases": list(self.aliases),
            "metadata": self.metadata,
        }


def blob_key(digest: str) -> str:
    """Store key of a blob: ``blobs/sha256/<hex>`` (the digest is checked first)."""
    return f"blobs/sha256/{hexdigest(digest)}"


def manifest_key(name: str, version: int) -> str:
    return f"manifests/{name}/v{version}.json"


def tombstone_key(name: str, version: int) -> str:
    """Marks a deleted version in the store, so a rebuilt catalog still retires its number."""
    return f"manifests/{name}/v{version}.deleted"


def aliases_key(name: str) -> str:
    return f"aliases/{name}.json"


def dumps(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def loads(data: bytes | str, *, origin: str) -> dict[str, Any]:
    """Parse a manifest, refusing ones written by a newer format."""
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"manifest {origin} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise CheckpointError(f"{origin} is not a registry manifest (no format_version)")
    if manifest["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"manifest {origin} has format_version {manifest['format_version']}, newer than this "
            f"registry understands ({FORMAT_VERSION}); upgrade the registry package"
        )
    return manifest


def files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The blobs a version is made of: ``[{"digest", "size", "format"}]``."""
    return list(manifest["files"])
