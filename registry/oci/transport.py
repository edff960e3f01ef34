"""The HTTP half of the OCI door: one registry host spoken to through httpx, by the rules of the
distribution spec (HEAD, mount, chunked uploads, manifests, blob downloads).

Every URL (the registry's, each redirect's, each upload Location, each token realm) passes
``refs.check_url`` first; ``Authorization`` never follows a redirect to another host; a 5xx or
a broken connection becomes :class:`OciUnavailableError`, a 401/403 the typed auth errors.
"""

from __future__ import annotations

import functools
import hashlib
import queue
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ..errors import NotFoundError, OciUnavailableError, quoted
from ..settings import OciCredential
from .auth import Authenticator
from .refs import OciRef, check_url

# One PATCH of a chunked upload, streamed from the file (never held in memory); a blob no larger
# goes in one monolithic PUT, as other clients send it.
CHUNK_BYTES = 256 * 2**20
READ_BYTES = 1 << 20
MAX_REDIRECTS = 5
UPLOAD_ATTEMPTS = 3
MAX_MANIFEST_BYTES = 4 * 2**20  # what the distribution registry itself accepts
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class OciClient:
    """One registry host and repository; thread-safe for parallel blob transfers."""

    def __init__(self, ref: OciRef, *, credential: OciCredential | None = None,
                 ca_bundle: Path | None = None, timeout: float = 60.0) -> None:
        self.ref = ref
        self._http = httpx.Client(verify=_tls_context(ca_bundle), follow_redirects=False,
                                  trust_env=False,
                                  timeout=httpx.Timeout(timeout, connect=10.0),
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
        check_url(realm, self.ref, what="token realm")
        try:
            return self._http.get(realm, params=params, headers=headers)
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
        ``size`` (the declared size) or a short body. Returns the sha256 of what was written.

        The socket is read on this thread while another hashes and writes (hashlib and file
        writes release the GIL), so verifying costs little beyond the transfer itself."""
        sha = hashlib.sha256()
        pieces: queue.Queue[bytes | None] = queue.Queue(maxsize=256)
        failed: list[BaseException] = []

        def consume() -> None:
            with open(dest, "wb") as out:
                while (piece := pieces.get()) is not None:
                    if not failed:
                        try:
                            sha.update(piece)
                            out.write(piece)
                        except BaseException as exc:  # noqa: BLE001 - raised on the caller's
                            failed.append(exc)

        worker = threading.Thread(target=consume, name="registry-oci-hash")
        worker.start()
        written = 0
        try:
            with self.request("GET", self.url(f"blobs/{digest}"), scope=self.scope("pull"),
                              headers={"accept-encoding": "identity"}, stream=True) as r:
                for piece in r.iter_raw():
                    written += len(piece)
                    if written > size:
                        raise OciUnavailableError(
                            f"OCI registry {self.ref.host} sent more than the {size} bytes "
                            f"declared for layer {digest}; the download was discarded")
                    if failed:
                        break
                    pieces.put(piece)
                    progress(len(piece))
        except httpx.HTTPError as exc:
            raise OciUnavailableError(f"the download of layer {digest} from {self.ref.host} "
                                      f"broke after {written} bytes: {exc}") from None
        finally:
            pieces.put(None)
            worker.join()
        if failed:
            raise failed[0]
        if written != size:
            raise OciUnavailableError(f"OCI registry {self.ref.host} sent {written} of the "
                                      f"{size} bytes of layer {digest}; the download was "
                                      "discarded")
        return f"sha256:{sha.hexdigest()}"

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
