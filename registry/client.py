"""The Registry facade: push and pull pipelines over a backend, on top of the catalog
operations of ``versions.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from . import adapters, architectures, attachments, placement, prefault, quantized
from . import devices as dev
from . import manifest as mf
from . import materialize as mat
from .catalog.records import VersionRecord
from .errors import RefError
from .exports import Artifact, ExportFormat
from .factories import warn_if_unpullable
from .files import weight_files, weights_digest
from .manifest import ModelVersion
from .normalize import dtype_name, factory_string, normalize
from .oci.results import OciPush
from .parallel import as_ready
from .placement import DeviceMap, NoSplit
from .record_check import checked as _checked
from .refs import (
    Ref,
    parse,
    parse_push_target,
    push_name_and_tags,
    validate_aliases,
    validate_name,
    validate_tags,
)
from .settings import parse_size
from .signing.facade import SignedVersions
from .staging import Stagings
from .statedict import ordered_state
from .versions import model_version
from .weights import DtypeFor, load_shard, write_shards

ModelInput = nn.Module | Mapping[str, Any] | str | os.PathLike[str]


class Registry(SignedVersions):
    """A model registry: embedded (SQLite + local files) by default, configured by environment.

    ``Registry(uri=None, *, home=None, catalog=None, store=None, token=None)``: ``catalog`` and
    ``store`` take URLs (or a Catalog / ObjectStore); ``home`` replaces ``REGISTRY_HOME``.
    Reads and catalog edits (show, list, alias, tag, delete, gc) come from :class:`Versions`,
    which needs no torch; push, pull and export are here.
    """

    # -- push -----------------------------------------------------------------------------

    def push(
        self,
        model: ModelInput,
        name: str | Mapping[str, str] | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        aliases: Iterable[str] = (),
        factory: str | Any = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        precision: str | None = None,
        keep_in_fp32: Iterable[str] = (),
        shard_size: int | str | None = None,
        files: Mapping[str, str | os.PathLike[str]] | None = None,
        base: str | Ref | None = None,
        sign_key: str | os.PathLike[str] | None = None,
    ) -> ModelVersion:
        """Normalize ``model`` and store it as a new immutable version of ``name``.

        Without ``name``, the version is named by ``tags["name"]`` or after what was pushed (a
        transformers model's ``name_or_path`` or ``model_type``, the timm architecture, the
        factory, the class); ``ModelVersion.ref`` says which. A mapping in ``name``'s place is
        the tags, so ``push(model, {"dataset": "imagenet"})`` names the version after the model.

        ``files`` (name -> path) are attached to the version, as is every non-weight file of a
        ``save_pretrained`` directory ``model``, whose ``config.json`` is recorded too.

        Weights are cut into safetensors shards of about ``shard_size`` (default
        ``REGISTRY_SHARD_SIZE``, 1 GiB) at module-group boundaries; only shards the store lacks
        are uploaded, and ``metadata["push"]`` of the returned version says how many were.
        A PEFT model stores its LoRA adapter alone, over ``base`` (default: the stored version
        holding its base weights).
        ``sign_key`` (an EC private key, PEM) signs the new version (see :meth:`sign`).
        """
        name, tags = push_name_and_tags(name, tags)  # the design card's push(model, tags)
        target, claim = parse_push_target(name) if name is not None else (None, None)
        alias_list = validate_aliases(aliases)
        tag_map = cast(dict[str, str], validate_tags(tags))
        architecture: dict[str, Any] = {}
        if factory is not None:
            architecture["factory"] = warn_if_unpullable(factory_string(factory),
                                                         self.settings.trusted_factories)
            architecture["factory_kwargs"] = _json_object(factory_kwargs, "factory_kwargs")
        elif factory_kwargs:
            raise RefError("factory_kwargs given without factory; pass factory='module:callable'")
        if precision is not None and (not isinstance(precision, str) or not precision):
            raise RefError(f"invalid precision {precision!r}: use a label such as 'amp-fp16'")
        prefixes = [keep_in_fp32] if isinstance(keep_in_fp32, str) else list(keep_in_fp32)

        target_size = (self.settings.shard_size if shard_size is None
                       else parse_size(shard_size, "shard_size", minimum=1))

        sections: dict[str, Any] = {}  # an adapter version's manifest section
        if adapters.is_adapter(model):
            adapter = adapters.capture(model)
            found = adapters.base_of(adapter, self._backend.resolve(parse(base)) if base
                                     else None, self._newest_first)
            sections["adapter"] = {**adapter.record, "base": adapters.base_entry(found)}
            model, target = adapter.tensors, target or tag_map.get("name") or f"{found.name}-lora"
        named = attachments.collect(model, files)
        if factory is None and isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
            architecture = attachments.transformers_architecture(Path(model)) or {}
        weights = normalize(model, precision=precision, keep_in_fp32=prefixes,
                            record_architecture=factory is None)
        architecture = {**weights.architecture, **architecture}
        named = self._signed_source(model, named, weights.source)
        if target is None:
            target = architectures.default_name(tag_map, architecture)
        # The latest version's shards found on this machine are compared, not written again.
        staged = write_shards(weights.tensors, target_size, self._backend.staging_dir(),
                              known=self._backend.known_shards(target))
        try:
            staged += attachments.stage(named, self._backend.staging_dir())
            shards = [s.file for s in staged if s.file.role == "weights"]
            attached = attachments.manifest_entries([s for s in staged if s.file.role == "file"])
            tensors = {
                key: {"dtype": dtype_name(t.dtype), "shape": list(t.shape)}
                for key, t in weights.tensors.items()
            }
            created_at = datetime.now(timezone.utc).isoformat()

            def manifest_for(version: int) -> dict[str, Any]:
                manifest = {
                    "format_version": mf.FORMAT_VERSION,
                    "name": target,
                    "version": version,
                    "created_at": created_at,
                    "digest": weights_digest(shards),
                    "files": [{"digest": f.digest, "size": f.size, "format": "safetensors",
                               "tensors": list(f.tensors)} for f in shards],
                    "tensor_count": len(tensors) + len(weights.tied),
                    "tensors": tensors,
                    "extras": weights.extras,
                    "architecture": architecture,
                    "source": weights.source,
                    "module_metadata": weights.module_metadata,
                    "key_order": weights.key_order,
                    "tags": tag_map,
                    **({"attachments": attached} if attached else {}),
                    **({"quantization": weights.quantization} if weights.quantization else {}),
                    **sections,
                }
                return {**manifest, "format_version": mf.format_for(manifest)}

            with self._signing_commit(sign_key):
                result = self._backend.push(target, claim, staged, manifest_for, tag_map,
                                            alias_list)
        finally:
            for s in staged:
                s.path.unlink(missing_ok=True)
        return self._signed_push(model_version(result.record, push=result.report()),
                                 sign_key)

    # -- pull -----------------------------------------------------------------------------

    def pull(
        self,
        ref: str | Ref,
        *,
        device: dev.DeviceRequest = "auto",
        dtype: dev.DtypeRequest = "auto",
        model: mat.ModelSpec = None,
        device_map: DeviceMap = None,
        max_memory: Mapping[str, int | str] | None = None,
        no_split: NoSplit = None,
        align_inputs: bool = False,
        merge: bool = False,
    ) -> nn.Module:
        """The module of ``ref`` on ``device`` (or spread by ``device_map``), in eval mode.

        ``device_map="auto"`` keeps tied weights and ``no_split`` blocks (default: the model's
        ``_no_split_modules``) on one device each. ``align_inputs=True`` moves and casts inputs
        to the module's device and dtype and returns outputs where the inputs came from.
        An adapter version comes back on its base (a ``PeftModel``; merged with ``merge=True``).
        """
        if isinstance(ref, str) and ref.startswith("oci://"):  # registry/oci/door.py
            from .oci.door import opened
            with opened(ref, self.settings) as (record, fetch):
                return self._pull(_checked(record), device, dtype, model, device_map,
                                  max_memory, no_split, align_inputs, fetch)
        record = self._verified(_checked(self._backend.resolve(parse(ref))))
        if "adapter" not in record.manifest:
            return self._pull(record, device, dtype, model, device_map, max_memory, no_split,
                              align_inputs)
        return adapters.pull(
            record, lambda ref: self._verified(_checked(self._backend.resolve(ref))),
            lambda base: self._pull(base, device, dtype, model, device_map, max_memory, no_split,
                                    align_inputs),
            lambda target: self._read(record, lambda _k: target, adapters.as_stored, {}),
            merge=merge)

    def _pull(self, record: VersionRecord, device: dev.DeviceRequest, dtype: dev.DtypeRequest,
              model: mat.ModelSpec, device_map: DeviceMap,
              max_memory: Mapping[str, int | str] | None, no_split: NoSplit,
              align_inputs: bool, fetch: Any = None) -> nn.Module:
        manifest = record.manifest
        requested = dev.parse_dtype(dtype)
        facts = dev.TorchFacts.probe()
        ref_text = f"{record.name}:v{record.version}"
        scheme = quantized.scheme_of(manifest, ref_text)  # quantized.Plain for float versions
        device = scheme.auto_device(device, facts)
        tied = dict(manifest["source"].get("tied", {}))
        stored = scheme.module_keys({*manifest["tensors"], *tied})
        module = mat.build_module(model, manifest.get("architecture", {}),
                                  self.settings.trusted_factories, ref_text, stored=stored)
        tied.update(mat.implied_ties(module, stored))
        stored_shapes = {**manifest["tensors"],
                         **{a: manifest["tensors"][k] for a, k in tied.items()}}
        mat.check_fits(module, scheme.shapes(stored_shapes), ref_text)
        policy = mat.DtypePolicy(requested, manifest["source"].get("keep_in_fp32", []), facts)
        placed = placement.plan(module, manifest, device=device, device_map=device_map,
                                max_memory=max_memory, no_split=no_split, dtype=requested,
                                facts=facts, sizes=scheme.sizes(manifest))
        scheme.check_devices(placed.devices, facts, requested)
        state = self._read(record, placed.device_of, scheme.policy(policy), tied, fetch)
        state = scheme.rebuild(module, state, requested)
        mat.fill_module(module, ordered_state(state, manifest), tied, placed.device_of)
        architectures.retie(module)
        placement.install_hooks(module, placed, align_inputs=align_inputs)
        module.registry_ref = ref_text  # type: ignore[assignment]
        return module

    def pull_files(self, ref: str | Ref, dest_dir: str | os.PathLike[str]) -> Path:
        """Write the files attached to ``ref`` (tokenizer, config...) under ``dest_dir``, each
        fetched through the verified cache; returns ``dest_dir``."""
        record = self._verified(_checked(self._backend.resolve(parse(ref))))
        return attachments.pull_files(record.manifest, self._backend.blob_path, dest_dir)

    def save_pretrained(self, ref: str | Ref, dest_dir: str | os.PathLike[str],
                        dtype: dev.DtypeRequest = "auto") -> Path:
        """Write ``ref`` as a directory ``transformers``' ``from_pretrained`` loads: its recorded
        config, its weights (``dtype`` casts floating tensors) and its attached files."""
        from .pretrained import write_pretrained

        record = self._verified(_checked(self._backend.resolve(parse(ref))))
        return self._signed_directory(record, dtype, write_pretrained(
            record.manifest, self._backend.blob_path, dest_dir, dtype,
            f"{record.name}:v{record.version}"))

    def pull_state_dict(
        self,
        ref: str | Ref,
        *,
        device: dev.DeviceRequest = "auto",
        dtype: dev.DtypeRequest = "auto",
    ) -> dict[str, Any]:
        """The weights of ``ref`` (plus stored non-tensor entries) on ``device`` and ``dtype``."""
        record = self._verified(_checked(self._backend.resolve(parse(ref))))
        return self._pull_state_dict(record, device, dtype)

    def _pull_state_dict(self, record: VersionRecord, device: dev.DeviceRequest,
                         dtype: dev.DtypeRequest) -> dict[str, Any]:
        manifest = record.manifest
        requested = dev.parse_dtype(dtype)
        facts = dev.TorchFacts.probe()
        target = dev.resolve_device(device, placement.bytes_needed(manifest, requested), facts)
        if requested is not None:
            dev.check_dtype_runs(requested, target)
        policy = mat.DtypePolicy(requested, manifest["source"].get("keep_in_fp32", []), facts)
        tied = dict(manifest["source"].get("tied", {}))
        # A quantized version: its library's tensors, or floats when dtype asks (quantized.py).
        scheme = quantized.scheme_of(manifest, f"{record.name}:v{record.version}")
        scheme.check_devices([target], facts, requested)
        state: dict[str, Any] = self._read(record, lambda _k: target, scheme.policy(policy), tied)
        state = scheme.state_dict(state, requested)
        state.update(manifest.get("extras", {}))
        return ordered_state(state, manifest)

    def _read(self, record: VersionRecord, placement: Any, policy: DtypeFor,
              tied: dict[str, str], fetch: Any = None) -> dict[str, torch.Tensor]:
        """Every stored tensor on its device and dtype, tied aliases re-added. Shards are
        fetched into the verified cache side by side, and each is loaded as soon as it is
        verified while the others still arrive."""
        specs = record.manifest["tensors"]
        origin = f"{record.name}:v{record.version}"
        out: dict[str, torch.Tensor] = {}
        # Tensors bound for CUDA cross through two pinned buffers per device (staging.py).
        stagings = Stagings(prefault_threads=self.settings.prefault_threads)
        # Each shard is mapped from the very file that was verified (Backend.open_blob); an OCI
        # pull's fetch hands back its verified layers in the cache.
        opener = self._backend.open_blob if fetch is None else (
            lambda digest, size: open(fetch(digest, size), "rb"))  # noqa: SIM115 (closed below)
        for shard, fh in as_ready(lambda f: opener(f.digest, f.size),
                                  weight_files(record.manifest)):
            with fh:
                loaded = load_shard(fh, {k: specs[k] for k in shard.tensors}, placement,
                                    policy, origin=origin, stagings=stagings)
            # Map the shard's pages on other threads while the pull goes on (prefault.py).
            prefault.start(loaded.values(), self.settings.prefault_threads)
            out.update(loaded)
        stagings.finish()
        out = dict(sorted(out.items()))
        for alias, kept in tied.items():
            out[alias] = out[kept]
        return out

    def push_oci(self, ref: str | Ref, target: str, *, plain_http: bool = False) -> OciPush:
        """Write ``ref`` to ``oci://HOST[:PORT]/REPO[:TAG]`` (tag default ``v<N>``) as a ModelPack
        artifact whose layers are its blobs, sending only layers the OCI registry lacks; plain
        HTTP goes only to loopback unless ``plain_http`` (registry/oci)."""
        from .oci.door import push

        return push(_checked(self._backend.resolve(parse(ref))), target, self.settings,
                    self._backend.blob_path, plain_http=plain_http)

    def import_oci(self, source: str, name: str | None = None, *, plain_http: bool = False,
                   tags: Mapping[str, str] | None = None,
                   aliases: Iterable[str] = ()) -> ModelVersion:
        """Import the OCI artifact ``source`` as a new version of ``name`` (default: its own);
        its blobs keep their digests, another producer's artifact is normalized like a
        checkpoint directory (registry/oci)."""
        from .oci.door import import_artifact

        tag_map, alias_list = cast(dict[str, str], validate_tags(tags)), validate_aliases(aliases)
        done = import_artifact(
            source, None if name is None else validate_name(name), self.settings,
            self._backend.staging_dir(), self._backend.push,
            lambda d, n: self.push(d, n, tags=tag_map, aliases=alias_list),
            plain_http=plain_http, tags=tag_map, aliases=alias_list)
        return done if isinstance(done, ModelVersion) else model_version(done.record,
                                                                         push=done.report())

    # -- exports: the logic lives in registry/exports ----------------------------------------

    def export(self, ref: str | Ref, *, format: ExportFormat = "onnx",
               input_shapes: Sequence[Sequence[int]] | None = None,
               example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
               dynamic_batch: bool = False, dynamic_axes: Sequence[Sequence[int]] | None = None,
               opset: int | None = None, device: dev.DeviceRequest = "cpu",
               dtype: dev.DtypeRequest = "auto", tolerance: float | None = None,
               model: mat.ModelSpec = None, out: str | os.PathLike[str] | None = None) -> Artifact:
        """An ONNX / pt2 / TorchScript artifact of ``ref``, verified against the module on
        random inputs of ``input_shapes`` (or ``example_inputs``) and stored with the version;
        the same options return the stored one. ``dynamic_axes``: per input, the dims besides
        the batch dim whose size may vary. ``out``: a file or directory to write it to."""
        from .exports import common, service

        return service.export(self, ref, common.make_request(
            format, input_shapes=input_shapes, example_inputs=example_inputs,
            dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
            dtype=dtype, tolerance=tolerance), model, out)

    def pull_export(self, ref: str | Ref, *, format: ExportFormat = "onnx",
                    input_shapes: Sequence[Sequence[int]] | None = None,
                    example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
                    dynamic_batch: bool = False,
                    dynamic_axes: Sequence[Sequence[int]] | None = None,
                    opset: int | None = None, device: dev.DeviceRequest = "cpu",
                    dtype: dev.DtypeRequest = "auto", tolerance: float | None = None,
                    model: mat.ModelSpec = None,
                    out: str | os.PathLike[str] | None = None) -> Path:
        """The verified local file of :meth:`export` with the same options (at ``out``)."""
        from .exports import service

        return service.path_of(self.export(
            ref, format=format, input_shapes=input_shapes, example_inputs=example_inputs,
            dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
            dtype=dtype, tolerance=tolerance, model=model, out=out))


# -- helpers ------------------------------------------------------------------------------



def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RefError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(dict(value), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise RefError(f"{what} must be JSON-serializable: {exc}") from None
