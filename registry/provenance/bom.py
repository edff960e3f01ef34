"""An AI-BOM of a version, written from its signed manifest: CycloneDX 1.6 or SPDX 3.0.1 JSON.

Both writers start from the same :class:`Facts` (:func:`facts`): the version's identity, its
files with their SHA-256, its model parameters, its training facts, its lineage (parents,
datasets, git, MLflow, run, libraries) and its signatures.

CycloneDX: the version is the BOM's subject (``metadata.component``), a
``machine-learning-model`` whose ``bom-ref`` is its digest, whose ``hashes`` hold that digest and
whose ``components`` are its files (every shard and attached file, with its SHA-256). Its
``modelCard.modelParameters`` name the architecture, the task and the datasets; what the 1.6
schema has no field for (parameter count, quantization, training devices, dtypes and wrapping,
lineage, signatures) is recorded as ``torch-registry:*`` properties. Each parent version and
dataset is a component, and ``dependencies`` says the version depends on them.

SPDX (:func:`spdx`): a JSON-LD ``SpdxDocument`` conforming to the core, software, AI and dataset
profiles. The version is an ``ai_AIPackage`` (verified by its digest, ``ai_typeOfModel`` its
architecture, ``ai_hyperparameter`` its parameter count and quantization,
``ai_informationAboutTraining`` its devices, dtypes and wrapping, ``ai_domain`` its task), which
``contains`` one ``software_File`` per file (with its SHA-256); each dataset is a
``dataset_DatasetPackage`` the version is ``trainedOn``; each parent is an ``ai_AIPackage``
that is ``ancestorOf`` the version (and that the version ``dependsOn`` when it is an adapter's
base). Lineage and signatures are ``Annotation`` elements on the version.

Both documents are built as plain JSON: ``cyclonedx-python-lib`` (whose strict validator the
tests run on it) has no model of ``modelCard`` (its ``Component.model_card`` is not
implemented), and building the SPDX graph with ``spdx-python-model`` (whose JSON-LD
deserializer the tests run on it) would make that library a runtime dependency of
``registry bom`` for a document this small.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Literal

from ..display import quantization_method
from ..errors import RefError
from ..files import VersionFile, attached_files, weight_files
from .card import pipeline_tag
from .lineage import of as lineage_of

BomFormat = Literal["cyclonedx", "spdx"]
FORMATS: tuple[str, ...] = ("cyclonedx", "spdx")
SPEC_VERSION = "1.6"
SPDX_VERSION = "3.0.1"
SPDX_CONTEXT = "https://spdx.org/rdf/3.0.1/spdx-context.jsonld"
TOOL = "torch-registry"
_SHA256 = re.compile(r"sha256:([0-9a-f]{64})")


def check_format(format: object) -> BomFormat:
    """``format`` if this registry writes it; RefError naming the choices otherwise."""
    if format == "cyclonedx":
        return "cyclonedx"
    if format == "spdx":
        return "spdx"
    raise RefError(f"unknown BOM format {str(format)[:40]!r}; use one of {', '.join(FORMATS)}")


def document(manifest: Mapping[str, Any], format: BomFormat, *,
             signatures: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The BOM of a (validated) manifest in ``format`` (checked by :func:`check_format`)."""
    found = facts(manifest, signatures)
    return _cyclonedx(found) if format == "cyclonedx" else _spdx(found)


@dataclass(frozen=True)
class Facts:
    """What either BOM says about a version, gathered once from its manifest."""

    name: str
    version: int
    digest: str
    created: str
    description: str | None
    files: list[VersionFile]
    parents: list[dict[str, Any]]
    datasets: list[dict[str, str]]
    model: dict[str, str]  # architectureFamily, modelArchitecture, task (those known)
    parameters: int
    quantization: str
    properties: list[tuple[str, str]]  # torch-registry:* facts (training, lineage, signatures)

    @property
    def serial(self) -> str:
        return uuid.uuid5(uuid.NAMESPACE_URL,
                          f"torch-registry:{self.name}:v{self.version}@{self.digest}").urn


