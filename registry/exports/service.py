"""Export a stored version in this process, verify the artifact, store it, find it again.

The facade's ``export`` / ``pull_export`` are thin calls of the functions here (listing the
stored exports needs no torch: ``versions.py`` does it), with the registry's backend and
settings; the module exported comes from the pull pipeline (:mod:`registry.pipelines.pull`),
not from the facade. The backend decides where the artifact goes (``local.py`` in-process,
``remote.py`` to a server), and nothing here depends on which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..backends import Backend
from ..errors import ExportError
from ..io import safewrite
from ..io.digests import hexdigest, sha256_file
from ..pipelines import pull as pulling
from ..refs import Ref, parse
from ..settings import Settings
from . import onnx, pt2, records, torchscript
from .artifact import SUFFIXES, Artifact
from .common import (
    ExportRequest,
    check_inputs,
    compare,
    compute_dtype,
    leaves,
    tolerance_for,
    trace_inputs,
)

# Each format's module: export(module, inputs, request, path, origin) and run(path, inputs).
# None imports onnx or onnxruntime until an ONNX export runs.
FORMAT_MODULES: dict[str, Any] = {"onnx": onnx, "pt2": pt2, "torchscript": torchscript}


def export(backend: Backend, settings: Settings, ref: str | Ref, request: ExportRequest,
           model: Any = None, out: str | os.PathLike[str] | None = None) -> Artifact:
    """The artifact ``request`` describes for ``ref``: the stored one when the same parameters
    were exported before, else exported, verified and stored now. Its ``path`` ends in the
    format's extension: ``out`` (see :func:`destination`), or a link to the verified blob in
    the cache's ``exports/`` (a blob path has no extension, and ``torch.export.load`` warns)."""
    artifact = stored_or_made(backend, settings, ref, request, model)
    if out is not None:
        return dataclasses.replace(artifact, path=copy_to(artifact, Path(out)))
    return dataclasses.replace(artifact, path=_named_link(
        path_of(artifact), artifact.digest, SUFFIXES[artifact.format],
        settings.cache_dir / "exports"))


def stored_or_made(backend: Backend, settings: Settings, ref: str | Ref, request: ExportRequest,
                   model: Any = None) -> Artifact:
    """The stored artifact with ``request``'s key, else the module pulled (the same pipeline
    and cache as :meth:`Registry.pull`), exported, verified and registered with the backend."""
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
    module = pulling.pull(backend, settings, origin, pulling.Target(
        device=request.device, dtype=request.dtype, model=model))
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
    fmt = FORMAT_MODULES[request.format]
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


def destination(artifact: Artifact, out: Path) -> Path:
    """Where ``out`` asks an artifact to go: inside it when it is a directory (or ends in a
    separator), named ``<name>-v<N><ext>``; with the format's extension added when it has none."""
    suffix = SUFFIXES[artifact.format]
    if out.is_dir() or str(out).endswith((os.sep, "/")):
        return out / f"{artifact.ref.replace(':', '-')}{suffix}"
    return out if out.suffix else out.with_name(out.name + suffix)


def copy_to(artifact: Artifact, output: Path) -> Path:
    """Copy a verified artifact to :func:`destination` of ``output`` (a new file beside it,
    renamed into place; folders made one level at a time, see :mod:`registry.io.safewrite`)."""
    target = destination(artifact, output)
    safewrite.copy_file(safewrite.folder(target.parent) / target.name, path_of(artifact))
    return target


def _named_link(blob: Path, digest: str, suffix: str, directory: Path) -> Path:
    """``directory/<hex><suffix>``, a symbolic link to the verified ``blob`` (a copy where links
    cannot be made), so the artifact's path carries its format's extension."""
    target = directory / f"{hexdigest(digest)}{suffix}"
    with contextlib.suppress(OSError):
        if target.resolve(strict=True) == blob.resolve(strict=True):
            return target
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{target.name}.{secrets.token_hex(8)}.tmp"
    try:
        os.symlink(blob.resolve(), tmp)
    except OSError:
        safewrite.copy_file(target, blob)
        return target
    try:
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


@dataclasses.dataclass(frozen=True)
class Exports:
    """The exports of one registry, a field of :class:`registry.Registry`: :func:`export`
    over its backend and settings."""

    backend: Backend
    settings: Settings

    def export(self, ref: str | Ref, request: ExportRequest, model: Any = None,
               out: str | os.PathLike[str] | None = None) -> Artifact:
        """:func:`export` in this registry."""
        return export(self.backend, self.settings, ref, request, model, out)
