"""The manifest (what a version records, as JSON), its schema, and the ModelVersion.

A manifest holds everything needed to pull a version without the catalog: its weight shards
(digest, size, the tensor keys each holds), every tensor's dtype and shape, tied aliases,
extras, keep-in-fp32 prefixes, attached files, the architecture and where the weights came from.
It is written to the store at ``manifests/<name>/v<N>.json`` and kept in the catalog row.

Format 2 (written since sharding) lists shards in ``files``::

    {"digest": "sha256:…", "size": 123, "format": "safetensors", "tensors": ["a.weight", …]}

Format 1 had exactly one file and no ``tensors`` list in it; it keeps loading. A manifest's
``digest`` names its weights: the one shard's digest, or the sha256 of the canonical JSON list
of its shard digests (:func:`registry.io.digests.version_digest`).

Everything read back is untrusted: :func:`validate` checks a manifest's schema, bounds, that
every stored tensor is in exactly one shard, that tied aliases point at stored tensors, and that
its digest is the one its files give, before it is committed, rebuilt or used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, TypeGuard

from .errors import DigestMismatchError, ManifestError, RefError, quoted
from .files import VersionFile, check_file_name, weights_digest
from .io.digests import check_digest, sha256_bytes, version_digest
from .model import architectures, statedict
from .provenance import lineage
from .refs import MAX_VERSION, validate_name
from .store.layout import aliases_key, blob_key, manifest_key, tombstone_key  # noqa: F401
from .trust import boundedjson
from .trust.validate import MAX_BLOB_BYTES

FORMAT_VERSION = 2
# A quantized or adapter version's manifest: format 2 plus the keys below, which a format-2
# reader cannot use. Format 3 makes such a reader refuse it as newer ("upgrade the registry
# package") instead of misreading it as float weights; a float version stays format 2.
EXTENDED_FORMAT = 3
EXTENDED_KEYS = ("quantization", "adapter")
READABLE_FORMATS = (1, 2, 3)


@dataclass(frozen=True)
class ModelVersion:
    """One immutable version of a model, as the catalog knows it."""

    name: str
    version: int
    digest: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    # What the catalog and manifest say; not part of equality, so the version a push returns
    # (whose metadata["push"] says what was uploaded) equals the same version shown later.
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    ref: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", f"{self.name}:v{self.version}")

    def __str__(self) -> str:
        return self.ref

    def __repr__(self) -> str:
        short = self.digest[:19] + "…" if len(self.digest) > 19 else self.digest
        return (f"ModelVersion({self.ref!r}, digest={short!r}, aliases={self.aliases!r}, "
                f"tags={self.tags!r})")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``registry show --json`` prints."""
        return {
            "name": self.name,
            "version": self.version,
            "ref": self.ref,
            "digest": self.digest,
            "tags": dict(self.tags),
            "aliases": list(self.aliases),
            "metadata": self.metadata,
        }


# -- writing one ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Draft:
    """A pushed version's manifest before the catalog numbers it: :meth:`for_version` is the
    manifest the backend commits as version N (the reader is :func:`validate`, below)."""

    name: str
    created_at: str
    shards: Sequence[VersionFile]
    tensors: Mapping[str, dict[str, Any]]  # stored key -> {"dtype", "shape"}
    tied_aliases: int
    extras: dict[str, Any]
    architecture: dict[str, Any]
    source: dict[str, Any]
    module_metadata: dict[str, Any]
    key_order: list[str]
    tags: dict[str, str]
    attachments: list[dict[str, Any]] = field(default_factory=list)
    quantization: dict[str, Any] | None = None
    sections: dict[str, Any] = field(default_factory=dict)  # an adapter's "adapter" section

    def for_version(self, version: int) -> dict[str, Any]:
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "version": version,
            "created_at": self.created_at,
            "digest": weights_digest(self.shards),
            "files": [{"digest": f.digest, "size": f.size, "format": "safetensors",
                       "tensors": list(f.tensors)} for f in self.shards],
            "tensor_count": len(self.tensors) + self.tied_aliases,
            "tensors": dict(self.tensors),
            "extras": self.extras,
            "architecture": self.architecture,
            "source": self.source,
            "module_metadata": self.module_metadata,
            "key_order": self.key_order,
            "tags": self.tags,
            **({"attachments": self.attachments} if self.attachments else {}),
            **({"quantization": self.quantization} if self.quantization else {}),
            **self.sections,
        }
        return {**manifest, "format_version": format_for(manifest)}


