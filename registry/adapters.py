"""LoRA adapters as versions over a base version.

An adapter version stores only what PEFT's ``get_peft_model_state_dict`` gives (the LoRA
tensors) and a ``manifest["adapter"]`` record: the library, its version, the adapter config and
the base, by name, version and weights digest. Its base is named at push (``base="gpt2:v1"``) or
found by hashing the base weights of the PEFT model the way the store hashed them, and matching
a stored version's digest. Pull materializes the base like any version (same verified cache)
and attaches the adapter with PEFT (``merge=True``: merged into a plain module).

The record is untrusted: the config is rebuilt as a ``LoraConfig`` from an allow list of plain
fields (a field that would load code or data, such as ``megatron_core`` or ``loftq_config``, is
refused), and the targets it names must exist in the base before PEFT touches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from . import adapterpatterns, attachments, loracopies, peftreplay, prefault, safewrite
from .devices import DtypeRequest, parse_dtype
from .digests import version_digest
from .errors import (
    AdapterError,
    BaseNotFoundError,
    NotFoundError,
    quoted,
)
from .formats import table as formats
from .metaparams import empty_parameters
from .refs import Ref
from .weights import load_shard, safetensors_header, tensor_bytes, write_safetensors

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


def is_adapter(model: object) -> bool:
    """Whether ``model`` is a PEFT model (PEFT is already imported if it is)."""
    peft = sys.modules.get(PEFT)
    return peft is not None and isinstance(model, peft.PeftModel)


@dataclass
class Captured:
    """What push stores of a PEFT model, and the base weights it was trained on."""

    tensors: dict[str, torch.Tensor]
    record: dict[str, Any]
    base: nn.Module


def capture(model: Any) -> Captured:
    """The adapter tensors and record of a PEFT model with one LoRA adapter."""
    import peft

    names = list(model.peft_config)
    if len(names) != 1:
        raise AdapterError(f"the PEFT model holds {len(names)} adapters ({names}); push one "
                           "adapter per version (delete_adapter() the others first)")
    config = model.peft_config[names[0]]
    kind = getattr(config.peft_type, "value", config.peft_type)
    if kind != LORA:
        raise AdapterError(f"adapter {names[0]!r} is a {kind} adapter; only LoRA adapters are "
                           "stored")
    tensors = {k: v.detach() for k, v in
               peft.get_peft_model_state_dict(model, adapter_name=names[0]).items()}
    record = {"library": PEFT, "library_version": peft.__version__, "peft_type": LORA,
              "config": _plain(config.to_dict())}
    _lora_config(record, "push")  # what pull will accept, refused now rather than then
    return Captured(tensors, record, model.get_base_model())


def base_tensors(base: nn.Module) -> dict[str, torch.Tensor]:
    """The base weights under a PEFT model: its state dict without LoRA tensors and with the
    ``base_layer`` step PEFT inserts removed."""
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        out[".".join(p for p in parts if p != "base_layer")] = value
    return out


def shard_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """The digest a weights shard holding exactly ``tensors`` has in the store."""
    parts = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
    order, head = safetensors_header(parts)
    h = hashlib.sha256(head)
    for key in order:
        h.update(tensor_bytes(parts[key]))
    return f"sha256:{h.hexdigest()}"


def matches(manifest: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``tensors`` (normalized base weights) are the weights a version stores."""
    specs = manifest["tensors"]
    if set(specs) != set(tensors) or any(
            list(tensors[k].shape) != spec["shape"]
            or str(tensors[k].dtype).removeprefix("torch.") != spec["dtype"]
            for k, spec in specs.items()):
        return False
    digests = [shard_digest({k: tensors[k] for k in f["tensors"]}) for f in manifest["files"]]
    return version_digest(digests) == manifest["digest"]


def find_base(tensors: Mapping[str, torch.Tensor], candidates: Iterable[Any],
              what: str) -> Any:
    """The first candidate version (newest first) whose stored weights are ``tensors``."""
    for record in candidates:
        if "adapter" not in record.manifest and matches(record.manifest, tensors):
            return record
    raise BaseNotFoundError(
        f"the base model of this adapter ({what}) matches no stored version: push the base "
        "model first (the one get_peft_model wrapped, before training the adapter), then push "
        "the adapter, or name its base with base='NAME:vN'")


def base_of(adapter: Captured, named: Any | None,
            versions: Callable[[], Iterable[Any]]) -> Any:
    """The base version of a pushed adapter: ``named`` once its modules fit, else the stored
    version whose weights are the PEFT model's base weights."""
    if named is not None:
        check_targets(adapter.record, {k.rpartition(".")[0] for k in named.manifest["tensors"]},
                      f"{named.name}:v{named.version}")
        return named
    # A quantized base (LoRA over torchao int8, as QLoRA trains): matched in its stored form,
    # the components its format's flatten gives, as its own push stored them.
    stored = formats.stored_tensors(adapter.base, base_tensors(adapter.base))
    return find_base(stored, versions(), type(adapter.base).__name__)


