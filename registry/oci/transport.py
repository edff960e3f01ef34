"""The HTTP half of the OCI door: one registry host spoken to through httpx, by the rules of the
distribution spec (HEAD, mount, chunked uploads, manifests, blob downloads).

Every URL (the registry's, each redirect's, each upload Location, each token realm) passes
``refs.check_url`` first; ``Authorization`` never follows a redirect to another host; a 5xx or
a broken connection becomes :class:`OciUnavailableError`, a 401/403 the typed auth errors.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ..errors import NotFoundError, OciUnavailableError, quoted
from ..settings import OciCredential
from ..trust.boundedjson import read_capped
from .auth import MAX_TOKEN_ANSWER, Authenticator
from .refs import OciRef, check_url

# One PATCH of a chunked upload, streamed from the file (never held in memory); a blob no larger
# goes in one monolithic PUT, as other clients send it.
CHUNK_BYTES = 256 * 2**20
READ_BYTES = 1 << 20
MAX_REDIRECTS = 5
CONNECT_TIMEOUT = 10.0
UPLOAD_ATTEMPTS = 3
MAX_MANIFEST_BYTES = 4 * 2**20  # what the distribution registry itself accepts
MAX_ERROR_BYTES = 64 * 2**10  # of a refusal's body, read for its message
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class OciClient:
    """One registry host and repository; thread-safe for parallel blob transfers."""

    def __init__(self, ref: OciRef, *, credential: OciCredential | None = None,
                 ca_bundle: Path | None = None, timeout: float = 60.0,
                 min_rate: int = 64 * 2**10, grace: float = 60.0) -> None:
        self.ref = ref
        # A blob download's deadline: grace + size / min_rate seconds (REGISTRY_OCI_MIN_RATE,
        # REGISTRY_OCI_BLOB_GRACE), over the per-read timeout a trickle stays under.
        self._min_rate, self._grace = min_rate, grace
        self._tls, self._timeout = _tls_context(ca_bundle), timeout
        self._http = httpx.Client(verify=self._tls, follow_redirects=False,
                                  trust_env=False,
                                  timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT),
                                  limits=httpx.Limits(max_connections=16))
        self.auth = Authenticator(ref.host, credential, self._token_request)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OciClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------

    def url(self, path: str, repository: str | None = None) -> str:
        return f"{self.ref.base_url}/v2/{repository or self.ref.repository}/{path}"

    def scope(self, action: str, repository: str | None = None) -> str:
        return f"repository:{repository or self.ref.repository}:{action}"

    def _token_request(self, realm: str, params: dict[str, str],
                       headers: dict[str, str]) -> httpx.Response:
        """The token service's answer, its body read with the cap applied while reading (a
        realm streaming 256 MiB is cut off after :data:`~.auth.MAX_TOKEN_ANSWER` bytes)."""
        check_url(realm, self.ref, what="token realm")
        try:
            # Raw bytes, asked for uncompressed: a compressed answer is not decoded (no bomb).
            with self._http.stream("GET", realm, params=params,
                                   headers={**headers, "Accept-Encoding": "identity"}) as answer:
                body = read_capped(answer.iter_raw(READ_BYTES), MAX_TOKEN_ANSWER)
                if body is None:
                    raise OciUnavailableError(
                        f"the token service {quoted(realm, 120)} of {self.ref.host} "
                        f"answered more than {MAX_TOKEN_ANSWER} bytes; it was not read")
                return httpx.Response(answer.status_code, content=body)
        except httpx.HTTPError as exc:
            raise OciUnavailableError(f"the token service {quoted(realm, 120)} of "
                                      f"{self.ref.host} cannot be reached: {exc}") from None

    @contextmanager
    def request(self, method: str, url: str, *, scope: str, headers: dict[str, str] | None = None,
                content: Body = None, ok: tuple[int, ...] = (200,),
                stream: bool = False) -> Iterator[httpx.Response]:
        """Send with auth (answering one 401), following GET/HEAD redirects by the transport
        rule; yields the response whose status is in ``ok`` (else a typed error)."""
        response = self._send(method, url, scope, headers or {}, content, stream)
        try:
            if response.status_code not in ok:
                if stream:
                    response.read()
                raise self._error(method, url, response)
            yield response
        finally:
            response.close()

    def _send(self, method: str, url: str, scope: str, headers: dict[str, str],
              content: Body, stream: bool) -> httpx.Response:
        answered = False
        for _ in range(MAX_REDIRECTS + 2):
            check_url(url, self.ref, what="URL")
            own = urllib.parse.urlsplit(url).netloc.lower() == self.ref.host
            sent = {**headers, **(self.auth.headers(scope) if own else {})}
            try:
                body = content() if callable(content) else content  # fresh for each attempt
                request = self._http.build_request(method, url, headers=sent, content=body)
                response = self._http.send(request, stream=stream)
            except httpx.HTTPError as exc:
                raise OciUnavailableError(f"OCI registry {self.ref.host} cannot be reached "
                                          f"({method} {quoted(url, 120)}): {exc}") from None
            if response.status_code == 401 and own and not answered:
                response.read()
                response.close()
                self.auth.answer(response.headers.get("www-authenticate"), scope, 401,
                                 sent.get("Authorization"))
                answered = True
                continue
            if response.status_code in (301, 302, 303, 307, 308) \
                    and method in ("GET", "HEAD") and "location" in response.headers:
                response.close()
                url = urllib.parse.urljoin(url, response.headers["location"])
                continue
            return response
        raise OciUnavailableError(f"OCI registry {self.ref.host} redirected {method} "
                                  f"{quoted(url, 120)} more than {MAX_REDIRECTS} times")

    def _error(self, method: str, url: str, response: httpx.Response) -> Exception:
        status = response.status_code
        detail = _registry_message(response)
        if status in (401, 403):
            return self.auth.refused(status, f"{method} answered {status}{detail}")
        if status == 404:
            return NotFoundError(f"{self.ref} not found on {self.ref.host} ({method} answered "
                                 f"404{detail}); check the repository, tag or digest")
        return OciUnavailableError(f"OCI registry {self.ref.host} answered {status} to {method} "
                                   f"{quoted(urllib.parse.urlsplit(url).path, 120)}{detail}; "
                                   "nothing was kept, try again")

    # -- blobs ------------------------------------------------------------------------------

    def blob_size(self, digest: str) -> int | None:
        """The size the registry holds ``digest`` at in this repository (HEAD), or None."""
        with self.request("HEAD", self.url(f"blobs/{digest}"), scope=self.scope("pull"),
                          ok=(200, 404)) as r:
            if r.status_code == 404:
                return None
            return int(r.headers.get("content-length", -1))

    def mount(self, digest: str, source: str) -> str | None:
        """Ask the registry to link ``digest`` from repository ``source``; None when it did
        (201), else the upload session it opened instead (202: mounting unsupported or the
        source lacks the blob)."""
        url = self.url("blobs/uploads/") + "?" + urllib.parse.urlencode(
            {"mount": digest, "from": source})
        scope = f"{self.scope('pull,push')} {self.scope('pull', source)}"
        with self.request("POST", url, scope=scope, ok=(201, 202)) as r:
            return None if r.status_code == 201 else self._location(r)

    def start_upload(self) -> str:
        with self.request("POST", self.url("blobs/uploads/"), scope=self.scope("pull,push"),
                          ok=(202,), headers={"content-length": "0"}) as r:
            return self._location(r)

    def _location(self, response: httpx.Response) -> str:
        location = response.headers.get("location")
        if not location:
            raise OciUnavailableError(f"OCI registry {self.ref.host} opened an upload without "
                                      "a Location")
        return check_url(urllib.parse.urljoin(str(response.request.url), location), self.ref,
                         what="upload location")

    def upload(self, digest: str, path: Path, size: int, *, session: str | None = None,
               progress: Callable[[int], None] = lambda _n: None,
               chunk: int | None = None) -> None:
        """Upload the file at ``path`` as blob ``digest``: in one streamed PUT when it fits one
        chunk, else in streamed PATCH chunks, a failed one resumed from the offset the
        registry reports (``GET`` on the session)."""
        location = session or self.start_upload()
        chunk = chunk or CHUNK_BYTES
        scope = self.scope("pull,push")
        headers = {"content-type": "application/octet-stream"}
        if size <= chunk:
            for attempt in range(UPLOAD_ATTEMPTS):
                try:
                    with self.request("PUT", _with_digest(location, digest), scope=scope,
                                      content=lambda: _pieces(path, 0, size), ok=(201,),
                                      headers={**headers, "content-length": str(size)}):
                        progress(size)
                        return
                except OciUnavailableError:
                    if attempt + 1 == UPLOAD_ATTEMPTS:
                        raise
                    location = self.start_upload()
        offset, attempts = 0, 0
        while offset < size:
            n = min(chunk, size - offset)
            start = offset
            try:
                with self.request("PATCH", location, scope=scope,
                                  content=functools.partial(_pieces, path, start, n), ok=(202,),
                                  headers={**headers, "content-length": str(n),
                                           "content-range": f"{start}-{start + n - 1}"}) as r:
                    location = self._location(r)
                offset += n
                progress(n)
            except OciUnavailableError:
                attempts += 1
                if attempts >= UPLOAD_ATTEMPTS:
                    raise
                offset = self._resume_offset(location, offset, progress)
        with self.request("PUT", _with_digest(location, digest), scope=scope, ok=(201,),
                          headers={"content-length": "0"}):
            pass

    def _resume_offset(self, location: str, offset: int,
                       progress: Callable[[int], None]) -> int:
        with self.request("GET", location, scope=self.scope("pull,push"), ok=(204,)) as r:
            _first, _, last = r.headers.get("range", "0--1").partition("-")
            done = int(last) + 1 if last.lstrip("-").isdigit() else 0
        progress(done - offset)
        return max(done, 0)

    def download(self, digest: str, size: int, dest: Path,
                 progress: Callable[[int], None] = lambda _n: None) -> str:
        """Write blob ``digest`` to ``dest``, hashing as it arrives; refuse a byte past
        ``size`` (the declared size, also checked against Content-Length before a byte is
        read) or a short body. Returns the sha256 of what was written.

        The body is read by ``http.client``'s ``readinto`` into one reused buffer, then hashed
        and written from it on this thread: httpx's bytes object per 64 KiB, h11's parsing and
        a queue to a hashing thread cost more CPU than the hash itself (an 806 MB layer on
        loopback: 1.7 s of client CPU through httpx, 0.8 s this way)."""
        sha = hashlib.sha256()
        view = memoryview(bytearray(READ_BYTES))
        written = 0
        allowed = self._grace + size / self._min_rate
        deadline = time.monotonic() + allowed
        with self._body("GET", self.url(f"blobs/{digest}"), self.scope("pull")) as response, \
                open(dest, "wb", buffering=0) as out:
            if response.length is not None and response.length > size:
                raise self._too_long(digest, size)
            while True:
                try:  # at most one byte past ``size`` is ever read, to notice it is there
                    n = response.readinto(view[:min(READ_BYTES, size + 1 - written)])
                except (OSError, http.client.HTTPException) as exc:
                    raise OciUnavailableError(
                        f"the download of layer {digest} from {self.ref.host} broke after "
                        f"{written} bytes: {exc}") from None
                if not n:
                    break
                if time.monotonic() > deadline:
                    raise OciUnavailableError(
                        f"the download of layer {digest} from {self.ref.host} took more than "
                        f"{allowed:.0f} s ({written + n} of {size} bytes): slower than "
                        "REGISTRY_OCI_MIN_RATE after REGISTRY_OCI_BLOB_GRACE; the download was "
                        "discarded, try again") from None
                written += n
                if written > size:
                    raise self._too_long(digest, size)
                piece = view[:n]
                sha.update(piece)  # hashlib drops the GIL: parallel layers hash side by side
                while piece:
                    piece = piece[out.write(piece) or 0:]
                progress(n)
        if written != size:
            raise OciUnavailableError(f"OCI registry {self.ref.host} sent {written} of the "
                                      f"{size} bytes of layer {digest}; the download was "
                                      "discarded")
        return f"sha256:{sha.hexdigest()}"

    def _too_long(self, digest: str, size: int) -> OciUnavailableError:
        return OciUnavailableError(f"OCI registry {self.ref.host} sent more than the {size} "
                                   f"bytes declared for layer {digest}; the download was "
                                   "discarded")

    @contextmanager
    def _body(self, method: str, url: str, scope: str) -> Iterator[http.client.HTTPResponse]:
        """:meth:`request` for a large body, through ``http.client`` on a connection of its
        own: the same auth headers (never sent to another host), the same single answer to
        a 401, the same redirect and transport rule, the same typed errors; the 200 response
        is yielded unread."""
        answered = False
        for _ in range(MAX_REDIRECTS + 2):
            check_url(url, self.ref, what="URL")
            parts = urllib.parse.urlsplit(url)
            own = parts.netloc.lower() == self.ref.host
            sent = self.auth.headers(scope) if own else {}
            conn = self._connection(parts)
            try:
                try:
                    conn.connect()
                    conn.sock.settimeout(self._timeout)  # connecting had CONNECT_TIMEOUT
                    conn.request(method, urllib.parse.urlunsplit(("", "", parts.path or "/",
                                                                  parts.query, "")),
                                 headers=sent)
                    response = conn.getresponse()
                    status = response.status
                    if status != 200:
                        body = response.read(MAX_ERROR_BYTES)
                except (OSError, http.client.HTTPException) as exc:
                    raise OciUnavailableError(f"OCI registry {self.ref.host} cannot be reached "
                                              f"({method} {quoted(url, 120)}): {exc}") from None
                if status == 200:
                    yield response
                    return
                location = response.getheader("location")
            finally:
                conn.close()
            if status == 401 and own and not answered:
                self.auth.answer(response.getheader("www-authenticate"), scope, 401,
                                 sent.get("Authorization"))
                answered = True
                continue
            if status in (301, 302, 303, 307, 308) and location:
                url = urllib.parse.urljoin(url, location)
                continue
            raise self._error(method, url, httpx.Response(
                status, headers=response.getheaders(), content=body,
                request=httpx.Request(method, url)))
        raise OciUnavailableError(f"OCI registry {self.ref.host} redirected {method} "
                                  f"{quoted(url, 120)} more than {MAX_REDIRECTS} times")

    def _connection(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        """A new connection to ``parts``' host: one per large body, so none is shared between
        threads or reused after a broken read."""
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT,
                                               context=self._tls)
        return http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)

    def put_blob(self, digest: str, data: bytes) -> None:
        """A small blob (a config, a manifest layer) in one PUT, unless the registry has it."""
        if self.blob_size(digest) == len(data):
            return
        location = self.start_upload()
        with self.request("PUT", _with_digest(location, digest), scope=self.scope("pull,push"),
                          content=data, ok=(201,),
                          headers={"content-type": "application/octet-stream"}):
            pass

    # -- manifests --------------------------------------------------------------------------

    def get_manifest(self, reference: str) -> tuple[bytes, str]:
        """The manifest bytes and their media type (at most 4 MiB)."""
        with self.request("GET", self.url(f"manifests/{reference}"), scope=self.scope("pull"),
                          headers={"accept": ", ".join(MANIFEST_TYPES)}, stream=True) as r:
            body = b""
            for piece in r.iter_bytes(READ_BYTES):
                body += piece
                if len(body) > MAX_MANIFEST_BYTES:
                    raise OciUnavailableError(f"the manifest {self.ref} is larger than "
                                              f"{MAX_MANIFEST_BYTES} bytes; it was not read")
            return body, r.headers.get("content-type", "").split(";")[0].strip()

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> None:
        with self.request("PUT", self.url(f"manifests/{reference}"),
                          scope=self.scope("pull,push"), content=body, ok=(201,),
                          headers={"content-type": media_type}):
            pass


Body = bytes | Callable[[], Iterator[bytes]] | None


def _with_digest(location: str, digest: str) -> str:
    sep = "&" if urllib.parse.urlsplit(location).query else "?"
    return f"{location}{sep}digest={digest}"


def _pieces(path: Path, offset: int, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``path`` from ``offset``, read a MiB at a time as they are sent."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        while length > 0:
            piece = fh.read(min(READ_BYTES, length))
            if not piece:
                raise OciUnavailableError(f"{path} ended {length} bytes early while uploading")
            length -= len(piece)
            yield piece


@functools.lru_cache(maxsize=8)
def _tls_context(ca_bundle: Path | None) -> ssl.SSLContext:
    """The system's CAs, or those of ``REGISTRY_OCI_CA_BUNDLE``; built once per process (loading
    a CA bundle costs tens of milliseconds, a pull of a small model less)."""
    if ca_bundle is None:
        return httpx.create_ssl_context()
    return ssl.create_default_context(cafile=str(ca_bundle))


def _registry_message(response: httpx.Response) -> str:
    """The first error the registry's JSON body names (`errors[0].message`), if any."""
    try:
        data: Any = response.json()
        first = data["errors"][0]
        return f": {quoted(first.get('code', ''), 40)} {quoted(first.get('message', ''), 160)}"
    except Exception:
        return ""
