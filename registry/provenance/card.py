"""A Hugging Face style model card of a version, written from its manifest.

YAML front matter the Hub reads (``library_name``, ``base_model`` and ``base_model_relation``,
``datasets``, ``tags``, ``pipeline_tag`` when the architecture names a task), then the facts
the registry recorded: identity and digest, where and how it was trained (devices, dtypes,
wrapping), quantization, lineage, signatures and every file with its SHA-256.

:func:`render` is a pure function of a manifest (and, for :meth:`Registry.card`, the version's
signature records). The card a ``from_pretrained`` directory holds as ``README.md``
(:mod:`registry.pretrained_files`) is rendered without signature records, since a signature of
that directory covers the card itself; it says where the signatures are instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..display import human_bytes, quantization_method
from ..files import attached_files, weight_files
from .lineage import of as lineage_of

README_NAME = "README.md"
# The task a transformers class names by its suffix (the Hub's pipeline tags).
_TASKS = {
    "ForCausalLM": "text-generation",
    "LMHeadModel": "text-generation",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
    "ForImageClassification": "image-classification",
    "ForSpeechSeq2Seq": "automatic-speech-recognition",
    "ForObjectDetection": "object-detection",
}


def library_name(manifest: Mapping[str, Any]) -> str:
    if isinstance(manifest.get("adapter"), dict):
        return "peft"
    kind = (manifest.get("architecture") or {}).get("kind")
    return kind if kind in ("transformers", "timm") else "pytorch"


def pipeline_tag(manifest: Mapping[str, Any]) -> str | None:
    """The Hub task of the version's architecture, when its class names one."""
    arch = manifest.get("architecture") or {}
    if arch.get("kind") == "timm":
        return "image-classification"
    names = [str(arch.get("class", "")).rsplit(":", 1)[-1]]
    config = arch.get("config")
    if isinstance(config, dict) and isinstance(config.get("architectures"), list):
        names += [str(n) for n in config["architectures"][:4]]
    for name in names:
        for suffix, task in _TASKS.items():
            if name.endswith(suffix):
                return task
    return None


