"""The Hub door: each model a Hugging Face Hub model repository, read only.

``HF_ENDPOINT=http://HOST:PORT/hf`` points ``huggingface_hub`` (and so transformers, vLLM, TGI,
the ``hf`` CLI) at a registry server; ``server/routes/hf.py`` only translates HTTP to the calls
of :class:`HubDoor`.

    repo_id    the model name
    revision   main (the latest version) | vN | an alias | a weights digest prefix
               (sha256:<hex> or 12+ hex, as `registry ls` prints) | a commit this door
               answered (40 hex); each may end in +float16, +bfloat16 or +float32: the
               version's floating weights cast to that dtype (a dtype variant)

A revision's files are those ``save_pretrained`` writes, from the same list
(:func:`registry.pretrained_files.listing`) plus ``model.sig`` when the version is signed:
shards and attached files are the verified stored blobs, byte for byte; configs are generated
from the manifest. A revision whose directory is rewritten is **derived** once by
``save_pretrained``'s own writer into this node's cache (``<cache>/hub/<commit>/``) and served
from there: a dtype variant, a transformers version quantized with torchao (its shards carry
torchao's metadata) or compressed-tensors (its config gains the ``quantization_config``), a
PEFT adapter (PEFT's file names). A quantized version has no dtype variant: its weights are
integer components and scales, not floats.

The commit of a revision is 40 hex of sha256 over the version's manifest digest (what its
signatures sign) and the variant's dtype: the same on every server, replica and restart.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from ..catalog.records import VersionRecord
from ..errors import HubNotFoundError, NotFoundError, QuantizationError, RefError, quoted
from ..files import VersionFile
from ..pretrained_files import is_transformers, listing
from ..refs import Ref, parse, validate_name
from ..signing.oms import SIGNATURE_NAME
from ..signing.records import manifest_digest
from .hubcache import read_listing, touch

VARIANTS = ("float16", "bfloat16", "float32")
MAX_REVISION_CHARS = 160
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_VERSION_RE = re.compile(r"v?[1-9][0-9]{0,9}")
_DIGEST_RE = re.compile(r"(?:sha256:)?([0-9a-f]{12,64})")
_PAGE = 500
_MEMO_LIMIT = 100_000
_LISTED_SECONDS = 10.0
_KEPT_LIMIT = 4096

OpenBlob = Callable[[str, int], BinaryIO]


@dataclass(frozen=True)
class HubFile:
    """A file of a revision: a stored ``blob``, generated ``data``, or a derived file at
    ``path``; its sha256 (hex) is its ETag."""

    name: str
    size: int
    sha256: str
    blob: VersionFile | None = None
    data: bytes | None = None
    path: Path | None = None


@dataclass(frozen=True)
class HubRevision:
    """A resolved revision: the version, the variant's dtype, its commit and its files."""

    record: VersionRecord
    dtype: str | None
    commit: str
    files: Mapping[str, HubFile]

    @property
    def origin(self) -> str:
        variant = f"+{self.dtype}" if self.dtype else ""
        return f"{self.record.name}:v{self.record.version}{variant}"

    def file(self, path: str) -> HubFile:
        """The file ``path`` of this revision; an EntryNotFound HubNotFoundError for a name it
        does not list (a path is never looked up anywhere else)."""
        found = self.files.get(path)
        if found is None:
            raise HubNotFoundError(f"{self.origin} has no file {quoted(path, 120)}; its files "
                                   f"are listed by GET /hf/api/models/{self.record.name}/tree/"
                                   f"{self.commit}", hub_code="EntryNotFound", commit=self.commit)
        return found


def commit_of(manifest: Mapping[str, Any], dtype: str | None) -> str:
    """The 40-hex commit of a version (its manifest digest) and variant."""
    seed = f"registry-hub\0{manifest_digest(manifest)}\0{dtype or ''}"
    return hashlib.sha256(seed.encode()).hexdigest()[:40]


