"""Exports of a stored version: ONNX, torch.export (pt2) and TorchScript artifacts, each
verified against the PyTorch module and stored as a blob of role ``export``.

One module per format (``onnx``, ``pt2``, ``torchscript``) plus what they share (``common``);
``service`` runs an export, ``local`` / ``remote`` store and find them. Importing this package
loads neither onnx nor onnxruntime: the ONNX module imports them when an ONNX export runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .formats import FORMATS, ExportFormat

if TYPE_CHECKING:
    from .common import Artifact

__all__ = ["FORMATS", "Artifact", "ExportFormat"]


def __getattr__(name: str) -> Any:
    # Artifact lives beside the torch code of exports; a server that only stores and lists
    # export records imports this package without torch.
    if name == "Artifact":
        from .common import Artifact

        return Artifact
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
