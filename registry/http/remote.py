"""RemoteBackend: the Backend protocol spoken over the registry server's REST API.

The Registry facade runs the same push and pull pipelines on it as on LocalBackend; only the
catalog and store calls travel over HTTP. Blobs go straight to and from object storage when the
server hands out presigned URLs (S3), or through the server (file store), and always land in the
same verified content-addressed cache as on the embedded path. The HTTP itself is
:class:`~registry.http.transport.Transport`, which this backend builds and shares with the
components
it owns: its exports (registry/exports/remote.py) and its signatures (registry/signing/remote.py).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from ..audit import ServerEvents
from ..backends import PushResult
from ..caching.cache import BlobCache
from ..caching.unchanged import KnownShard, known_shards
from ..catalog.records import VersionRecord
from ..errors import RegistryError, ServerUnavailableError, SettingsError, quoted
from ..exports.remote import RemoteExports
from ..files import StagedFile
from ..gc import GcReport
from ..governance.remote import ServerGovernance
from ..io.digests import check_digest
from ..io.parallel import UPLOAD_CONCURRENCY, concurrently
from ..refs import Ref, parse, validate_name
from ..signing.remote import RemoteSignatures
from ..trust.validate import (
    MAX_PAGE,
    answer_field,
    answer_object,
    answer_page,
    strict_int,
    version_number,
)
from ..webhooks.remote import RemoteWebhooks
from .transport import Transport, segment, upload_targets
from .wire import IDEMPOTENCY_HEADER, record_from_wire

log = logging.getLogger(__name__)

# Pauses between tries of a commit whose server did not answer: a restart of a replica behind
# a load balancer or a blip of a few seconds is ridden out.
_COMMIT_RETRY_PAUSES = (0.5, 1.0, 2.0, 4.0)


class RemoteBackend:
    """A registry server reached over HTTP(S), with a local verified blob cache."""

    def __init__(self, url: str, *, token: str | None, cache_dir: Path,
                 timeout: float = 60.0, transport: Any = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"registry URI {url!r} is not an http(s) URL; use e.g. "
                                "'http://registry.example:8080'")
        if parts.username or parts.password:
            raise SettingsError("put credentials in token=... or REGISTRY_TOKEN, not in the "
                                "registry URI")
        self.url = url.rstrip("/")
        self.cache = BlobCache(cache_dir)
        # ``transport`` is httpx's (tests put an app behind it); ``self.transport`` is ours.
        self.transport = Transport(self.url, token=token, timeout=timeout, cache=self.cache,
                                   httpx_transport=transport)
        self.exports = RemoteExports(self.transport)
        self.signatures = RemoteSignatures(self.transport)
        self.audit = ServerEvents(self.transport)
        self.webhooks = RemoteWebhooks(self.transport)
        self.governance = ServerGovernance(self.transport, record_from_wire)

    def __repr__(self) -> str:  # never show the token
        return f"RemoteBackend({self.url!r})"

    def close(self) -> None:
        self.transport.close()

    # -- push -----------------------------------------------------------------------------

    def staging_dir(self) -> Path:
        return self.cache.tmp_dir()

    def known_shards(self, name: str) -> list[KnownShard]:
        """The latest version's shards in the verified cache (never downloaded for this); with
        nothing verified in the cache, not even the server is asked which they are."""
        if not self.cache.holds_verified():
            return []
        return known_shards(self.resolve, name, self.cache.verified, self.cache.path)

    def push(self, name: str, version: int | None, staged: Sequence[StagedFile],
             manifest_for: Callable[[int], dict[str, Any]], tags: dict[str, str],
             aliases: Iterable[str], *, idempotency_key: str | None = None) -> PushResult:
        """Begin (reserve a number, learn which files the server lacks), upload those side by
        side, then commit; every request carries the push's idempotency key, so a push begun
        again with it gets the version it made (catalog/pushes.py)."""
        files, key = [s.file for s in staged], idempotency_key or secrets.token_hex(16)
        begun = self.transport.call("POST", f"/models/{segment(name)}/pushes",
                                    headers={IDEMPOTENCY_HEADER: key},
                                    json={"version": version,
                                          "files": [f.to_row() for f in files]})
        number = answer_field(begun, "push answer", "version", version_number)
        if begun.get("committed") is not None:  # this push, committed already
            return PushResult(record_from_wire(begun["committed"]), files, [])
        by_digest = {s.digest: s for s in staged}
        try:
            uploads = [(target, by_digest[digest]) for target, digest in
                       answer_field(begun, "push answer", "uploads",
                                    lambda v: upload_targets(v, by_digest))]
            concurrently(lambda job: self.transport.upload(job[0], job[1].ensure(), job[1].size,
                                                           job[1].digest),
                         uploads, workers=UPLOAD_CONCURRENCY)
            manifest = manifest_for(number)
            record = record_from_wire(self._commit(name, number, {
                "manifest": manifest, "tags": tags, "aliases": list(aliases),
                **self.signatures.commit_fields(manifest)}, key))
        except BaseException:
            with contextlib.suppress(Exception):
                self.transport.call("DELETE", f"/models/{segment(name)}/pushes/{number}")
            raise
        for s in staged:
            self.transport.keep_in_cache(s.path, s.digest)
        return PushResult(record, files, [s.file for _, s in uploads])

    def _commit(self, name: str, number: int, body: dict[str, Any], key: str) -> Any:
        """POST the commit, again with the same body while the server cannot be reached: a
        commit is idempotent (the server answers a repeat of one that went through with its
        version), so a lost answer never turns a committed push into a failure or a
        duplicate; past the retries, the same push again with ``key`` is safe too."""
        path = f"/models/{segment(name)}/pushes/{number}/commit"
        for pause in (*_COMMIT_RETRY_PAUSES, None):
            try:
                return self.transport.call("POST", path, json=body,
                                           headers={IDEMPOTENCY_HEADER: key})
            except ServerUnavailableError as exc:
                if pause is None:
                    raise ServerUnavailableError(
                        f"{exc}; the commit of {name}:v{number} may have gone through: "
                        f"`registry show {name}:v{number}` says, and the same push again with "
                        f"idempotency_key={key!r} answers it without a duplicate") from None
                log.warning("commit of %s:v%d: %s; trying again in %.1fs", name, number, exc,
                            pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    # -- pull -----------------------------------------------------------------------------

    def resolve(self, ref: Ref) -> VersionRecord:
        return record_from_wire(self.transport.call("GET", "/resolve", params={"ref": str(ref)}))

    def blob_path(self, digest: str, size: int) -> Path:
        return self.transport.blob_path(digest, size)

    def open_blob(self, digest: str, size: int) -> BinaryIO:
        return self.transport.open_blob(digest, size)

    # -- reads and changes ----------------------------------------------------------------

    def list_models(self) -> list[str]:
        return self._all_pages("/models", "models", validate_name,
                               lambda c: validate_name(c))

    def list_versions(self, name: str) -> list[VersionRecord]:
        return self._all_pages(f"/models/{segment(name)}/versions", "versions", record_from_wire,
                               lambda c: version_number(c, "cursor"))

    def _all_pages(self, path: str, key: str, item: Callable[[Any], Any],
                   cursor: Callable[[Any], Any]) -> list[Any]:
        """Every item of a paginated list, following ``next`` cursors until there is none."""
        items: list[Any] = []
        after: Any = None
        while True:
            params = {"limit": MAX_PAGE, **({"after": after} if after is not None else {})}
            answer = self.transport.call("GET", path, params=params)
            page, following = answer_page(answer, key, item, cursor)
            items.extend(page)
            if following is None:
                return items
            if not page or following == after:
                # A cursor that does not move would make this loop forever.
                raise RegistryError(f"registry server {self.url} sent a list cursor that does "
                                    f"not advance ({quoted(following)}); is REGISTRY_URI a "
                                    "registry server of this version?")
            after = following

    def set_alias(self, name: str, alias: str, version: int, *,
                  force: bool = False) -> VersionRecord:
        """``force`` is the server's to grant: a protected alias moves for an admin token."""
        path = f"/models/{segment(name)}/aliases/{segment(alias)}"
        return record_from_wire(self.transport.call("PUT", path, json={"version": version}))

    def delete_alias(self, name: str, alias: str, *, force: bool = False) -> None:
        self.transport.call("DELETE", f"/models/{segment(name)}/aliases/{segment(alias)}")

    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord:
        path = f"/models/{segment(name)}/versions/{version}/tags"
        return record_from_wire(self.transport.call("PATCH", path, json={"tags": tags}))

    def delete_version(self, name: str, version: int, *,
                       force: bool = False) -> VersionRecord:
        params = {"force": "true"} if force else {}
        path = f"/models/{segment(name)}/versions/{version}"
        return record_from_wire(self.transport.call("DELETE", path, params=params))

    def gc(self) -> GcReport:
        data = self.transport.call("POST", "/gc")
        try:
            answer = answer_object(data, "gc report")
            return GcReport([check_digest(d) for d in answer["deleted"]],
                            strict_int(answer["freed_bytes"], "freed_bytes", low=0, high=2**63),
                            strict_int(answer["kept"], "kept", low=0, high=2**63),
                            strict_int(answer["stale_pushes"], "stale_pushes", low=0, high=2**63),
                            strict_int(answer.get("young", 0), "young", low=0, high=2**63),
                            strict_int(answer.get("temporary_files", 0), "temporary_files",
                                       low=0, high=2**63),
                            strict_int(answer.get("temporary_bytes", 0), "temporary_bytes",
                                       low=0, high=2**63),
                            strict_int(answer.get("unknown", 0), "unknown", low=0, high=2**63),
                            expired=[str(parse(r)) for r in answer.get("expired", [])[:10**6]],
                            purged=[str(parse(r)) for r in answer.get("purged", [])[:10**6]])
        except (KeyError, TypeError, RegistryError) as exc:
            raise RegistryError(f"registry server {self.url} sent a malformed gc report "
                                f"({quoted(str(exc))})") from None

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """Export records of ``name:vN``, each checked (registry/exports/remote.py)."""
        return self.exports.list_exports(name, version)

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]:
        return self.exports.register(name, version, record, path)

    def rebuild(self) -> int:
        raise SettingsError(f"`registry db rebuild` works on the catalog directly; run it on "
                            f"the server host of {self.url}, not through REGISTRY_URI")

    def mlflow_sync(self, *, full: bool = False) -> dict[str, Any]:
        """Ask the server to bring its MLflow mirror up to date (admin scope)."""
        answer = self.transport.call("POST", "/mlflow/sync", params={"full": str(full).lower()})
        return answer_object(answer, "sync report")
