"""torch.ao ``quantize_dynamic`` Linear modules (qint8), stored as plain tensors.

Push: each packed weight is stored as its int8 values, scales and zero points (per tensor or per
channel) beside its float bias, and the record lists each module's path, shape and scheme.
Pull: the same dynamic modules are swapped into the float model and packed again; they run on
the CPU engines (fbgemm, qnnpack, x86) alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..errors import QuantizationError, quoted
from ..model.devices import dtype_name
from .base import Flat, Read, ReadBy, Runs, Shell, Steps
from .common import Checked, param_count, quantization_record

log = logging.getLogger(__name__)

LIBRARY = "torch.ao"
QINT8 = "dynamic_qint8"
METHODS: dict[str, Runs] = {QINT8: Runs(cpu=True, cuda=None)}
_PARTS = ("weight_qdata", "weight_scale", "weight_zero_point")


def is_dynamic_linear(module: object) -> bool:
    try:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    except ImportError:  # pragma: no cover - torch without torch.ao
        return False
    return isinstance(module, DynamicLinear)


# -- push: dynamic Linears -> plain tensors + record ---------------------------------------------

def flatten(module: nn.Module, state: Mapping[str, Any]) -> Flat | None:
    """The stored form of ``module`` when it holds dynamic Linears, else None; a dtype or
    qscheme other than qint8 affine is refused."""
    dynamic = [(p, m) for p, m in module.named_modules() if is_dynamic_linear(m)]
    if not dynamic:
        return None
    prefixes = tuple(f"{p}." for p, _ in dynamic)
    out: dict[str, Any] = {k: v for k, v in state.items() if not k.startswith(prefixes)}
    modules: list[dict[str, Any]] = []
    stored: dict[str, torch.Tensor] = {}
    float_params = param_count(module)
    for path, sub in dynamic:
        weight, bias = sub._packed_params._weight_bias()
        float_params += weight.numel() + (bias.numel() if bias is not None else 0)
        if weight.dtype != torch.qint8:
            raise QuantizationError(
                f"module {path!r} is a dynamic Linear of {weight.dtype}; only qint8 is stored "
                "(quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8))")
        scheme = weight.qscheme()
        entry: dict[str, Any] = {"path": path, "in_features": int(sub.in_features),
                                 "out_features": int(sub.out_features),
                                 "bias": bias is not None}
        parts = {"weight_qdata": weight.int_repr()}
        if scheme == torch.per_tensor_affine:
            entry["qscheme"] = "per_tensor_affine"
            parts["weight_scale"] = torch.tensor(weight.q_scale(), dtype=torch.float64)
            parts["weight_zero_point"] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
        elif scheme == torch.per_channel_affine:
            entry["qscheme"] = "per_channel_affine"
            entry["axis"] = int(weight.q_per_channel_axis())
            parts["weight_scale"] = weight.q_per_channel_scales().to(torch.float64)
            parts["weight_zero_point"] = weight.q_per_channel_zero_points().to(torch.int64)
        else:
            raise QuantizationError(f"module {path!r} uses {scheme}, which is not stored; use "
                                    "per-tensor or per-channel affine qint8")
        if bias is not None:
            parts["bias"] = bias.detach()
        for part, t in parts.items():
            stored[f"{path}.{part}"] = t.contiguous()
        modules.append(entry)
    out.update(stored)
    record = quantization_record(LIBRARY, torch.__version__, QINT8, METHODS[QINT8], out, set(),
                                 float_params)
    record.update(modules=modules)
    return Flat(out, record)


# -- the record, untrusted -----------------------------------------------------------------------

def check(record: dict[str, Any]) -> str | None:
    """Why a torch.ao record's module list is malformed, or None."""
    modules = record.get("modules")
    if not isinstance(modules, list) or not modules:
        return "lists no quantized modules"
    for m in modules:
        if not isinstance(m, dict) or not isinstance(m.get("path"), str) \
                or m.get("qscheme") not in ("per_tensor_affine", "per_channel_affine") \
                or not all(isinstance(m.get(k), int) and not isinstance(m.get(k), bool)
                           and 0 < m[k] < 2**31 for k in ("in_features", "out_features")) \
                or not isinstance(m.get("bias"), bool) \
                or m.get("axis", 0) not in (0, 1):
            return f"has a malformed module entry {quoted(m)}"
    return None


def steps(record: dict[str, Any], manifest: Mapping[str, Any], origin: str) -> Steps:
    """The record's modules against the stored tensors (their manifest specs), before a module
    is built: each one's components stored, of the shapes and dtype its entry gives, each
    module listed once."""
    seen: set[str] = set()
    tensors = manifest.get("tensors", {})
    for m in record["modules"]:
        p = m["path"]
        shape = [m["out_features"], m["in_features"]]
        scale = [shape[m.get("axis", 0)]] if m["qscheme"] == "per_channel_affine" else []
        want = {f"{p}.weight_qdata": (shape, "int8"), f"{p}.weight_scale": (scale, None),
                f"{p}.weight_zero_point": (scale, None)}
        if m["bias"]:
            want[f"{p}.bias"] = ([shape[0]], None)
        problems = [f"{k} is not stored" if k not in tensors else
                    f"{k} is {tensors[k]['dtype']} {tensors[k]['shape']}"
                    for k, (dims, dtype) in want.items()
                    if k not in tensors or list(tensors[k]["shape"]) != dims
                    or (dtype is not None and tensors[k]["dtype"] != dtype)]
        if not m["bias"] and f"{p}.bias" in tensors:
            problems.append(f"{p}.bias is stored but its entry says no bias")
        if p in seen:
            problems.append(f"{p!r} is listed twice")
        seen.add(p)
        if problems:
            raise QuantizationError(
                f"{origin}: its torch.ao record lists module {quoted(p, 120)} "
                f"({m['qscheme']}, {shape[1]} -> {shape[0]}), which its stored tensors "
                f"do not hold ({'; '.join(problems[:3])}); push the model again")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    modules = record["modules"]
    drop = {f"{m['path']}.{c}" for m in modules
            for c in (*_PARTS, *([] if m["bias"] else ["bias"]))}
    logical = {f"{m['path']}.weight": [m["out_features"], m["in_features"]] for m in modules}
    logical.update({f"{m['path']}.bias": [m["out_features"]] for m in modules if m["bias"]})
    shells = {m["path"]: Shell(DynamicLinear, functools.partial(
        nn.Linear, m["in_features"], m["out_features"], bias=m["bias"], device="meta"))
        for m in modules}
    return Steps(origin, METHODS[record["method"]], drop=frozenset(drop), logical=logical,
                 components={f"{m['path']}.{c}": f"{m['path']}.weight" for m in modules
                             for c in _PARTS},
                 shells=shells, format=Linears(record, origin))


