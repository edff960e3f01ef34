"""The Registry facade: the public calls of push, pull and export, on top of the catalog
operations of ``versions.py``. It delegates: the pull pipeline is :mod:`registry.pipelines.pull`,
the manifest a push writes :class:`registry.manifest.Draft`, exports :mod:`registry.exports`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from . import attachments
from . import manifest as mf
from .doors import uri as uri_door
from .errors import AdapterError, RefError
from .exports import Artifact, ExportFormat
from .exports import service as exports
from .exports.common import make_request
from .formats import table as formats
from .formats.base import Bases
from .io.weights import write_shards
from .manifest import ModelVersion
from .model import architectures
from .model import devices as dev
from .model import materialize as mat
from .model.factories import factory_string, warn_if_unpullable
from .model.placement import DeviceMap, NoSplit
from .oci import door as oci_door
from .oci.results import OciPush
from .pipelines import pull as pulling
from .pretrained import write_pretrained
from .provenance import capture
from .provenance import diff as diffs
from .refs import (
    Ref,
    parse,
    parse_push_target,
    push_name_and_tags,
    validate_aliases,
    validate_name,
    validate_push_key,
    validate_tags,
)
from .settings import parse_size
from .signing.facade import SignedVersions
from .trust.record_check import checked
from .versions import model_version

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
        idempotency_key: str | None = None,
        parents: Sequence[str | Ref] | None = None,
        datasets: Sequence[Mapping[str, str]] | None = None,
        run: Mapping[str, str] | None = None,
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
        ``idempotency_key`` names this push (default: a fresh one): the same push again with
        it, after an unknown outcome, returns the version it made instead of a second one.

        Lineage (``parents`` refs, ``datasets`` ``{"name", "uri", "digest"}``, ``run`` ``{"id",
        "uri"}``, and what ``REGISTRY_LINEAGE*`` captures) goes into the signed manifest.
        """
        name, tags = push_name_and_tags(name, tags)  # the design card's push(model, tags)
        target, claim = parse_push_target(name) if name is not None else (None, None)
        alias_list = validate_aliases(aliases)
        tag_map = cast(dict[str, str], validate_tags(tags))
        push_key = None if idempotency_key is None else validate_push_key(idempotency_key)
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
        trail = capture.begin_push(self.settings, self._backend.resolve, parents, datasets, run)

        named = attachments.collect(model, files)
        if factory is None and isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
            architecture = attachments.transformers_architecture(Path(model)) or {}
        weights = formats.flatten(  # a PEFT model: its adapter, over the base version found
            model, precision=precision, keep_in_fp32=prefixes, record_architecture=factory is None,
            bases=Bases(parse(base) if base else None, self._backend.resolve, self._newest_first))
        architecture = {**weights.architecture, **architecture}
        named = self._signed_source(model, named, weights.source)
        if target is None:
            target = architectures.default_name(tag_map, architecture) if weights.name is None \
                else tag_map.get("name") or weights.name
        # The latest version's shards found on this machine are compared, not written again.
        staged = write_shards(weights.tensors, target_size, self._backend.staging_dir(),
                              known=self._backend.known_shards(target))
        try:
            staged += attachments.stage(named, self._backend.staging_dir())
            shards = [s.file for s in staged if s.file.role == "weights"]
            draft = mf.Draft(
                name=target, created_at=datetime.now(timezone.utc).isoformat(),
                shards=shards,
                tensors=weights.specs,
                tied_aliases=len(weights.tied), extras=weights.extras,
                architecture=architecture, source=trail.source(
                    weights.source, target, shards,
                    weights.sections.get("adapter", {}).get("base")),
                module_metadata=weights.module_metadata, key_order=weights.key_order,
                tags=tag_map, sections=weights.sections,
                attachments=attachments.manifest_entries(
                    [s for s in staged if s.file.role == "file"]))
            with self._signing_commit(sign_key):
                result = self._backend.push(target, claim, staged, draft.for_version,
                                            tag_map, alias_list, idempotency_key=push_key)
        finally:
            for s in staged:
                s.path.unlink(missing_ok=True)
        return self._signed_push(model_version(result.record, push=result.report()),
                                 sign_key)

    # -- pull: the pipeline lives in registry/pipelines/pull.py ------------------------------

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
        target = pulling.Target(device, dtype, model, device_map, max_memory, no_split,
                                 align_inputs)
        return pulling.pull(self._backend, self.settings, ref, target, merge=merge)

    def materialize_uri(self, uri: str, dest: str | os.PathLike[str], *,
                        format: uri_door.Format = "hf") -> list[Path]:
        """Write the version ``registry://NAME[:vN|@ALIAS]`` names into folder ``dest``, whole
        or not at all: ``hf``, its save_pretrained folder; ``safetensors``, its weights."""
        ref, fmt = uri_door.parse_uri(uri), uri_door.check_format(format)
        return uri_door.materialize(dest, lambda tmp: self.save_pretrained(ref, tmp)
                                    if fmt == "hf" else uri_door.write_weights(lambda: (
                                        pulling.opened_files(self._backend, self.settings,
                                                              ref)), tmp))

    def pull_files(self, ref: str | Ref, dest_dir: str | os.PathLike[str]) -> Path:
        """Write the files attached to ``ref`` (tokenizer, config...; ``oci://`` included)
        under ``dest_dir``, each fetched through the verified cache; returns ``dest_dir``."""
        with pulling.opened_files(self._backend, self.settings, ref) as (record, open_blob):
            return attachments.pull_files(record.manifest, open_blob, dest_dir)

    def save_pretrained(self, ref: str | Ref, dest_dir: str | os.PathLike[str],
                        dtype: dev.DtypeRequest = "auto", *, merge: bool = False) -> Path:
        """Write ``ref`` (``oci://`` included) as a directory ``transformers``'
        ``from_pretrained`` loads: its recorded config, its weights (``dtype`` casts floating
        tensors) and its attached files. An adapter version: PEFT's adapter directory, or with
        ``merge=True`` its base's directory with the adapter merged into the weights (pulled on
        the CPU in the base's stored dtype, or ``dtype``, and merged there by PEFT)."""
        if merge:
            return self._merged_pretrained(ref, dest_dir, dtype)
        with pulling.opened_files(self._backend, self.settings, ref) as (record, open_blob):
            root = write_pretrained(record.manifest, open_blob, dest_dir, dtype,
                                    f"{record.name}:v{record.version}")
        if pulling.is_oci(ref):  # the store's signatures sign its own versions, not this one
            return root
        return self._signed_directory(record, dtype, root)

    def _merged_pretrained(self, ref: str | Ref, dest_dir: str | os.PathLike[str],
                           dtype: dev.DtypeRequest) -> Path:
        if pulling.is_oci(ref):
            raise AdapterError(f"merge=True merges an adapter version of this registry into its "
                               f"base; {ref} is an OCI artifact: import it first "
                               "(registry oci pull)")
        record = pulling.resolve(self._backend, self.settings, ref)
        origin = f"{record.name}:v{record.version}"
        if "adapter" not in record.manifest:
            raise AdapterError(f"{origin} is not an adapter version: merge=True merges an "
                               f"adapter into its base; call save_pretrained({origin!r}) "
                               "without merge")
        base = formats.adapter(record.manifest, origin).base
        with pulling.opened_files(self._backend, self.settings, base) as (stored, open_blob):
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
            merged = pulling.pull(self._backend, self.settings, origin,
                                   pulling.Target(device="cpu", dtype=merge_dtype), merge=True)
            state = merged.state_dict()
            missing = sorted(set(stored.manifest["tensors"]) - state.keys())
            if missing:
                raise AdapterError(f"{origin}: the merged model has no {missing[:3]} that its "
                                   f"base {stored.name}:v{stored.version} stores; pull it with "
                                   "merge=True and save it with its own save_pretrained")
            return write_pretrained(stored.manifest, open_blob, dest_dir, dtype,
                                    f"{stored.name}:v{stored.version}", weights=state)

    def show(self, ref: str | Ref) -> ModelVersion:
        """The version ``ref`` names, with its signatures (listed, not verified); an OCI
        artifact's (``oci://HOST/REPO:TAG``) too, read from its manifest and signature layers
        where this registry pushed it, normalized as a pull does where another producer did."""
        if pulling.is_oci(ref):
            record, listed = oci_door.described(str(ref), self.settings)
            return self._with_signatures(model_version(record), listed)
        return super().show(ref)

    def diff(self, a: str | Ref, b: str | Ref) -> diffs.VersionDiff:
        """What changed from ``a`` to ``b``, reading no shard both hold (provenance/diff.py)."""
        return diffs.between(self._backend, self.settings, a, b)

    def pull_state_dict(
        self,
        ref: str | Ref,
        *,
        device: dev.DeviceRequest = "auto",
        dtype: dev.DtypeRequest = "auto",
    ) -> dict[str, Any]:
        """The weights of ``ref`` (plus stored non-tensor entries) on ``device`` and ``dtype``;
        ``ref`` may name an OCI artifact (``oci://HOST/REPO:TAG``), as for :meth:`pull`."""
        return pulling.pulled_state(self._backend, self.settings, ref, device, dtype)

    def push_oci(self, ref: str | Ref, target: str, *, plain_http: bool = False) -> OciPush:
        """Write ``ref`` to ``oci://HOST[:PORT]/REPO[:TAG]`` (tag default ``v<N>``) as a ModelPack
        artifact whose layers are its blobs, sending only layers the OCI registry lacks; plain
        HTTP goes only to loopback unless ``plain_http`` (registry/oci)."""
        return oci_door.push(checked(self._backend.resolve(parse(ref))), target, self.settings,
                             self._backend.blob_path, plain_http=plain_http,
                             signatures=self._backend.signatures)

    def import_oci(self, source: str, name: str | None = None, *, plain_http: bool = False,
                   tags: Mapping[str, str] | None = None,
                   aliases: Iterable[str] = ()) -> ModelVersion:
        """Import the OCI artifact ``source`` as a new version of ``name`` (default: its own);
        its blobs keep their digests, another producer's artifact is normalized like a
        checkpoint directory (registry/oci)."""
        tag_map, alias_list = cast(dict[str, str], validate_tags(tags)), validate_aliases(aliases)
        done = oci_door.import_artifact(
            source, None if name is None else validate_name(name), self.settings,
            self._backend.staging_dir(), self._backend.push,
            lambda d, n: self.push(d, n, tags=tag_map, aliases=alias_list),
            plain_http=plain_http, tags=tag_map, aliases=alias_list,
            signatures=self._backend.signatures)
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
        return exports.export(self._backend, self.settings, ref, make_request(
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
        return exports.path_of(self.export(
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
