"""The catalog operations: a registry opened from the environment, and every operation that
reads or edits versions without touching a tensor (show, list, alias, tag, delete, exports, gc).

Nothing here imports torch, so the CLI commands built on it (``ls``, ``show``, ``alias``,
``tag``, ``rm``, ``gc``, ``db``) answer at once. :class:`registry.Registry` holds one
:class:`Versions` and delegates these calls to it, beside push, pull and export.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .backends import Backend, LocalBackend
from .caching import cachedir, prefetching
from .caching.cachedir import CacheListing, PruneReport
from .caching.prefetching import PrefetchReport
from .catalog.records import VersionRecord
from .errors import ReferencedVersionError, RefError, SettingsError
from .events import MAX_EVENT_ID, Event
from .exports import Artifact
from .gc import GcReport
from .governance import ModelGovernance, Trashed, check_reason, check_retention
from .http.remote import RemoteBackend
from .io.parallel import DOWNLOAD_CONCURRENCY
from .manifest import ModelVersion
from .provenance import bom, card, lineage
from .provenance.bom import BomFormat
from .provenance.lineage import Lineage
from .refs import Ref, parse, validate_alias, validate_name, validate_tags, validate_version
from .settings import Settings, parse_duration, parse_size
from .signing.records import Signature
from .store import ObjectStore
from .trust.record_check import checked
from .trust.validate import strict_int
from .webhooks import Delivery, Webhook

if TYPE_CHECKING:
    from .catalog.repository import Catalog


class Versions:
    """A registry's versions: embedded (SQLite + local files) by default, configured by
    environment; ``uri`` (or ``REGISTRY_URI``) opens a registry server instead."""

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
            self._backend = RemoteBackend(uri, token=token, cache_dir=self.settings.cache_dir)
            return
        self._backend = LocalBackend.from_settings(
            self.settings,
            catalog=None if catalog is None or isinstance(catalog, str) else catalog,
            store=None if store is None or isinstance(store, str) else store,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._backend!r})"

    @property
    def backend(self) -> Backend:
        return self._backend

    # -- reads ----------------------------------------------------------------------------

    def show(self, ref: str | Ref) -> ModelVersion:
        """The version ``ref`` names (the latest one for a bare name), with its signatures."""
        mv = model_version(self._backend.resolve(parse(ref)))
        return with_signatures(self._backend, self._with_governance([mv])[0])

    def _with_governance(self, versions: list[ModelVersion]) -> list[ModelVersion]:
        """``metadata["governance"]`` where a version has a protected alias or a hold
        (``protected_aliases``, ``hold``); absent otherwise, so metadata stays the manifest."""
        if not versions:
            return versions
        state = self._backend.governance.state(versions[0].name)
        if not state.protected and not state.holds:
            return versions
        for mv in versions:
            marks: dict[str, Any] = {}
            protected = [a for a in mv.aliases if a in state.protected]
            if protected:
                marks["protected_aliases"] = protected
            if mv.version in state.holds:
                marks["hold"] = state.holds[mv.version].to_dict()
            if marks:
                mv.metadata["governance"] = marks
        return versions

    # -- provenance: computed from manifests and catalog links (registry/provenance) ------------

    def lineage(self, ref: str | Ref) -> Lineage:
        """Where ``ref`` came from (git commit, run, datasets, libraries, parents, as its
        signed manifest records them) and the versions that name it as a parent, found
        through the catalog."""
        record = checked(self._backend.resolve(parse(ref)))
        return lineage.graph(record, self._newest_first())

    def bom(self, ref: str | Ref, format: BomFormat = "cyclonedx") -> dict[str, Any]:
        """The AI-BOM of ``ref`` as JSON: CycloneDX 1.6 (``format="cyclonedx"``), the version a
        ``machine-learning-model`` with every file's SHA-256, its parents and datasets as
        components; or SPDX 3.0.1 JSON-LD (``format="spdx"``) with the AI and Dataset
        profiles: an ``ai_AIPackage`` containing its files, ``trainedOn`` each dataset's
        ``dataset_DatasetPackage``, each parent ``ancestorOf`` it (registry/provenance/bom.py)."""
        chosen = bom.check_format(format)
        record = checked(self._backend.resolve(parse(ref)))
        return bom.document(record.manifest, chosen, signatures=self._backend.signatures.listed(
            record.name, record.version))

    def card(self, ref: str | Ref) -> str:
        """A Hugging Face style model card of ``ref`` (YAML front matter, then identity,
        training device/dtype/wrapping, quantization, lineage, signatures and files), written
        from its manifest; ``save_pretrained`` writes it as ``README.md``."""
        record = checked(self._backend.resolve(parse(ref)))
        return card.render(record.manifest,
                           signatures=self._backend.signatures.listed(record.name,
                                                                      record.version))

    def list_models(self) -> list[str]:
        """Names of models with at least one version, sorted."""
        return self._backend.list_models()

    def list_versions(self, name: str) -> list[ModelVersion]:
        """Every live version of ``name``, oldest first."""
        return self._with_governance(
            [model_version(r) for r in self._backend.list_versions(validate_name(name))])

    def list_exports(self, ref: str | Ref) -> list[Artifact]:
        """The stored exports of ``ref``, oldest first (``path`` is None: nothing is fetched)."""
        version = self._backend.resolve(parse(ref))
        origin = f"{version.name}:v{version.version}"
        return [Artifact.from_record(origin, r)
                for r in self._backend.list_exports(version.name, version.version)]

    # -- the event log --------------------------------------------------------------------

    def history(self, name: str, alias: str | None = None, *,
                since: datetime | str | None = None, limit: int | None = None) -> list[Event]:
        """What happened to model ``name`` (to ``name@alias`` only, when given), oldest first:
        the events at or after ``since`` (a datetime or ISO-8601 text), the newest ``limit`` of
        them. Deleted versions keep their history."""
        return self._backend.audit.history(validate_name(name),
                                     None if alias is None else validate_alias(alias),
                                     since=parse_since(since), limit=_limit(limit))

    def events(self, *, since_id: int | None = None, limit: int | None = None) -> list[Event]:
        """Events of every model with an id above ``since_id``, oldest first, at most ``limit``
        (the audit log; through a server it needs the admin scope)."""
        if since_id is not None:
            since_id = strict_int(since_id, "since_id", low=0, high=MAX_EVENT_ID)
        return self._backend.audit.events(since_id=since_id, limit=_limit(limit))

    # -- changes --------------------------------------------------------------------------

    def set_alias(self, name: str, alias: str, version: int | str, *,
                  force: bool = False) -> ModelVersion:
        """Point ``name@alias`` at ``version`` (moving it if it pointed elsewhere); a protected
        alias moves only with ``force`` (through a server: for an admin token)."""
        return model_version(self._backend.set_alias(validate_name(name), validate_alias(alias),
                                                     validate_version(version), force=force))

    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> None:
        """Remove ``name@alias``; a protected alias only with ``force`` (server: admin)."""
        self._backend.delete_alias(validate_name(name), validate_alias(alias), force=force)

    # -- governance (registry/governance.py) ----------------------------------------------

    def protect_alias(self, name: str, alias: str) -> None:
        """Protect ``name@alias``: moving or deleting it then needs ``force`` (embedded) or
        the admin scope (server)."""
        self._backend.governance.protect_alias(validate_name(name), validate_alias(alias), True)

    def unprotect_alias(self, name: str, alias: str) -> None:
        self._backend.governance.protect_alias(validate_name(name), validate_alias(alias), False)

    def hold(self, ref: str | Ref, reason: str) -> ModelVersion:
        """Hold the version ``ref`` names: nobody may delete, trash or expire it until
        :meth:`release`."""
        found = self._backend.resolve(parse(ref))
        return model_version(self._backend.governance.hold(found.name, found.version,
                                                           check_reason(reason)))

    def release(self, ref: str | Ref) -> ModelVersion:
        """Lift the hold on version ``ref`` (through a server: admin scope)."""
        found = self._backend.resolve(parse(ref))
        return model_version(self._backend.governance.release(found.name, found.version))

    def set_retention(self, name: str, *, keep_last: int | None = None,
                      max_age: timedelta | str | None = None) -> None:
        """``gc`` trashes versions of ``name`` that are not among the ``keep_last`` newest and
        older than ``max_age`` (``"90d"``), never an aliased, held or base version; with
        neither, the policy is cleared."""
        policy = None if keep_last is None and max_age is None else \
            check_retention(keep_last, max_age)
        self._backend.governance.set_retention(validate_name(name), policy)

    def restore_version(self, ref: str | Ref) -> ModelVersion:
        """Bring deleted version ``name:vN`` back from the trash (within REGISTRY_TRASH_DAYS);
        its aliases are not restored."""
        parsed = parse(ref)
        if parsed.version is None:
            raise RefError(f"restore_version needs an explicit version such as "
                           f"'{parsed.name}:v1', not {str(parsed)!r}")
        return model_version(self._backend.governance.restore_version(parsed.name,
                                                                      parsed.version))

    def list_trash(self, name: str | None = None) -> list[Trashed]:
        """Deleted versions still restorable (of ``name``, or of every model)."""
        return self._backend.governance.trash(None if name is None else validate_name(name))

    def governance(self, name: str) -> ModelGovernance:
        """``name``'s protected aliases, held versions and retention policy."""
        return self._backend.governance.state(validate_name(name))

    def set_tags(self, ref: str | Ref, tags: Mapping[str, str | None]) -> ModelVersion:
        """Merge ``tags`` into the version's tags; a None value removes a tag."""
        resolved = self._backend.resolve(parse(ref))
        return model_version(self._backend.set_tags(resolved.name, resolved.version,
                                                    validate_tags(tags, removals=True)))

    def list_adapters(self, ref: str | Ref) -> list[ModelVersion]:
        """The adapter versions over the version ``ref`` names (any version of a bare name)."""
        parsed = parse(ref)
        bases = (self._backend.list_versions(parsed.name) if parsed.is_latest
                 else [self._backend.resolve(parsed)])
        return [model_version(r) for r in adapters_over(bases, self._newest_first())]

    def delete_version(self, ref: str | Ref, *, force: bool = False) -> ModelVersion:
        """Move version ``name:vN`` to the trash (its number is never reused;
        :meth:`restore_version` brings it back within REGISTRY_TRASH_DAYS, then gc purges it).
        A version that aliases point at, or that adapters name as their base, needs ``force``;
        one a protected alias points at needs ``force`` (server: admin); a held one is
        refused."""
        parsed = parse(ref)
        if parsed.version is None:
            raise RefError(f"delete_version needs an explicit version such as "
                           f"'{parsed.name}:v1', not {str(parsed)!r}")
        if not force:
            refuse_deleting_a_base(self._backend, parsed.name, parsed.version)
        return model_version(self._backend.delete_version(parsed.name, parsed.version,
                                                          force=force))

    def _newest_first(self) -> Iterable[VersionRecord]:
        return newest_first(self._backend)

    # -- webhooks (registry/webhooks) ------------------------------------------------------

    def add_webhook(self, url: str, events: str | Iterable[str], *,
                    models: str | Iterable[str] | None = None,
                    secret: str | None = None) -> Webhook:
        """POST every event of ``events`` kinds (or ``"*"``) on models matching ``models``
        (fnmatch patterns; None: all) to ``url``, signed; ``secret`` is generated when absent
        and returned once, in the Webhook's ``secret``."""
        return self._backend.webhooks.add(url, events, models=models, secret=secret)

    def list_webhooks(self) -> list[Webhook]:
        """Every webhook, oldest first (secrets are never listed)."""
        return self._backend.webhooks.listed()

    def remove_webhook(self, id: str) -> None:  # noqa: A002 (the contract's name)
        """Remove webhook ``id`` and what it was owed."""
        self._backend.webhooks.remove(id)

    def test_webhook(self, id: str) -> int:  # noqa: A002
        """Send webhook ``id`` a ``ping`` event now; the receiver's HTTP status."""
        return self._backend.webhooks.test(id)

    def webhook_deliveries(self, id: str, *, limit: int = 100) -> list[Delivery]:  # noqa: A002
        """Webhook ``id``'s newest deliveries, newest first, each with its attempts."""
        return self._backend.webhooks.deliveries(id, limit=limit)

    def gc(self) -> GcReport:
        """Remove store and cache objects that no version references."""
        return self._backend.gc()

    # -- the local cache ------------------------------------------------------------------

    def prefetch(self, ref: str | Ref, *, files: bool = True,
                 jobs: int = DOWNLOAD_CONCURRENCY) -> PrefetchReport:
        """Every blob of ``ref`` (with ``files``, its attached files too) verified in the local
        cache without building the model (an init container's or a node cache's job); a
        second call fetches nothing (``report.already_cached``). ``jobs``: blobs fetched at
        once. One download per blob however many processes prefetch or pull it at once."""
        return prefetching.prefetch(self._backend, self.settings, ref, files=files, jobs=jobs)

    def cache_list(self) -> CacheListing:
        """The versions and bytes the local cache (REGISTRY_CACHE_DIR) holds."""
        return cachedir.listing(self.settings.cache_dir)

    def prune_cache(self, *, keep: Iterable[str | Ref] = (), max_size: int | str | None = None,
                    older_than: str | timedelta | None = None) -> PruneReport:
        """Remove cached blobs, the Hub door's derived revisions and signature memos: those
        unused for ``older_than``, then the least recently used until the cache holds at most
        ``max_size``; with neither, all. What ``keep`` (refs, resolved here) needs stays, and
        so does any blob a pull reads now and any revision being derived now."""
        kept: set[str] = set()
        versions: set[str] = set()
        for ref in keep:
            record = self._backend.resolve(parse(ref))
            kept.update(f.digest for f in prefetching.blobs_of(record, files=True))
            versions.add(f"{record.name}:v{record.version}")
        return cachedir.prune(
            self.settings.cache_dir, keep=kept, keep_versions=versions,
            max_size=None if max_size is None else parse_size(max_size, "max_size"),
            older_than=None if older_than is None else parse_duration(older_than,
                                                                      "older_than"))

    def close(self) -> None:
        self._backend.close()


