"""A LoRA adapter's record, untrusted: the config rebuilt as a ``LoraConfig`` from an allow list
of plain fields (a field that would load code or data, such as ``megatron_core`` or
``loftq_config``, is refused), its ranks checked against its stored tensors, and the modules it
targets found in its base before PEFT touches it. Its patterns are matched by RE2
(``patterns.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import AdapterError, quoted
from . import patterns

PEFT = "peft"
LORA = "LORA"
# LoraConfig fields kept from a record; anything else must hold its default (None, empty, False).
_FIELDS = frozenset({
    "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "fan_in_fan_out",
    "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "use_dora", "lora_bias", "task_type",
})
# Informational fields PEFT writes; dropped.
_IGNORED = frozenset({"peft_type", "peft_version", "base_model_name_or_path", "revision",
                      "inference_mode", "megatron_core", "qalora_group_size"})
_TASK_TYPES = frozenset({None, "CAUSAL_LM", "SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS",
                         "QUESTION_ANS", "FEATURE_EXTRACTION"})


# PEFT's state-dict keys: the module path under this prefix, then the LoRA part.
_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"(?P<path>.+)\.lora_(?:embedding_)?(?P<part>[AB])(?:\.weight)?")
MAX_RANK = 2**16


def check_tensors(record: Mapping[str, Any], tensors: Mapping[str, Any],
                  origin: str) -> dict[str, int]:
    """Check an adapter record's ranks against its stored tensors (their manifest shapes)
    before anything is built: ``r`` and every ``rank_pattern`` value a positive integer no
    larger than the tensors' largest dimension, and each LoRA module's A and B tensors of the
    rank the config gives that module. The modules' ranks, by module path."""
    config = record["config"]
    sizes = [int(d) for spec in tensors.values() for d in spec["shape"]]
    bound = min(max(sizes, default=0), MAX_RANK)
    ranks = {"r": config.get("r", 8),
             **{f"rank_pattern[{k!r}]": v for k, v in (config.get("rank_pattern") or {}).items()}}
    for field, value in ranks.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= bound:
            raise AdapterError(f"{origin}: its adapter config sets {field} to {quoted(value)}, "
                               f"not a rank its stored tensors hold (a whole number from 1 to "
                               f"{bound}); it was not used")
    found: dict[str, int] = {}
    for key, spec in tensors.items():
        parsed = _LORA_KEY.fullmatch(key)
        shape = spec["shape"]
        if parsed is None or len(shape) < 2:
            continue
        path = parsed["path"].removeprefix(_PEFT_PREFIX)
        rank = int(shape[0] if parsed["part"] == "A" else shape[1])
        expected = _rank_of(path, config, origin)
        if rank != expected or found.setdefault(path, rank) != rank:
            raise AdapterError(f"{origin}: its stored tensor {quoted(key, 120)} has rank {rank} "
                               f"(shape {shape}) but its config gives module {quoted(path, 120)} "
                               f"rank {expected}; the record and its tensors disagree, it was "
                               "not used")
    if not found:
        raise AdapterError(f"{origin}: it stores no LoRA tensors (lora_A / lora_B); it was not "
                           "used")
    return found


def _rank_of(path: str, config: Mapping[str, Any], origin: str) -> int:
    """The rank PEFT gives module ``path``: the first ``rank_pattern`` key matching it, else
    ``r`` (matched by RE2, as PEFT would with re)."""
    for key, value in (config.get("rank_pattern") or {}).items():
        if patterns.selected(key, [path], "rank_pattern key", origin, suffix=True):
            return int(value)
    return int(config.get("r", 8))


def check_modules(lora: Iterable[str], base_tensors: Mapping[str, Any], origin: str) -> None:
    """Every module an adapter's tensors attach to is a module of the base (by the base's
    stored tensor names), checked before the base is built."""
    modules = {k.rpartition(".")[0] for k in base_tensors}
    prefixes = {".".join(parts[:i]) for m in modules for parts in [m.split(".")]
                for i in range(1, len(parts) + 1)}
    missing = sorted(p for p in lora if p not in prefixes)
    if missing:
        raise AdapterError(f"{origin}: its tensors attach to modules its base does not have "
                           f"({quoted(missing[:3], 160)}); push the adapter with the base it "
                           "was trained on (base='NAME:vN')")


def check_targets(record: Mapping[str, Any], modules: Iterable[str], origin: str) -> None:
    """Every module an adapter targets exists in its base (``modules``: its module paths)."""
    config = lora_config(record, origin)
    modules = set(modules)
    targets = config.target_modules
    if isinstance(targets, str):  # RE2: linear in each path, whatever the record's pattern
        found = bool(patterns.selected(targets, modules, "target_modules", origin))
        shown = targets
    else:
        names = set(targets or ())
        found = bool(names) and all(any(m == t or m.endswith(f".{t}") for m in modules)
                                    for t in names)
        shown = ", ".join(sorted(names))
    if not found:
        raise AdapterError(f"{origin}: the adapter targets modules {quoted(shown, 120)} that "
                           "its base does not have; it was not attached. Push the adapter with "
                           "the base it was trained on (base='NAME:vN')")


def check(record: object, origin: str) -> dict[str, Any]:
    """A manifest's ``adapter`` record, if it is one this registry loads."""
    if not isinstance(record, dict) or record.get("library") != PEFT \
            or record.get("peft_type") != LORA:
        raise AdapterError(f"{origin}: its adapter record names {quoted(record, 120)}, not a "
                           "peft LoRA adapter; it was not used")
    base = record.get("base")
    if not isinstance(base, dict) or not isinstance(base.get("name"), str) \
            or not isinstance(base.get("digest"), str):
        raise AdapterError(f"{origin}: its adapter record names no base; it was not used")
    lora_config(record, origin)
    return record


def lora_config(record: Mapping[str, Any], origin: str, *,
                 modules: Iterable[str] | None = None) -> Any:
    """The record's config as a ``LoraConfig``, every field checked; with ``modules`` (the
    base's module paths) its patterns replaced by the literal paths they select there, which is
    what PEFT is given (patterns.py)."""
    import peft

    config = record.get("config")
    if not isinstance(config, dict):
        raise AdapterError(f"{origin}: its adapter config is {quoted(config)}, not an object")
    kept: dict[str, Any] = {}
    for key, value in config.items():
        if key in _FIELDS:
            kept[key] = value
        elif key not in _IGNORED and value not in (None, {}, [], False, ""):
            raise AdapterError(f"{origin}: its adapter config sets {key!r} to "
                               f"{quoted(value, 80)}, which this registry does not load (only "
                               f"{', '.join(sorted(_FIELDS))})")
    targets = kept.get("target_modules")
    if not isinstance(targets, str) and (not isinstance(targets, list) or not targets):
        raise AdapterError(f"{origin}: its target_modules {quoted(targets, 80)} is not a list "
                           "of module names")
    patterns.check(kept, origin)
    if modules is not None:
        kept = patterns.literal_config(kept, modules, origin)
    if kept.get("task_type") not in _TASK_TYPES:
        raise AdapterError(f"{origin}: its task_type {quoted(kept.get('task_type'))} is unknown")
    if not isinstance(kept.get("init_lora_weights", True), bool):
        raise AdapterError(f"{origin}: init_lora_weights must be true or false (an "
                           "initialisation that reads data is not loaded)")
    try:
        return peft.LoraConfig(**kept)
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"{origin}: its adapter config is invalid ({quoted(str(exc))})") \
            from None


def plain(value: Any) -> Any:
    """A PEFT config dict as JSON: sets become sorted lists, enums their values."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
        return value.value
    return value
