"""What a mirrored version looks like in MLflow's Model Registry: its tags and its description,
and the registered model's own description.

Pure functions of a catalog record and its export records, so a sync can compare them with what
MLflow shows and put back whatever was edited in the UI (``mirror_mlflow.py`` decides what to
sync, ``mlflow_client.py`` does it). :func:`view` gathers those inputs from a backend (the store
URI, the stored exports, the signatures) into the one :class:`VersionView` every mirror and
repair compares against. Tags name store objects by their store-relative key; a store URI
appears only when it is not a path on the server's disk.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import manifest as mf
from ..catalog.records import VersionRecord
from ..display import human_bytes, quantization_method, version_table
from ..files import weight_files
from ..manifest import ModelVersion
from ..provenance import card

if TYPE_CHECKING:
    from ..backends import LocalBackend

_TAG_KEY_RE = re.compile(r"[^\w.\- /]")
# MLflow keeps a version's description in a VARCHAR(5000) column.
MAX_DESCRIPTION = 5000
MODEL_TAGS = {"registry.mirrored": "true"}


def source_key(record: VersionRecord) -> str:
    """The store key MLflow's ``source`` points at: the weights blob of a one-shard version,
    else the version's manifest (which lists its shards)."""
    shards = weight_files(record.manifest)
    if len(shards) == 1:
        return mf.blob_key(shards[0].digest)
    return mf.manifest_key(record.name, record.version)


class VersionView(NamedTuple):
    """How MLflow should show one version: its ``source``, tags and description."""

    source: str
    tags: dict[str, str]
    description: str


def view(backend: LocalBackend, record: VersionRecord,
         exports: list[dict[str, Any]] | None = None,
         signed: str | None = None, governed: dict[str, str] | None = None) -> VersionView:
    """How MLflow shows ``record`` (every sync, mirror and repair compares against this one
    answer); ``exports``, ``signed`` and ``governed`` are read from ``backend`` when not
    given."""
    if exports is None:
        exports = export_records(backend, record.name, record.version)
    if signed is None:
        signed = signature_tag(backend.signatures.listed(record.name, record.version))
    if governed is None:
        governed = governance_tags(backend, record.name,
                                   {record.version: record}).get(record.version, {})
    source = source_uri(backend, record)
    tags = version_tags(record, source, exports)
    if signed:
        tags["registry.signatures"] = signed
    tags.update(governed)
    return VersionView(source, tags, describe(record, exports))


def governance_tags(backend: LocalBackend,
                    name: str, records: Mapping[int, VersionRecord]) -> dict[int, dict[str, str]]:
    """The governance tags of each of ``records`` (versions of ``name``): its protected
    aliases (``registry.protected_aliases``), its hold (``registry.hold``) and, for each alias
    pointing at it, the last change of that alias (``registry.last_alias_change``: from which
    version, by whom, when, from the event log)."""
    state = backend.governance.state(name)
    found: dict[int, dict[str, str]] = {}
    for version, record in records.items():
        tags: dict[str, str] = {}
        protected = [a for a in record.aliases if a in state.protected]
        if protected:
            tags["registry.protected_aliases"] = ",".join(protected)
        if version in state.holds:
            hold = state.holds[version]
            tags["registry.hold"] = f"{hold.reason} (by {hold.actor}, {hold.at[:19]})"[:5000]
        changes = []
        for alias in record.aliases:
            # The newest alias.set among the alias's last events (protecting it is no move).
            moves = [e for e in backend.audit.history(name, alias, limit=16)
                     if e.kind == "alias.set"]
            for e in moves[-1:]:
                before = f"v{e.previous}" if e.previous is not None else "(none)"
                changes.append(f"{alias}: {before} -> v{e.version} by {e.actor} at {e.at[:19]}")
        if changes:
            tags["registry.last_alias_change"] = "; ".join(changes)[:5000]
        if tags:
            found[version] = tags
    return found


def source_uri(backend: LocalBackend, record: VersionRecord) -> str:
    """What MLflow's ``source`` names: the store URI of :func:`source_key`."""
    return backend.store.uri(source_key(record))


def export_records(backend: LocalBackend, name: str, version: int) -> list[dict[str, Any]]:
    """The stored exports of ``name:vN`` (the ``registry.exports`` tag and description rows)."""
    return list(backend.exports.list_exports(name, version))


def signature_tag(listed: list[dict[str, Any]]) -> str:
    """The ``registry.signatures`` tag: ``method signer`` of each signature, as listed (the
    registry verifies them on pull; MLflow only shows them)."""
    return ", ".join(f"{r['method']} {r['signer']}" for r in listed)[:4000]


