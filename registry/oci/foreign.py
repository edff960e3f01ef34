"""Another ModelPack producer's artifact (safetensors and config layers, raw or tar, with no
registry manifest) as a checkpoint directory, and as a version a pull can materialize.

An import pushes the checkout directory (the push normalizes it). A pull
(``registry.pull("oci://...")``) normalizes it the same way (:func:`registry.formats.table.flatten`
and, for a ``save_pretrained`` directory, its ``config.json``), attaches its other files as
that push would (``config.json``, tokenizer files, a model card: same names, same checks),
writes the normalized shards and the attached files into the verified cache, and holds the
version's manifest under ``oci/foreign/<digest>.json``: a second pull of the same manifest
digest reads them from the cache while every file it lists is still there, each verified again
by its digest as every pull reads it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import manifest as mf
from ..attachments import (
    as_provenance,
    collect,
    manifest_entries,
    stage,
    transformers_architecture,
)
from ..caching.cache import BlobCache
from ..catalog.records import VersionRecord
from ..errors import OciArtifactError, RefError, RegistryError
from ..files import StagedFile, version_files
from ..formats import table as formats
from ..io.digests import hexdigest
from ..io.weights import write_shards
from ..refs import validate_name
from ..settings import Settings
from ..signing.push import check_source
from . import modelpack
from .pull import LayerFetcher
from .unpack import Budget, Expansion, claim, place, unpack

FALLBACK_NAME = "oci-model"


def checkout(artifact: modelpack.Artifact, layers: LayerFetcher, root: Path, *, origin: str,
             budget: int, expansion: Expansion) -> Path:
    """A new directory under ``root`` holding the artifact's files: each raw layer at its file
    path, each tar layer unpacked. It must hold safetensors weights from a weight layer."""
    root.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(dir=root, prefix="checkout-"))
    claimed: set[str] = set()
    weights: list[str] = []
    left = Budget(budget)
    try:
        for layer in artifact.layers:
            if layer.media_type in modelpack.OWN_TYPES:
                continue
            what = f"{origin} layer {layer.digest}"
            with layers.open(layer.digest, layer.size) as fh:
                if modelpack.is_tar(layer.media_type):
                    names = unpack(fh, layer.media_type, target, what=what, claimed=claimed,
                                   budget=left, limit=expansion.allowed(layer.size))
                else:
                    claim(layer.filepath, claimed, what)
                    place(fh, target / layer.filepath)  # filepath passed check_file_name
                    names = [layer.filepath]
            if layer.media_type.startswith(modelpack.WEIGHT.removesuffix(".raw") + "."):
                weights += [n for n in names if n.endswith(".safetensors") and "/" not in n]
        if not weights:
            raise OciArtifactError(
                f"{origin} holds no safetensors weights at its top level ({modelpack.WEIGHT} "
                "layers, or their .tar forms, with *.safetensors files, as a checkpoint "
                "directory holds them)")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def version(artifact: modelpack.Artifact, layers: LayerFetcher, settings: Settings, *,
            manifest_digest: str, origin: str, repository: str, budget: int) -> VersionRecord:
    """The normalized version of another producer's artifact, its shards and attached files in
    the cache: the files a push of the checkout directory would attach, under the same names
    and checks (:func:`registry.attachments.collect`, a ``model.sig`` kept as provenance)."""
    cache_root = settings.cache_dir
    cache = BlobCache(cache_root)
    memo = cache_root / "oci" / "foreign" / f"{hexdigest(manifest_digest)}.json"
    held = _held(memo, cache, origin)
    if held is not None:
        return _record(held)
    layers.prefetch(artifact.layers)
    directory = checkout(artifact, layers, cache_root / "oci" / "checkouts", origin=origin,
                         budget=budget, expansion=Expansion(settings.oci_max_expansion,
                                                            settings.oci_max_unpacked))
    staged: list[StagedFile] = []
    try:
        weights = formats.flatten(directory)
        architecture = {**weights.architecture, **(transformers_architecture(directory) or {})}
        named = collect(directory, None)
        signed_files = check_source(directory, named, settings)
        staged = write_shards(weights.tensors, settings.shard_size, cache.tmp_dir())
        staged += stage(as_provenance(named), cache.tmp_dir())
    except BaseException:
        for s in staged:
            s.path.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    try:
        for s in staged:
            _keep(cache, s)
    finally:
        for s in staged:
            s.path.unlink(missing_ok=True)
    source = {**weights.source, "oci": {"ref": origin, "digest": manifest_digest}}
    source.get("checkpoint", {}).pop("file", None)  # the checkout's temporary name
    if signed_files is not None:
        source["signed_files"] = signed_files
    manifest = mf.Draft(
        name=_name(artifact, repository), created_at=_created(artifact),
        shards=[s.file for s in staged if s.file.role == "weights"],
        tensors=weights.specs,
        tied_aliases=len(weights.tied), extras=weights.extras, architecture=architecture,
        source=source, module_metadata=weights.module_metadata, key_order=weights.key_order,
        tags={}, quantization=weights.sections.get("quantization"),
        attachments=manifest_entries([s for s in staged if s.file.role == "file"]),
    ).for_version(1)
    mf.validate(manifest, origin=origin)
    _write(memo, mf.dumps(manifest))
    return _record(manifest)


def _keep(cache: BlobCache, staged: StagedFile) -> None:
    """A normalized shard or an attached file into the cache (its digest was computed as it
    was written); bytes the cache holds already (a raw layer's own blob) stay as they are."""
    def move(tmp: Path) -> str:
        os.replace(staged.path, tmp)
        return staged.digest

    cache.open(staged.digest, move, staged.size).close()


def _held(memo: Path, cache: BlobCache, origin: str) -> dict[str, Any] | None:
    """The manifest a pull of this artifact normalized before, if every file it lists (shards
    and attached files) is still cached; each is verified again when it is opened."""
    try:
        manifest = mf.loads(memo.read_bytes(), origin=origin)
    except (OSError, RegistryError, ValueError):
        return None
    if all(cache.path(f.digest).is_file() for f in version_files(manifest)):
        return manifest
    return None


def _record(manifest: dict[str, Any]) -> VersionRecord:
    size = sum(f["size"] for f in manifest["files"])
    return VersionRecord(manifest["name"], manifest["version"], manifest["digest"], size,
                         manifest, {}, [])


def _name(artifact: modelpack.Artifact, repository: str) -> str:
    """The ModelPack descriptor's name where it is a valid model name, else the repository's
    last part."""
    for candidate in (artifact.annotations.get("org.cncf.model.name"),
                      repository.rsplit("/", 1)[-1]):
        with contextlib.suppress(RefError):
            return validate_name(candidate)
    return FALLBACK_NAME


def _created(artifact: modelpack.Artifact) -> str:
    stamp = artifact.annotations.get("org.opencontainers.image.created", "")
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        when = datetime.now(timezone.utc)
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()


def _write(path: Path, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a memo only saves normalizing again
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".foreign-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
