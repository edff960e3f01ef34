"""Export a stored version in this process, verify the artifact, store it, find it again.

The facade's ``export`` / ``pull_export`` / ``list_exports`` are thin calls of the functions
here; the backend decides where the artifact goes (``local.py`` in-process, ``remote.py`` to a
server), and nothing here depends on which.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import safewrite
from ..digests import sha256_file
from ..errors import ExportError
from ..refs import Ref, parse
from . import records
from .common import (
    SUFFIXES,
    Artifact,
    ExportRequest,
    check_inputs,
    compare,
    compute_dtype,
    leaves,
    tolerance_for,
    trace_inputs,
)

if TYPE_CHECKING:
    from ..client import Registry


def _format_module(fmt: str) -> Any:
    import importlib

    return importlib.import_module(f"{__package__}.{fmt}")


def list_exports(registry: Registry, ref: str | Ref) -> list[Artifact]:
    """Every stored export of ``ref`` (nothing is downloaded: ``path`` is None)."""
    version = registry.backend.resolve(parse(ref))
    origin = f"{version.name}:v{version.version}"
    return [Artifact.from_record(origin, r)
            for r in registry.backend.list_exports(version.name, version.version)]


def export(registry: Registry, ref: str | Ref, request: ExportRequest,
           model: Any = None) -> Artifact:
    """The artifact ``request`` describes for ``ref``: the stored one when the same parameters
    were exported before, else exported, verified and stored now."""
    backend = registry.backend
    version = backend.resolve(parse(ref))
    origin = f"{version.name}:v{version.version}"
    for record in backend.list_exports(version.name, version.version):
        if record["key"] != request.key:
            continue
        if request.tolerance is not None and record["max_abs_diff"] > request.tolerance:
            raise ExportError(
                f"the stored {request.format} export of {origin} with these options differs "
                f"from the module by {record['max_abs_diff']:.3g}, more than tolerance="
                f"{request.tolerance:.3g}; pass a larger tolerance, or change an option (dtype, "
                "format) to make another export")
        path = backend.blob_path(record["digest"], record["size"])
        return Artifact.from_record(origin, record, path, cached=True)
    module = registry.pull(origin, device=request.device, dtype=request.dtype, model=model)
    staging = backend.staging_dir()
    fd, name = tempfile.mkstemp(dir=staging, prefix=".export-",
                                suffix=SUFFIXES[request.format])
    os.close(fd)
    path = Path(name)
    try:
        record = run(module, request, origin, path)
        kept = backend.register_export(version.name, version.version, record, path)
    finally:
        path.unlink(missing_ok=True)
    return Artifact.from_record(origin, kept, backend.blob_path(kept["digest"], kept["size"]))


def run(module: torch.nn.Module, request: ExportRequest, origin: str,
        path: Path) -> dict[str, Any]:
    """Export ``module`` to ``path``, run the artifact beside the module on the same random
    inputs, and return the export record; ExportError when they differ beyond the tolerance."""
    fmt = _format_module(request.format)
    param = next(iter((*module.parameters(), *module.buffers())), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = compute_dtype(module)
    with torch.no_grad():
        facts = fmt.export(module, trace_inputs(request, dtype, device), request, path, origin)
    diff, scale = 0.0, 0.0
    for batch in check_inputs(request, dtype, device):
        with torch.no_grad():
            expected = leaves(module(*batch))
        try:
            actual = fmt.run(path, batch)
        except ExportError:
            raise
        except Exception as exc:
            shapes = ", ".join("x".join(map(str, t.shape)) for t in batch)
            raise ExportError(
                f"the {request.format} artifact of {origin} failed to run on inputs of shape "
                f"{shapes} ({type(exc).__name__}: {str(exc)[:300]}); if the shape varies, pass "
                "dynamic_batch=True or dynamic_axes=") from exc
        d, s = compare(request.format, expected, actual)
        diff, scale = max(diff, d), max(scale, s)
    tolerance = request.tolerance if request.tolerance is not None \
        else tolerance_for(dtype, scale)
    if diff > tolerance:
        raise ExportError(
            f"{request.format} artifact of {origin} differs from the module by {diff:.3g} "
            f"(tolerance {tolerance:.3g} for {str(dtype).removeprefix('torch.')}); it was not "
            "stored. Try dtype='float32', another format, or pass tolerance= if this is "
            "expected")
    versions = {"torch": torch.__version__}
    versions.update({k: str(v) for k, v in facts.items() if k in ("onnx", "onnxruntime")})
    params = {**request.params(), "compute_dtype": str(dtype).removeprefix("torch.")}
    if facts.get("opset") is not None:
        params["onnx_opset"] = facts["opset"]
    record = {"format": request.format, "key": request.key, "digest": sha256_file(path),
              "size": path.stat().st_size, "max_abs_diff": diff, "tolerance": tolerance,
              "params": params, "versions": versions,
              "created_at": datetime.now(timezone.utc).isoformat()}
    return records.check(record, f"export of {origin}")


def path_of(artifact: Artifact) -> Path:
    if artifact.path is None:
        raise ExportError(f"the {artifact.format} export of {artifact.ref} has no local file")
    return artifact.path


def copy_to(artifact: Artifact, output: Path) -> Path:
    """Copy a verified artifact to ``output`` (written beside it, then renamed)."""
    assert artifact.path is not None
    safewrite.copy_file(safewrite.folder(output.parent) / output.name, artifact.path)
    return output
