"""Lineage: where a version came from, recorded at push inside its manifest (and so signed with
it), and the graph of parents and children read back from manifests.

The record sits in the manifest's ``source`` section under ``lineage``, beside the training
devices, dtypes and wrapping that section already holds. ``source`` admits keys a reader does not
know, so a manifest with lineage stays format 2 and a registry that predates lineage still reads
it (a new top-level key would have needed a format a reader refuses as newer)::

    "lineage": {
      "git": {"commit": "<40 hex>", "dirty": false, "remote": "https://host/org/repo.git"},
      "mlflow": {"run_id": "...", "experiment_id": "...", "tracking_uri": "..."},
      "run": {"id": "...", "uri": "..."},                    # given: push(run=...)
      "libraries": {"torch": "2.15.0", "safetensors": "0.7.0", ...},
      "parents": [{"name", "version", "digest", "relation"}],  # relation: reused-shards,
                                                             # adapter-base or given
      "datasets": [{"name", "uri", "digest"?}]               # given: push(datasets=...)
    }

Automatic captures each have a setting (``REGISTRY_LINEAGE_GIT``, ``_MLFLOW``, ``_LIBRARIES``,
``_PARENTS``; ``REGISTRY_LINEAGE=0`` turns them all off); what the caller gives is always
recorded. Everything is bounded here, at push and again when a manifest is read
(:func:`problem`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from ..errors import RefError, quoted

log = logging.getLogger(__name__)

Relation = Literal["reused-shards", "adapter-base", "given"]
RELATIONS: tuple[str, ...] = ("reused-shards", "adapter-base", "given")
KEYS = frozenset({"git", "mlflow", "run", "libraries", "parents", "datasets"})
MAX_PARENTS = 32
MAX_DATASETS = 64
MAX_NAME = 256
MAX_URI = 2048
MAX_TEXT = 256
MAX_RECORD_BYTES = 256 * 1024
HEX_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 and SHA-256 repositories
# A dataset digest: an algorithm and its hex value (sha256:..., md5:..., a git commit as sha1:).
_DATA_DIGEST = re.compile(r"[a-z0-9][a-z0-9_-]{1,15}:[0-9a-fA-F]{8,128}")
_RUN_ID = re.compile(r"runs:/([^/]{1,128})(/.*)?")


@dataclass(frozen=True)
class LineageLink:
    """One edge of the graph: another version, named by digest, name and version."""

    name: str
    version: int
    digest: str
    relation: str

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"


@dataclass(frozen=True)
class Lineage:
    """Where a version came from (its manifest's record) and which versions came from it."""

    name: str
    version: int
    digest: str
    parents: list[LineageLink] = field(default_factory=list)
    children: list[LineageLink] = field(default_factory=list)
    git: dict[str, Any] | None = None
    mlflow: dict[str, Any] | None = None
    run: dict[str, Any] | None = None
    libraries: dict[str, str] = field(default_factory=dict)
    datasets: list[dict[str, str]] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``registry lineage --json`` prints."""
        out = asdict(self)
        out["ref"] = self.ref
        for key in ("parents", "children"):
            out[key] = [{**asdict(link), "ref": link.ref} for link in getattr(self, key)]
        return out


def strip_credentials(url: str) -> str:
    """``url`` without a user name or password (``https://tok@host/x`` -> ``https://host/x``);
    an scp-style git remote (``git@host:org/repo``) names no secret and is kept."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


# -- what the caller gives ------------------------------------------------------------------

def given_datasets(datasets: Iterable[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """``push(datasets=[{"name", "uri", "digest"}, ...])`` checked: RefError names the entry."""
    if datasets is None:
        return []
    if isinstance(datasets, (str, bytes, Mapping)):
        raise RefError(f"datasets must be a list of {{'name', 'uri', 'digest'}} dicts, got "
                       f"{type(datasets).__name__}")
    out = []
    for i, entry in enumerate(datasets):
        if i >= MAX_DATASETS:
            raise RefError(f"datasets lists more than {MAX_DATASETS} entries (at most "
                           f"{MAX_DATASETS}); record a manifest of them as one dataset instead")
        if not isinstance(entry, Mapping):
            raise RefError(f"datasets[{i}] is {quoted(entry)}, expected a dict with 'name', "
                           "'uri' and optionally 'digest'")
        if unknown := sorted(str(k) for k in entry if k not in ("name", "uri", "digest")):
            raise RefError(f"datasets[{i}] has key {unknown[0]!r}; use 'name', 'uri', 'digest'")
        item = {"name": _text(entry.get("name"), f"datasets[{i}].name", MAX_NAME),
                "uri": strip_credentials(_text(entry.get("uri"), f"datasets[{i}].uri", MAX_URI))}
        if entry.get("digest") is not None:
            item["digest"] = dataset_digest(entry["digest"], f"datasets[{i}].digest")
        out.append(item)
    return out


def parse_dataset(text: str) -> dict[str, str]:
    """``NAME=URI[@DIGEST]`` (the CLI's ``--dataset``) -> a dataset entry; the ``@`` part is a
    digest only when it looks like one (``sha256:...``), so a URI holding ``@`` stays whole."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise RefError(f"--dataset {quoted(text)} is not NAME=URI[@DIGEST] (e.g. "
                       "imagenet=s3://data/imagenet@sha256:...)")
    uri, at, digest = rest.rpartition("@")
    if at and _DATA_DIGEST.fullmatch(digest):
        return given_datasets([{"name": name, "uri": uri, "digest": digest}])[0]
    return given_datasets([{"name": name, "uri": rest}])[0]


def given_run(run: Mapping[str, Any] | str | None) -> dict[str, str] | None:
    """``push(run={"id", "uri"})`` (or a bare URI, as the CLI's ``--run``) checked; an MLflow
    ``runs:/ID`` URI gives its id."""
    if run is None:
        return None
    if isinstance(run, str):
        run = {"uri": run}
    if not isinstance(run, Mapping) or not run:
        raise RefError(f"run is {quoted(run)}, expected a dict with 'id' and/or 'uri'")
    if unknown := sorted(str(k) for k in run if k not in ("id", "uri")):
        raise RefError(f"run has key {unknown[0]!r}; use 'id' and 'uri'")
    out = {}
    if run.get("uri") is not None:
        out["uri"] = strip_credentials(_text(run["uri"], "run.uri", MAX_URI))
    if run.get("id") is not None:
        out["id"] = _text(run["id"], "run.id", MAX_TEXT)
    elif "uri" in out and (m := _RUN_ID.fullmatch(out["uri"])):
        out["id"] = m.group(1)
    if not out:
        raise RefError("run needs 'id' or 'uri' (e.g. run={'id': 'abc123', 'uri': 'runs:/abc123'})")
    return out


def dataset_digest(value: object, what: str) -> str:
    if isinstance(value, str) and _DATA_DIGEST.fullmatch(value):
        return value
    raise RefError(f"{what} is {quoted(value)}: expected ALGORITHM:HEX such as 'sha256:<64 hex>'")


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit \
            or any(ord(c) < 32 for c in value):
        raise RefError(f"{what} is {quoted(value)}: expected a non-empty single-line string of "
                       f"at most {limit} characters")
    return value


def link(record: Any, relation: str) -> dict[str, Any]:
    """A parent entry for a (resolved) version record."""
    return {"name": record.name, "version": record.version, "digest": record.digest,
            "relation": relation}


def record(auto: Mapping[str, Any], *, parents: Sequence[Mapping[str, Any]] = (),
           datasets: Sequence[Mapping[str, str]] = (),
           run: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``lineage`` record of a push: the captures plus what was given, parents once each
    by digest (a given parent that is also the reused version keeps the first relation)."""
    out = dict(auto)
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for parent in parents:
        kept.setdefault((parent["digest"], parent["name"]), dict(parent))
    if len(kept) > MAX_PARENTS:
        raise RefError(f"a version records at most {MAX_PARENTS} parents, got {len(kept)}")
    if kept:
        out["parents"] = list(kept.values())
    if datasets:
        out["datasets"] = [dict(d) for d in datasets]
    if run:
        out["run"] = dict(run)
    if problem_text := problem(out):
        raise RefError(f"the lineage of this push is invalid: {problem_text}")
    return out


# -- reading it back ------------------------------------------------------------------------

def problem(value: object) -> str | None:
    """What is wrong with a manifest's ``lineage`` record (None when it is well formed):
    every part bounded in count and length, since a manifest is read from outside."""
    if not isinstance(value, dict):
        return f"is {quoted(value)}, expected a JSON object"
    if unknown := sorted(str(k) for k in value if k not in KEYS):
        return f"has key {quoted(unknown[0])}; expected some of {sorted(KEYS)}"
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        return f"is not plain JSON ({exc})"
    if size > MAX_RECORD_BYTES:
        return f"is {size} bytes of JSON, more than {MAX_RECORD_BYTES}"
    checks: dict[str, Callable[[Any], str | None]] = {
        "git": _git_problem, "mlflow": _strings_problem, "run": _strings_problem,
        "libraries": _strings_problem, "parents": _parents_problem,
        "datasets": _datasets_problem}
    for key, check in checks.items():
        if key in value and (found := check(value[key])):
            return f"{key} {found}"
    return None


def _strings_problem(value: object) -> str | None:
    if not isinstance(value, dict) or len(value) > 32 or not all(
            isinstance(k, str) and len(k) <= MAX_TEXT and isinstance(v, str) and len(v) <= MAX_URI
            for k, v in value.items()):
        return f"is {quoted(value)}, expected an object of at most 32 short strings"
    return None


def _git_problem(value: object) -> str | None:
    if not isinstance(value, dict) or not set(value) <= {"commit", "dirty", "remote"}:
        return f"is {quoted(value)}, expected {{'commit', 'dirty', 'remote'}}"
    if not isinstance(value.get("commit"), str) or not HEX_COMMIT.fullmatch(value["commit"]):
        return f"commit is {quoted(value.get('commit'))}, expected 40 hex digits"
    if not isinstance(value.get("dirty"), bool):
        return f"dirty is {quoted(value.get('dirty'))}, expected true or false"
    remote = value.get("remote", "")
    if not isinstance(remote, str) or len(remote) > MAX_URI:
        return f"remote is {quoted(remote)}, expected a URL"
    return None


def _parents_problem(value: object) -> str | None:
    if not isinstance(value, list) or len(value) > MAX_PARENTS:
        return f"is {quoted(value)}, expected a list of at most {MAX_PARENTS} versions"
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"name", "version", "digest",
                                                         "relation"} \
                or not isinstance(entry["name"], str) or not 0 < len(entry["name"]) <= MAX_NAME \
                or not isinstance(entry["version"], int) or isinstance(entry["version"], bool) \
                or not isinstance(entry["digest"], str) \
                or not re.fullmatch(r"sha256:[0-9a-f]{64}", entry["digest"]) \
                or entry["relation"] not in RELATIONS:
            return (f"holds {quoted(entry)}, expected {{'name', 'version', 'digest', "
                    f"'relation'}} with relation one of {RELATIONS}")
    return None


def _datasets_problem(value: object) -> str | None:
    if not isinstance(value, list) or len(value) > MAX_DATASETS:
        return f"is {quoted(value)}, expected a list of at most {MAX_DATASETS} datasets"
    for entry in value:
        try:
            given_datasets([entry])
        except RefError as exc:
            return str(exc)
    return None


def of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A (validated) manifest's lineage record; ``{}`` for one pushed before lineage existed.
    An adapter's base is a parent even then: the adapter section names it."""
    source = manifest.get("source")
    found = source.get("lineage") if isinstance(source, dict) else None
    # A catalog row is read as stored: a record that fails the schema counts as none.
    found = dict(found) if found is not None and problem(found) is None else {}
    adapter = manifest.get("adapter")
    if isinstance(adapter, dict) and isinstance(base := adapter.get("base"), dict) \
            and _parents_problem([{**base, "relation": "adapter-base"}]) is None:
        parents = list(found.get("parents", []))
        if not any(p["digest"] == base.get("digest") and p["name"] == base.get("name")
                   for p in parents):
            parents.append({"name": base.get("name"), "version": base.get("version"),
                            "digest": base.get("digest"), "relation": "adapter-base"})
        found["parents"] = parents
    return found


def graph(record: Any, versions: Iterable[Any]) -> Lineage:
    """The :class:`Lineage` of ``record``: its manifest's parents, and as children every
    version among ``versions`` (the catalog's, newest first) that names its digest as a
    parent."""
    mine = of(record.manifest)
    children = []
    for other in versions:
        if (other.name, other.version) == (record.name, record.version):
            continue
        for parent in of(other.manifest).get("parents", []):
            if parent["digest"] == record.digest:
                children.append(LineageLink(other.name, other.version, other.digest,
                                            parent["relation"]))
                break
    return Lineage(
        name=record.name, version=record.version, digest=record.digest,
        parents=[LineageLink(p["name"], p["version"], p["digest"], p["relation"])
                 for p in mine.get("parents", [])],
        children=sorted(children, key=lambda c: (c.name, c.version)),
        git=mine.get("git"), mlflow=mine.get("mlflow"), run=mine.get("run"),
        libraries=dict(mine.get("libraries", {})), datasets=list(mine.get("datasets", [])))
