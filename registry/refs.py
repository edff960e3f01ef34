"""Refs: how a user names a model version.

    name                      the latest version
    name:latest               the same, spelled out
    name:v3  or  name:3       version 3
    name@production           the version the alias points at
    name@sha256:<64 hex>      the newest version whose weights have that digest
    name@sha256:<12+ hex>     the same for an unambiguous prefix (what ``registry ls`` prints)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import RefError, quoted
from .io.digests import PATTERN as DIGEST_PATTERN

NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,127}"
ALIAS_PATTERN = r"[a-z][a-z0-9_-]{0,62}"
MAX_VERSION = 2**31 - 1
# Longer than any valid ref (name 128 + "@" + a 71-character digest): refused before parsing.
MAX_REF_LENGTH = 256
# Python refuses int() of a string past 4300 digits with a bare ValueError; no version has more
# than these, so longer digit strings are refused before they are converted.
_MAX_VERSION_DIGITS = len(str(MAX_VERSION))

_NAME_RE = re.compile(NAME_PATTERN)
_ALIAS_RE = re.compile(ALIAS_PATTERN)
_RESERVED_ALIAS_RE = re.compile(r"latest|v\d+")
_VERSION_RE = re.compile(r"v?([1-9][0-9]*)")
_DIGEST_RE = re.compile(DIGEST_PATTERN)
# A digest prefix names a version once it is this long (48 bits: collisions within one model's
# versions are vanishingly rare, and an ambiguous one is refused with the candidates).
MIN_DIGEST_PREFIX = 12
_DIGEST_PREFIX_RE = re.compile(rf"sha256:[0-9a-f]{{{MIN_DIGEST_PREFIX},64}}")


@dataclass(frozen=True)
class Ref:
    """A parsed ref; at most one of ``version``, ``alias`` and ``digest`` is set."""

    name: str
    version: int | None = None
    alias: str | None = None
    digest: str | None = None

    @property
    def is_digest_prefix(self) -> bool:
        """Whether ``digest`` is a prefix (fewer than 64 hex digits) rather than a digest."""
        return self.digest is not None and not _DIGEST_RE.fullmatch(self.digest)

    @property
    def is_latest(self) -> bool:
        return self.version is None and self.alias is None and self.digest is None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}:v{self.version}"
        if self.alias is not None:
            return f"{self.name}@{self.alias}"
        if self.digest is not None:
            return f"{self.name}@{self.digest}"
        return self.name


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid model name, else raise :class:`RefError`."""
    if not isinstance(name, str):
        raise RefError(f"model name must be a string, got {type(name).__name__}")
    if not _NAME_RE.fullmatch(name):
        raise RefError(
            f"invalid model name {quoted(name)}: use 1-128 characters of lowercase letters, "
            "digits, '.', '_' or '-', starting with a letter or digit (e.g. 'resnet18')"
        )
    return name


def validate_alias(alias: object) -> str:
    """Return ``alias`` if it is a valid alias, else raise :class:`RefError`."""
    if not isinstance(alias, str):
        raise RefError(f"alias must be a string, got {type(alias).__name__}")
    if _RESERVED_ALIAS_RE.fullmatch(alias):
        raise RefError(
            f"alias {quoted(alias)} is reserved: 'latest' and 'v<digits>' already name versions; "
            "pick another alias such as 'production'"
        )
    if not _ALIAS_RE.fullmatch(alias):
        raise RefError(
            f"invalid alias {quoted(alias)}: use 1-63 characters of lowercase letters, digits, "
            "'_' or '-', starting with a letter (e.g. 'production')"
        )
    return alias


def validate_version(version: object) -> int:
    """Accept ``3``, ``"3"`` or ``"v3"``; return the version number."""
    if isinstance(version, bool):
        raise RefError(f"invalid version {version!r}: use a positive integer such as 3 or 'v3'")
    if isinstance(version, int):
        number = version
    elif isinstance(version, str) and (m := _VERSION_RE.fullmatch(version)):
        digits = m.group(1)
        number = int(digits) if len(digits) <= _MAX_VERSION_DIGITS else MAX_VERSION + 1
    else:
        raise RefError(
            f"invalid version {quoted(version)}: use a positive integer such as 3 or 'v3' "
            "(no leading zeros)"
        )
    if not 1 <= number <= MAX_VERSION:
        raise RefError(f"invalid version {quoted(version)}: versions run from 1 to "
                       f"{MAX_VERSION}")
    return number


MAX_TAG_KEY = 250
MAX_TAG_VALUE = 5000
MAX_TAGS = 1000
MAX_ALIASES = 100


def validate_aliases(aliases: Iterable[str] | str) -> list[str]:
    """A sorted, de-duplicated list of valid aliases (a single string is one alias)."""
    if not isinstance(aliases, (str, Iterable)) or isinstance(aliases, Mapping):
        raise RefError(f"aliases must be a list of strings, got {type(aliases).__name__}")
    items = [aliases] if isinstance(aliases, str) else list(aliases)
    if len(items) > MAX_ALIASES:
        raise RefError(f"{len(items)} aliases given; at most {MAX_ALIASES} can be set at once")
    return sorted({validate_alias(a) for a in items})