class HubDoor:
    """Repositories, revisions and files of the Hub's read API over one registry's versions.

    Built with the narrow things it needs: ``resolve`` and ``list_versions`` of the backend,
    ``open_blob`` (verified bytes), ``signature`` (a version's directory ``model.sig`` or None)
    and ``cache_dir``, under which derived revisions are kept."""

    def __init__(self, *, resolve: Callable[[Ref], VersionRecord],
                 list_versions: Callable[..., list[VersionRecord]], open_blob: OpenBlob,
                 signature: Callable[[Mapping[str, Any]], bytes | None],
                 cache_dir: Path) -> None:
        self._resolve = resolve
        self._list_versions = list_versions
        self.open_blob = open_blob
        self._signature = signature
        self.derived_dir = cache_dir / "hub"
        self._commits: dict[tuple[str, str], tuple[int, str | None]] = {}
        self._kept: dict[tuple[str, int, str | None],
                         tuple[float, str, Mapping[str, HubFile]]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # -- revisions ------------------------------------------------------------------------

    def revision(self, repo: str, revision: str | None, *,
                 may_see: Callable[[str], bool] = lambda _name: True) -> HubRevision:
        """The revision ``revision`` (None: main) of repository ``repo``; HubNotFoundError
        (RepoNotFound, RevisionNotFound) for what does not exist, QuantizationError for a dtype
        variant of a quantized version. ``may_see`` is the caller's model scope: a model it
        refuses is a repository that does not exist, in the same words."""
        name = self._repo(repo, may_see)
        text = "main" if revision is None else revision
        if len(text) > MAX_REVISION_CHARS or not text.isascii() or not text.isprintable():
            raise self._no_revision(name, text, "it is not a revision this registry names")
        base, _, dtype = text.rpartition("+") if "+" in text else (text, "", None)
        if dtype is not None and dtype not in VARIANTS:
            raise self._no_revision(name, text, f"+{dtype[:40]} is not a dtype variant "
                                                f"({', '.join('+' + v for v in VARIANTS)})")
        record, pinned = self._version(name, base, text)
        if pinned is not None:
            if dtype is not None and dtype != pinned:
                raise self._no_revision(name, text, "a commit names its variant already")
            dtype = pinned
        commit, files = self._listed(record, dtype)
        return HubRevision(record, dtype, commit, files)

    def _listed(self, record: VersionRecord,
                dtype: str | None) -> tuple[str, Mapping[str, HubFile]]:
        """The commit and files of a version's variant, kept for :data:`_LISTED_SECONDS` (a
        client's HEAD and GET of each file ask again; a signature added meanwhile shows after)."""
        key = (record.name, record.version, dtype)
        now = time.monotonic()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < _LISTED_SECONDS:
            return kept[1], kept[2]
        commit = commit_of(record.manifest, dtype)
        self._remember(record.name, commit, record.version, dtype)
        files = self._files(record, dtype, commit)
        if len(self._kept) > _KEPT_LIMIT:
            self._kept.clear()
        self._kept[key] = (now, commit, files)
        return commit, files

    def _repo(self, repo: str, may_see: Callable[[str], bool]) -> str:
        """The model name ``repo`` if the caller may see it (whether it exists is learnt from
        the revision's lookup, one catalog query)."""
        try:
            name = validate_name(repo)
        except RefError:
            raise self._no_repo(repo) from None
        if not may_see(name):
            raise self._no_repo(repo)
        return name

    def _no_repo(self, repo: str) -> HubNotFoundError:
        return HubNotFoundError(f"repository {quoted(repo, 140)} not found: it names no model "
                                "of this registry (repo_id is the model name)")

    def _no_revision(self, name: str, text: str, why: str) -> HubNotFoundError:
        """RevisionNotFound, or RepoNotFound when the model has no version at all."""
        try:
            exists = bool(self._list_versions(name, limit=1))
        except NotFoundError:
            exists = False
        if not exists:
            return self._no_repo(name)
        return HubNotFoundError(
            f"revision {quoted(text, 100)} of {name} not found: {why}; use main, vN, an "
            "alias, a digest prefix or a commit, optionally +float16/+bfloat16/+float32",
            hub_code="RevisionNotFound")

    def _version(self, name: str, base: str, text: str) -> tuple[VersionRecord, str | None]:
        """The version ``base`` names, and the variant when it is a commit."""
        try:
            if base == "main":
                return self._resolve(Ref(name)), None
            if _COMMIT_RE.fullmatch(base):
                found = self._find_commit(name, base)
                if found is not None:
                    return self._resolve(Ref(name, version=found[0])), found[1]
            if _VERSION_RE.fullmatch(base):
                return self._resolve(parse(f"{name}:{base}")), None
            digest = _DIGEST_RE.fullmatch(base)
            if digest is not None:
                return self._resolve(parse(f"{name}@sha256:{digest.group(1)}")), None
            return self._resolve(parse(f"{name}@{base}")), None
        except (RefError, NotFoundError) as exc:
            raise self._no_revision(name, text, str(exc)[:200]) from None

    def _find_commit(self, name: str, commit: str) -> tuple[int, str | None] | None:
        """The version and variant whose commit is ``commit``: remembered, else found by
        computing the commits of ``name``'s versions (remembered as they are computed)."""
        found = self._commits.get((name, commit))
        if found is not None:
            return found
        after: int | None = None
        while True:
            page = self._list_versions(name, limit=_PAGE, after=after)
            for record in page:
                for dtype in (None, *VARIANTS):
                    self._remember(name, commit_of(record.manifest, dtype), record.version,
                                   dtype)
            found = self._commits.get((name, commit))
            if found is not None or len(page) < _PAGE:
                return found
            after = page[-1].version

    def _remember(self, name: str, commit: str, version: int, dtype: str | None) -> None:
        if len(self._commits) > _MEMO_LIMIT:
            self._commits.clear()
        self._commits[(name, commit)] = (version, dtype)

    # -- files ----------------------------------------------------------------------------

    def _files(self, record: VersionRecord, dtype: str | None,
               commit: str) -> dict[str, HubFile]:
        manifest = record.manifest
        origin = f"{record.name}:v{record.version}"
        if dtype is not None and "quantization" in manifest:
            library = str(manifest["quantization"].get("library", "a quantization library"))
            raise QuantizationError(
                f"{origin} is quantized ({library[:40]}): its weights are integer components "
                f"and scales, not floats to cast to {dtype}; ask for the revision without "
                f"+{dtype}")
        rewritten = "adapter" in manifest or (
            is_transformers(manifest) and "quantization" in manifest)
        if dtype is not None or rewritten:
            return self._derived(record, dtype, commit)
        files: dict[str, HubFile] = {}
        for f in listing(manifest):
            if f.data is not None:
                files[f.name] = HubFile(f.name, len(f.data), str(f.sha256), data=f.data)
            elif f.blob is not None:
                files[f.name] = HubFile(f.name, f.blob.size, f.blob.digest[7:], blob=f.blob)
        bundle = self._signature(manifest)
        if bundle is not None:
            files[SIGNATURE_NAME] = HubFile(SIGNATURE_NAME, len(bundle),
                                            hashlib.sha256(bundle).hexdigest(), data=bundle)
        return dict(sorted(files.items()))

    def _derived(self, record: VersionRecord, dtype: str | None,
                 commit: str) -> dict[str, HubFile]:
        """The files of a derived revision, written once into ``<cache>/hub/<commit>``."""
        root = self.derived_dir / commit
        files = _read_derived(root)
        if files is not None:
            return files
        with self._guard:
            lock = self._locks.setdefault(commit, threading.Lock())
        with lock:  # one derivation per revision in this process; across processes, a rename
            files = _read_derived(root)
            if files is None:
                # torch, loaded on the first derived revision: the server stays torch-free
                # until one is asked for.
                from . import hfderive

                hfderive.derive(record.manifest, self.open_blob, root, dtype, record.name,
                                record.version)
                files = _read_derived(root)
        if files is None:
            raise NotFoundError(f"the derived files of {record.name}:v{record.version} vanished "
                                f"from {root}; ask again")
        return files

    def open(self, rev: HubRevision, f: HubFile) -> BinaryIO | bytes:
        """The bytes of ``rev``'s file ``f``: its data, or an open file holding them (the
        verified blob, or the derived file). A derived revision removed since it was listed
        (``registry cache prune``) is derived again, and its file served if it is the one
        listed, byte for byte."""
        if f.data is not None:
            return f.data
        if f.blob is not None:
            return self.open_blob(f.blob.digest, f.blob.size)
        assert f.path is not None
        root = self.derived_dir / rev.commit
        try:
            fh = open(f.path, "rb")  # noqa: SIM115 - the response closes it
        except FileNotFoundError:
            self._kept.pop((rev.record.name, rev.record.version, rev.dtype), None)
            again = self._derived(rev.record, rev.dtype, rev.commit).get(f.name)
            if again is None or again.sha256 != f.sha256 or again.path is None:
                raise NotFoundError(f"{f.name} of {rev.origin} changed while it was derived "
                                    "again; ask again") from None
            fh = open(again.path, "rb")  # noqa: SIM115
        touch(root)
        return fh

    # -- the Hub's JSON -------------------------------------------------------------------

    def model_info(self, rev: HubRevision) -> dict[str, Any]:
        """``GET /api/models/{repo}/revision/{rev}``: what ``HfApi.model_info`` reads."""
        manifest = rev.record.manifest
        arch = manifest.get("architecture") or {}
        config = arch.get("config") if is_transformers(manifest) else None
        created = _hub_time(manifest.get("created_at"))
        tags = sorted({*rev.record.aliases, *(f"{k}:{v}" for k, v in rev.record.tags.items())})
        return {
            "_id": rev.commit, "id": rev.record.name, "modelId": rev.record.name,
            "sha": rev.commit, "private": False, "gated": False, "disabled": False,
            "downloads": 0, "likes": 0, "tags": tags,
            "library_name": "transformers" if config is not None else None,
            "createdAt": created, "lastModified": created,
            "config": ({k: config[k] for k in ("architectures", "model_type") if k in config}
                       if config is not None else None),
            "siblings": [{"rfilename": f.name, "size": f.size, "blobId": f.sha256[:40],
                          "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}}
                         for f in rev.files.values()],
        }

    def tree(self, rev: HubRevision, path: str, *, recursive: bool) -> list[dict[str, Any]]:
        """``GET /api/models/{repo}/tree/{rev}[/{path}]``: the files (and folders) under
        ``path``; EntryNotFound when nothing is."""
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        out: dict[str, dict[str, Any]] = {}
        for f in rev.files.values():
            if not f.name.startswith(prefix):
                continue
            rest = f.name[len(prefix):]
            if "/" in rest and not recursive:
                folder = prefix + rest.split("/", 1)[0]
                out.setdefault(folder, {"type": "directory", "path": folder,
                                        "oid": hashlib.sha1(folder.encode()).hexdigest()})
                continue
            out[f.name] = {"type": "file", "path": f.name, "size": f.size,
                           "oid": f.sha256[:40],
                           "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
        if recursive:
            for name in list(out):
                parts = name.split("/")
                for i in range(prefix.count("/") + 1, len(parts)):
                    folder = "/".join(parts[:i])
                    out.setdefault(folder, {"type": "directory", "path": folder,
                                            "oid": hashlib.sha1(folder.encode()).hexdigest()})
        if not out:
            raise HubNotFoundError(f"{rev.origin} has no file under {quoted(path, 120)}",
                                   hub_code="EntryNotFound", commit=rev.commit)
        return [out[k] for k in sorted(out)]


def _hub_time(value: object) -> str | None:
    """An ISO time as the Hub writes it (``2026-11-28T11:19:02.505239Z``), or None."""
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _read_derived(root: Path) -> dict[str, HubFile] | None:
    listed = read_listing(root)
    if listed is None:
        return None
    return {name: HubFile(name, size, sha256, path=path)
            for name, (sha256, size, path) in listed.items()}
