"""Readable text for humans: the ``show`` table and the ``ls`` listings."""

from __future__ import annotations

from typing import Any

from .manifest import ModelVersion


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def version_table(mv: ModelVersion) -> str:
    """The ``registry show`` table: identity, then where and how the weights were trained."""
    meta = mv.metadata
    source: dict[str, Any] = meta.get("source", {})
    arch: dict[str, Any] = meta.get("architecture", {})
    rows: list[tuple[str, str]] = [
        ("ref", mv.ref),
        ("digest", mv.digest),
        ("aliases", ", ".join(_marked(mv)) or "-"),
        *([("hold", _hold(meta["governance"]["hold"]))]
          if "hold" in meta.get("governance", {}) else []),
        ("tags", ", ".join(f"{k}={v}" for k, v in mv.tags.items()) or "-"),
        ("created", meta.get("created_at", "-")),
        ("architecture", _architecture(arch, meta.get("adapter"))),
        ("parameters", f"{source.get('params', 0):,}"),
        ("size", human_bytes(int(source.get("size_bytes", 0)))),
        *([("quantization", _quantization(meta["quantization"]))]
          if isinstance(meta.get("quantization"), dict) else []),
        *([("adapter", _adapter(meta["adapter"]))] if isinstance(meta.get("adapter"), dict)
          else []),
        ("tensors", str(meta.get("tensor_count", "-"))),
        ("files", _attachments(meta.get("attachments", []))),
        ("trained on", ", ".join(source.get("devices", [])) or "unknown"),
        ("dtypes", ", ".join(f"{k} x{v}" for k, v in source.get("dtypes", {}).items()) or "-"),
        ("precision", str(source.get("precision", "-"))),
        ("wrapping", " > ".join(source.get("wrapping", [])) or "none"),
        ("keep in fp32", ", ".join(source.get("keep_in_fp32", [])) or "-"),
        ("tied", ", ".join(f"{a} -> {k}" for a, k in source.get("tied", {}).items()) or "-"),
        ("input", "PEFT model (its adapter only)" if isinstance(meta.get("adapter"), dict)
         else _input(source)),
        ("torch", str(source.get("torch_version", "-"))),
        ("python", str(source.get("python_version", "-"))),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _marked(mv: ModelVersion) -> list[str]:
    """The version's aliases, a protected one marked ``(protected)``."""
    protected = mv.metadata.get("governance", {}).get("protected_aliases", [])
    return [f"{a} (protected)" if a in protected else a for a in mv.aliases]


def _hold(hold: dict[str, Any]) -> str:
    return f"held: {hold.get('reason')} (by {hold.get('actor')}, {str(hold.get('at'))[:10]})"


def _architecture(arch: dict[str, Any], adapter: object = None) -> str:
    if isinstance(adapter, dict):  # pulled over its base, rebuilt from the base's record
        base = adapter.get("base") or {}
        return f"its base's ({base.get('name')}:v{base.get('version')})"
    factory = arch.get("factory")
    if factory:
        kwargs = arch.get("factory_kwargs") or {}
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return f"{factory}({args})"
    config = arch.get("config")
    if arch.get("kind") == "transformers" and isinstance(config, dict):
        return f"{arch.get('class')} (from its config, model_type={config.get('model_type')})"
    return str(arch.get("class") or "unknown (pull with model=)")


def _quantization(q: dict[str, Any]) -> str:
    """``torchao 0.18.0 int8_weight_only (group sizes 16, 32; runs on cpu, cuda)``; an intx
    scheme names its weights' width: ``... intx_weight_only int4 (group sizes 32; ...)``."""
    groups = ", ".join(str(g) for g in q.get("group_sizes", [])) or "-"
    runs = ", ".join(str(d) for d in q.get("devices", [])) or "-"
    return (f"{q.get('library')} {q.get('library_version')} {quantization_method(q)} "
            f"(group sizes {groups}; runs on {runs})")


def quantization_method(q: dict[str, Any]) -> str:
    """A quantization record's method, with its weights' width where it names one:
    ``int8_weight_only``, ``intx_weight_only int4``."""
    widths = q.get("weight_dtypes")
    return " ".join([str(q.get("method")), *(map(str, widths) if isinstance(widths, list)
                                              else [])])


def _adapter(a: dict[str, Any]) -> str:
    """``peft 0.21.2 LORA r=4 on c_attn over gpt2-tiny:v1 (sha256:ab12…)``."""
    config, base = a.get("config") or {}, a.get("base") or {}
    targets = config.get("target_modules")
    shown = ", ".join(targets) if isinstance(targets, list) else str(targets)
    return (f"{a.get('library')} {a.get('library_version')} {a.get('peft_type')} "
            f"r={config.get('r')} on {shown} over {base.get('name')}:v{base.get('version')} "
            f"({str(base.get('digest'))[:19]}…)")


def _attachments(files: list[dict[str, Any]], shown: int = 6) -> str:
    """``config.json, tokenizer.json (2 files, 1.2 MiB)``: what travels with the weights."""
    if not files:
        return "-"
    names = ", ".join(f["name"] for f in files[:shown]) + (", …" if len(files) > shown else "")
    total = human_bytes(sum(int(f["size"]) for f in files))
    return f"{names} ({len(files)} file{'s' if len(files) != 1 else ''}, {total})"


def _input(source: dict[str, Any]) -> str:
    kind = str(source.get("input", "-"))
    ckpt = source.get("checkpoint")
    if ckpt:
        key = f" [{ckpt['key']}]" if ckpt.get("key") else ""
        return f"{kind}: {ckpt.get('file')} ({ckpt.get('format')}){key}"
    return kind


def push_summary(report: dict[str, int]) -> str:
    """``uploaded 1 of 14 shards (120.0 MiB of 7.0 GiB)``: what a push sent to the store."""
    noun = "shard" if report["shards"] == 1 else "shards"
    line = (f"uploaded {report['shards_uploaded']} of {report['shards']} {noun} "
            f"({human_bytes(report['bytes_uploaded'])} of {human_bytes(report['bytes'])})")
    if report.get("files"):
        line += f", {report['files_uploaded']} of {report['files']} attached files"
    return line


def version_summary(mv: ModelVersion) -> dict[str, Any]:
    """One version in a line of JSON (``registry ls --json``): identity, size, when, names, and
    where it came from; ``registry show --json`` prints the whole manifest."""
    meta = mv.metadata
    source: dict[str, Any] = meta.get("source", {})
    return {
        "ref": mv.ref,
        "digest": mv.digest,
        "size": int(source.get("size_bytes", 0)),
        "created": meta.get("created_at"),
        "aliases": list(mv.aliases),
        **mv.metadata.get("governance", {}),  # protected_aliases, hold: only where there are
        "tags": dict(mv.tags),
        "source": {
            "architecture": _architecture(meta.get("architecture", {})),
            "parameters": source.get("params"),
            "devices": source.get("devices", []),
            "dtypes": source.get("dtypes", {}),
            "precision": source.get("precision"),
            "wrapping": source.get("wrapping", []),
            "input": source.get("input"),
        },
    }


def versions_table(versions: list[ModelVersion]) -> str:
    rows = [("VERSION", "DIGEST", "SIZE", "ALIASES", "TAGS")]
    for mv in versions:
        rows.append((
            mv.ref, mv.digest[:19], human_bytes(int(mv.metadata["source"]["size_bytes"])),
            ",".join(_marked(mv)) + (" [held]" if "hold" in mv.metadata.get("governance", {})
                                     else "") or "-",
            ",".join(f"{k}={v}" for k, v in mv.tags.items()) or "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)
