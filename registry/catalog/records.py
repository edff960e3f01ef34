"""What catalog reads return: plain dataclasses, never ORM rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class VersionRecord:
    """A committed version as the catalog holds it (the client turns it into a ModelVersion)."""

    name: str
    version: int
    digest: str
    size_bytes: int
    manifest: dict[str, Any]
    tags: dict[str, str]
    aliases: list[str]
    # The manifest's text as the catalog holds it, where the record was read from a catalog's
    # row: the client checks each text once (record_check.checked) instead of on every pull.
    manifest_text: str | None = field(default=None, compare=False, repr=False)
