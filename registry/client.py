"""The Registry facade: push and pull pipelines over a backend, plus catalog operations."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from . import architectures, attachments, placement, prefault
from . import devices as dev
from . import manifest as mf
from . import materialize as mat
from .backends import Backend, LocalBackend
from .catalog.records import VersionRecord
from .checked import checked as _checked
from .errors import RefError, SettingsError
from .exports import Artifact, ExportFormat
from .files import weight_files, weights_digest
from .gc import GcReport
from .manifest import ModelVersion
from .normalize import dtype_name, factory_string, normalize
from .parallel import as_ready
from .placement import DeviceMap, NoSplit
from .refs import (
    Ref,
    parse,
    parse_push_target,
    validate_alias,
    validate_aliases,
    validate_name,
    validate_tags,
    validate_version,
)
from .settings import Settings, parse_size
from .signing.facade import SignedVersions
from .staging import Stagings
from .statedict import ordered_state
from .store import ObjectStore
from .weights import load_shard, write_shards

if TYPE_CHECKING:
    from .catalog.repository import Catalog

ModelInput = nn.Module | Mapping[str, Any] | str | os.PathLike[str]


class Registry(SignedVersions):
    """A model registry: embedded (SQLite + local files) by default, configured by environment.

    ``Registry(uri=None, *, home=None, catalog=None, store=None, token=None)``: ``catalog`` and
    ``store`` take URLs (or a Catalog / ObjectStore); ``home`` replaces ``REGISTRY_HOME``.
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        catalog: str | Catalog | None = None,
        store: str | ObjectStore | None = None,
        token: str | None = None,
    ) -> None:
        self.settings = Settings.from_env(
            home=home,
            catalog=catalog if isinstance(catalog, str) else None,
            store=store if isinstance(store, str) else None,
        )
        self._backend: Backend
        uri = uri if uri is not None else self.settings.uri
        if uri and token is None and uri == self.settings.uri:
            token = self.settings.token  # REGISTRY_TOKEN goes only to REGISTRY_URI
        if uri:
            if catalog is not None or store is not None:
                raise SettingsError(f"remote registry {uri!r} keeps its own catalog and store; "
                                    "pass either a uri or catalog=/store=, not both")
            from .remote import RemoteBackend

            self._backend = RemoteBackend(uri, token=token, cache_dir=self.settings.cache_dir)
            return
        self._backend = LocalBackend.from_settings(
            self.settings,
            catalog=None if catalog is None or isinstance(catalog, str) else catalog,
            store=None if store is None or isinstance(store, str) else store,
        )

    def __repr__(self) -> str:
        return f"Registry({self._backend!r})"

    @property
    def backend(self) -> Backend:
        return self._backend

    # -- push -----------------------------------------------------------------------------

    def push(
        self,
        model: ModelInput,
        name: str | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        aliases: Iterable[str] = (),
        factory: str | Any = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        precision: str | None = None,
        keep_in_fp32: Iterable[str] = (),
        shard_size: int | str | None = None,
        files: Mapping[str, str | os.PathLike[str]] | None = None,
        sign_key: str | os.PathLike[str] | None = None,
    ) -> ModelVersion:
        """Normalize ``model`` and store it as a new immutable version of ``name``.

        Without ``name``, the version is named by ``tags["name"]`` or after what was pushed (a
        transformers model's ``name_or_path`` or ``model_type``, the timm architecture, the
        factory, the class); ``ModelVersion.ref`` says which.

        ``files`` (name -> path) are attached to the version, as is every non-weight file of a
        ``save_pretrained`` directory ``model``, whose ``config.json`` is recorded too.

        Weights are cut into safetensors shards of about ``shard_size`` (default
        ``REGISTRY_SHARD_SIZE``, 1 GiB) at module-group boundaries; only shards the store lacks
        are uploaded, and ``metadata["push"]`` of the returned version says how many were.
        ``sign_key`` (an EC private key, PEM) signs the new version (see :meth:`sign`).
        """
        target, claim = parse_push_target(name) if name is not None else (None, None)
        alias_list = validate_aliases(aliases)
        tag_map = cast(dict[str, str], validate_tags(tags))
        architecture: dict[str, Any] = {}
        if factory is not None:
            architecture["factory"] = factory_string(factory)
            architecture["factory_kwargs"] = _json_object(factory_kwargs, "factory_kwargs")
        elif factory_kwargs:
            raise RefError("factory_kwargs given without factory; pass factory='module:callable'")
        if precision is not None and (not isinstance(precision, str) or not precision):
            raise RefError(f"invalid precision {precision!r}: use a label such as 'amp-fp16'")
        prefixes = [keep_in_fp32] if isinstance(keep_in_fp32, str) else list(keep_in_fp32)

        target_size = (self.settings.shard_size if shard_size is None
                       else parse_size(shard_size, "shard_size", minimum=1))

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
                return {
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
                }

            with self._signing_commit(sign_key):
                result = self._backend.push(target, claim, staged, manifest_for, tag_map,
                                            alias_list)
        finally:
            for s in staged:
                s.path.unlink(missing_ok=True)
        return self._signed_push(_version(result.record, push=result.report()), sign_key)

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
    ) -> nn.Module:
        """The module of ``ref`` on ``device`` (or spread by ``device_map``), in eval mode.

        ``device_map="auto"`` keeps tied weights and ``no_split`` blocks (default: the model's
        ``_no_split_modules``) on one device each. ``align_inputs=True`` moves and casts inputs
        to the module's device and dtype and returns outputs where the inputs came from.
        """
        record = self._verified(_checked(self._backend.resolve(parse(ref))))
        return self._pull(record, device, dtype, model, device_map, max_memory, no_split,
                          align_inputs)

    def _pull(self, record: VersionRecord, device: dev.DeviceRequest, dtype: dev.DtypeRequest,
              model: mat.ModelSpec, device_map: DeviceMap,
              max_memory: Mapping[str, int | str] | None, no_split: NoSplit,
              align_inputs: bool) -> nn.Module:
        manifest = record.manifest
        requested = dev.parse_dtype(dtype)
        facts = dev.TorchFacts.probe()
        ref_text = f"{record.name}:v{record.version}"
        tied = dict(manifest["source"].get("tied", {}))
        module = mat.build_module(model, manifest.get("architecture", {}),
                                  self.settings.trusted_factories, ref_text,
                                  stored={*manifest["tensors"], *tied})
        tied.update(mat.implied_ties(module, {*manifest["tensors"], *tied}))
        stored_shapes = {**manifest["tensors"],
                         **{a: manifest["tensors"][k] for a, k in tied.items()}}
        mat.check_fits(module, stored_shapes, ref_text)
        policy = mat.DtypePolicy(requested, manifest["source"].get("keep_in_fp32", []), facts)
        placed = placement.plan(module, manifest, device=device, device_map=device_map,
                                max_memory=max_memory, no_split=no_split, dtype=requested,
                                facts=facts)
        state = self._read(record, placed.device_of, policy, tied)
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
        state: dict[str, Any] = self._read(record, lambda _k: target, policy, tied)
        state.update(manifest.get("extras", {}))
        return ordered_state(state, manifest)

    def _read(self, record: VersionRecord, placement: Any, policy: mat.DtypePolicy,
              tied: dict[str, str]) -> dict[str, torch.Tensor]:
        """Every stored tensor on its device and dtype, tied aliases re-added. Shards are
        fetched into the verified cache side by side, and each is loaded as soon as it is
        verified while the others still arrive."""
        specs = record.manifest["tensors"]
        origin = f"{record.name}:v{record.version}"
        out: dict[str, torch.Tensor] = {}
        # Tensors bound for CUDA cross through two pinned buffers per device (staging.py).
        stagings = Stagings(prefault_threads=self.settings.prefault_threads)
        for shard, path in as_ready(lambda f: self._backend.blob_path(f.digest, f.size),
                                    weight_files(record.manifest)):
            loaded = load_shard(path, {k: specs[k] for k in shard.tensors}, placement, policy,
                                origin=origin, stagings=stagings)
            # Map the shard's pages on other threads while the pull goes on (prefault.py).
            prefault.start(loaded.values(), self.settings.prefault_threads)
            out.update(loaded)
        stagings.finish()
        out = dict(sorted(out.items()))
        for alias, kept in tied.items():
            out[alias] = out[kept]
        return out

    # -- reads ----------------------------------------------------------------------------

    def show(self, ref: str | Ref) -> ModelVersion:
        """The version ``ref`` names (the latest one for a bare name), with its signatures."""
        return self._with_signatures(_version(self._backend.resolve(parse(ref))))

    def list_models(self) -> list[str]:
        """Names of models with at least one version, sorted."""
        return self._backend.list_models()

    def list_versions(self, name: str) -> list[ModelVersion]:
        """Every live version of ``name``, oldest first."""
        return [_version(r) for r in self._backend.list_versions(validate_name(name))]

    # -- changes --------------------------------------------------------------------------

    def set_alias(self, name: str, alias: str, version: int | str) -> ModelVersion:
        """Point ``name@alias`` at ``version`` (moving it if it pointed elsewhere)."""
        return _version(self._backend.set_alias(validate_name(name), validate_alias(alias),
                                                validate_version(version)))

    def delete_alias(self, name: str, alias: str) -> None:
        self._backend.delete_alias(validate_name(name), validate_alias(alias))

    def set_tags(self, ref: str | Ref, tags: Mapping[str, str | None]) -> ModelVersion:
        """Merge ``tags`` into the version's tags; a None value removes a tag."""
        resolved = self._backend.resolve(parse(ref))
        return _version(self._backend.set_tags(resolved.name, resolved.version,
                                               validate_tags(tags, removals=True)))

    def delete_version(self, ref: str | Ref) -> ModelVersion:
        """Delete one explicit version (``name:vN``); its number is never reused."""
        parsed = parse(ref)
        if parsed.version is None:
            raise RefError(f"delete_version needs an explicit version such as "
                           f"'{parsed.name}:v1', not {str(parsed)!r}")
        return _version(self._backend.delete_version(parsed.name, parsed.version))

    # -- exports: the logic lives in registry/exports ----------------------------------------

    def export(self, ref: str | Ref, *, format: ExportFormat = "onnx",
               input_shapes: Sequence[Sequence[int]] | None = None,
               example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
               dynamic_batch: bool = False, dynamic_axes: Sequence[Sequence[int]] | None = None,
               opset: int | None = None, device: dev.DeviceRequest = "cpu",
               dtype: dev.DtypeRequest = "auto", tolerance: float | None = None,
               model: mat.ModelSpec = None) -> Artifact:
        """An ONNX / pt2 / TorchScript artifact of ``ref``, verified against the module on
        random inputs of ``input_shapes`` (or ``example_inputs``) and stored with the version;
        the same options return the stored one. ``dynamic_axes``: per input, the dims besides
        the batch dim whose size may vary."""
        from .exports import common, service

        return service.export(self, ref, common.make_request(
            format, input_shapes=input_shapes, example_inputs=example_inputs,
            dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
            dtype=dtype, tolerance=tolerance), model)

    def pull_export(self, ref: str | Ref, *, format: ExportFormat = "onnx",
                    input_shapes: Sequence[Sequence[int]] | None = None,
                    example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
                    dynamic_batch: bool = False,
                    dynamic_axes: Sequence[Sequence[int]] | None = None,
                    opset: int | None = None, device: dev.DeviceRequest = "cpu",
                    dtype: dev.DtypeRequest = "auto", tolerance: float | None = None,
                    model: mat.ModelSpec = None) -> Path:
        """The verified local file of :meth:`export` with the same options (cached)."""
        from .exports import service

        return service.path_of(self.export(
            ref, format=format, input_shapes=input_shapes, example_inputs=example_inputs,
            dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
            dtype=dtype, tolerance=tolerance, model=model))

    def list_exports(self, ref: str | Ref) -> list[Artifact]:
        """The stored exports of ``ref``, oldest first (``path`` is None: nothing is fetched)."""
        from .exports import service

        return service.list_exports(self, ref)

    def gc(self) -> GcReport:
        """Remove store and cache objects that no version references."""
        return self._backend.gc()

    def close(self) -> None:
        self._backend.close()


# -- helpers ------------------------------------------------------------------------------

def _version(record: VersionRecord, *, push: dict[str, int] | None = None) -> ModelVersion:
    metadata = {**record.manifest, "tags": dict(record.tags)}
    if push is not None:
        metadata["push"] = push
    return ModelVersion(record.name, record.version, record.digest, dict(record.tags),
                        list(record.aliases), metadata)


def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RefError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(dict(value), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise RefError(f"{what} must be JSON-serializable: {exc}") from None
