"""The export formats and their file suffixes: what a record names, without torch (a server
checks export records and never loads a module)."""

from __future__ import annotations

from typing import Literal

ExportFormat = Literal["onnx", "pt2", "torchscript"]
FORMATS: tuple[str, ...] = ("onnx", "pt2", "torchscript")
SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "torchscript": ".pt"}