def validate_tags(tags: Mapping[str, str | None] | None, *,
                  removals: bool = False) -> dict[str, str | None]:
    """Tags as a sorted dict of str -> str; with ``removals``, a None value marks a deletion."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise RefError(f"tags must be a dict of str -> str, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise RefError(f"{len(tags)} tags given; a version holds at most {MAX_TAGS} tags")
    out: dict[str, str | None] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not key or len(key) > MAX_TAG_KEY or key != key.strip() \
                or not _plain_text(key):
            raise RefError(f"invalid tag key {quoted(key)}: use a non-empty string of at most "
                           f"{MAX_TAG_KEY} characters without surrounding spaces")
        if value is None and removals:
            out[key] = None
            continue
        if not isinstance(value, str) or len(value) > MAX_TAG_VALUE or not _plain_text(value):
            raise RefError(f"invalid value for tag {key!r}: {quoted(value)}; tag values are "
                           f"strings of at most {MAX_TAG_VALUE} characters (use str(...))")
        out[key] = value
    return dict(sorted(out.items()))


def _plain_text(text: str) -> bool:
    # NUL and lone surrogates survive JSON but not UTF-8 encoding, PostgreSQL text or MLflow:
    # a tag holding one would make every later read of its version fail.
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse(text: object) -> Ref:
    """Parse a ref string; raise :class:`RefError` naming the part that is wrong."""
    if isinstance(text, Ref):
        return text
    if not isinstance(text, str):
        raise RefError(f"ref must be a string such as 'resnet18:v3', got {type(text).__name__}")
    if not text:
        raise RefError("empty ref: use 'name', 'name:v3', 'name@alias' or 'name@sha256:<hex>'")
    if len(text) > MAX_REF_LENGTH:
        raise RefError(f"ref {quoted(text)} is too long to be valid: names have at most 128 "
                       "characters; use 'name', 'name:v3', 'name@alias' or 'name@sha256:<hex>'")
    if "@" in text:
        name, _, selector = text.partition("@")
        validate_name(name)
        if selector.startswith("sha256:"):
            if not _DIGEST_PREFIX_RE.fullmatch(selector):
                hexpart = selector[7:]
                short = len(hexpart) < MIN_DIGEST_PREFIX and re.fullmatch("[0-9a-f]+", hexpart)
                raise RefError(
                    f"invalid digest {selector!r} in ref {text!r}: expected 'sha256:' followed by "
                    f"{MIN_DIGEST_PREFIX} to 64 lowercase hex digits"
                    + (f" (a prefix needs at least {MIN_DIGEST_PREFIX}; this one has "
                       f"{len(hexpart)})" if short else "")
                )
            return Ref(name, digest=selector)
        if not selector:
            raise RefError(f"ref {text!r} has an empty alias after '@'")
        try:
            return Ref(name, alias=validate_alias(selector))
        except RefError as exc:
            raise RefError(f"in ref {text!r}: {exc}") from None
    if ":" in text:
        name, _, selector = text.partition(":")
        validate_name(name)
        if selector == "latest":
            return Ref(name)
        if not selector:
            raise RefError(f"ref {text!r} has an empty version after ':'; use e.g. '{name}:v1'")
        try:
            return Ref(name, version=validate_version(selector))
        except RefError:
            in_range = "" if not _VERSION_RE.fullmatch(selector) else \
                f" (versions run from 1 to {MAX_VERSION})"
            raise RefError(
                f"invalid version {selector!r} in ref {text!r}: use 'v3', '3' or "
                f"'latest'{in_range}"
            ) from None
    return Ref(validate_name(text))


def push_name_and_tags(name: str | Mapping[str, str] | None, tags: Mapping[str, str] | None,
                       ) -> tuple[str | None, Mapping[str, str] | None]:
    """``push(model, {"k": "v"})``: a mapping in the name's place is the tags (the name is then
    derived); ``(name, tags)`` unchanged otherwise."""
    if not isinstance(name, Mapping):
        return name, tags
    if tags is not None:
        raise RefError("tags given twice: as the second argument and as tags=; pass "
                       "push(model, tags) or push(model, name, tags=tags)")
    return None, name


def parse_push_target(text: object) -> tuple[str, int | None]:
    """Parse the ``name`` argument of push: ``"resnet18"`` or ``"resnet18:v7"`` (a claim)."""
    ref = parse(text)
    if ref.alias is not None or ref.digest is not None:
        raise RefError(
            f"cannot push to {text!r}: push takes 'name' or 'name:vN'; "
            "set aliases with aliases=[...] instead"
        )
    if isinstance(text, str) and text.endswith(":latest"):
        raise RefError(f"cannot push to {text!r}: 'latest' is assigned, not claimed; push to "
                       f"{ref.name!r}")
    return ref.name, ref.version


_PUSH_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def validate_push_key(key: object) -> str:
    """``key`` if it is a usable idempotency key of a push (1 to 64 letters, digits and
    ``._:-``; the catalog's ``push_key`` column, catalog/pushes.py), else :class:`RefError`."""
    if not isinstance(key, str) or not _PUSH_KEY.fullmatch(key):
        raise RefError(f"invalid idempotency key {quoted(key)}: use 1 to 64 letters, digits and "
                       "'.', '_', ':', '-', starting with a letter or digit (a fresh one per "
                       "push, e.g. a UUID)")
    return key
