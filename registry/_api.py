"""The module-level verbs: ``registry.push(...)`` and friends, each the same call on the default
:class:`Registry` that the environment describes when it is called.

Their signatures are the facade's, kept equal by tests/unit/test_exported_members.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .caching.cachedir import CacheListing, PruneReport
from .caching.prefetching import PrefetchReport
from .client import ModelInput, Registry
from .doors.uri import Format
from .events import Event
from .exports import Artifact, ExportFormat
from .gc import GcReport
from .governance import ModelGovernance, Trashed
from .io.parallel import DOWNLOAD_CONCURRENCY
from .manifest import ModelVersion
from .model.devices import DeviceRequest, DtypeRequest
from .model.materialize import ModelSpec
from .model.placement import DeviceMap, NoSplit
from .oci.results import OciPush
from .provenance.bom import BomFormat
from .provenance.diff import VersionDiff
from .provenance.lineage import Lineage
from .refs import Ref
from .settings import Settings
from .signing import Signature
from .webhooks import Delivery, Webhook

_defaults: dict[Settings, Registry] = {}
_defaults_lock = threading.Lock()


def default_registry() -> Registry:
    """The registry the environment describes right now (one per distinct configuration)."""
    settings = Settings.from_env()
    with _defaults_lock:
        reg = _defaults.get(settings)
        if reg is None:
            reg = _defaults[settings] = Registry()
        return reg


def push(model: ModelInput, name: str | Mapping[str, str] | None = None, *,
         tags: Mapping[str, str] | None = None,
         aliases: Iterable[str] = (), factory: str | Any = None,
         factory_kwargs: Mapping[str, Any] | None = None, precision: str | None = None,
         keep_in_fp32: Iterable[str] = (),
         shard_size: int | str | None = None,
         files: Mapping[str, str | os.PathLike[str]] | None = None,
         base: str | Ref | None = None,
         sign_key: str | os.PathLike[str] | None = None,
         idempotency_key: str | None = None,
         parents: Sequence[str | Ref] | None = None,
         datasets: Sequence[Mapping[str, str]] | None = None,
         run: Mapping[str, str] | None = None) -> ModelVersion:
    """Store ``model`` as a new version of ``name`` (derived when omitted; a mapping there is
    the tags: ``push(model, {"dataset": "imagenet"})``; a PEFT model is stored as an adapter
    over ``base``; ``sign_key`` signs it; ``idempotency_key`` makes a retry safe; ``parents``,
    ``datasets`` and ``run`` go into its lineage); see :meth:`Registry.push`."""
    return default_registry().push(model, name, tags=tags, aliases=aliases, factory=factory,
                                   factory_kwargs=factory_kwargs, precision=precision,
                                   keep_in_fp32=keep_in_fp32, shard_size=shard_size,
                                   files=files, base=base, sign_key=sign_key,
                                   idempotency_key=idempotency_key, parents=parents,
                                   datasets=datasets, run=run)


def pull(ref: str | Ref, *, device: DeviceRequest = "auto", dtype: DtypeRequest = "auto",
         model: ModelSpec = None, device_map: DeviceMap = None,
         max_memory: Mapping[str, int | str] | None = None, no_split: NoSplit = None,
         align_inputs: bool = False, merge: bool = False) -> nn.Module:
    """Materialize ``ref`` as a module; see :meth:`Registry.pull`."""
    return default_registry().pull(ref, device=device, dtype=dtype, model=model,
                                   device_map=device_map, max_memory=max_memory,
                                   no_split=no_split, align_inputs=align_inputs, merge=merge)


def pull_files(ref: str | Ref, dest_dir: str | os.PathLike[str]) -> Path:
    """Write the files attached to ``ref`` under ``dest_dir``; see :meth:`Registry.pull_files`."""
    return default_registry().pull_files(ref, dest_dir)


def materialize_uri(uri: str, dest: str | os.PathLike[str], *,
                    format: Format = "hf") -> list[Path]:
    """Write the version a ``registry://`` URI names into ``dest``; see
    :meth:`Registry.materialize_uri`."""
    return default_registry().materialize_uri(uri, dest, format=format)


def save_pretrained(ref: str | Ref, dest_dir: str | os.PathLike[str],
                    dtype: DtypeRequest = "auto", *, merge: bool = False) -> Path:
    """Write ``ref`` as a from_pretrained directory; see :meth:`Registry.save_pretrained`."""
    return default_registry().save_pretrained(ref, dest_dir, dtype, merge=merge)


def pull_state_dict(ref: str | Ref, *, device: DeviceRequest = "auto",
                    dtype: DtypeRequest = "auto") -> dict[str, Any]:
    """The weights of ``ref``; see :meth:`Registry.pull_state_dict`."""
    return default_registry().pull_state_dict(ref, device=device, dtype=dtype)


def show(ref: str | Ref) -> ModelVersion:
    return default_registry().show(ref)


def list_models() -> list[str]:
    return default_registry().list_models()


def list_versions(name: str) -> list[ModelVersion]:
    return default_registry().list_versions(name)


def set_alias(name: str, alias: str, version: int | str, *,
              force: bool = False) -> ModelVersion:
    return default_registry().set_alias(name, alias, version, force=force)


def delete_alias(name: str, alias: str, *, force: bool = False) -> None:
    default_registry().delete_alias(name, alias, force=force)


def set_tags(ref: str | Ref, tags: Mapping[str, str | None]) -> ModelVersion:
    return default_registry().set_tags(ref, tags)


def list_adapters(ref: str | Ref) -> list[ModelVersion]:
    return default_registry().list_adapters(ref)


def delete_version(ref: str | Ref, *, force: bool = False) -> ModelVersion:
    return default_registry().delete_version(ref, force=force)


def gc() -> GcReport:
    return default_registry().gc()


def protect_alias(name: str, alias: str) -> None:
    default_registry().protect_alias(name, alias)


def unprotect_alias(name: str, alias: str) -> None:
    default_registry().unprotect_alias(name, alias)


def hold(ref: str | Ref, reason: str) -> ModelVersion:
    return default_registry().hold(ref, reason)


def release(ref: str | Ref) -> ModelVersion:
    return default_registry().release(ref)


def set_retention(name: str, *, keep_last: int | None = None,
                  max_age: timedelta | str | None = None) -> None:
    default_registry().set_retention(name, keep_last=keep_last, max_age=max_age)


def restore_version(ref: str | Ref) -> ModelVersion:
    return default_registry().restore_version(ref)


def list_trash(name: str | None = None) -> list[Trashed]:
    return default_registry().list_trash(name)


def governance(name: str) -> ModelGovernance:
    return default_registry().governance(name)


def history(name: str, alias: str | None = None, *, since: datetime | str | None = None,
            limit: int | None = None) -> list[Event]:
    return default_registry().history(name, alias, since=since, limit=limit)


def events(*, since_id: int | None = None, limit: int | None = None) -> list[Event]:
    return default_registry().events(since_id=since_id, limit=limit)
def prefetch(ref: str | Ref, *, files: bool = True,
             jobs: int = DOWNLOAD_CONCURRENCY) -> PrefetchReport:
    """Every blob of ``ref`` verified in the local cache; see :meth:`Registry.prefetch`."""
    return default_registry().prefetch(ref, files=files, jobs=jobs)


def cache_list() -> CacheListing:
    """What the local cache holds; see :meth:`Registry.cache_list`."""
    return default_registry().cache_list()


def prune_cache(*, keep: Iterable[str | Ref] = (), max_size: int | str | None = None,
                older_than: str | timedelta | None = None) -> PruneReport:
    """Bound the local cache; see :meth:`Registry.prune_cache`."""
    return default_registry().prune_cache(keep=keep, max_size=max_size, older_than=older_than)


def export(ref: str | Ref, *, format: ExportFormat = "onnx",
           input_shapes: Sequence[Sequence[int]] | None = None,
           example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
           dynamic_batch: bool = False, dynamic_axes: Sequence[Sequence[int]] | None = None,
           opset: int | None = None, device: DeviceRequest = "cpu",
           dtype: DtypeRequest = "auto", tolerance: float | None = None,
           model: ModelSpec = None, out: str | os.PathLike[str] | None = None) -> Artifact:
    """A verified, stored export of ``ref``; see :meth:`Registry.export`."""
    return default_registry().export(
        ref, format=format, input_shapes=input_shapes, example_inputs=example_inputs,
        dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
        dtype=dtype, tolerance=tolerance, model=model, out=out)


def pull_export(ref: str | Ref, *, format: ExportFormat = "onnx",
                input_shapes: Sequence[Sequence[int]] | None = None,
                example_inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
                dynamic_batch: bool = False, dynamic_axes: Sequence[Sequence[int]] | None = None,
                opset: int | None = None, device: DeviceRequest = "cpu",
                dtype: DtypeRequest = "auto", tolerance: float | None = None,
                model: ModelSpec = None, out: str | os.PathLike[str] | None = None) -> Path:
    """The local path of a verified export of ``ref``; see :meth:`Registry.pull_export`."""
    return default_registry().pull_export(
        ref, format=format, input_shapes=input_shapes, example_inputs=example_inputs,
        dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes, opset=opset, device=device,
        dtype=dtype, tolerance=tolerance, model=model, out=out)


def list_exports(ref: str | Ref) -> list[Artifact]:
    """The stored exports of ``ref``; see :meth:`Registry.list_exports`."""
    return default_registry().list_exports(ref)


def push_oci(ref: str | Ref, target: str, *, plain_http: bool = False) -> OciPush:
    """Write ``ref`` to an OCI registry as a ModelPack artifact; see :meth:`Registry.push_oci`."""
    return default_registry().push_oci(ref, target, plain_http=plain_http)


def import_oci(source: str, name: str | None = None, *, plain_http: bool = False,
               tags: Mapping[str, str] | None = None,
               aliases: Iterable[str] = ()) -> ModelVersion:
    """Import an OCI artifact as a new version; see :meth:`Registry.import_oci`."""
    return default_registry().import_oci(source, name, plain_http=plain_http, tags=tags,
                                         aliases=aliases)


def sign(ref: str | Ref, *, key: str | os.PathLike[str],
         certificate: str | os.PathLike[str] | None = None,
         chain: Sequence[str | os.PathLike[str]] = ()) -> Signature:
    """Sign version ``ref`` (OpenSSF Model Signing); see :meth:`Registry.sign`."""
    return default_registry().sign(ref, key=key, certificate=certificate, chain=chain)


def verify(ref: str | Ref, *, public_keys: Sequence[str | os.PathLike[str]] | None = None,
           certificates: Sequence[str | os.PathLike[str]] | None = None,
           fast: bool = False) -> list[Signature]:
    """The signatures of ``ref`` that verify with trusted keys, every file they cover hashed
    again unless ``fast``; see :meth:`Registry.verify`."""
    return default_registry().verify(ref, public_keys=public_keys, certificates=certificates,
                                     fast=fast)


def lineage(ref: str | Ref) -> Lineage:
    """Where ``ref`` came from and which versions came from it; see :meth:`Registry.lineage`."""
    return default_registry().lineage(ref)


def add_webhook(url: str, events: str | Iterable[str], *,
                models: str | Iterable[str] | None = None,
                secret: str | None = None) -> Webhook:
    """Subscribe ``url`` to events; see :meth:`Registry.add_webhook`."""
    return default_registry().add_webhook(url, events, models=models, secret=secret)


def list_webhooks() -> list[Webhook]:
    """Every webhook; see :meth:`Registry.list_webhooks`."""
    return default_registry().list_webhooks()


def remove_webhook(id: str) -> None:  # noqa: A002 (the facade's name)
    """Remove a webhook; see :meth:`Registry.remove_webhook`."""
    default_registry().remove_webhook(id)


def test_webhook(id: str) -> int:  # noqa: A002
    """Ping a webhook now; see :meth:`Registry.test_webhook`."""
    return default_registry().test_webhook(id)


def webhook_deliveries(id: str, *, limit: int = 100) -> list[Delivery]:  # noqa: A002
    """A webhook's newest deliveries; see :meth:`Registry.webhook_deliveries`."""
    return default_registry().webhook_deliveries(id, limit=limit)


def diff(a: str | Ref, b: str | Ref) -> VersionDiff:
    """What changed from ``a`` to ``b``; see :meth:`Registry.diff`."""
    return default_registry().diff(a, b)


def bom(ref: str | Ref, format: BomFormat = "cyclonedx") -> dict[str, Any]:
    """The AI-BOM of ``ref`` (CycloneDX 1.6 or SPDX 3.0.1 JSON); see :meth:`Registry.bom`."""
    return default_registry().bom(ref, format)


def card(ref: str | Ref) -> str:
    """The model card of ``ref``; see :meth:`Registry.card`."""
    return default_registry().card(ref)
