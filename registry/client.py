"""The Registry facade: every public call, each delegated. It holds its collaborators as fields
and inherits from none: the catalog operations (:class:`registry.versions.Versions`, no torch),
the signing calls (:class:`registry.signing.facade.Signing`), the exports
(:class:`registry.exports.service.Exports`), the OCI door (:class:`registry.oci.door.Door`) and
the backend they share; the two pipelines (:mod:`registry.pipelines.push`,
:mod:`registry.pipelines.pull`) are functions over that backend and the settings."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from . import attachments
from .backends import Backend
from .caching.cachedir import CacheListing, PruneReport
from .caching.prefetching import PrefetchReport
from .doors import uri as uri_door
from .events import Event
from .exports import Artifact, ExportFormat
from .exports import service as exports
from .exports.common import make_request
from .gc import GcReport
from .governance import ModelGovernance, Trashed
from .io.parallel import DOWNLOAD_CONCURRENCY
from .manifest import ModelVersion
from .model import devices as dev
from .model import materialize as mat
from .model.placement import DeviceMap, NoSplit
from .oci import door as oci_door
from .oci.results import OciPush
from .pipelines import pull as pulling
from .pipelines import push as pushing
from .provenance import diff as diffs
from .provenance.bom import BomFormat
from .provenance.lineage import Lineage
from .refs import Ref, parse, validate_aliases, validate_name, validate_tags
from .signing.facade import PathLike, Signing
from .signing.records import Signature
from .store import ObjectStore
from .trust.record_check import checked
from .versions import Versions, model_version, with_signatures
from .webhooks import Delivery, Webhook

if TYPE_CHECKING:
    from .catalog.repository import Catalog

ModelInput = nn.Module | Mapping[str, Any] | str | os.PathLike[str]


class Registry:
    """A model registry: embedded (SQLite + local files) by default, configured by environment.

    ``Registry(uri=None, *, home=None, catalog=None, store=None, token=None)``: ``catalog`` and
    ``store`` take URLs (or a Catalog / ObjectStore); ``home`` replaces ``REGISTRY_HOME``;
    ``uri`` (or ``REGISTRY_URI``) opens a registry server instead.
    """

    def __init__(self, uri: str | None = None, *, home: str | os.PathLike[str] | None = None,
                 catalog: str | Catalog | None = None, store: str | ObjectStore | None = None,
                 token: str | None = None) -> None:
        self._versions = Versions(uri, home=home, catalog=catalog, store=store, token=token)
        self.settings, self._backend = self._versions.settings, self._versions.backend
        self._signing = Signing(self.settings, self._backend)
        self._exports, self._oci = (exports.Exports(self._backend, self.settings),
                                    oci_door.Door(self._backend, self.settings))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._backend!r})"

    @property
    def backend(self) -> Backend:
        return self._backend

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
        return pushing.push(self._backend, self.settings, model, pushing.request(
            self.settings, name, tags=tags, aliases=aliases, factory=factory,
            factory_kwargs=factory_kwargs, precision=precision, keep_in_fp32=keep_in_fp32,
            shard_size=shard_size, files=files, base=base, sign_key=sign_key,
            idempotency_key=idempotency_key, parents=parents, datasets=datasets, run=run))

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
            return pulling.merged_pretrained(self._backend, self.settings, ref, dest_dir, dtype)
        record, root = pulling.pretrained(self._backend, self.settings, ref, dest_dir, dtype)
        # The store's signatures sign its own versions, not an OCI artifact's directory.
        return root if pulling.is_oci(ref) else self._signing.signed_directory(record, dtype, root)

    def show(self, ref: str | Ref) -> ModelVersion:
        """The version ``ref`` names, with its signatures (listed, not verified); an OCI
        artifact's (``oci://HOST/REPO:TAG``) too, read from its manifest and signature layers
        where this registry pushed it, normalized as a pull does where another producer did."""
        if pulling.is_oci(ref):
            record, listed = self._oci.describe(str(ref))
            return with_signatures(self._backend, model_version(record), listed)
        return self._versions.show(ref)

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
        return self._oci.push(checked(self._backend.resolve(parse(ref))), target,
                              plain_http=plain_http)

    def import_oci(self, source: str, name: str | None = None, *, plain_http: bool = False,
                   tags: Mapping[str, str] | None = None,
                   aliases: Iterable[str] = ()) -> ModelVersion:
        """Import the OCI artifact ``source`` as a new version of ``name`` (default: its own);
        its blobs keep their digests, another producer's artifact is normalized like a
        checkpoint directory (registry/oci)."""
        tag_map, alias_list = cast(dict[str, str], validate_tags(tags)), validate_aliases(aliases)
        done = self._oci.import_artifact(
            source, None if name is None else validate_name(name),
            lambda d, n: self.push(d, n, tags=tag_map, aliases=alias_list),
            plain_http=plain_http, tags=tag_map, aliases=alias_list)
        return done if isinstance(done, ModelVersion) else model_version(done.record,
                                                                         push=done.report())

    def sign(self, ref: str | Ref, *, key: PathLike, certificate: PathLike | None = None,
             chain: Sequence[PathLike] = ()) -> Signature:
        """Sign version ``ref`` with an EC private key (PEM), or with the key and its
        ``certificate`` plus the ``chain`` up to its CA: an OpenSSF Model Signing bundle over
        every file of the version and its manifest, stored with it. A version may carry several
        signatures (producer, reviewer). Keyless Sigstore signing needs the network to reach
        Sigstore's CA and log, so it is not offered here."""
        return self._signing.sign(ref, key=key, certificate=certificate, chain=chain)

    def verify(self, ref: str | Ref, *, public_keys: Sequence[PathLike] | None = None,
               certificates: Sequence[PathLike] | None = None,
               fast: bool = False) -> list[Signature]:
        """The signatures of ``ref`` that verify with ``public_keys`` (PEM) or through a chain
        to ``certificates`` (CA PEM); by default REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS.
        A signature whose key is trusted but which does not verify raises SignatureError.

        Where one verifies, every file it covers is hashed again as stored (the weights read
        once, through the verified cache over a server): a stored byte changed since the push
        raises SignatureError naming the file. ``fast=True`` checks the signatures against the
        manifest's digests only, reading no weight."""
        return self._signing.verify(ref, public_keys=public_keys, certificates=certificates,
                                    fast=fast)

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
        return self._exports.export(ref, make_request(
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

    # -- the catalog operations: registry/versions.py -----------------------------------------

    def lineage(self, ref: str | Ref) -> Lineage:
        """Where ``ref`` came from (git commit, run, datasets, libraries, parents, as its
        signed manifest records them) and the versions that name it as a parent, found
        through the catalog."""
        return self._versions.lineage(ref)

    def bom(self, ref: str | Ref, format: BomFormat = "cyclonedx") -> dict[str, Any]:
        """The AI-BOM of ``ref`` as JSON: CycloneDX 1.6 (``format="cyclonedx"``), the version a
        ``machine-learning-model`` with every file's SHA-256, its parents and datasets as
        components; or SPDX 3.0.1 JSON-LD (``format="spdx"``) with the AI and Dataset
        profiles: an ``ai_AIPackage`` containing its files, ``trainedOn`` each dataset's
        ``dataset_DatasetPackage``, each parent ``ancestorOf`` it (registry/provenance/bom.py)."""
        return self._versions.bom(ref, format)

    def card(self, ref: str | Ref) -> str:
        """A Hugging Face style model card of ``ref`` (YAML front matter, then identity,
        training device/dtype/wrapping, quantization, lineage, signatures and files), written
        from its manifest; ``save_pretrained`` writes it as ``README.md``."""
        return self._versions.card(ref)

    def list_models(self) -> list[str]:
        """Names of models with at least one version, sorted."""
        return self._versions.list_models()

    def list_versions(self, name: str) -> list[ModelVersion]:
        """Every live version of ``name``, oldest first."""
        return self._versions.list_versions(name)

    def list_exports(self, ref: str | Ref) -> list[Artifact]:
        """The stored exports of ``ref``, oldest first (``path`` is None: nothing is fetched)."""
        return self._versions.list_exports(ref)

    def history(self, name: str, alias: str | None = None, *,
                since: datetime | str | None = None, limit: int | None = None) -> list[Event]:
        """What happened to model ``name`` (to ``name@alias`` only, when given), oldest first:
        the events at or after ``since`` (a datetime or ISO-8601 text), the newest ``limit`` of
        them. Deleted versions keep their history."""
        return self._versions.history(name, alias, since=since, limit=limit)

    def events(self, *, since_id: int | None = None, limit: int | None = None) -> list[Event]:
        """Events of every model with an id above ``since_id``, oldest first, at most ``limit``
        (the audit log; through a server it needs the admin scope)."""
        return self._versions.events(since_id=since_id, limit=limit)

    def set_alias(self, name: str, alias: str, version: int | str, *,
                  force: bool = False) -> ModelVersion:
        """Point ``name@alias`` at ``version`` (moving it if it pointed elsewhere); a protected
        alias moves only with ``force`` (through a server: for an admin token)."""
        return self._versions.set_alias(name, alias, version, force=force)

    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> None:
        """Remove ``name@alias``; a protected alias only with ``force`` (server: admin)."""
        return self._versions.delete_alias(name, alias, force=force)

    def protect_alias(self, name: str, alias: str) -> None:
        """Protect ``name@alias``: moving or deleting it then needs ``force`` (embedded) or
        the admin scope (server)."""
        return self._versions.protect_alias(name, alias)

    def unprotect_alias(self, name: str, alias: str) -> None:
        return self._versions.unprotect_alias(name, alias)

    def hold(self, ref: str | Ref, reason: str) -> ModelVersion:
        """Hold the version ``ref`` names: nobody may delete, trash or expire it until
        :meth:`release`."""
        return self._versions.hold(ref, reason)

    def release(self, ref: str | Ref) -> ModelVersion:
        """Lift the hold on version ``ref`` (through a server: admin scope)."""
        return self._versions.release(ref)

    def set_retention(self, name: str, *, keep_last: int | None = None,
                      max_age: timedelta | str | None = None) -> None:
        """``gc`` trashes versions of ``name`` that are not among the ``keep_last`` newest and
        older than ``max_age`` (``"90d"``), never an aliased, held or base version; with
        neither, the policy is cleared."""
        return self._versions.set_retention(name, keep_last=keep_last, max_age=max_age)

    def restore_version(self, ref: str | Ref) -> ModelVersion:
        """Bring deleted version ``name:vN`` back from the trash (within REGISTRY_TRASH_DAYS);
        its aliases are not restored."""
        return self._versions.restore_version(ref)

    def list_trash(self, name: str | None = None) -> list[Trashed]:
        """Deleted versions still restorable (of ``name``, or of every model)."""
        return self._versions.list_trash(name)

    def governance(self, name: str) -> ModelGovernance:
        """``name``'s protected aliases, held versions and retention policy."""
        return self._versions.governance(name)

    def set_tags(self, ref: str | Ref, tags: Mapping[str, str | None]) -> ModelVersion:
        """Merge ``tags`` into the version's tags; a None value removes a tag."""
        return self._versions.set_tags(ref, tags)

    def list_adapters(self, ref: str | Ref) -> list[ModelVersion]:
        """The adapter versions over the version ``ref`` names (any version of a bare name)."""
        return self._versions.list_adapters(ref)

    def delete_version(self, ref: str | Ref, *, force: bool = False) -> ModelVersion:
        """Move version ``name:vN`` to the trash (its number is never reused;
        :meth:`restore_version` brings it back within REGISTRY_TRASH_DAYS, then gc purges it).
        A version that aliases point at, or that adapters name as their base, needs ``force``;
        one a protected alias points at needs ``force`` (server: admin); a held one is
        refused."""
        return self._versions.delete_version(ref, force=force)

    def add_webhook(self, url: str, events: str | Iterable[str], *,
                    models: str | Iterable[str] | None = None,
                    secret: str | None = None) -> Webhook:
        """POST every event of ``events`` kinds (or ``"*"``) on models matching ``models``
        (fnmatch patterns; None: all) to ``url``, signed; ``secret`` is generated when absent
        and returned once, in the Webhook's ``secret``."""
        return self._versions.add_webhook(url, events, models=models, secret=secret)

    def list_webhooks(self) -> list[Webhook]:
        """Every webhook, oldest first (secrets are never listed)."""
        return self._versions.list_webhooks()

    def remove_webhook(self, id: str) -> None:  # noqa: A002 (the contract's name)
        """Remove webhook ``id`` and what it was owed."""
        return self._versions.remove_webhook(id)

    def test_webhook(self, id: str) -> int:  # noqa: A002
        """Send webhook ``id`` a ``ping`` event now; the receiver's HTTP status."""
        return self._versions.test_webhook(id)

    def webhook_deliveries(self, id: str, *, limit: int = 100) -> list[Delivery]:  # noqa: A002
        """Webhook ``id``'s newest deliveries, newest first, each with its attempts."""
        return self._versions.webhook_deliveries(id, limit=limit)

    def gc(self) -> GcReport:
        """Remove store and cache objects that no version references."""
        return self._versions.gc()

    def prefetch(self, ref: str | Ref, *, files: bool = True,
                 jobs: int = DOWNLOAD_CONCURRENCY) -> PrefetchReport:
        """Every blob of ``ref`` (with ``files``, its attached files too) verified in the local
        cache without building the model (an init container's or a node cache's job); a
        second call fetches nothing (``report.already_cached``). ``jobs``: blobs fetched at
        once. One download per blob however many processes prefetch or pull it at once."""
        return self._versions.prefetch(ref, files=files, jobs=jobs)

    def cache_list(self) -> CacheListing:
        """The versions and bytes the local cache (REGISTRY_CACHE_DIR) holds."""
        return self._versions.cache_list()

    def prune_cache(self, *, keep: Iterable[str | Ref] = (), max_size: int | str | None = None,
                    older_than: str | timedelta | None = None) -> PruneReport:
        """Remove cached blobs and signature memos: those unused for ``older_than``, then the
        least recently used until the cache holds at most ``max_size``; with neither, all.
        Blobs of ``keep`` (refs, resolved here) stay, and so does any blob a pull reads now."""
        return self._versions.prune_cache(keep=keep, max_size=max_size, older_than=older_than)

    def close(self) -> None:
        self._versions.close()
