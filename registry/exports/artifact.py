"""What an export is once stored: its format names and the :class:`Artifact` record.

Kept apart from ``common`` (requests, inputs, verification), which needs torch: listing a
version's exports (``registry show``) reads records and imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ExportFormat = Literal["onnx", "pt2", "torchscript"]
FORMATS: tuple[str, ...] = ("onnx", "pt2", "torchscript")
SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "torchscript": ".pt"}


@dataclass(frozen=True)
class Artifact:
    """An export of a version: a verified file computing what the version's module computes.

    ``path`` is the verified local file (None in :meth:`Registry.list_exports`, which downloads
    nothing); ``max_abs_diff`` was measured against the PyTorch module when it was exported;
    ``params`` holds the export's options (inputs, dynamic axes, opset, device, dtype);
    ``cached`` says this call found the artifact stored and exported nothing.
    """

    ref: str
    format: ExportFormat
    digest: str
    size: int
    path: Path | None
    max_abs_diff: float
    tolerance: float
    params: dict[str, Any]
    key: str
    versions: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    cached: bool = False

    @classmethod
    def from_record(cls, ref: str, record: Mapping[str, Any], path: Path | None = None, *,
                    cached: bool = False) -> Artifact:
        return cls(ref, record["format"], record["digest"], int(record["size"]), path,
                   float(record["max_abs_diff"]), float(record["tolerance"]),
                   dict(record["params"]), record["key"], dict(record.get("versions", {})),
                   record.get("created_at", ""), cached)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "format": self.format, "digest": self.digest, "size": self.size,
                "path": None if self.path is None else str(self.path),
                "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
                "params": self.params, "key": self.key, "versions": self.versions,
                "created_at": self.created_at, "cached": self.cached}
