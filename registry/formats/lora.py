"""LoRA adapters (PEFT) as versions over a base version: the adapter format.

An adapter version stores only what PEFT's ``get_peft_model_state_dict`` gives (the LoRA
tensors) and a ``manifest["adapter"]`` record: the library, its version, the adapter config and
the base, by name, version and weights digest. Its base is named at push (``base="gpt2:v1"``) or
found by hashing the base weights of the PEFT model the way the store hashed them, and matching
a stored version's digest. Pull materializes the base like any version (same verified cache)
and attaches the adapter with PEFT (``merge=True``: merged into a plain module); its attach is
recorded and replayed (``peft/replay.py``), its LoRA layers copied (``peft/copies.py``).

The record is untrusted: ``peft/config.py`` checks it (an allow list of plain fields, ranks
against the stored tensors, targets in the base) and ``peft/patterns.py`` matches its patterns
in linear time before PEFT touches anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from .. import attachments
from ..errors import AdapterError, BaseNotFoundError, NotFoundError, quoted
from ..io import prefault, safewrite
from ..io.digests import version_digest
from ..io.weights import load_shard, safetensors_header, tensor_bytes, write_safetensors
from ..model.devices import DtypeRequest, parse_dtype
from ..model.metaparams import empty_parameters
from ..refs import Ref
from .base import Bases
from .peft.config import (
    LORA,
    PEFT,
    check,
    check_modules,
    check_targets,
    check_tensors,
    lora_config,
    plain,
)
from .peft.copies import copying
from .peft.replay import begin

LIBRARY = PEFT
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter(model: object) -> bool:
    """Whether ``model`` is a PEFT model (PEFT is already imported if it is)."""
    peft = sys.modules.get(PEFT)
    return peft is not None and isinstance(model, peft.PeftModel)


@dataclass
class Captured:
    """What push stores of a PEFT model: its LoRA tensors and the manifest's ``adapter``
    section (the base version included), and the name of that base."""

    tensors: dict[str, torch.Tensor]
    record: dict[str, Any]
    base_name: str


def flatten(model: object, bases: Bases,
            stored_tensors: Callable[[nn.Module, Mapping[str, Any]], Mapping[str, torch.Tensor]]
            ) -> Captured | None:
    """The adapter of a PEFT model over its base version (None for any other model): the one
    ``bases.named`` gives once its modules fit, else the stored version whose weights are the
    PEFT model's base weights, as ``stored_tensors`` (the push's own flatten) stores them."""
    if not is_adapter(model):
        return None
    tensors, record, base = capture(model)
    if bases.named is not None and bases.resolve is not None:
        found = bases.resolve(bases.named)
        check_targets(record, {k.rpartition(".")[0] for k in found.manifest["tensors"]},
                      f"{found.name}:v{found.version}")
    else:
        # A quantized base (LoRA over torchao int8, as QLoRA trains): matched in its stored
        # form, the components its format's flatten gives, as its own push stored them.
        found = find_base(stored_tensors(base, base_tensors(base)), bases.versions(),
                          type(base).__name__)
    return Captured(tensors, {**record, "base": base_entry(found)}, found.name)


def capture(model: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], nn.Module]:
    """The adapter tensors and record of a PEFT model with one LoRA adapter, and its base."""
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
              "config": plain(config.to_dict())}
    lora_config(record, "push")  # what pull will accept, refused now rather than then
    return tensors, record, model.get_base_model()


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


def base_entry(record: Any) -> dict[str, Any]:
    return {"name": record.name, "version": record.version, "digest": record.digest}


# -- pull ------------------------------------------------------------------------------------

def pull(manifest: Mapping[str, Any], origin: str, resolve: Callable[[Ref], Any],
         pull_base: Callable[[Any], nn.Module],
         read: Callable[[torch.device], dict[str, torch.Tensor]], *, merge: bool,
         floats: bool = False, pulled_as: Hashable | None = None) -> nn.Module:
    """An adapter version checked (:func:`checked`) and pulled on its base
    (:meth:`Adapter.pull`)."""
    return checked(manifest, origin).pull(resolve, pull_base, read, merge=merge, floats=floats,
                                          pulled_as=pulled_as)


def checked(manifest: Mapping[str, Any], origin: str) -> Adapter:
    """An adapter version's record checked against its stored tensors (their manifest specs),
    before anything is built."""
    record = check(manifest["adapter"], origin)
    return Adapter(record, origin, check_tensors(record, manifest["tensors"], origin))


@dataclass(frozen=True)
class Adapter:
    """An adapter version's checked record: its base, and the adapter attached to it at pull
    or written as PEFT's directory."""

    record: dict[str, Any]
    origin: str
    modules: dict[str, int]  # the LoRA modules' ranks, by module path

    @property
    def base(self) -> Ref:
        return Ref(self.record["base"]["name"], digest=self.record["base"]["digest"])

    def pull(self, resolve: Callable[[Ref], Any], pull_base: Callable[[Any], nn.Module],
             read: Callable[[torch.device], dict[str, torch.Tensor]], *, merge: bool,
             floats: bool = False, pulled_as: Hashable | None = None) -> nn.Module:
        """The adapter on its base: the base pulled (``pull_base``, the same pipeline and
        cache as any pull), the adapter's tensors read onto the base's device (``read``, in
        the dtypes the pull's rule gives their stored ones, as the base's) and attached.
        ``floats``: the pull asked for a float dtype, which dequantizes a quantized base.
        ``pulled_as``: how the base is pulled (device, dtype...), where that and its version
        fix its structure: PEFT's attach is then recorded once and replayed (peft/replay.py);
        None: PEFT attaches each time."""
        spec, origin = self.record, self.origin
        try:
            base = resolve(self.base)
        except NotFoundError:
            raise BaseNotFoundError(
                f"the base of {origin} ({spec['base']['name']}@{spec['base']['digest']}) is not "
                "stored: push that base model again, then pull the adapter") from None
        check_modules(self.modules, base.manifest["tensors"], origin)  # before it is built
        scheme = base.manifest.get("quantization")
        if merge and scheme is not None and not floats:
            # Folding the adapter into quantized weights would quantize them again with a
            # config the version does not hold (PEFT needs the one transformers loaded them
            # with).
            raise AdapterError(
                f"{origin}: merge=True folds the adapter into its base's weights, and its base "
                f"{base.name}:v{base.version} is quantized ({quoted(scheme.get('method'))}); "
                "pull with dtype='float32' (or 'bfloat16') and merge=True for a merged float "
                "model, or without merge for the adapter over the quantized base")
        with prefault.held():  # PEFT's injection first, then the base's pages (prefault.py)
            module = pull_base(base)
            target = next(module.parameters()).device
            key = None if pulled_as is None else (
                pulled_as, base.digest, json.dumps(spec["config"], sort_keys=True),
                torch.get_default_dtype(), torch.get_default_device())
            return attach(module, read(target), spec, origin, merge=merge, replay=key)

    def write_pretrained(self, manifest: Mapping[str, Any],
                         open_blob: Callable[[str, int], BinaryIO],
                         dest_dir: str | os.PathLike[str], dtype: DtypeRequest) -> Path:
        """Write the version as the directory ``PeftModel.from_pretrained`` loads on its base:
        ``adapter_config.json`` and ``adapter_model.safetensors`` (keys as PEFT saves them),
        its floats cast to ``dtype`` where one is given ("auto": as stored)."""
        requested = parse_dtype(dtype)

        def dtype_for(_key: str, stored: torch.dtype, _device: torch.device) -> torch.dtype:
            return requested if requested is not None and stored.is_floating_point else stored

        root = safewrite.folder(Path(dest_dir))  # one level at a time, no link followed out
        tensors: dict[str, torch.Tensor] = {}
        specs = manifest["tensors"]
        for f in manifest["files"]:
            keys = f.get("tensors", list(specs))
            with open_blob(f["digest"], f["size"]) as source:  # the very file that was verified
                tensors.update(load_shard(source, {k: specs[k] for k in keys},
                                          lambda _k: torch.device("cpu"), dtype_for,
                                          origin=self.origin))
        with safewrite.replacing(root / ADAPTER_WEIGHTS) as fh:
            write_safetensors({k: t.contiguous() for k, t in tensors.items()}, fh)
        base = self.record["base"]
        config = {**self.record["config"], "peft_type": LORA,
                  "base_model_name_or_path": f"{base['name']}:v{base.get('version')}"}
        attachments.write_bytes(root / ADAPTER_CONFIG,
                                (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
        return root


def attach(base: nn.Module, tensors: Mapping[str, torch.Tensor], record: Mapping[str, Any],
           origin: str, *, merge: bool, replay: Hashable | None = None) -> nn.Module:
    """``base`` with the adapter attached (a ``PeftModel``), or merged into it (``merge``).
    ``replay``: the key under which PEFT's attach is recorded and replayed (peft/replay.py)."""
    import peft

    paths = [name for name, _ in base.named_modules()]
    check_targets(record, paths, origin)  # config checked

    # LoRA layers are created on meta with their init skipped (metaparams.empty_parameters):
    # the stored tensors replace them all (in their stored dtype, or as PEFT's load casts them),
    # so PEFT's upcast of the new meta parameters to float32 would be undone: it is skipped
    # (autocast_adapter_dtype=False; ~0.4 ms of a 12-layer adapter's pull). PEFT builds one
    # LoRA layer of each kind and the others are copies of it (copies.py).
    step = begin(base, replay)
    model: Any = step.model
    if model is None:  # PEFT's attach, where it is not replayed
        config = lora_config(record, origin, modules=paths)  # no record pattern reaches PEFT
        with empty_parameters(), copying():
            model = peft.get_peft_model(base, config, low_cpu_mem_usage=True,
                                        autocast_adapter_dtype=False)
        # In eval mode before it is recorded, so a replay gives it in eval mode (a base pulled
        # for a replay key is in eval mode already: nothing of it changes) and the walk over
        # every module that eval() is, ~0.3 ms of a 12-layer adapter's pull, is not repeated.
        model.eval()
        step.done(model)  # remembered, or recorded for the next pull under the same key
    if not _assign_plain_lora(dict(model.named_modules()), tensors):
        result: Any = peft.set_peft_model_state_dict(model, dict(tensors),
                                                     low_cpu_mem_usage=True)
        lost = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or lost:
            raise AdapterError(
                f"{origin}: the stored adapter tensors do not fit its config on the base "
                f"(unexpected {sorted(result.unexpected_keys)[:3]}, missing {lost[:3]}); push "
                "the adapter again")
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
