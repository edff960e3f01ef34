"""What the OCI door returns (kept apart so that importing the facade does not load httpx)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class OciPush:
    """What :meth:`Registry.push_oci` wrote: the artifact's ref and manifest digest, its layer
    count, and how many layers were uploaded, mounted from another repository, or already
    there (``layers - uploaded - mounted``)."""

    ref: str
    digest: str
    layers: int
    uploaded: int
    mounted: int
    bytes_uploaded: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