def export_formats(exports: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({str(e["format"]) for e in exports})


def version_tags(record: VersionRecord, source: str,
                 exports: Sequence[Mapping[str, Any]] = ()) -> dict[str, str]:
    """Our tags (keys MLflow accepts) plus registry.* facts about where the weights came from.
    ``source`` is the store URI of :func:`source_key`: a ``file:`` URI is a path on the
    registry's host and stays out of the tags (``registry.blob_key`` names the object)."""
    meta = record.manifest.get("source", {})
    dtypes = meta.get("dtypes", {})
    tags = {_TAG_KEY_RE.sub("_", k)[:250]: v[:5000] for k, v in record.tags.items()}
    tags.update({
        "registry.ref": f"{record.name}:v{record.version}",
        "registry.digest": record.digest,
        "registry.devices": ",".join(meta.get("devices", [])) or "unknown",
        "registry.dtypes": ",".join(dtypes) if isinstance(dtypes, dict) else str(dtypes),
        "registry.wrapping": ",".join(meta.get("wrapping", [])) or "none",
        "registry.precision": str(meta.get("precision") or "-"),
        "registry.params": str(meta.get("params", 0)),
        "registry.size": human_bytes(int(meta.get("size_bytes", record.size_bytes))),
        "registry.size_bytes": str(meta.get("size_bytes", record.size_bytes)),
        "registry.shards": str(len(record.manifest.get("files", ()))),
        "registry.blob_key": source_key(record),
    })
    if not source.startswith("file:"):
        tags["registry.blob_uri"] = source
    if exports:
        tags["registry.exports"] = ",".join(export_formats(exports))
    quant, adapter = record.manifest.get("quantization"), record.manifest.get("adapter")
    if isinstance(quant, dict):  # issue 35: the scheme, and the base of an adapter
        tags["registry.quantization"] = \
            f"{quant.get('library')} {quantization_method(quant)}"[:5000]
    if isinstance(adapter, dict) and isinstance(base := adapter.get("base"), dict):
        tags["registry.adapter_base"] = f"{base.get('name')}:v{base.get('version')}"[:5000]
    return tags


def describe(record: VersionRecord, exports: Sequence[Mapping[str, Any]] = ()) -> str:
    """The version's model card (registry/provenance/card.py, without its YAML front matter),
    then a Markdown table of the ``registry show`` facts and the version's exports (MLflow
    renders descriptions); cut to MLflow's 5000 characters by shortening the card."""
    facts = _facts(record, exports)
    text = card.render(record.manifest, front=False)
    budget = MAX_DESCRIPTION - len(facts) - 120
    if len(text) > budget:
        text = (text[:max(budget, 0)].rsplit("\n", 1)[0] + "\n\n... (cut: `registry card "
                f"{record.name}:v{record.version}` prints the whole card)\n")
    return (text + "\n## Registry facts\n\n" + facts)[:MAX_DESCRIPTION]


def _facts(record: VersionRecord, exports: Sequence[Mapping[str, Any]]) -> str:
    mv = ModelVersion(record.name, record.version, record.digest, dict(record.tags),
                      list(record.aliases), {**record.manifest, "tags": dict(record.tags)})
    lines = version_table(mv).splitlines()
    width = max(len(line.split("  ", 1)[0].rstrip()) for line in lines)
    source = record.manifest.get("source", {})
    summary = (f"{mv.ref}: trained on {', '.join(source.get('devices', [])) or 'unknown'}, "
               f"{source.get('params', 0):,} parameters, "
               f"{human_bytes(int(source.get('size_bytes', record.size_bytes)))}")
    rows = [summary, "", "| field | value |", "|---|---|"]
    for line in lines:
        label, value = line[:width].strip(), line[width + 2:].strip()
        rows.append(f"| {label} | {value.replace('|', '/')} |")
    rows += [f"| export {e['format']} | {_export_row(e)} |"
             for e in sorted(exports, key=lambda e: (str(e["format"]), str(e["digest"])))]
    if not exports:
        rows.append("| exports | - |")
    return "\n".join(rows)


def _export_row(export: Mapping[str, Any]) -> str:
    params = export.get("params", {})
    shapes = ", ".join("x".join(str(d) for d in i.get("shape", []))
                       for i in params.get("inputs", []))
    dynamic = ", dynamic batch" if params.get("dynamic_batch") else ""
    dtype = params.get("compute_dtype", params.get("dtype"))
    return (f"inputs {shapes or '-'}{dynamic}, {params.get('device')}/{dtype}, "
            f"{human_bytes(int(export.get('size', 0)))}, max_abs_diff "
            f"{float(export.get('max_abs_diff', 0)):.3g}, {str(export['digest'])[:19]}")


def model_description(name: str) -> str:
    return (f"Mirrored from the PyTorch registry: pull with `registry.pull(\"{name}:vN\")`. "
            "Edits made here are put back by the next `registry mlflow sync`.")
