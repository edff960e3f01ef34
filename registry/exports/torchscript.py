"""TorchScript: ``torch.jit.trace`` (``.pt``), verified with ``torch.jit.load``.

TorchScript is deprecated upstream in favour of torch.export; it is offered because C++ and
mobile runtimes still load it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from .common import ExportRequest, failure, leaves

INSTEAD = "use format='pt2' (torch.export) or format='onnx'"


def export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], request: ExportRequest,
           path: Path, ref: str) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            # Tracer warnings and the upstream deprecation notice: the export is verified below
            # on fresh inputs instead, and docs/exports.md says TorchScript is deprecated.
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, args, check_trace=False, strict=False)
            torch.jit.save(traced, str(path))
    except Exception as exc:
        raise failure("torchscript", ref, exc, INSTEAD) from exc
    return {}


def run(path: Path, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.jit.load(str(path), map_location=args[0].device if args else "cpu")
    with torch.no_grad():
        return leaves(loaded(*args))
