"""torch.export: ``torch.export.export`` + ``torch.export.save`` (a ``.pt2`` archive), verified
with ``torch.export.load``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .common import ExportRequest, failure, leaves

INSTEAD = ("rewrite data-dependent branches with torch.cond, or use format='torchscript' "
           "(tracing records the one path the example inputs take)")


def dynamic_shapes(request: ExportRequest) -> tuple[dict[int, Any], ...] | None:
    """torch.export's dynamic_shapes for the request: one shared Dim for every batch dim."""
    if not any(s.dynamic for s in request.inputs):
        return None
    from torch.export import Dim

    batch = Dim("batch", min=1) if request.dynamic_batch else None
    out: list[dict[int, Any]] = []
    for i, spec in enumerate(request.inputs):
        dims: dict[int, Any] = {}
        for d in spec.dynamic:
            dims[d] = batch if (d == 0 and batch is not None) else Dim(f"input{i}_dim{d}", min=1)
        out.append(dims)
    return tuple(out)


def exported_program(module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                     request: ExportRequest, ref: str, fmt: str,
                     instead: str = INSTEAD) -> Any:
    """``torch.export.export`` of ``module``; an exporter failure becomes ExportError."""
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes(request),
                                   strict=False)
    except Exception as exc:  # the exporter raises many unrelated types; all mean "cannot"
        raise failure(fmt, ref, exc, instead) from exc


def export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], request: ExportRequest,
           path: Path, ref: str) -> dict[str, Any]:
    program = exported_program(module, args, request, ref, "pt2")
    torch.export.save(program, path)
    return {}


def run(path: Path, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    loaded = torch.export.load(path).module()
    with torch.no_grad():
        return leaves(loaded(*args))
