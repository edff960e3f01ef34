"""HTTP to one registry server: JSON calls under its API, blob uploads and downloads (straight
to object storage by presigned URL, or through the server), each answer checked before use.

:class:`Transport` is built by :class:`~registry.http.remote.RemoteBackend` and shared with the
components it owns (its exports, its signatures), so every request to the server goes one way.
httpx is imported on first use.

Error bodies are ``{"error": {"code": ..., "message": ...}}``; the code selects the same
RegistryError subclass the server raised, with the same message.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import quote, urlsplit

from .._progress import transfer
from ..caching.cache import BlobCache
from ..errors import (
    DigestMismatchError,
    RefError,
    RegistryError,
    ServerUnavailableError,
    SettingsError,
    StoreUnavailableError,
    quoted,
)
from ..io.digests import HashingWriter, check_digest
from ..io.safewrite import open_emptied
from ..trust import boundedjson
from .headers import why_not_header_value
from .wire import API, error_class

if TYPE_CHECKING:
    import ssl

    import httpx

CHUNK = 1024 * 1024
DOWNLOAD_ATTEMPTS = 3
MAX_MESSAGE = 2000
# The largest JSON answer read from a server (a listing of many versions, a manifest with its
# signatures), and the largest error body: a hostile server cannot make the client hold more.
MAX_ANSWER = 64 * 2**20
MAX_ERROR_ANSWER = 16 * 2**20


class Transport:
    """Requests to the registry server at ``url`` (with ``token`` as a bearer token, never
    sent to a presigned URL), and the verified blob ``cache`` that pushed bytes are kept in.
    ``httpx_transport`` replaces httpx's network transport (tests put an app behind it)."""

    def __init__(self, url: str, *, token: str | None, timeout: float, cache: BlobCache,
                 httpx_transport: Any = None) -> None:
        self.url = url
        self.cache = cache
        self.timeout = timeout
        self.httpx_transport = httpx_transport
        self._token = token
        self._http: httpx.Client | None = None
        self._plain: httpx.Client | None = None
        self._lock = threading.RLock()  # the plain client and the TLS context, made once
        self._tls_context: ssl.SSLContext | None = None

    def __repr__(self) -> str:  # never show the token
        return f"Transport({self.url!r})"

    def client(self) -> httpx.Client:
        """The client for the server's own URLs, which carries the token (made on first use)."""
        if self._http is None:
            import httpx

            headers = {"User-Agent": "registry-client"}
            why = None if not self._token else why_not_header_value(self._token)
            if why is not None:  # Settings checks REGISTRY_TOKEN; a token passed in code too
                raise SettingsError(f"the token for {self.url} cannot be sent as a bearer "
                                    f"token: {why}")
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            self._http = httpx.Client(base_url=self.url, headers=headers,
                                      timeout=httpx.Timeout(self.timeout, connect=10.0),
                                      transport=self.httpx_transport, follow_redirects=False,
                                      verify=self._tls())
        return self._http

    def _tls(self) -> ssl.SSLContext:
        """The TLS context both clients use (httpx's default one: the same trust store),
        built once: loading the trust store costs 50-60 ms of CPU here."""
        with self._lock:
            if self._tls_context is None:
                import httpx

                self._tls_context = httpx.create_ssl_context()
            return self._tls_context

    def plain(self) -> httpx.Client:
        """The client without the token, for presigned URLs (they carry their own
        authorization); made once and shared by every transfer, so its connections are kept
        (a client per blob cost a TLS context each, a third of the CPU of a 25 MB pull). It
        keeps no cookies: nothing an object store answers goes to another request."""
        if self._plain is None:
            with self._lock:
                if self._plain is None:
                    from http.cookiejar import DefaultCookiePolicy

                    import httpx

                    plain = httpx.Client(timeout=self.timeout, transport=self.httpx_transport,
                                         verify=self._tls())
                    plain.cookies.jar.set_policy(DefaultCookiePolicy(allowed_domains=[]))
                    self._plain = plain
        return self._plain

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._plain is not None:
            self._plain.close()
            self._plain = None

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """``method`` on ``path`` under the API; the parsed JSON answer (None when empty), or
        the RegistryError the server's error body names."""
        import httpx

        try:  # the body read with its cap applied while reading, never whole first
            with self.client().stream(method, API + path, **kwargs) as streamed:
                limit = MAX_ANSWER if streamed.status_code < 400 else MAX_ERROR_ANSWER
                body = boundedjson.read_capped(streamed.iter_bytes(CHUNK), limit)
                if body is None:
                    raise RegistryError(
                        f"registry server {self.url} answered {method} {path} with more "
                        f"than {limit} bytes (HTTP {streamed.status_code}); it was not read;"
                        " is REGISTRY_URI a registry server?")
            response = httpx.Response(streamed.status_code, content=body)
        except httpx.TransportError as exc:
            raise ServerUnavailableError(
                f"registry server {self.url} is unreachable ({type(exc).__name__}: {exc}); "
                "check that `registry serve` runs there and REGISTRY_URI is right"
            ) from None
        raise_for_error(response, self.url)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return boundedjson.loads(response.content, max_bytes=MAX_ANSWER)
        except ValueError:
            raise RegistryError(f"registry server {self.url} answered {method} {path} with "
                                f"something that is not JSON (HTTP {response.status_code}); is "
                                "REGISTRY_URI a registry server?") from None

    def upload(self, target: dict[str, Any], blob: Path, size: int, digest: str) -> None:
        """Send ``blob`` to an upload ``target`` the server handed out (see
        :func:`upload_targets`), streamed with progress."""
        import httpx

        url, direct = target_url(self.url, target)
        headers = upload_headers(target.get("headers"), self.url)
        headers["Content-Length"] = str(size)
        with transfer(size, f"push {digest[7:19]}") as progress, open(blob, "rb") as fh:

            def chunks() -> Iterator[bytes]:
                while chunk := fh.read(CHUNK):
                    progress(len(chunk))
                    yield chunk

            try:
                if direct:
                    # A presigned URL carries its own authorization: never send our token there.
                    response = self.plain().request(target.get("method", "PUT"), url,
                                                    content=chunks(), headers=headers)
                else:
                    response = self.client().request(target.get("method", "PUT"), url,
                                                     content=chunks(), headers=headers)
            except httpx.TransportError as exc:
                raise StoreUnavailableError(f"upload of {digest} to {host(url)} failed "
                                            f"({type(exc).__name__}); retry the push") from None
        if direct and response.status_code >= 300:
            raise StoreUnavailableError(f"object store refused the upload of {digest} "
                                        f"(HTTP {response.status_code}); retry the push")
        raise_for_error(response, self.url)

    def keep_in_cache(self, blob: Path, digest: str) -> None:
        """The pushed bytes are verified already: keep them so a pull needs no download."""
        target = self.cache.path(digest)
        if target.exists() or not blob.exists():
            return
        with contextlib.suppress(OSError):
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(blob, 0o444)
            os.replace(blob, target)
            self.cache.verified.remember(target, digest)

    def blob_path(self, digest: str, size: int) -> Path:
        """A path holding verified bytes of blob ``digest``: the cache's, downloaded first when
        it is not there."""
        return self.cache.get(digest, lambda tmp: self.download(digest, size, tmp), size)

    def open_blob(self, digest: str, size: int) -> BinaryIO:
        """:meth:`blob_path`'s file, open."""
        return self.cache.open(digest, lambda tmp: self.download(digest, size, tmp), size)

    def download(self, digest: str, size: int, tmp: Path) -> str:
        """Stream blob ``digest`` into ``tmp``, resuming with a Range request if the stream
        breaks; returns the sha256 of what was written, hashed as it arrived."""
        import httpx

        link = self.call("GET", f"/blobs/{digest}/link")
        url, direct = target_url(self.url, link)
        with transfer(size, f"pull {digest[7:19]}") as progress, \
                open_emptied(tmp) as fh:
            out = HashingWriter(fh, gather=size)
            for attempt in range(DOWNLOAD_ATTEMPTS):
                headers = {"Range": f"bytes={out.written}-"} if out.written else {}
                try:
                    http = self.plain() if direct else self.client()
                    with http.stream("GET", url, headers=headers) as response:
                        if response.status_code >= 400:
                            response.read()
                            if direct:
                                raise StoreUnavailableError(
                                    f"object store refused the download of {digest} "
                                    f"(HTTP {response.status_code})")
                            raise_for_error(response, self.url)
                        if out.written and response.status_code != 206:
                            # The range was ignored: the whole blob comes again.
                            fh.seek(0)
                            fh.truncate()
                            out = HashingWriter(fh, gather=size)
                        for chunk in response.iter_bytes():  # as received: no re-chunking copies
                            if out.written + len(chunk) > size:  # the manifest's size ends it
                                raise DigestMismatchError(
                                    f"download of {digest} from {host(url)} sent more than "
                                    f"the {size} bytes its manifest lists; it was discarded")
                            out.write(chunk)
                            progress(len(chunk))
                    out.close()
                    return out.digest()
                except httpx.TransportError as exc:
                    if attempt == DOWNLOAD_ATTEMPTS - 1:
                        raise StoreUnavailableError(
                            f"download of {digest} from {host(url)} failed after "
                            f"{DOWNLOAD_ATTEMPTS} attempts ({type(exc).__name__}); retry"
                        ) from None
        raise AssertionError("unreachable: the last attempt returns or raises")