def pull(record: Any, resolve: Callable[[Ref], Any], pull_base: Callable[[Any], nn.Module],
         read: Callable[[torch.device], dict[str, torch.Tensor]], *, merge: bool,
         floats: bool = False, pulled_as: Hashable | None = None) -> nn.Module:
    """An adapter version: its base pulled (``pull_base``, the same pipeline and cache as any
    pull), its tensors read onto the base's device (``read``, in the dtypes the pull's rule
    gives their stored ones, as the base's) and attached. ``floats``: the pull asked for a
    float dtype, which dequantizes a quantized base. ``pulled_as``: how the base is pulled
    (device, dtype...), where that and its version fix its structure: PEFT's attach is then
    recorded once and replayed (peftreplay.py); None: PEFT attaches each time."""
    origin = f"{record.name}:v{record.version}"
    spec = check(record.manifest["adapter"], origin)
    lora_modules = check_tensors(spec, record.manifest["tensors"], origin)
    try:
        base = resolve(Ref(spec["base"]["name"], digest=spec["base"]["digest"]))
    except NotFoundError:
        raise BaseNotFoundError(
            f"the base of {origin} ({spec['base']['name']}@{spec['base']['digest']}) is not "
            "stored: push that base model again, then pull the adapter") from None
    check_modules(lora_modules, base.manifest["tensors"], origin)  # before the base is built
    scheme = base.manifest.get("quantization")
    if merge and scheme is not None and not floats:
        # Folding the adapter into quantized weights would quantize them again with a config
        # the version does not hold (PEFT needs the one transformers loaded them with).
        raise AdapterError(
            f"{origin}: merge=True folds the adapter into its base's weights, and its base "
            f"{base.name}:v{base.version} is quantized ({quoted(scheme.get('method'))}); pull "
            "with dtype='float32' (or 'bfloat16') and merge=True for a merged float model, or "
            "without merge for the adapter over the quantized base")
    with prefault.held():  # PEFT's injection first, then the base's pages (prefault.py)
        module = pull_base(base)
        target = next(module.parameters()).device
        replay = None if pulled_as is None else (
            pulled_as, base.digest, json.dumps(spec["config"], sort_keys=True),
            torch.get_default_dtype(), torch.get_default_device())
        return attach(module, read(target), spec, origin, merge=merge, replay=replay)


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
        if adapterpatterns.selected(key, [path], "rank_pattern key", origin, suffix=True):
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


def base_entry(record: Any) -> dict[str, Any]:
    return {"name": record.name, "version": record.version, "digest": record.digest}


def check_targets(record: Mapping[str, Any], modules: Iterable[str], origin: str) -> None:
    """Every module an adapter targets exists in its base (``modules``: its module paths)."""
    config = _lora_config(record, origin)
    modules = set(modules)
    targets = config.target_modules
    if isinstance(targets, str):  # RE2: linear in each path, whatever the record's pattern
        found = bool(adapterpatterns.selected(targets, modules, "target_modules", origin))
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


def attach(base: nn.Module, tensors: Mapping[str, torch.Tensor], record: Mapping[str, Any],
           origin: str, *, merge: bool, replay: Hashable | None = None) -> nn.Module:
    """``base`` with the adapter attached (a ``PeftModel``), or merged into it (``merge``).
    ``replay``: the key under which PEFT's attach is recorded and replayed (peftreplay.py)."""
    import peft

    paths = [name for name, _ in base.named_modules()]
    check_targets(record, paths, origin)  # config checked

    # LoRA layers are created on meta with their init skipped (metaparams.empty_parameters):
    # the stored tensors replace them all (in their stored dtype, or as PEFT's load casts them),
    # so PEFT's upcast of the new meta parameters to float32 would be undone: it is skipped
    # (autocast_adapter_dtype=False; ~0.4 ms of a 12-layer adapter's pull). PEFT builds one
    # LoRA layer of each kind and the others are copies of it (loracopies.py).
    def inject(module: nn.Module) -> nn.Module:  # PEFT's attach, where it is not replayed
        config = _lora_config(record, origin, modules=paths)  # no record pattern reaches PEFT
        with empty_parameters(), loracopies.copying():
            injected: nn.Module = peft.get_peft_model(module, config, low_cpu_mem_usage=True,
                                                      autocast_adapter_dtype=False)
        return injected

    model: Any = peftreplay.attached(base, replay, inject)
    if not _assign_plain_lora(dict(model.named_modules()), tensors):
        result: Any = peft.set_peft_model_state_dict(model, dict(tensors),
                                                     low_cpu_mem_usage=True)
        lost = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or lost:
            raise AdapterError(
                f"{origin}: the stored adapter tensors do not fit its config on the base "
                f"(unexpected {sorted(result.unexpected_keys)[:3]}, missing {lost[:3]}); push "
                "the adapter again")
    model.eval()
    if merge:
        return model.merge_and_unload().eval()
    return model