def parse_since(since: datetime | str | None) -> datetime | None:
    """``since`` as an aware UTC datetime (ISO-8601 text without an offset is UTC)."""
    if since is None:
        return None
    if isinstance(since, str):
        try:
            since = datetime.fromisoformat(since.strip()) if len(since) <= 64 else None
        except ValueError:
            since = None
        if since is None:
            raise RefError("since must be an ISO-8601 time such as 2026-11-28 or "
                           "2026-11-28T09:30:00+00:00")
    if not isinstance(since, datetime):
        raise RefError(f"since must be a datetime or ISO-8601 text, not {type(since).__name__}")
    return (since if since.tzinfo else since.replace(tzinfo=timezone.utc)).astimezone(
        timezone.utc)


def _limit(limit: int | None) -> int | None:
    return None if limit is None else strict_int(limit, "limit", low=1, high=MAX_EVENT_ID)


def model_version(record: VersionRecord, *, push: dict[str, int] | None = None) -> ModelVersion:
    """The :class:`ModelVersion` a caller gets for a catalog record (``push``: the upload
    report of the push that made it)."""
    metadata = {**record.manifest, "tags": dict(record.tags)}
    if push is not None:
        metadata["push"] = push
    return ModelVersion(record.name, record.version, record.digest, dict(record.tags),
                        list(record.aliases), metadata)