def facts(manifest: Mapping[str, Any], signatures: Sequence[Mapping[str, Any]] = ()) -> Facts:
    """The :class:`Facts` of a (validated) manifest and its signature records."""
    trail = lineage_of(manifest)
    description = manifest.get("tags", {}).get("description")
    quant = manifest.get("quantization")
    return Facts(
        name=str(manifest["name"]), version=int(manifest["version"]),
        digest=str(manifest["digest"]), created=_timestamp(str(manifest["created_at"])),
        description=str(description)[:2000] if description else None,
        files=[*weight_files(manifest), *attached_files(manifest)],
        parents=[dict(p) for p in trail.get("parents", [])],
        datasets=[dict(d) for d in trail.get("datasets", [])],
        model=_model_parameters(manifest),
        parameters=int((manifest.get("source") or {}).get("params", 0)),
        quantization=(f"{quant.get('library')} {quant.get('library_version')} "
                      f"{quantization_method(dict(quant))}" if isinstance(quant, dict)
                      else "none"),
        properties=_properties(manifest, trail, signatures))


def cyclonedx(manifest: Mapping[str, Any], *, signatures: Sequence[Mapping[str, Any]] = ()
              ) -> dict[str, Any]:
    """The CycloneDX 1.6 BOM of a (validated) manifest and its signature records."""
    return _cyclonedx(facts(manifest, signatures))


def spdx(manifest: Mapping[str, Any], *, signatures: Sequence[Mapping[str, Any]] = ()
         ) -> dict[str, Any]:
    """The SPDX 3.0.1 JSON-LD document of a (validated) manifest and its signature records."""
    return _spdx(facts(manifest, signatures))


def _cyclonedx(f: Facts) -> dict[str, Any]:
    parents = [_parent(p) for p in f.parents]
    datasets = [_dataset(d) for d in f.datasets]
    params: dict[str, Any] = dict(f.model)
    if datasets:
        params["datasets"] = [{"ref": d["bom-ref"]} for d in datasets]
    subject: dict[str, Any] = {
        "type": "machine-learning-model",
        "bom-ref": f.digest,
        "name": f.name,
        "version": f"v{f.version}",
        "hashes": [_hash(f.digest)],
        "modelCard": {"modelParameters": params,
                      "properties": [_prop("parameters", str(f.parameters)),
                                     _prop("quantization", f.quantization)]},
        "properties": [_prop(k, v) for k, v in f.properties],
        "components": [_file(v.name, v.digest, v.size, v.role) for v in f.files],
    }
    if f.description:
        subject["description"] = f.description
    refs = [c["bom-ref"] for c in (*parents, *datasets)]
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f.serial,
        "version": 1,
        "metadata": {
            "timestamp": f.created,
            "tools": {"components": [{"type": "application", "name": TOOL,
                                      "version": _tool_version()}]},
            "component": subject,
        },
        "components": [*parents, *datasets],
        "dependencies": [{"ref": f.digest, "dependsOn": refs},
                         *({"ref": r} for r in refs)],
    }


