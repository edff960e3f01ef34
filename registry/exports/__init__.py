"""Exports of a stored version: ONNX, torch.export (pt2) and TorchScript artifacts, each
verified against the PyTorch module and stored as a blob of role ``export``.

One module per format (``onnx``, ``pt2``, ``torchscript``) plus what they share (``common``; the
``artifact`` record, which needs no torch);
``service`` runs an export, ``local`` / ``remote`` store and find them. Importing this package
loads neither onnx nor onnxruntime: the ONNX module imports them when an ONNX export runs.
"""

from .artifact import FORMATS, Artifact, ExportFormat

__all__ = ["FORMATS", "Artifact", "ExportFormat"]

