"""RemoteBackend: the Backend protocol spoken over the registry server's REST API.

The Registry facade runs the same push and pull pipelines on it as on LocalBackend; only the
catalog and store calls travel over HTTP. Blobs go straight to and from object storage when the
server hands out presigned URLs (S3), or through the server (file store), and always land in the
same verified content-addressed cache as on the embedded path. httpx is imported on first use.

Error bodies are ``{"error": {"code": ..., "message": ...}}``; the code selects the same
RegistryError subclass the server raised, with the same message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import quote, urlsplit

from . import boundedjson
from ._progress import transfer
from .backends import PushResult
from .cache import BlobCache
from .catalog.records import VersionRecord
from .digests import HashingWriter, check_digest
from .errors import (
    DigestMismatchError,
    RefError,
    RegistryError,
    ServerUnavailableError,
    SettingsError,
    StoreUnavailableError,
    quoted,
)
from .files import StagedFile
from .gc import GcReport
from .parallel import UPLOAD_CONCURRENCY, concurrently
from .refs import Ref, validate_name
from .signing.remote import RemoteSignatures
from .unchanged import KnownShard, known_shards
from .validate import (
    MAX_PAGE,
    answer_field,
    answer_object,
    answer_page,
    strict_int,
    version_number,
)
from .wire import API, error_class, record_from_wire

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
# Pauses between tries of a commit whose server did not answer: a restart of a replica behind
# a load balancer or a blip of a few seconds is ridden out.
_COMMIT_RETRY_PAUSES = (0.5, 1.0, 2.0, 4.0)
_DOWNLOAD_ATTEMPTS = 3
_MAX_MESSAGE = 2000


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
        self._token = token
        self._timeout = timeout
        self._transport = transport
        self._http: httpx.Client | None = None
        self.signatures = RemoteSignatures(self._call, self.blob_path)

    def __repr__(self) -> str:  # never show the token
        return f"RemoteBackend({self.url!r})"

    # -- http -----------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None:
            import httpx

            headers = {"User-Agent": "registry-client"}
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            self._http = httpx.Client(base_url=self.url, headers=headers,
                                      timeout=httpx.Timeout(self._timeout, connect=10.0),
                                      transport=self._transport, follow_redirects=False)
        return self._http

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self._client().request(method, API + path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnavailableError(
                f"registry server {self.url} is unreachable ({type(exc).__name__}: {exc}); "
                "check that `registry serve` runs there and REGISTRY_URI is right"
            ) from None
        _raise_for_error(response, self.url)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return boundedjson.loads(response.content)
        except ValueError:
            raise RegistryError(f"registry server {self.url} answered {method} {path} with "
                                f"something that is not JSON (HTTP {response.status_code}); is "
                                "REGISTRY_URI a registry server?") from None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

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
             aliases: Iterable[str]) -> PushResult:
        """Begin (reserve a number, learn which files the server lacks), upload those side by
        side, then commit."""
        files = [s.file for s in staged]
        begun = self._call("POST", f"/models/{_seg(name)}/pushes",
                           json={"version": version, "files": [f.to_row() for f in files]})
        number = answer_field(begun, "push answer", "version", version_number)
        by_digest = {s.digest: s for s in staged}
        try:
            uploads = [(target, by_digest[digest]) for target, digest in
                       answer_field(begun, "push answer", "uploads",
                                    lambda v: _upload_targets(v, by_digest))]
            concurrently(lambda job: self._upload(job[0], job[1].ensure(), job[1].size,
                                                  job[1].digest),
                         uploads, workers=UPLOAD_CONCURRENCY)
            manifest = manifest_for(number)
            record = record_from_wire(self._commit(name, number, {
                "manifest": manifest, "tags": tags, "aliases": list(aliases),
                **self.signatures.commit_fields(manifest)}))
        except BaseException:
            with contextlib.suppress(Exception):
                self._call("DELETE", f"/models/{_seg(name)}/pushes/{number}")
            raise
        for s in staged:
            self._keep_in_cache(s.path, s.digest)
        return PushResult(record, files, [s.file for _, s in uploads])

    def _commit(self, name: str, number: int, body: dict[str, Any]) -> Any:
        """POST the commit, again with the same body while the server cannot be reached: a
        commit is idempotent (the server answers a repeat of one that went through with its
        version), so a lost answer never turns a committed push into a failure or a
        duplicate."""
        path = f"/models/{_seg(name)}/pushes/{number}/commit"
        for pause in (*_COMMIT_RETRY_PAUSES, None):
            try:
                return self._call("POST", path, json=body)
            except ServerUnavailableError as exc:
                if pause is None:
                    raise ServerUnavailableError(
                        f"{exc}; the commit of {name}:v{number} may have gone through: "
                        f"`registry show {name}:v{number}` says") from None
                log.warning("commit of %s:v%d: %s; trying again in %.1fs", name, number, exc,
                            pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _upload(self, target: dict[str, Any], blob: Path, size: int, digest: str) -> None:
        import httpx

        url, direct = _target_url(self.url, target)
        headers = dict(target.get("headers") or {})
        headers["Content-Length"] = str(size)
        with transfer(size, f"push {digest[7:19]}") as progress, open(blob, "rb") as fh:

            def chunks() -> Iterator[bytes]:
                while chunk := fh.read(_CHUNK):
                    progress(len(chunk))
                    yield chunk

            try:
                if direct:
                    # A presigned URL carries its own authorization: never send our token there.
                    with httpx.Client(timeout=self._timeout, transport=self._transport) as plain:
                        response = plain.request(target.get("method", "PUT"), url,
                                                 content=chunks(), headers=headers)
                else:
                    response = self._client().request(target.get("method", "PUT"), url,
                                                      content=chunks(), headers=headers)
            except httpx.TransportError as exc:
                raise StoreUnavailableError(f"upload of {digest} to {_host(url)} failed "
                                            f"({type(exc).__name__}); retry the push") from None
        if direct and response.status_code >= 300:
            raise StoreUnavailableError(f"object store refused the upload of {digest} "
                                        f"(HTTP {response.status_code}); retry the push")
        _raise_for_error(response, self.url)

    def _keep_in_cache(self, blob: Path, digest: str) -> None:
        """The pushed bytes are verified already: keep them so a pull needs no download."""
        target = self.cache.path(digest)
        if target.exists() or not blob.exists():
            return
        with contextlib.suppress(OSError):
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(blob, 0o444)
            os.replace(blob, target)
            self.cache.verified.remember(target, digest)

    # -- pull -----------------------------------------------------------------------------

    def resolve(self, ref: Ref) -> VersionRecord:
        return record_from_wire(self._call("GET", "/resolve", params={"ref": str(ref)}))

    def blob_path(self, digest: str, size: int) -> Path:
        return self.cache.get(digest, lambda tmp: self._download(digest, size, tmp), size)

    def open_blob(self, digest: str, size: int) -> BinaryIO:
        return self.cache.open(digest, lambda tmp: self._download(digest, size, tmp), size)

    def _download(self, digest: str, size: int, tmp: Path) -> str:
        """Stream the blob into ``tmp``, resuming with a Range request if the stream breaks;
        returns the sha256 of what was written, hashed as it arrived."""
        import httpx

        link = self._call("GET", f"/blobs/{digest}/link")
        url, direct = _target_url(self.url, link)
        with transfer(size, f"pull {digest[7:19]}") as progress, \
                open(tmp, "wb", buffering=0) as fh:
            out = HashingWriter(fh)
            for attempt in range(_DOWNLOAD_ATTEMPTS):
                headers = {"Range": f"bytes={out.written}-"} if out.written else {}
                try:
                    client = (httpx.Client(timeout=self._timeout, transport=self._transport)
                              if direct else contextlib.nullcontext(self._client()))
                    with client as http, http.stream("GET", url, headers=headers) as response:
                        if response.status_code >= 400:
                            response.read()
                            if direct:
                                raise StoreUnavailableError(
                                    f"object store refused the download of {digest} "
                                    f"(HTTP {response.status_code})")
                            _raise_for_error(response, self.url)
                        if out.written and response.status_code != 206:
                            # The range was ignored: the whole blob comes again.
                            fh.seek(0)
                            fh.truncate()
                            out = HashingWriter(fh)
                        for chunk in response.iter_bytes(_CHUNK):
                            if out.written + len(chunk) > size:  # the manifest's size ends it
                                raise DigestMismatchError(
                                    f"download of {digest} from {_host(url)} sent more than "
                                    f"the {size} bytes its manifest lists; it was discarded")
                            out.write(chunk)
                            progress(len(chunk))
                    out.close()
                    return out.digest()
                except httpx.TransportError as exc:
                    if attempt == _DOWNLOAD_ATTEMPTS - 1:
                        raise StoreUnavailableError(
                            f"download of {digest} from {_host(url)} failed after "
                            f"{_DOWNLOAD_ATTEMPTS} attempts ({type(exc).__name__}); retry"
                        ) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- reads and changes ----------------------------------------------------------------

    def list_models(self) -> list[str]:
        return self._all_pages("/models", "models", validate_name,
                               lambda c: validate_name(c))

    def list_versions(self, name: str) -> list[VersionRecord]:
        return self._all_pages(f"/models/{_seg(name)}/versions", "versions", record_from_wire,
                               lambda c: version_number(c, "cursor"))

    def _all_pages(self, path: str, key: str, item: Callable[[Any], Any],
                   cursor: Callable[[Any], Any]) -> list[Any]:
        """Every item of a paginated list, following ``next`` cursors until there is none."""
        items: list[Any] = []
        after: Any = None
        while True:
            params = {"limit": MAX_PAGE, **({"after": after} if after is not None else {})}
            page, following = answer_page(self._call("GET", path, params=params), key, item,
                                          cursor)
            items.extend(page)
            if following is None:
                return items
            if not page or following == after:
                # A cursor that does not move would make this loop forever.
                raise RegistryError(f"registry server {self.url} sent a list cursor that does "
                                    f"not advance ({quoted(following)}); is REGISTRY_URI a "
                                    "registry server of this version?")
            after = following

    def set_alias(self, name: str, alias: str, version: int) -> VersionRecord:
        return record_from_wire(self._call("PUT", f"/models/{_seg(name)}/aliases/{_seg(alias)}",
                                           json={"version": version}))

    def delete_alias(self, name: str, alias: str) -> None:
        self._call("DELETE", f"/models/{_seg(name)}/aliases/{_seg(alias)}")

    def set_tags(self, name: str, version: int, tags: dict[str, str | None]) -> VersionRecord:
        path = f"/models/{_seg(name)}/versions/{version}/tags"
        return record_from_wire(self._call("PATCH", path, json={"tags": tags}))

    def delete_version(self, name: str, version: int, *,
                       force: bool = False) -> VersionRecord:
        params = {"force": "true"} if force else {}
        return record_from_wire(self._call("DELETE", f"/models/{_seg(name)}/versions/{version}",
                                           params=params))

    def gc(self) -> GcReport:
        data = self._call("POST", "/gc")
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
                            strict_int(answer.get("unknown", 0), "unknown", low=0, high=2**63))
        except (KeyError, TypeError, RegistryError) as exc:
            raise RegistryError(f"registry server {self.url} sent a malformed gc report "
                                f"({quoted(str(exc))})") from None

    def list_exports(self, name: str, version: int) -> list[dict[str, Any]]:
        """Export records of ``name:vN``, each checked (registry/exports/remote.py)."""
        from .exports import remote as exports

        return exports.list_exports(self, name, version)

    def register_export(self, name: str, version: int, record: dict[str, Any],
                        path: Path) -> dict[str, Any]:
        from .exports import remote as exports

        return exports.register(self, name, version, record, path)

    def rebuild(self) -> int:
        raise SettingsError(f"`registry db rebuild` works on the catalog directly; run it on "
                            f"the server host of {self.url}, not through REGISTRY_URI")

    def mlflow_sync(self, *, full: bool = False) -> dict[str, Any]:
        """Ask the server to bring its MLflow mirror up to date (admin scope)."""
        return answer_object(self._call("POST", "/mlflow/sync",
                                        params={"full": str(full).lower()}), "sync report")


def _raise_for_error(response: Any, base: str) -> None:
    if response.status_code < 400:
        return
    try:
        error = boundedjson.loads(response.content)["error"]
        code, message = str(error["code"])[:64], str(error["message"])
    except (ValueError, KeyError, TypeError):
        if response.status_code >= 500:
            raise ServerUnavailableError(f"registry server {base} failed with HTTP "
                                         f"{response.status_code}; see the server log") from None
        raise RegistryError(f"registry server {base} answered HTTP {response.status_code} "
                            "without an error body; is REGISTRY_URI a registry server?") from None
    if len(message) > _MAX_MESSAGE:  # a hostile server must not flood logs or terminals
        message = f"{message[:_MAX_MESSAGE]}… (cut from {len(message)} characters)"
    raise error_class(code)(message)


def _upload_targets(value: object, ours: Mapping[str, object]) -> list[tuple[dict[str, Any], str]]:
    """The upload targets of a push answer, each naming one of the files this push has."""
    if not isinstance(value, list) or len(value) > len(ours):
        raise RefError("expected a list of at most one upload per file")
    out = []
    for target in value:
        digest = check_digest(target.get("digest") if isinstance(target, dict) else None,
                              "upload digest")
        if digest not in ours:
            raise RefError(f"an upload of {digest}, which this push does not have")
        out.append((target, digest))
    return out


def _seg(value: str) -> str:
    return quote(value, safe="")


def _target_url(base: str, target: dict[str, Any]) -> tuple[str, bool]:
    """(url, direct): a presigned absolute URL is direct; a server path goes through ``base``."""
    url = target.get("url") if isinstance(target, dict) else None
    if not isinstance(url, str) or not url or len(url) > 8192:
        raise RegistryError(f"registry server {base} sent a transfer target without a usable "
                            f"url ({quoted(target)})")
    if target.get("direct") is True:
        if not url.startswith(("http://", "https://")):
            raise RegistryError(f"registry server {base} sent a direct transfer URL that is not "
                                f"http(s) ({quoted(url, 60)}); refusing it")
        return url, True
    # Anything but a path of this API (an absolute or protocol-relative URL, a climb out of
    # the API) could carry the token to another host.
    if not url.startswith(API + "/") or "/../" in url or "\\" in url:
        raise RegistryError(f"registry server {base} sent a transfer URL outside its API "
                            f"({quoted(url, 60)}); refusing to send the token there")
    return url, False


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else "the registry server"