def pull(record: dict[str, Any], manifest: Mapping[str, Any], origin: str,
         dequantize: torch.dtype | None, read: ReadBy) -> Read:
    """Pull, this format's one visit (:meth:`~.base.Format.pull`): its :func:`steps`, the
    pipeline's read by them, and what was read rebuilt: the dynamic Linears swapped into the
    module (or ``pull_state_dict``'s tensors where no module was built)."""
    got = read(steps(record, manifest, origin))
    rebuild = Linears(record, origin)
    return replace(got, state=rebuild.state_dict(got.state, dequantize) if got.module is None
                   else rebuild.rebuild(got.module, got.state, dequantize))


# -- pull: the dynamic Linears swapped in --------------------------------------------------------

class Linears(Checked):
    """A torch.ao version's checked record: each module's components make its packed weight,
    swapped into the model as a dynamic Linear (a ``model=`` holding them gets float shells
    first, :class:`~registry.formats.base.Shell`)."""

    def state_dict(self, state: dict[str, Any], dequantize: torch.dtype | None) -> dict[str, Any]:
        """Packed params live only in their modules, so the stored components come back as
        floats when asked, else are refused."""
        if dequantize is not None:
            return self.rebuild(nn.Module(), state, dequantize)
        raise QuantizationError(
            f"{self.origin} is quantized with {self.name}, whose weights exist only inside its "
            "dynamic Linear modules: pull the module with registry.pull(ref, model=...), or "
            "pass dtype='float32' to pull_state_dict for dequantized weights")

    def rebuild(self, module: nn.Module, state: dict[str, Any],
                dequantize: torch.dtype | None) -> dict[str, Any]:
        """The dynamic Linear modules swapped into ``module`` with their packed weights, or
        float weights when ``dequantize``."""
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        if dequantize is not None:
            log.info("%s: dequantizing %s to %s on load, as dtype=%s asked", self.origin,
                     self.name, dtype_name(dequantize), repr(dtype_name(dequantize)))
        out = dict(state)
        for m in self.record["modules"]:
            p = m["path"]
            qdata = out.pop(f"{p}.weight_qdata")
            scale = out.pop(f"{p}.weight_scale")
            zero = out.pop(f"{p}.weight_zero_point")
            bias = out.pop(f"{p}.bias", None)
            shape = [m["out_features"], m["in_features"]]
            per_channel = m["qscheme"] == "per_channel_affine"
            want_scale = [shape[m.get("axis", 0)]] if per_channel else []
            if list(qdata.shape) != shape or list(scale.shape) != want_scale \
                    or list(zero.shape) != want_scale or qdata.dtype != torch.int8 \
                    or (bias is not None) != m["bias"] \
                    or (bias is not None and list(bias.shape) != [shape[0]]):
                raise QuantizationError(
                    f"{self.origin}: the packed tensors of {p!r} ({list(qdata.shape)}, scale "
                    f"{list(scale.shape)}) disagree with its config ({m['qscheme']}, "
                    f"{shape[1]} -> {shape[0]}); push the model again")
            if per_channel:
                weight = torch._make_per_channel_quantized_tensor(
                    qdata, scale, zero, m.get("axis", 0))
            else:
                weight = torch._make_per_tensor_quantized_tensor(
                    qdata, float(scale), int(zero))
            if dequantize is not None:
                out[f"{p}.weight"] = weight.dequantize().to(dequantize)
                if bias is not None:
                    out[f"{p}.bias"] = bias.to(dequantize)
                continue
            parent_path, _, attr = p.rpartition(".")
            parent = module.get_submodule(parent_path)
            if not isinstance(parent._modules.get(attr), nn.Linear):
                raise QuantizationError(
                    f"{self.origin}: module {p!r} of the model is a "
                    f"{type(parent._modules.get(attr)).__name__}, not the nn.Linear that was "
                    "quantized; pull with the float model it was quantized from")
            swapped = DynamicLinear(m["in_features"], m["out_features"], bias_=m["bias"],
                                    dtype=torch.qint8)
            parent._modules[attr] = swapped
            out[f"{p}.scale"] = torch.tensor(1.0)
            out[f"{p}.zero_point"] = torch.tensor(0, dtype=torch.long)
            out[f"{p}._packed_params.dtype"] = torch.qint8
            out[f"{p}._packed_params._packed_params"] = (weight, bias)
        if dequantize is not None:
            out = {k: (v.to(dequantize) if isinstance(v, torch.Tensor) and v.is_floating_point()
                       else v) for k, v in out.items()}
        return out
