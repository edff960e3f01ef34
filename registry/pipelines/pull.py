"""The pull pipeline: a reference resolved to a checked record that the signature policy passed,
its shards fetched into the verified cache side by side, and each one loaded onto its device as
soon as it is verified, into a module built on ``meta`` (or a state dict).

Functions over ``(backend, settings, record, ...)``: the facade (:class:`registry.Registry`)
and the export service (:mod:`registry.exports.service`) both call them, and neither knows the
other. The stages, in order:

1. :func:`resolve` - ``backend.resolve`` -> :func:`registry.trust.record_check.checked` (the
   manifest passes the schema and names the catalog's digest) -> the signature policy
   (``REGISTRY_VERIFY``), before any byte of the version is read;
2. :func:`read` - the shards through the verified cache (``Backend.open_blob``, or an OCI
   artifact's layers), each loaded by :func:`registry.io.weights.load_shard` while the others
   still arrive;
3. :func:`module` / :func:`state_dict` - the module built on ``meta`` and filled by assignment
   (:mod:`registry.model.materialize`), placed (:mod:`registry.model.placement`), or the bare
   tensors.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import torch
from torch import nn

from ..backends import Backend
from ..caching import cachedir
from ..caching.prefetching import resolved
from ..catalog.records import VersionRecord
from ..errors import AdapterError
from ..files import weight_files
from ..formats import table as formats
from ..formats.base import Read, Steps
from ..io import prefault
from ..io.parallel import as_ready
from ..io.staging import Stagings
from ..io.weights import DtypeFor, load_shard
from ..model import architectures, placement
from ..model import devices as dev
from ..model import materialize as mat
from ..model.placement import DeviceMap, NoSplit
from ..model.statedict import ordered_state
from ..oci.door import opened
from ..pretrained import write_pretrained
from ..refs import Ref, parse
from ..settings import Settings
from ..trust.record_check import checked

# An OCI pull's fetch: (digest, size) -> the path of the verified layer in the cache.
Fetch = Callable[[str, int], Any]


@dataclass(frozen=True)
class Target:
    """Where a pulled module lands: the placement options of :meth:`Registry.pull`."""

    device: dev.DeviceRequest = "auto"
    dtype: dev.DtypeRequest = "auto"
    model: mat.ModelSpec = None
    device_map: DeviceMap = None
    max_memory: Mapping[str, int | str] | None = None
    no_split: NoSplit = None
    align_inputs: bool = False


def resolve(backend: Backend, settings: Settings, ref: str | Ref) -> VersionRecord:
    """The record ``ref`` names, checked (:func:`checked`) and passed by the signature policy
    (REGISTRY_VERIFY): before any byte of the version is loaded. The cache writes down that it
    serves the version (``registry cache ls``)."""
    record = resolved(backend, settings, parse(ref))
    cachedir.remember(settings.cache_dir, record)
    return record


def is_oci(ref: str | Ref) -> TypeGuard[str]:
    """Whether ``ref`` names an artifact in an OCI registry (``oci://HOST/REPO:TAG``)."""
    return isinstance(ref, str) and ref.startswith("oci://")


@contextmanager
def opened_files(backend: Backend, settings: Settings, ref: str | Ref
                 ) -> Iterator[tuple[VersionRecord, Callable[[str, int], BinaryIO]]]:
    """The checked record ``ref`` names (``oci://`` included, registry/oci/door.py) and how to
    open each of its files (shards and attached files) from the verified cache, as
    ``Backend.open_blob`` does: valid inside the ``with``."""
    if is_oci(ref):
        with opened(ref, settings) as (record, fetch):
            yield checked(record), lambda digest, size: os.fdopen(fetch(digest, size), "rb")
        return
    yield resolve(backend, settings, ref), backend.open_blob


def pull(backend: Backend, settings: Settings, ref: str | Ref, target: Target, *,
         merge: bool = False) -> nn.Module:
    """The module of ``ref`` (``oci://`` included) at ``target``, in eval mode; an adapter
    version comes back on its base (merged with ``merge=True``)."""
    if is_oci(ref):  # registry/oci/door.py
        with opened(ref, settings) as (record, fetch):
            return module(backend, settings, checked(record), target, fetch)
    record = resolve(backend, settings, ref)
    if "adapter" not in record.manifest:
        return module(backend, settings, record, target)
    # The adapter's floats follow the rule the base's follow: dtype= where given, else what
    # "auto" makes of their stored dtype on the device (float32 for half precision on the CPU).
    requested = dev.parse_dtype(target.dtype)
    policy = mat.DtypePolicy(requested, [], dev.TorchFacts.probe())
    return formats.pull_adapter(
        record.manifest, f"{record.name}:v{record.version}",
        lambda base: resolve(backend, settings, base),
        lambda base: module(backend, settings, base, target),
        lambda device: read(backend, settings, record, lambda _k: device, policy, {}),
        merge=merge, floats=requested is not None,
        # How the base is pulled, where that alone fixes its structure (formats/peft/replay.py).
        pulled_as=None if target.model is not None or target.device_map is not None else (
            target.device, target.dtype, target.align_inputs))


def module(backend: Backend, settings: Settings, record: VersionRecord, target: Target,
           fetch: Fetch | None = None) -> nn.Module:
    """The module of a resolved ``record``: built on ``meta``, checked against the stored
    shapes, planned onto its devices, filled with the tensors :func:`read` gives, as rebuilt by
    the version's format (:func:`registry.formats.table.pull`, which calls :func:`_built_read`
    back with its steps)."""
    manifest = record.manifest
    requested = dev.parse_dtype(target.dtype)
    ref_text = f"{record.name}:v{record.version}"
    tied = dict(manifest["source"].get("tied", {}))
    got = formats.pull(manifest, ref_text, requested, functools.partial(
        _built_read, backend, settings, record, target, requested, tied, fetch))
    built = got.module
    assert built is not None  # _built_read builds one
    mat.fill_module(built, ordered_state(got.state, manifest), tied, got.placed.device_of)
    architectures.retie(built, stored=got.state.keys() - tied.keys())
    placement.install_hooks(built, got.placed, align_inputs=target.align_inputs)
    built.registry_ref = ref_text  # type: ignore[assignment]
    return built


def _built_read(backend: Backend, settings: Settings, record: VersionRecord, target: Target,
                requested: torch.dtype | None, tied: dict[str, str], fetch: Fetch | None,
                steps: Steps) -> Read:
    """:func:`module`'s part by the steps of the version's format: the module built on
    ``meta`` (in the format's skeleton), its tied keys found (added to ``tied``), checked against
    the stored shapes, planned onto devices that run the format, and the tensors read."""
    manifest = record.manifest
    facts = dev.TorchFacts.probe()
    ref_text = f"{record.name}:v{record.version}"
    device = steps.auto_device(target.device, facts)
    stored = steps.module_keys({*manifest["tensors"], *tied})
    built = steps.skeleton(mat.build_module(target.model, manifest.get("architecture", {}),
                                            settings.trusted_factories, ref_text, stored=stored))
    tied.update(mat.implied_ties(built, stored))
    stored_shapes = {**manifest["tensors"],
                     **{a: manifest["tensors"][k] for a, k in tied.items()}}
    mat.check_fits(built, steps.shapes(stored_shapes), ref_text)
    policy = mat.DtypePolicy(requested, manifest["source"].get("keep_in_fp32", []), facts)
    placed = placement.plan(built, manifest, device=device, device_map=target.device_map,
                            max_memory=target.max_memory, no_split=target.no_split,
                            dtype=requested, facts=facts, sizes=steps.sizes(manifest))
    steps.check_devices(placed.devices, facts, requested)
    return Read(steps, built, read(backend, settings, record, placed.device_of,
                                   steps.policy(policy), tied, fetch), placed)


def pulled_state(backend: Backend, settings: Settings, ref: str | Ref,
                 device: dev.DeviceRequest, dtype: dev.DtypeRequest) -> dict[str, Any]:
    """:func:`state_dict` of what ``ref`` names (``oci://`` included)."""
    if is_oci(ref):
        with opened(ref, settings) as (record, fetch):
            return state_dict(backend, settings, checked(record), device, dtype, fetch)
    return state_dict(backend, settings, resolve(backend, settings, ref), device, dtype)


def state_dict(backend: Backend, settings: Settings, record: VersionRecord,
               device: dev.DeviceRequest, dtype: dev.DtypeRequest,
               fetch: Fetch | None = None) -> dict[str, Any]:
    """The weights of a resolved ``record`` (plus stored non-tensor entries) on one device,
    ordered like ``state_dict()`` with its ``_metadata``; ``fetch`` as :func:`read` takes it.
    A quantized version's are its library's tensors, or floats when ``dtype`` asks (its
    format's rebuild, :func:`registry.formats.table.pull`)."""
    manifest = record.manifest
    requested = dev.parse_dtype(dtype)
    facts = dev.TorchFacts.probe()
    target = dev.resolve_device(device, placement.bytes_needed(manifest, requested), facts)
    if requested is not None:
        dev.check_dtype_runs(requested, target)
    policy = mat.DtypePolicy(requested, manifest["source"].get("keep_in_fp32", []), facts)
    tied = dict(manifest["source"].get("tied", {}))

    def read_by(steps: Steps) -> Read:
        steps.check_devices([target], facts, requested)
        return Read(steps, None, read(backend, settings, record, lambda _k: target,
                                      steps.policy(policy), tied, fetch))

    got = formats.pull(manifest, f"{record.name}:v{record.version}", requested, read_by)
    state = {**got.state, **manifest.get("extras", {})}
    return ordered_state(state, manifest, got.steps.owners())  # the quantized model's own order


def read(backend: Backend, settings: Settings, record: VersionRecord,
         device_of: Callable[[str], torch.device], policy: DtypeFor, tied: dict[str, str],
         fetch: Fetch | None = None) -> dict[str, torch.Tensor]:
    """Every stored tensor on its device and dtype, tied aliases re-added. Shards are fetched
    into the verified cache side by side, and each is loaded as soon as it is verified while
    the others still arrive."""
    specs = record.manifest["tensors"]
    origin = f"{record.name}:v{record.version}"
    out: dict[str, torch.Tensor] = {}
    # Tensors bound for CUDA cross through two pinned buffers per device (staging.py).
    stagings = Stagings(prefault_threads=settings.prefault_threads)
    # Each shard is mapped from the very file that was verified (Backend.open_blob); an OCI
    # pull's fetch hands back its verified layers in the cache.
    opener = backend.open_blob if fetch is None else (
        lambda digest, size: open(fetch(digest, size), "rb"))  # noqa: SIM115 (closed below)
    for shard, fh in as_ready(lambda f: opener(f.digest, f.size),
                              weight_files(record.manifest)):
        with fh:
            loaded = load_shard(fh, {k: specs[k] for k in shard.tensors}, device_of,
                                policy, origin=origin, stagings=stagings)
        # Map the shard's pages on other threads while the pull goes on (prefault.py).
        prefault.start_after(loaded.values(), settings.prefault_threads)
        out.update(loaded)
    stagings.finish()
    out = dict(sorted(out.items()))
    for alias, kept in tied.items():
        out[alias] = out[kept]
    return out


def pretrained(backend: Backend, settings: Settings, ref: str | Ref,
               dest_dir: str | os.PathLike[str], dtype: dev.DtypeRequest
               ) -> tuple[VersionRecord, Path]:
    """``save_pretrained(ref)``: the version written as a ``from_pretrained`` directory (its
    recorded config, its weights, ``dtype`` casting floating tensors, its attached files);
    (the record, the directory)."""
    with opened_files(backend, settings, ref) as (record, open_blob):
        return record, write_pretrained(record.manifest, open_blob, dest_dir, dtype,
                                        f"{record.name}:v{record.version}")


def merged_pretrained(backend: Backend, settings: Settings, ref: str | Ref,
                      dest_dir: str | os.PathLike[str], dtype: dev.DtypeRequest) -> Path:
    """``save_pretrained(ref, merge=True)``: an adapter version's base written as a
    ``from_pretrained`` directory with the adapter merged into its weights (pulled on the CPU in
    the base's stored dtype, or ``dtype``, and merged there by PEFT)."""
    if is_oci(ref):
        raise AdapterError(f"merge=True merges an adapter version of this registry into its "
                           f"base; {ref} is an OCI artifact: import it first "
                           "(registry oci pull)")
    record = resolve(backend, settings, ref)
    origin = f"{record.name}:v{record.version}"
    if "adapter" not in record.manifest:
        raise AdapterError(f"{origin} is not an adapter version: merge=True merges an "
                           f"adapter into its base; call save_pretrained({origin!r}) "
                           "without merge")
    base = formats.adapter(record.manifest, origin).base
    with opened_files(backend, settings, base) as (stored, open_blob):
        if "quantization" in stored.manifest:
            raise AdapterError(
                f"{origin}: its base {stored.name}:v{stored.version} is quantized, and a "
                "merged directory would hold its weights quantized again with a config the "
                "version does not record; pull(ref, dtype='float32', merge=True) gives the "
                "merged float model (its save_pretrained writes it)")
        # Merged in the dtype it is written in (the base's, when its floats share one):
        # float32 would double a bfloat16 base's memory for a rounding PEFT's merge avoids.
        floats = {t["dtype"] for t in stored.manifest["tensors"].values()
                  if getattr(torch, t["dtype"]).is_floating_point}
        merge_dtype = dtype if dev.parse_dtype(dtype) is not None else (
            floats.pop() if len(floats) == 1 else "float32")
        merged = pull(backend, settings, origin, Target(device="cpu", dtype=merge_dtype),
                      merge=True)
        state = merged.state_dict()
        missing = sorted(set(stored.manifest["tensors"]) - state.keys())
        if missing:
            raise AdapterError(f"{origin}: the merged model has no {missing[:3]} that its "
                               f"base {stored.name}:v{stored.version} stores; pull it with "
                               "merge=True and save it with its own save_pretrained")
        return write_pretrained(stored.manifest, open_blob, dest_dir, dtype,
                                f"{stored.name}:v{stored.version}", weights=state)