def with_signatures(backend: Backend, mv: ModelVersion,
                    listed: list[dict[str, Any]] | None = None) -> ModelVersion:
    """``mv`` with ``metadata["signatures"]``: its signatures, as listed (not verified;
    ``listed``: the records an OCI artifact carries); absent for an unsigned version, whose
    metadata stays its manifest and tags."""
    if listed is None:
        listed = backend.signatures.listed(mv.name, mv.version)
    shown = [Signature.from_record(r).to_dict() for r in listed]
    source = mv.metadata.get("source")
    signed = source.get("signed_files") if isinstance(source, dict) else None
    if isinstance(signed, dict):  # the pushed directory's model.sig, with its status
        shown.append({"method": signed.get("method"), "signer": signed.get("signer"),
                      "file": signed.get("file"), "of": "the pushed files",
                      "verified": bool(signed.get("verified")),
                      "status": signed.get("status") or (
                          "verified" if signed.get("verified") else "unverified")})
    if shown:
        mv.metadata["signatures"] = shown
    return mv


def adapters_over(bases: Iterable[VersionRecord],
                  versions: Iterable[VersionRecord]) -> list[VersionRecord]:
    """The adapter versions among ``versions`` over one of ``bases`` (by name and digest: an
    adapter pulls the newest version of its base's name holding its base's weights)."""
    wanted = {(b.name, b.digest) for b in bases}
    return [r for r in versions
            if isinstance(a := r.manifest.get("adapter"), dict)
            and isinstance(b := a.get("base"), dict)
            and (b.get("name"), b.get("digest")) in wanted]


