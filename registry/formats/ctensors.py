"""compressed-tensors packed-int versions: a transformers model loaded (or built) with a
``CompressedTensorsConfig`` whose format is ``pack-quantized`` (int1..int8 weights, by group or
by channel, packed eight 4-bit values to an int32).

Such a model's state dict is already plain tensors (``weight_packed`` int32, ``weight_scale``,
``weight_shape``, ``weight_zero_point`` when asymmetric): push stores them as they are, and
packs a module compressed-tensors has decompressed (after a first forward) again with the
library's own compressor. The record holds the transformers ``quantization_config`` and each
packed module's config group and logical weight shape.

Pull builds the float model from its recorded config, lets compressed-tensors give the
quantized modules their packed layout (``apply_quantization_config`` and ``compress_model``,
as transformers' own loader does) and loads the stored components into it; compressed-tensors
unpacks them on the first forward. ``dtype=`` unpacks them into float weights on load instead
(the compressor's ``decompress``), and the model stays a plain float model.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..errors import QuantizationError, quoted
from ..model.devices import dtype_name
from .base import Flat, Read, ReadBy, Runs, Steps
from .common import (
    MAX_CONFIG_CHARS,
    Checked,
    keep_stored,
    quantization_record,
)

log = logging.getLogger(__name__)
LIBRARY = "compressed-tensors"
PACK_QUANTIZED = "pack-quantized"
# It unpacks int1..int8 groups with plain torch ops wherever torch runs.
METHODS: dict[str, Runs] = {PACK_QUANTIZED: Runs(cpu=True, cuda=(0, 0))}
PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


def packed_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The submodules compressed-tensors quantized (they carry its ``quantization_scheme``)."""
    return [(p, m) for p, m in module.named_modules()
            if type(getattr(m, "quantization_scheme", None)).__module__.startswith(
                "compressed_tensors.")]


def flatten(module: nn.Module, state: Mapping[str, Any]) -> Flat | None:
    """The stored form of a model with packed modules (else None): its components as they are,
    a decompressed module packed again, and the record: the transformers quantization_config,
    each packed module's config group and logical weight shape."""
    packed = packed_modules(module)
    if not packed:
        return None
    import compressed_tensors
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    hf: Any = getattr(getattr(module, "config", None), "quantization_config", None)
    config = json.loads(json.dumps(hf.to_dict(), default=str)) if hasattr(hf, "to_dict") else {}
    groups = config.get("config_groups") or {}
    if config.get("quant_method") != LIBRARY or config.get("format") != PACK_QUANTIZED:
        raise QuantizationError(
            f"the model has compressed-tensors modules but its config's quantization_config is "
            f"{config.get('quant_method')!r} format {config.get('format')!r}; only "
            f"{PACK_QUANTIZED!r} is stored: load the checkpoint with transformers "
            "(from_pretrained), or save it with format='pack-quantized'")
    compressor = BaseCompressor.get_value_from_registry(PACK_QUANTIZED)
    schemes = {n: QuantizationScheme.model_validate(g).model_dump() for n, g in groups.items()}
    out = dict(state)
    modules: dict[str, dict[str, Any]] = {}
    for path, sub in packed:
        scheme: Any = sub.quantization_scheme
        dumped = scheme.model_dump()
        group = next((n for n, s in schemes.items() if s["weights"] == dumped["weights"]
                      and s["targets"] == dumped["targets"]), None)
        if group is None or dumped.get("input_activations") is not None:
            raise QuantizationError(
                f"module {path!r} is quantized with a scheme none of the config's groups "
                f"({sorted(groups)}) holds, or quantizes activations; push a model loaded "
                "from one pack-quantized, weight-only checkpoint")
        local = {k[len(path) + 1:]: out.pop(k) for k in list(out)
                 if k.startswith(f"{path}.") and "." not in k[len(path) + 1:]}
        if "weight_packed" not in local:  # decompressed by a forward: the library packs it again
            local = dict(compressor.compress(local, scheme))
        out.update({f"{path}.{k}": v.detach() for k, v in local.items()})
        modules[path] = {"group": group, "shape": [int(n) for n in local["weight_shape"]]}
    # The model's own key order: components where the model holds them, those packed here
    # where the module's first key was (a stable sort keeps them in the compressor's order).
    rank = {k: i for i, k in enumerate(state)}
    first: dict[str, int] = {}
    for k, i in rank.items():
        first.setdefault(k.rpartition(".")[0], i)
    out = {k: out[k] for k in sorted(out, key=lambda k: rank.get(
        k, first.get(k.rpartition(".")[0], len(rank))))}
    float_params = sum(math.prod(m["shape"]) for m in modules.values()) + sum(
        p.numel() for name, p in {id(p): (n, p) for n, p in module.named_parameters()}.values()
        if name.rpartition(".")[0] not in modules or name.rpartition(".")[2] not in
        (*PARTS, "weight"))
    sizes = sorted({g["weights"]["group_size"] for n, g in groups.items()
                    if n in {m["group"] for m in modules.values()}
                    and g["weights"].get("group_size")})
    record = quantization_record(LIBRARY, compressed_tensors.__version__, PACK_QUANTIZED,
                                 METHODS[PACK_QUANTIZED], out, sizes, float_params)
    record.update(config=config, modules=modules)
    return Flat(out, record, signature(out, modules))


