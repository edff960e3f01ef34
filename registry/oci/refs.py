"""OCI references, parsed and checked in one place, and the rule for which URLs may be spoken to.

    oci://HOST[:PORT]/REPO[/MORE]:TAG        a tag (push default: v<N>, pull default: latest)
    oci://HOST[:PORT]/REPO@sha256:<64 hex>   one manifest, by digest

Plain HTTP is spoken only to a loopback host, or to the ref's own host when the caller asked for
it (``plain_http=True``); every other URL, redirects and token realms included, must be HTTPS.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

from ..errors import InsecureTransportError, RefError, quoted
from ..io.digests import PATTERN as DIGEST_PATTERN

SCHEME = "oci://"
MAX_REF_CHARS = 512
# The distribution spec's grammar for repository names and tags.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HOST_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
                      r"|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?")
_DIGEST_RE = re.compile(DIGEST_PATTERN)
_FORM = "oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:<hex>"


@dataclass(frozen=True)
class OciRef:
    """A parsed ``oci://`` reference; at most one of ``tag`` and ``digest`` is set."""

    host: str  # HOST[:PORT], lowercased
    repository: str
    tag: str | None = None
    digest: str | None = None
    plain_http: bool = False  # the caller allowed plain HTTP to a host that is not loopback

    @property
    def scheme(self) -> str:
        return "http" if self.plain_http or is_loopback(self.hostname) else "https"

    @property
    def hostname(self) -> str:
        return urllib.parse.urlsplit(f"//{self.host}").hostname or self.host

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def reference(self) -> str | None:
        """What names the manifest in ``/v2/<repo>/manifests/<reference>``."""
        return self.digest or self.tag

    def with_tag(self, tag: str) -> OciRef:
        return OciRef(self.host, self.repository, _tag(tag, tag), None, self.plain_http)

    def __str__(self) -> str:
        tail = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"{SCHEME}{self.host}/{self.repository}{tail}"


def is_oci_ref(text: object) -> bool:
    """Whether ``text`` is meant as an OCI reference (it starts with ``oci://``)."""
    return isinstance(text, str) and text.startswith(SCHEME)


def parse_oci_ref(text: object, *, plain_http: bool = False) -> OciRef:
    """Parse ``oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]``; :class:`RefError` names the bad part."""
    if not isinstance(text, str) or not text.startswith(SCHEME):
        raise RefError(f"{quoted(text)} is not an OCI reference; use {_FORM}")
    if len(text) > MAX_REF_CHARS:
        raise RefError(f"OCI reference {quoted(text, 80)} is longer than {MAX_REF_CHARS} "
                       "characters")
    rest = text[len(SCHEME):]
    host, sep, path = rest.partition("/")
    match = _HOST_RE.fullmatch(host)
    if not sep or not match or (match.group(1) and not 0 < int(match.group(1)) < 65536):
        raise RefError(f"invalid registry host {host!r} in {text!r}: use {_FORM}")
    digest = tag = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST_RE.fullmatch(digest):
            raise RefError(f"invalid digest {digest!r} in {text!r}: expected 'sha256:' and 64 "
                           "lowercase hex digits")
    else:
        head, colon, maybe_tag = path.rpartition(":")
        if colon:
            path, tag = head, _tag(maybe_tag, text)
    if not _REPO_RE.fullmatch(path) or len(path) > 255:
        raise RefError(f"invalid repository {path!r} in {text!r}: use lowercase path components "
                       "of letters and digits joined by '.', '_' or '-' (e.g. 'team/resnet18')")
    return OciRef(host.lower(), path, tag, digest, plain_http)


def _tag(tag: str, text: str) -> str:
    if not _TAG_RE.fullmatch(tag):
        raise RefError(f"invalid tag {tag!r} in {text!r}: use up to 128 letters, digits, '_', "
                       "'.' or '-', not starting with '.' or '-'")
    return tag


def is_loopback(hostname: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``: the only hosts plain HTTP goes to unasked."""
    name = hostname.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_url(url: str, ref: OciRef, *, what: str) -> str:
    """``url`` if the transport rule allows speaking to it, else :class:`InsecureTransportError`:
    HTTPS anywhere; plain HTTP to loopback, or to the ref's own host when plain_http was asked."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and host:
        if is_loopback(host):
            return url
        if ref.plain_http and parts.netloc.lower() == ref.host:
            return url
    raise InsecureTransportError(
        f"refused {what} {quoted(url, 120)} from {ref.host}: plain HTTP goes only to loopback "
        "hosts or to the registry named with plain_http=True (--plain-http); anything else must "
        "be https://")