def refuse_deleting_a_base(backend: Backend, name: str, version: int, *,
                           shown: Callable[[str], bool] | None = None) -> None:
    """ReferencedVersionError when adapter versions name ``name:v<version>`` as their base and
    no other version of its name holds the same weights: the guard of every delete without
    ``force``, the facade's and the server's DELETE route alike. ``shown`` picks the model
    names the message may name (a server's caller limited to some models); the others are
    counted, not named."""
    _refuse_deleting_a_base(backend.resolve(Ref(name, version)), newest_first(backend),
                            shown)


def newest_first(backend: Backend) -> Iterable[VersionRecord]:
    """Every live version of every model, each model's newest first (read lazily)."""
    return (r for name in backend.list_models() for r in reversed(backend.list_versions(name)))


def _refuse_deleting_a_base(base: VersionRecord, versions: Iterable[VersionRecord],
                            shown: Callable[[str], bool] | None = None) -> None:
    """Refuse deleting ``base`` while adapter versions name it and no other version of its
    name holds the same weights."""
    every = list(versions)
    if any(r.name == base.name and r.digest == base.digest and r.version != base.version
           for r in every):
        return
    over = adapters_over([base], every)
    users = [f"{r.name}:v{r.version}" for r in over if shown is None or shown(r.name)]
    if over:
        more = len(over) - min(len(users), 5)
        listed = ", ".join(users[:5]) or "not shown"
        shown_text = listed + (f" and {more} more" if more and users else "")
        raise ReferencedVersionError(
            f"{base.name}:v{base.version} is the base of {len(over)} adapter version(s) "
            f"({shown_text}); delete those first, or pass force=True (`registry rm --force`) to "
            "leave them without their base")