def raise_for_error(response: Any, base: str) -> None:
    """The RegistryError an error answer of server ``base`` names; nothing below HTTP 400."""
    if response.status_code < 400:
        return
    try:
        error = boundedjson.loads(response.content, max_bytes=MAX_ERROR_ANSWER)["error"]
        code, message = str(error["code"])[:64], str(error["message"])
    except (ValueError, KeyError, TypeError):
        if response.status_code >= 500:
            raise ServerUnavailableError(f"registry server {base} failed with HTTP "
                                         f"{response.status_code}; see the server log") from None
        raise RegistryError(f"registry server {base} answered HTTP {response.status_code} "
                            "without an error body; is REGISTRY_URI a registry server?") from None
    if len(message) > MAX_MESSAGE:  # a hostile server must not flood logs or terminals
        message = f"{message[:MAX_MESSAGE]}… (cut from {len(message)} characters)"
    raise error_class(code)(message)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")


def upload_headers(value: object, base: str) -> dict[str, str]:
    """The headers a server's upload target asks for (a presigned PUT's), each name a token and
    each value one a header can carry (no CR/LF): checked before httpx would raise on them."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > 32:
        raise RegistryError(f"registry server {base} answered upload headers that are not a "
                            "map of at most 32 headers; is REGISTRY_URI a registry server?")
    out: dict[str, str] = {}
    for name, text in value.items():
        why = why_not_header_value(text)
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name) or why is not None:
            raise RegistryError(f"registry server {base} answered an upload header "
                                f"{quoted(name, 80)} that cannot be sent ({why or 'bad name'}); "
                                "nothing was uploaded")
        out[name] = text
    return out


def upload_targets(value: object, ours: Mapping[str, object]) -> list[tuple[dict[str, Any], str]]:
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


def segment(value: str) -> str:
    """``value`` quoted as one path segment of a URL."""
    return quote(value, safe="")


def target_url(base: str, target: dict[str, Any]) -> tuple[str, bool]:
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


def host(url: str) -> str:
    """The scheme and host of ``url``, for messages (never its path or query: a presigned
    URL's query is a credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else "the registry server"