# The store's copy of a manifest carries the sha256 of its own canonical JSON under this key, so
# a byte changed after it was written is caught even where the schema still holds (a class
# name, a size). Manifests written before it have none and are checked by their schema alone.
CHECKSUM_KEY = "manifest_sha256"


def _canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def dumps(manifest: dict[str, Any]) -> bytes:
    """The store's copy of ``manifest``: readable JSON with its checksum."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    checksum = sha256_bytes(_canonical(body))
    return json.dumps({**body, CHECKSUM_KEY: checksum}, indent=1, sort_keys=True).encode()


def loads(data: bytes | str, *, origin: str) -> dict[str, Any]:
    """Parse and :func:`validate` a manifest read from a store or sent by a client; a checksum
    it carries must match its content."""
    try:
        manifest = boundedjson.loads(data, parse_constant=_no_constant)
    except ValueError as exc:
        raise ManifestError(f"manifest {origin} is not valid JSON: {str(exc)[:120]}") from None
    if isinstance(manifest, dict) and CHECKSUM_KEY in manifest:
        recorded = manifest.pop(CHECKSUM_KEY)
        actual = sha256_bytes(_canonical(manifest))
        if recorded != actual:
            raise ManifestError(
                f"manifest {origin} does not match its checksum (recorded {quoted(recorded, 80)}, "
                f"content hashes to {actual}): it was changed after it was written. Restore it "
                "from a backup or remove it, then run `registry db rebuild` again")
    return validate(manifest, origin=origin)


# -- the schema -------------------------------------------------------------------------------

MAX_FILES = 100_000
MAX_TENSORS = 10_000_000
MAX_NDIM = 32
MAX_KEY_CHARS = 1024

# Every top-level key a manifest of a readable format may hold. A key outside it is refused, not
# ignored: a changed byte in a key's name (the checksum's own, say) must not turn a checked
# manifest into an unchecked one. A key added later comes with a new format_version.
TOP_LEVEL_KEYS = frozenset({
    "format_version", "name", "version", "created_at", "digest", "files", "tensor_count",
    "tensors", "extras", "architecture", "source", "module_metadata", "key_order", "tags",
    "attachments", "quantization", "adapter",
})


def format_for(manifest: Mapping[str, Any]) -> int:
    """The format_version a new manifest is written in: :data:`EXTENDED_FORMAT` when it holds
    a quantization or adapter record, else :data:`FORMAT_VERSION`."""
    return EXTENDED_FORMAT if any(k in manifest for k in EXTENDED_KEYS) else FORMAT_VERSION


def validate(manifest: object, *, origin: str) -> dict[str, Any]:
    """``manifest`` if it is a well-formed manifest whose digest matches its files.

    Raises :class:`ManifestError` naming the first fault (quoting at most ~200 characters of it)
    and :class:`DigestMismatchError` when the recorded digest is not the one its files give.
    """
    m = _obj(manifest, "manifest", origin)
    fmt = m.get("format_version")
    if not _is_int(fmt) or fmt not in READABLE_FORMATS:
        if _is_int(fmt) and fmt > EXTENDED_FORMAT:
            raise ManifestError(
                f"manifest {origin} has format_version {fmt}, newer than this registry "
                f"understands ({EXTENDED_FORMAT}); upgrade the registry package")
        raise ManifestError(f"{origin} is not a registry manifest (format_version "
                            f"{quoted(fmt)}; expected one of {READABLE_FORMATS})")
    if unknown := sorted(str(k) for k in m if k not in TOP_LEVEL_KEYS):
        _fail(origin, "a top-level key", unknown[0],
              f"one of {sorted(TOP_LEVEL_KEYS)} (format {fmt} holds no other)")
    try:
        validate_name(m.get("name"))
    except RefError as exc:
        raise ManifestError(f"manifest {origin}: {exc}") from None
    version = m.get("version")
    if not _is_int(version) or not 1 <= version <= MAX_VERSION:
        _fail(origin, "version", version, f"an integer from 1 to {MAX_VERSION}")
    created = m.get("created_at")
    if not isinstance(created, str) or not _is_timestamp(created):
        _fail(origin, "created_at", created, "an ISO 8601 timestamp")
    tensors = _obj(m.get("tensors"), "tensors", origin)
    if len(tensors) > MAX_TENSORS:
        _fail(origin, "tensors", f"{len(tensors)} entries", f"at most {MAX_TENSORS}")
    for key, spec in tensors.items():
        _tensor_spec(key, spec, origin)
    files = m.get("files")
    if not isinstance(files, list) or not 1 <= len(files) <= MAX_FILES \
            or (fmt == 1 and len(files) != 1):
        _fail(origin, "files", files, "a non-empty list of weight files"
              + (" (exactly one in format 1)" if fmt == 1 else ""))
    placed: set[str] = set()
    for i, entry in enumerate(files):
        where = f"files[{i}]"
        entry = _obj(entry, where, origin)
        _digest(entry.get("digest"), f"{where}.digest", origin)
        _size(entry.get("size"), f"{where}.size", origin)
        if entry.get("format") != "safetensors":
            _fail(origin, f"{where}.format", entry.get("format"), "'safetensors'")
        if fmt == 1:
            continue
        keys = entry.get("tensors")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            _fail(origin, f"{where}.tensors", keys, "a list of tensor keys")
        for key in keys:
            if key not in tensors:
                _fail(origin, f"{where}.tensors", key, "a key listed in 'tensors'")
            if key in placed:
                _fail(origin, f"{where}.tensors", key, "a key in exactly one shard")
            placed.add(key)
    if fmt != 1 and len(placed) != len(tensors):
        lost = next(k for k in tensors if k not in placed)
        _fail(origin, "tensors", lost, "a key that one of the files holds")
    _source(m.get("source"), tensors, origin)
    stored = len(tensors) + len(m["source"].get("tied", {}))
    count = m.get("tensor_count", stored)
    if not _is_int(count) or count != stored:
        _fail(origin, "tensor_count", count,
              "the number of stored tensors plus tied aliases")
    for part in ("extras", "architecture"):
        try:  # plain JSON: no NaN or infinity, which a reader's JSON may not take back
            json.dumps(_obj(m.get(part, {}), part, origin), allow_nan=False)
        except (TypeError, ValueError) as exc:
            _fail(origin, part, str(exc), "plain JSON (no NaN or infinity)")
    if problem := architectures.check(m.get("architecture", {})):
        raise ManifestError(f"manifest {origin} is invalid: architecture {problem}; it was not "
                            "used")
    tags = _obj(m.get("tags", {}), "tags", origin)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        _fail(origin, "tags", tags, "a dict of str -> str")
    _attachments(m.get("attachments", []), origin)
    for part in EXTENDED_KEYS:  # checked in full where used (registry/formats/)
        if part in m:
            if fmt != EXTENDED_FORMAT:
                _fail(origin, "format_version", fmt, f"{EXTENDED_FORMAT} in a manifest with "
                      f"{part!r}")
            _obj(m[part], part, origin)
    _module_metadata(m.get("module_metadata", {}), origin)
    _key_order(m.get("key_order"), [tensors, m["source"].get("tied", {}), m.get("extras", {})],
               origin)
    digest = _digest(m.get("digest"), "digest", origin)
    actual = version_digest([f["digest"] for f in files])
    if actual != digest:
        raise DigestMismatchError(
            f"manifest {origin} records digest {digest} but its files give {actual}: the "
            "manifest was tampered with; it was not used. Restore it or push the model again")
    return m


def _source(value: object, tensors: Mapping[str, Any], origin: str) -> None:
    source = _obj(value, "source", origin)
    size = source.get("size_bytes")
    if not _is_int(size) or not 0 <= size <= MAX_BLOB_BYTES * 16:
        _fail(origin, "source.size_bytes", size, "a byte count")
    tied = _obj(source.get("tied", {}), "source.tied", origin)
    for alias, kept in tied.items():
        if not isinstance(kept, str) or kept not in tensors or alias in tensors:
            _fail(origin, "source.tied", f"{alias} -> {kept}",
                  "an alias that is not stored, pointing at a stored tensor")
    keep = source.get("keep_in_fp32", [])
    if not isinstance(keep, list) or not all(isinstance(p, str) for p in keep):
        _fail(origin, "source.keep_in_fp32", keep, "a list of module prefixes")
    # Where the version came from (provenance/lineage.py): optional, so a manifest written
    # before lineage existed reads as before, and in ``source`` so an older reader takes it.
    if "lineage" in source and (problem := lineage.problem(source["lineage"])):
        raise ManifestError(f"manifest {origin} is invalid: source.lineage {problem}; it was "
                            "not used")


# The dtypes a stored tensor may have: those safetensors stores and torch (>= 2.4) names, the
# keys of devices.DTYPE_CODES, kept with the dtype policy (a unit test keeps the two equal).
# Spelled out so that validating a manifest (`registry db rebuild`, a remote `ls`) imports no
# torch.
STORED_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32",
                           "int16", "int8", "uint8", "bool", "complex64", "float8_e4m3fn",
                           "float8_e5m2"})


def _tensor_spec(key: object, spec: object, origin: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        _fail(origin, "tensors", key, f"a key of 1 to {MAX_KEY_CHARS} characters")
    spec = _obj(spec, f"tensors[{key!r}]", origin)
    dtype = spec.get("dtype")
    if dtype not in STORED_DTYPES:
        _fail(origin, f"tensors[{key!r}].dtype", dtype, "a dtype safetensors stores")
    shape = spec.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM \
            or not all(_is_int(n) and 0 <= n < 2**50 for n in shape):
        _fail(origin, f"tensors[{key!r}].shape", shape, "a list of non-negative integers")


def _attachments(value: object, origin: str) -> None:
    if not isinstance(value, list) or len(value) > MAX_FILES:
        _fail(origin, "attachments", value, "a list of files")
    names: set[str] = set()
    for i, entry in enumerate(value):
        entry = _obj(entry, f"attachments[{i}]", origin)
        try:
            name = check_file_name(entry.get("name"))
        except RefError as exc:
            raise ManifestError(f"manifest {origin}: attachments[{i}]: {exc}") from None
        if name in names:
            _fail(origin, f"attachments[{i}].name", name, "a name used once")
        names.add(name)
        _digest(entry.get("digest"), f"attachments[{i}].digest", origin)
        _size(entry.get("size"), f"attachments[{i}].size", origin)


def _module_metadata(value: object, origin: str) -> None:
    """Optional ``{module prefix: {"version": N}}``: what ``state_dict()._metadata`` held."""
    metadata = _obj(value, "module_metadata", origin)
    if len(metadata) > MAX_TENSORS:
        _fail(origin, "module_metadata", f"{len(metadata)} entries", f"at most {MAX_TENSORS}")
    for prefix, entry in metadata.items():
        if not isinstance(prefix, str) or len(prefix) > MAX_KEY_CHARS:
            _fail(origin, "module_metadata", prefix,
                  f"a module prefix of at most {MAX_KEY_CHARS} characters")
        version = entry.get("version") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or set(entry) != {"version"} or not _is_int(version) \
                or not 0 <= version <= statedict.MAX_VERSION:
            _fail(origin, f"module_metadata[{prefix!r}]", entry,
                  f'{{"version": N}} with N an integer from 0 to {statedict.MAX_VERSION}')


def _key_order(value: object, parts: list[dict[str, Any]], origin: str) -> None:
    """Optional list of every state-dict key (stored tensors, tied aliases, non-tensor
    entries), each once, in the order they were pushed."""
    if value is None:
        return
    expected = set().union(*parts)
    if not isinstance(value, list) or len(value) != len(expected):
        _fail(origin, "key_order", value,
              f"a list of the {len(expected)} state-dict keys, each once, in pushed order")
    seen: set[str] = set()
    for key in value:
        if not isinstance(key, str) or key not in expected or key in seen:
            _fail(origin, "key_order", key,
                  "a key stored, tied or kept as a non-tensor entry, listed once")
        seen.add(key)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _obj(value: object, what: str, origin: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(origin, what, value, "a JSON object")
    return value


def _digest(value: object, what: str, origin: str) -> str:
    try:
        return check_digest(value, what)
    except RefError as exc:
        raise ManifestError(f"manifest {origin}: {exc}") from None


def _size(value: object, what: str, origin: str) -> None:
    if not _is_int(value) or not 0 <= value <= MAX_BLOB_BYTES:
        _fail(origin, what, value, f"a byte count up to {MAX_BLOB_BYTES}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_timestamp(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return len(text) <= 64


def _fail(origin: str, what: str, value: object, expected: str) -> NoReturn:
    raise ManifestError(f"manifest {origin} is invalid: {what} is {quoted(value)}, expected "
                        f"{expected}; it was not used")