def _spdx(f: Facts) -> dict[str, Any]:
    base = f.serial  # urn:uuid:...; every element is a fragment of it
    info = "_:creationinfo"
    agent, tool, subject = f"{base}#agent", f"{base}#tool", f"{base}#model"
    graph: list[dict[str, Any]] = []

    def element(type_: str, spdx_id: str, **fields: Any) -> str:
        graph.append({"type": type_, "spdxId": spdx_id, "creationInfo": info,
                      **{k: v for k, v in fields.items() if v not in (None, [], "")}})
        return spdx_id

    def relate(kind: str, source: str, targets: list[str], comment: str | None = None) -> None:
        if targets:
            element("Relationship", f"{base}#rel-{kind}-{len(graph)}", relationshipType=kind,
                    to=targets, comment=comment, **{"from": source})

    element("SoftwareAgent", agent, name=TOOL)
    element("Tool", tool, name=f"{TOOL} {_tool_version()}")
    training = dict(f.properties)
    element(
        "ai_AIPackage", subject, name=f.name, software_packageVersion=f"v{f.version}",
        description=f.description, releaseTime=_spdx_time(f.created),
        software_primaryPurpose="model",
        verifiedUsing=[_spdx_hash(f.digest)],
        ai_typeOfModel=[f.model[k] for k in ("architectureFamily", "modelArchitecture")
                        if k in f.model],
        ai_domain=[f.model["task"]] if "task" in f.model else [],
        ai_hyperparameter=[_entry("parameters", str(f.parameters)),
                           _entry("quantization", f.quantization)],
        ai_informationAboutTraining="; ".join(
            f"{k.removeprefix('training:')}: {training[k]}" for k in
            ("training:devices", "training:dtypes", "training:wrapping", "training:precision")
            if k in training))
    files = [element("software_File", f"{base}#file-{i}", name=v.name,
                     verifiedUsing=[_spdx_hash(v.digest)],
                     software_primaryPurpose="model" if v.role != "file" else "other",
                     comment=f"role {v.role}, {v.size} bytes")
             for i, v in enumerate(f.files)]
    relate("contains", subject, files)
    datasets = []
    for i, d in enumerate(f.datasets):
        digest = d.get("digest") or ""
        datasets.append(element(
            "dataset_DatasetPackage", f"{base}#dataset-{i}", name=d["name"],
            software_downloadLocation=d["uri"], software_primaryPurpose="data",
            dataset_datasetType=["noAssertion"],
            verifiedUsing=[_spdx_hash(digest)] if _SHA256.fullmatch(digest) else [],
            comment=f"digest {digest}" if digest and not _SHA256.fullmatch(digest) else None))
    relate("trainedOn", subject, datasets)
    for i, p in enumerate(f.parents):
        parent = element("ai_AIPackage", f"{base}#parent-{i}", name=str(p["name"]),
                         software_packageVersion=f"v{p['version']}",
                         software_primaryPurpose="model",
                         verifiedUsing=[_spdx_hash(str(p["digest"]))],
                         comment=f"lineage relation {p['relation']}")
        relate("ancestorOf", parent, [subject], comment=str(p["relation"]))
        if p["relation"] == "adapter-base":
            relate("dependsOn", subject, [parent], comment="an adapter loads over its base")
    for i, (key, value) in enumerate(f.properties):
        element("Annotation", f"{base}#annotation-{i}", annotationType="other",
                subject=subject, statement=f"{TOOL}:{key}={value}"[:4000])
    document = {"type": "SpdxDocument", "spdxId": f"{base}#document", "creationInfo": info,
                "name": f"{f.name}:v{f.version}", "rootElement": [subject],
                "profileConformance": ["core", "software", "ai", "dataset"],
                "element": [e["spdxId"] for e in graph]}
    creation = {"type": "CreationInfo", "@id": info, "specVersion": SPDX_VERSION,
                "created": _spdx_time(f.created), "createdBy": [agent], "createdUsing": [tool]}
    return {"@context": SPDX_CONTEXT, "@graph": [creation, document, *graph]}


def _spdx_hash(digest: str) -> dict[str, str]:
    return {"type": "Hash", "algorithm": "sha256",
            "hashValue": digest.removeprefix("sha256:")}


def _entry(key: str, value: str) -> dict[str, str]:
    return {"type": "DictionaryEntry", "key": key, "value": value}