def front_matter(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The card's metadata, as the Hub's model card spec names it."""
    trail = lineage_of(manifest)
    out: dict[str, Any] = {"library_name": library_name(manifest)}
    parents = trail.get("parents", [])
    base = next((p for p in parents if p["relation"] == "adapter-base"), None) \
        or next((p for p in parents if p["relation"] == "given"), None)
    if base is not None:
        out["base_model"] = f"{base['name']}:v{base['version']}"
        out["base_model_relation"] = (
            "adapter" if isinstance(manifest.get("adapter"), dict)
            else "quantized" if isinstance(manifest.get("quantization"), dict) else "finetune")
    if datasets := [d["name"] for d in trail.get("datasets", [])]:
        out["datasets"] = datasets
    tags = ["torch-registry", library_name(manifest)]
    quant = manifest.get("quantization")
    if isinstance(quant, dict):
        tags += [str(quant.get("library")), quantization_method(quant)]
    tags += [f"{k}:{v}" for k, v in sorted((manifest.get("tags") or {}).items())][:20]
    out["tags"] = list(dict.fromkeys(t[:128] for t in tags))
    if task := pipeline_tag(manifest):
        out["pipeline_tag"] = task
    return out


def render(manifest: Mapping[str, Any], *, signatures: Sequence[Mapping[str, Any]] | None = None,
           front: bool = True) -> str:
    """The card of a (validated) manifest. ``signatures``: the version's signature records as
    listed (None: the card inside a directory, which its own ``model.sig`` covers);
    ``front=False`` leaves the YAML front matter out (the MLflow description)."""
    ref = f"{manifest['name']}:v{manifest['version']}"
    source = manifest.get("source") or {}
    trail = lineage_of(manifest)
    lines: list[str] = []
    if front:
        lines += ["---", *_yaml(front_matter(manifest)), "---", ""]
    lines += [f"# {ref}", "", f"Stored by torch-registry; pull it with "
              f"`registry.pull(\"{ref}\")`.", "",
              "| | |", "|---|---|",
              f"| digest | `{manifest['digest']}` |",
              f"| created | {manifest.get('created_at', '-')} |",
              f"| architecture | {_cell(_architecture(manifest))} |",
              f"| parameters | {int(source.get('params', 0)):,} |",
              f"| size | {human_bytes(int(source.get('size_bytes', 0)))} |",
              f"| tensors | {manifest.get('tensor_count', len(manifest.get('tensors', {})))} |",
              "", "## Training", "",
              f"- devices: {', '.join(source.get('devices', [])) or 'unknown'}",
              f"- dtypes: {', '.join(f'{k} x{v}' for k, v in _dtypes(source)) or '-'}",
              f"- precision: {source.get('precision') or '-'}",
              f"- wrapping: {' > '.join(source.get('wrapping', [])) or 'none'}"]
    quant = manifest.get("quantization")
    if isinstance(quant, dict):
        lines += ["", "## Quantization", "",
                  f"{quant.get('library')} {quant.get('library_version', '')} "
                  f"{quantization_method(quant)}; runs on "
                  f"{', '.join(str(d) for d in quant.get('devices', [])) or '-'}"]
    lines += ["", "## Lineage", "", *_lineage(trail)]
    lines += ["", "## Signatures", "", *_signatures(source, signatures, ref)]
    lines += ["", "## Files", "", "| file | size | sha256 |", "|---|---|---|"]
    for f in [*weight_files(manifest), *attached_files(manifest)]:
        lines.append(f"| {_cell(f.name)} | {f.size:,} | `{f.digest[7:]}` |")
    return "\n".join(lines) + "\n"


def _architecture(manifest: Mapping[str, Any]) -> str:
    adapter = manifest.get("adapter")
    if isinstance(adapter, dict):
        base = adapter.get("base") or {}
        config = adapter.get("config") or {}
        return (f"LoRA adapter (r={config.get('r')}, alpha={config.get('lora_alpha')}) over "
                f"{base.get('name')}:v{base.get('version')}")
    arch = manifest.get("architecture") or {}
    return str(arch.get("factory") or arch.get("class") or "unknown")


def _dtypes(source: Mapping[str, Any]) -> list[tuple[str, Any]]:
    dtypes = source.get("dtypes", {})
    return list(dtypes.items()) if isinstance(dtypes, dict) else []


def _lineage(trail: Mapping[str, Any]) -> list[str]:
    out = []
    git = trail.get("git")
    if git:
        out.append(f"- git: `{git['commit']}`{' (dirty)' if git.get('dirty') else ''}"
                   f"{' at ' + _cell(git['remote']) if git.get('remote') else ''}")
    if mlflow := trail.get("mlflow"):
        out.append(f"- MLflow run: `{mlflow.get('run_id')}` (experiment "
                   f"{mlflow.get('experiment_id')}, {_cell(mlflow.get('tracking_uri', ''))})")
    if run := trail.get("run"):
        out.append("- run: " + ", ".join(f"{k} {_cell(v)}" for k, v in sorted(run.items())))
    for p in trail.get("parents", []):
        out.append(f"- parent ({p['relation']}): {p['name']}:v{p['version']} `{p['digest']}`")
    for d in trail.get("datasets", []):
        digest = f" `{d['digest']}`" if d.get("digest") else ""
        out.append(f"- dataset: {_cell(d['name'])} ({_cell(d['uri'])}){digest}")
    if libraries := trail.get("libraries"):
        out.append("- libraries: " + ", ".join(f"{k} {v}" for k, v in sorted(libraries.items())))
    return out or ["No lineage recorded."]


def _signatures(source: Mapping[str, Any], signatures: Sequence[Mapping[str, Any]] | None,
                ref: str) -> list[str]:
    out = []
    if signatures is None:
        out.append(f"The version's signatures are kept beside it (`registry verify {ref}`); a "
                   "directory written with its stored bytes carries `model.sig`.")
    elif not signatures:
        out.append("Not signed.")
    for s in signatures or []:
        out.append(f"- {s.get('method')} {_cell(str(s.get('signer')))} at {s.get('created_at')}")
    signed = source.get("signed_files")
    if isinstance(signed, dict):
        out.append(f"- the pushed directory was signed: {_cell(json.dumps(signed)[:300])}")
    return out


def _cell(value: object) -> str:
    """Text for one Markdown table cell or list item: one line, no pipes."""
    return str(value).replace("|", "/").replace("\n", " ")[:500]


def _yaml(data: Mapping[str, Any]) -> list[str]:
    """Flat YAML of strings and lists of strings, each a JSON string (valid YAML)."""
    out = []
    for key, value in data.items():
        if isinstance(value, list):
            out.append(f"{key}:")
            out += [f"- {json.dumps(str(v))}" for v in value]
        else:
            out.append(f"{key}: {json.dumps(str(value))}")
    return out
