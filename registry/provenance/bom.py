"""An AI-BOM of a version, written from its signed manifest: CycloneDX 1.6 JSON.

The version is the BOM's subject (``metadata.component``), a ``machine-learning-model`` whose
``bom-ref`` is its digest, whose ``hashes`` hold that digest and whose ``components`` are its
files (every shard and attached file, with its SHA-256). Its ``modelCard.modelParameters`` name
the architecture, the task and the datasets; what the 1.6 schema has no field for (parameter
count, quantization, training devices, dtypes and wrapping, lineage, signatures) is recorded as
``torch-registry:*`` properties. Each parent version and dataset is a component, and
``dependencies`` says the version depends on them.

The document is built as plain JSON: ``cyclonedx-python-lib`` (whose strict validator the tests
run on it) has no model of ``modelCard`` (its ``Component.model_card`` is not implemented), so
building with it would mean building this part by hand anyway, plus a runtime dependency.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, Literal

from ..display import quantization_method
from ..errors import RefError
from ..files import attached_files, weight_files
from .card import pipeline_tag
from .lineage import of as lineage_of

BomFormat = Literal["cyclonedx", "spdx"]
FORMATS: tuple[str, ...] = ("cyclonedx", "spdx")
SPEC_VERSION = "1.6"
TOOL = "torch-registry"
_SHA256 = re.compile(r"sha256:([0-9a-f]{64})")


def check_format(format: object) -> BomFormat:
    """``format`` if this registry writes it; RefError naming the choices otherwise."""
    if format == "cyclonedx":
        return "cyclonedx"
    if format == "spdx":
        raise RefError(
            "format 'spdx' is not offered yet: this registry writes only what a validator in "
            "its tests checks, and its SPDX 3.0 AI and Dataset profile writer is not built; "
            "use format='cyclonedx' (CycloneDX 1.6) and convert it with a CycloneDX-to-SPDX "
            "tool if you need SPDX")
    raise RefError(f"unknown BOM format {str(format)[:40]!r}; use one of {', '.join(FORMATS)}")


def cyclonedx(manifest: Mapping[str, Any], *, signatures: Sequence[Mapping[str, Any]] = ()
              ) -> dict[str, Any]:
    """The CycloneDX 1.6 BOM of a (validated) manifest and its signature records."""
    name, version = str(manifest["name"]), int(manifest["version"])
    digest = str(manifest["digest"])
    trail = lineage_of(manifest)
    parents = [_parent(p) for p in trail.get("parents", [])]
    datasets = [_dataset(d) for d in trail.get("datasets", [])]
    subject: dict[str, Any] = {
        "type": "machine-learning-model",
        "bom-ref": digest,
        "name": name,
        "version": f"v{version}",
        "hashes": [_hash(digest)],
        "modelCard": _model_card(manifest, [d["bom-ref"] for d in datasets]),
        "properties": _properties(manifest, trail, signatures),
        "components": [_file(f.name, f.digest, f.size, f.role)
                       for f in [*weight_files(manifest), *attached_files(manifest)]],
    }
    if description := manifest.get("tags", {}).get("description"):
        subject["description"] = str(description)[:2000]
    refs = [c["bom-ref"] for c in (*parents, *datasets)]
    bom: dict[str, Any] = {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": uuid.uuid5(uuid.NAMESPACE_URL,
                                   f"torch-registry:{name}:v{version}@{digest}").urn,
        "version": 1,
        "metadata": {
            "timestamp": _timestamp(str(manifest["created_at"])),
            "tools": {"components": [{"type": "application", "name": TOOL,
                                      "version": _tool_version()}]},
            "component": subject,
        },
        "components": [*parents, *datasets],
        "dependencies": [{"ref": digest, "dependsOn": refs},
                         *({"ref": r} for r in refs)],
    }
    return bom


def _model_card(manifest: Mapping[str, Any], dataset_refs: list[str]) -> dict[str, Any]:
    arch = manifest.get("architecture") or {}
    adapter = manifest.get("adapter")
    params: dict[str, Any] = {}
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
    if dataset_refs:
        params["datasets"] = [{"ref": r} for r in dataset_refs]
    source = manifest.get("source") or {}
    props = [("parameters", str(int(source.get("params", 0))))]
    quant = manifest.get("quantization")
    if isinstance(quant, dict):
        props.append(("quantization", f"{quant.get('library')} {quant.get('library_version')} "
                                      f"{quantization_method(dict(quant))}"))
    else:
        props.append(("quantization", "none"))
    return {"modelParameters": params, "properties": [_prop(k, v) for k, v in props]}


def _properties(manifest: Mapping[str, Any], trail: Mapping[str, Any],
                signatures: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
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
    return [_prop(k, v) for k, v in out]


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


def _timestamp(text: str) -> str:
    """An RFC 3339 date-time (the schema's format): the manifest's ISO time, with its zone."""
    return text if re.search(r"(Z|[+-]\d\d:\d\d)$", text) else text + "Z"