def _model_parameters(manifest: Mapping[str, Any]) -> dict[str, str]:
    arch = manifest.get("architecture") or {}
    adapter = manifest.get("adapter")
    params: dict[str, str] = {}
    if isinstance(adapter, dict):
        params["architectureFamily"] = "LoRA adapter"
        params["modelArchitecture"] = f"LoRA over {adapter.get('base', {}).get('name')}"
    else:
        config = arch.get("config")
        if isinstance(config, dict) and config.get("model_type"):
            params["architectureFamily"] = str(config["model_type"])
        architecture = arch.get("factory") or arch.get("class")
        if architecture:
            params["modelArchitecture"] = str(architecture)
    if task := pipeline_tag(manifest):
        params["task"] = task
    return params


def _properties(manifest: Mapping[str, Any], trail: Mapping[str, Any],
                signatures: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    source = manifest.get("source") or {}
    dtypes = source.get("dtypes", {})
    out = [("ref", f"{manifest['name']}:v{manifest['version']}"),
           ("created", str(manifest["created_at"])),
           ("training:devices", ",".join(source.get("devices", [])) or "unknown"),
           ("training:dtypes", ",".join(f"{k}x{v}" for k, v in dtypes.items())
            if isinstance(dtypes, dict) else str(dtypes)),
           ("training:wrapping", ",".join(source.get("wrapping", [])) or "none"),
           ("training:precision", str(source.get("precision") or "-"))]
    if git := trail.get("git"):
        out += [("lineage:git:commit", git["commit"]),
                ("lineage:git:dirty", str(git["dirty"]).lower())]
        if git.get("remote"):
            out.append(("lineage:git:remote", git["remote"]))
    for key, value in sorted((trail.get("mlflow") or {}).items()):
        out.append((f"lineage:mlflow:{key}", value))
    for key, value in sorted((trail.get("run") or {}).items()):
        out.append((f"lineage:run:{key}", value))
    for key, value in sorted((trail.get("libraries") or {}).items()):
        out.append((f"lineage:library:{key}", value))
    for s in signatures:
        out.append(("signature", f"{s.get('method')} {s.get('signer')} {s.get('created_at')}"))
    return [(k, str(v)) for k, v in out]


def _parent(p: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "machine-learning-model", "bom-ref": f"{p['name']}:v{p['version']}@"
            f"{p['digest']}", "name": str(p["name"]), "version": f"v{p['version']}",
            "hashes": [_hash(str(p["digest"]))],
            "properties": [_prop("lineage:relation", str(p["relation"]))]}


def _dataset(d: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "data", "bom-ref": f"dataset:{d['name']}", "name": d["name"],
        "data": [{"type": "dataset", "name": d["name"], "contents": {"url": d["uri"]}}],
        "externalReferences": [{"type": "distribution", "url": d["uri"]}]}
    digest = d.get("digest")
    if digest and (m := _SHA256.fullmatch(digest)):
        out["hashes"] = [{"alg": "SHA-256", "content": m.group(1)}]
    elif digest:
        out["properties"] = [_prop("dataset:digest", digest)]
    return out


def _file(name: str, digest: str, size: int, role: str) -> dict[str, Any]:
    return {"type": "file", "bom-ref": f"file:{name}@{digest}", "name": name,
            "hashes": [_hash(digest)],
            "properties": [_prop("file:size", str(size)), _prop("file:role", role)]}


def _tool_version() -> str:
    try:
        return metadata.version(TOOL)
    except metadata.PackageNotFoundError:
        return "unknown"


def _hash(digest: str) -> dict[str, str]:
    return {"alg": "SHA-256", "content": digest.removeprefix("sha256:")}


def _prop(name: str, value: str) -> dict[str, str]:
    return {"name": f"{TOOL}:{name}", "value": str(value)[:4000]}


def _spdx_time(text: str) -> str:
    """SPDX's DateTime: UTC to the second with a ``Z`` (``2024-05-01T12:00:00Z``)."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp(text: str) -> str:
    """An RFC 3339 date-time (the schema's format): the manifest's ISO time, with its zone."""
    return text if re.search(r"(Z|[+-]\d\d:\d\d)$", text) else text + "Z"