def _assign_plain_lora(modules: Mapping[str, nn.Module],
                       tensors: Mapping[str, torch.Tensor]) -> bool:
    """Assign plain LoRA tensors (``<path>.lora_A.weight``, ``<path>.lora_B.weight``) to the
    default adapter's parameters, as ``set_peft_model_state_dict`` would, without its walks
    over the whole model's state dict (most of an adapter pull's time); False, assigning
    nothing, for anything else (DoRA, saved modules, biases), which PEFT then loads.
    ``modules``: the model's ``named_modules()``, one walk that finds each holder and counts the
    LoRA parameters (``get_submodule`` per key and ``named_parameters`` cost 3x more)."""
    plan: list[tuple[nn.Module, torch.Tensor, bool]] = []
    for key, tensor in tensors.items():
        head, _, leaf = key.rpartition(".")
        owner, _, part = head.rpartition(".")
        if leaf != "weight" or part not in ("lora_A", "lora_B"):
            return False
        holder = modules.get(f"{owner}.{part}.default")
        if holder is None:
            return False
        old = holder._parameters.get("weight")
        if old is None or tuple(old.shape) != tuple(tensor.shape):
            return False
        # On its base layer's device, as PEFT places it: a base spread by a device map holds
        # layers on several devices, and the adapter was read onto the first one's.
        weight = getattr(modules.get(f"{owner}.base_layer"), "weight", None)
        if isinstance(weight, torch.Tensor) and weight.device != tensor.device:
            tensor = tensor.to(weight.device)
        plan.append((holder, tensor, old.requires_grad))
    # Every LoRA parameter of the model must be one of those assigned.
    lora = {id(p) for name, module in modules.items() for leaf, p in module._parameters.items()
            if p is not None and ".lora_" in (f"{name}.{leaf}" if name else leaf)}
    if len(lora) != len(plan):
        return False
    for holder, tensor, grad in plan:
        holder._parameters["weight"] = nn.Parameter(tensor, requires_grad=grad)
    return True


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
    _lora_config(record, origin)
    return record


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def write_pretrained(manifest: Mapping[str, Any], open_blob: Callable[[str, int], BinaryIO],
                     dest_dir: str | os.PathLike[str], dtype: DtypeRequest, origin: str) -> Path:
    """Write an adapter version as the directory ``PeftModel.from_pretrained`` loads on its
    base: ``adapter_config.json`` and ``adapter_model.safetensors`` (keys as PEFT saves them),
    its floats cast to ``dtype`` where one is given ("auto": as stored)."""
    record = check(manifest["adapter"], origin)
    check_tensors(record, manifest["tensors"], origin)
    requested = parse_dtype(dtype)

    def dtype_for(_key: str, stored: torch.dtype, _device: torch.device) -> torch.dtype:
        return requested if requested is not None and stored.is_floating_point else stored

    root = safewrite.folder(Path(dest_dir))  # one level at a time, no link followed out
    tensors: dict[str, torch.Tensor] = {}
    for f in manifest["files"]:
        keys = f.get("tensors", list(manifest["tensors"]))
        with open_blob(f["digest"], f["size"]) as source:  # the very file that was verified
            tensors.update(load_shard(source, {k: manifest["tensors"][k] for k in keys},
                                      lambda _k: torch.device("cpu"), dtype_for, origin=origin))
    with safewrite.replacing(root / ADAPTER_WEIGHTS) as fh:
        write_safetensors({k: t.contiguous() for k, t in tensors.items()}, fh)
    base = record["base"]
    config = {**record["config"], "peft_type": LORA,
              "base_model_name_or_path": f"{base['name']}:v{base.get('version')}"}
    attachments.write_bytes(root / ADAPTER_CONFIG,
                            (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return root


def _lora_config(record: Mapping[str, Any], origin: str, *,
                 modules: Iterable[str] | None = None) -> Any:
    """The record's config as a ``LoraConfig``, every field checked; with ``modules`` (the
    base's module paths) its patterns replaced by the literal paths they select there, which is
    what PEFT is given (adapterpatterns.py)."""
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
    adapterpatterns.check(kept, origin)
    if modules is not None:
        kept = adapterpatterns.literal_config(kept, modules, origin)
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


def _plain(value: Any) -> Any:
    """A PEFT config dict as JSON: sets become sorted lists, enums their values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
        return value.value
    return value