def signature(state: Mapping[str, Any], modules: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The float model's keys and shapes: each packed module's components make its weight."""
    parts = {f"{p}.{c}" for p in modules for c in PARTS}
    out = {k: tuple(v.shape) for k, v in state.items()
           if isinstance(v, torch.Tensor) and k not in parts}
    out.update({f"{p}.weight": tuple(m["shape"]) for p, m in modules.items()})
    return out


# -- the record, untrusted: a transformers quantization_config, checked as data ------------------

_CT_KEYS = frozenset({"config_groups", "quant_method", "kv_cache_scheme", "format", "version",
                      "quantization_status", "global_compression_ratio", "ignore",
                      "moe_sparsity_config", "sparsity_config", "transform_config"})
_CT_GROUP_KEYS = frozenset({"targets", "weights", "input_activations", "output_activations",
                            "format"})
_CT_WEIGHT_KEYS = frozenset({"num_bits", "type", "symmetric", "group_size", "strategy",
                             "dynamic", "actorder", "observer", "observer_kwargs", "scale_dtype",
                             "zp_dtype", "block_structure"})


def check(record: dict[str, Any]) -> str | None:
    """A pack-quantized, weight-only int config whose every value is plain data (the library
    validates it again with pydantic; nothing in it names code), and the modules it packed."""
    config = record.get("config")
    if not isinstance(config, dict) or len(json.dumps(config)) > 16 * MAX_CONFIG_CHARS:
        return f"has a compressed-tensors config {quoted(config, 80)} that is not an object"
    if unknown := sorted(str(k) for k in config if k not in _CT_KEYS):
        return f"has a config key {quoted(unknown[0], 60)} compressed-tensors configs lack"
    if config.get("quant_method") != LIBRARY or config.get("format") != PACK_QUANTIZED:
        return (f"has quant_method {quoted(config.get('quant_method'), 40)} format "
                f"{quoted(config.get('format'), 40)}; only {PACK_QUANTIZED!r} is loaded")
    if any(config.get(k) for k in ("kv_cache_scheme", "sparsity_config", "transform_config",
                                   "moe_sparsity_config")):
        return "quantizes more than weights (kv cache, sparsity or transforms)"
    if not _strings(config.get("ignore") or []):
        return f"has ignore {quoted(config.get('ignore'), 80)}, not a list of names"
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return "has no config_groups"
    for name, group in groups.items():
        if problem := _check_group(group):
            return f"gives group {quoted(name, 40)} {problem}"
    modules = record.get("modules")
    if not isinstance(modules, dict) or not modules:
        return "lists no quantized modules"
    for path, m in modules.items():
        if not isinstance(m, dict) or m.get("group") not in groups or not isinstance(path, str) \
                or not isinstance(m.get("shape"), list) or len(m["shape"]) != 2 \
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**31
                           for n in m["shape"]):
            return f"has a malformed module entry {quoted(path, 80)}: {quoted(m, 80)}"
    return None


def _check_group(group: object) -> str | None:
    if not isinstance(group, dict) or not set(group) <= _CT_GROUP_KEYS:
        return f"{quoted(group, 80)}, not a scheme"
    if group.get("input_activations") is not None or group.get("output_activations") is not None:
        return "quantized activations; only weight-only schemes are loaded"
    if group.get("format") not in (None, PACK_QUANTIZED) or not _strings(group.get("targets")):
        return f"format {quoted(group.get('format'), 40)} or targets that are not names"
    w = group.get("weights")
    if not isinstance(w, dict) or not set(w) <= _CT_WEIGHT_KEYS or w.get("type") != "int" \
            or w.get("num_bits") not in range(1, 9) or w.get("dynamic") not in (False, None) \
            or w.get("strategy") not in ("group", "channel") or w.get("observer_kwargs") \
            or not all(v is None or isinstance(v, (bool, int, float)) or
                       (isinstance(v, str) and len(v) <= 64) for k, v in w.items()
                       if k not in ("observer_kwargs", "block_structure")):
        return f"weights {quoted(w, 120)}, not int1..int8 by group or channel"
    size = w.get("group_size")
    if w["strategy"] == "group" and not (isinstance(size, int) and 0 < size < 2**31):
        return f"group_size {quoted(size)}"
    return None


def _strings(value: object) -> bool:
    return isinstance(value, list) and len(value) <= 1024 and all(
        isinstance(v, str) and len(v) <= 256 for v in value)


# -- pull: the packed layout given to the model --------------------------------------------------

def steps(record: dict[str, Any], manifest: Mapping[str, Any], origin: str) -> Steps:
    """Each packed module's components make its ``weight``, of the recorded logical shape."""
    components = {f"{path}.{c}": f"{path}.weight" for path in record["modules"] for c in PARTS}
    return Steps(origin, METHODS[record["method"]], drop=frozenset(components),
                 logical={f"{p}.weight": m["shape"] for p, m in record["modules"].items()},
                 components=components, format=Packed(record, origin))


def pull(record: dict[str, Any], manifest: Mapping[str, Any], origin: str,
         dequantize: torch.dtype | None, read: ReadBy) -> Read:
    """Pull, this format's one visit (:meth:`~.base.Format.pull`): its :func:`steps`, the
    pipeline's read by them, and what was read rebuilt: the module given compressed-tensors'
    packed layout (or ``pull_state_dict``'s tensors where no module was built)."""
    got = read(steps(record, manifest, origin))
    rebuild = Packed(record, origin)
    return replace(got, state=rebuild.state_dict(got.state, dequantize) if got.module is None
                   else rebuild.rebuild(got.module, got.state, dequantize))


class Packed(Checked):
    """A compressed-tensors version's checked record: the model given compressed-tensors'
    packed layout for its stored components, or the float weights they unpack to."""

    def _schemes(self) -> dict[str, Any]:
        from compressed_tensors.quantization import QuantizationScheme

        return {n: QuantizationScheme.model_validate(g)
                for n, g in self.record["config"]["config_groups"].items()}

    def _checked(self, state: Mapping[str, Any]) -> None:
        """Each module's components have the shapes its group's config gives its weight."""
        groups = self.record["config"]["config_groups"]
        for path, m in self.record["modules"].items():
            w = groups[m["group"]]["weights"]
            rows, cols = m["shape"]
            per_row = -(-cols // w["group_size"]) if w["strategy"] == "group" else 1
            want = {"weight_packed": [rows, -(-cols * w["num_bits"] // 32)],
                    "weight_scale": [rows, per_row], "weight_shape": [2]}
            got = {c: list(state[f"{path}.{c}"].shape) for c in want if f"{path}.{c}" in state}
            shape = state.get(f"{path}.weight_shape")
            if got != want or shape is None or shape.tolist() != m["shape"]:
                raise QuantizationError(
                    f"{self.origin}: the packed tensors of {path!r} ({got}) disagree with its "
                    f"quantization config (int{w['num_bits']} {w['strategy']} of a "
                    f"{rows}x{cols} weight needs {want}); push the model again")

    def rebuild(self, module: nn.Module, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        """The stored components, ``module`` given compressed-tensors' packed layout for them;
        float weights in the float module when ``dequantize``."""
        if dequantize is not None:
            return self.state_dict(state, dequantize)
        self._checked(state)
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import apply_quantization_config
        from transformers.utils.quantization_config import CompressedTensorsConfig

        hf = CompressedTensorsConfig.from_dict(dict(self.record["config"]))
        compressor = ModelCompressor.from_compression_config(hf)
        apply_quantization_config(module, compressor.quantization_config.model_copy(deep=True),
                                  run_compressed=False)
        found = {p for p, _ in packed_modules(module)}
        if found != set(self.record["modules"]):
            raise QuantizationError(
                f"{self.origin}: its quantization config quantizes {sorted(found)[:3]} in this "
                f"model, not the packed modules {sorted(self.record['modules'])[:3]}; pull with "
                "the model it was pushed from")
        compressor.compress_model(module)
        config: Any = getattr(module, "config", None)
        if config is not None:  # save_pretrained writes it back
            config.quantization_config = hf
        return state

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """The packed components as a compressed model's own ``state_dict()`` holds them, or,
        when ``dequantize``, the float weights the compressor unpacks (other floats cast)."""
        self._checked(state)
        if dequantize is None:
            return state
        from compressed_tensors.compressors import BaseCompressor

        log.info("%s: dequantizing %s to %s on load, as dtype=%r asked", self.origin, self.name,
                 dtype_name(dequantize), dtype_name(dequantize))
        compressor = BaseCompressor.get_value_from_registry(PACK_QUANTIZED)
        schemes = self._schemes()
        out = {k: (v.to(dequantize) if isinstance(v, torch.Tensor) and v.is_floating_point()
                   else v) for k, v in state.items()}
        for path, m in self.record["modules"].items():
            local = {c: state[f"{path}.{c}"] for c in PARTS if f"{path}.{c}" in state}
            for c in local:
                del out[f"{path}.{c}"]
            weight = compressor.decompress(local, schemes[m["group"]])["weight"]
            out[f"{path}.weight"] = weight.to(dequantize)
        return out

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """Its components are the checkpoint's own tensors, written as stored, under the
        recorded ``quantization_config``."""
        keep_stored(self.origin, requested)
        return dict(self.record["config"]), None
