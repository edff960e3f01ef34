"""What every export format shares: the request and its cache key, inputs, verification, errors.

An export request is normalized into :class:`ExportRequest` before anything runs; its ``key`` (a
sha256 of the canonical parameters) names the artifact among a version's exports, so the same
parameters find the stored artifact without exporting again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ExportError, SettingsError, quoted
from .formats import FORMATS, SUFFIXES, ExportFormat  # noqa: F401  (their old home)

# Largest |artifact - module| accepted per unit of output magnitude, by compute dtype.
TOLERANCES = {torch.float64: 1e-8, torch.float32: 1e-4, torch.float16: 1e-2,
              torch.bfloat16: 5e-2}
MAX_INPUTS = 16
MAX_DIMS = 8
MAX_DIM_SIZE = 1 << 20
_SEED = 1234


@dataclass(frozen=True)
class Artifact:
    """An export of a version: a verified file computing what the version's module computes.

    ``path`` is the verified local file (None in :meth:`Registry.list_exports`, which downloads
    nothing); ``max_abs_diff`` was measured against the PyTorch module when it was exported;
    ``params`` holds the export's options (inputs, dynamic axes, opset, device, dtype);
    ``cached`` says this call found the artifact stored and exported nothing.
    """

    ref: str
    format: ExportFormat
    digest: str
    size: int
    path: Path | None
    max_abs_diff: float
    tolerance: float
    params: dict[str, Any]
    key: str
    versions: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    cached: bool = False

    @classmethod
    def from_record(cls, ref: str, record: Mapping[str, Any], path: Path | None = None, *,
                    cached: bool = False) -> Artifact:
        return cls(ref, record["format"], record["digest"], int(record["size"]), path,
                   float(record["max_abs_diff"]), float(record["tolerance"]),
                   dict(record["params"]), record["key"], dict(record.get("versions", {})),
                   record.get("created_at", ""), cached)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "format": self.format, "digest": self.digest, "size": self.size,
                "path": None if self.path is None else str(self.path),
                "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
                "params": self.params, "key": self.key, "versions": self.versions,
                "created_at": self.created_at, "cached": self.cached}


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: the module's compute dtype
    dynamic: tuple[int, ...]   # dims whose size may vary

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape),
                "dtype": None if self.dtype is None else str(self.dtype).removeprefix("torch."),
                "dynamic": list(self.dynamic)}


@dataclass(frozen=True)
class ExportRequest:
    """The normalized options of one export; ``key`` names the artifact among a version's."""

    format: ExportFormat
    inputs: tuple[InputSpec, ...]
    dynamic_batch: bool
    opset: int | None
    device: str
    dtype: str
    tolerance: float | None
    examples: tuple[torch.Tensor, ...] | None = None

    def params(self) -> dict[str, Any]:
        return {"format": self.format, "inputs": [i.to_json() for i in self.inputs],
                "dynamic_batch": self.dynamic_batch, "opset": self.opset,
                "device": self.device, "dtype": self.dtype}

    @property
    def key(self) -> str:
        text = json.dumps(self.params(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def make_request(
    format: object, *, input_shapes: object, example_inputs: object, dynamic_batch: object,
    dynamic_axes: object, opset: object, device: object, dtype: object, tolerance: object,
) -> ExportRequest:
    """Check every option and name the bad one with its fix."""
    if format not in FORMATS:
        raise SettingsError(f"invalid export format {quoted(format)}: use one of "
                            f"{', '.join(FORMATS)}")
    if not isinstance(dynamic_batch, bool):
        raise SettingsError(f"dynamic_batch must be True or False, not {quoted(dynamic_batch)}")
    examples: tuple[torch.Tensor, ...] | None = None
    if (input_shapes is None) == (example_inputs is None):
        raise SettingsError("pass either input_shapes=[(1, 3, 224, 224)] or "
                            "example_inputs=(tensor, ...), exactly one of them")
    if example_inputs is not None:
        items = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
        if not isinstance(items, Sequence) or not items or \
                not all(isinstance(t, torch.Tensor) for t in items):
            raise SettingsError("example_inputs must be a tensor or a tuple of tensors, one per "
                                "argument of forward()")
        examples = tuple(t.detach() for t in items)
        shapes: list[tuple[int, ...]] = [tuple(t.shape) for t in examples]
        dtypes: list[torch.dtype | None] = [t.dtype for t in examples]
    else:
        shapes = _shapes(input_shapes)
        dtypes = [None] * len(shapes)
    if len(shapes) > MAX_INPUTS:
        raise SettingsError(f"{len(shapes)} inputs given; an export takes at most {MAX_INPUTS}")
    axes = _axes(dynamic_axes, shapes)
    specs = []
    for i, (shape, dt) in enumerate(zip(shapes, dtypes, strict=True)):
        dims = set(axes[i])
        if dynamic_batch:
            if not shape:
                raise SettingsError(f"input {i} is a scalar and has no batch dimension; pass "
                                    "dynamic_batch=False")
            dims.add(0)
        specs.append(InputSpec(shape, dt, tuple(sorted(dims))))
    if opset is not None:
        if format != "onnx":
            raise SettingsError(f"opset applies to format='onnx' only, not {format!r}")
        if isinstance(opset, bool) or not isinstance(opset, int) or not 7 <= opset <= 99:
            raise SettingsError(f"invalid opset {quoted(opset)}: use an ONNX opset number "
                                "such as 18, or None for the exporter's default")
    if tolerance is not None and (isinstance(tolerance, bool)
                                  or not isinstance(tolerance, int | float)
                                  or not 0 <= tolerance < float("inf")):
        raise SettingsError(f"invalid tolerance {quoted(tolerance)}: use a non-negative number")
    return ExportRequest(format, tuple(specs), dynamic_batch,  # type: ignore[arg-type]
                         opset, _device_text(device), _dtype_text(dtype),
                         None if tolerance is None else float(tolerance), examples)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` -> ``(1, 3, 224, 224)`` (the CLI's --input-shape)."""
    parts = text.strip().lower().split("x")
    if not all(p.isdigit() for p in parts):
        raise SettingsError(f"invalid input shape {quoted(text)}: use sizes joined by 'x', "
                            "such as 1x3x224x224")
    return _shapes([tuple(int(p) for p in parts)])[0]


def _shapes(value: object) -> list[tuple[int, ...]]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise SettingsError(f"invalid input_shapes {quoted(value)}: use a list with one shape "
                            "per forward() argument, such as [(1, 3, 224, 224)]")
    if all(isinstance(v, int) for v in value):
        value = [value]  # one shape given bare: (1, 3, 224, 224)
    out = []
    for shape in value:
        if not isinstance(shape, Sequence) or isinstance(shape, str) or len(shape) > MAX_DIMS \
                or not all(isinstance(d, int) and not isinstance(d, bool)
                           and 1 <= d <= MAX_DIM_SIZE for d in shape):
            raise SettingsError(f"invalid input shape {quoted(shape)}: use up to {MAX_DIMS} "
                                f"sizes from 1 to {MAX_DIM_SIZE}, such as (1, 3, 224, 224)")
        out.append(tuple(shape))
    return out


def _axes(value: object, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    if value is None:
        return [()] * len(shapes)
    if not isinstance(value, Sequence) or len(value) != len(shapes):
        raise SettingsError(f"invalid dynamic_axes {quoted(value)}: give one list of dims per "
                            f"input ({len(shapes)}), such as [[1]] for a varying sequence length")
    out = []
    for i, dims in enumerate(value):
        if not isinstance(dims, Sequence) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < len(shapes[i])
                for d in dims):
            raise SettingsError(f"invalid dynamic_axes[{i}] {quoted(dims)}: use dims of input "
                                f"{i}, from 0 to {len(shapes[i]) - 1}")
        out.append(tuple(sorted(set(dims))))
    return out


def _device_text(device: object) -> str:
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    if isinstance(device, str) and re.fullmatch(r"[a-z]+(:[0-9]{1,3})?", device):
        return device
    raise SettingsError(f"invalid export device {quoted(device)}: use 'cpu', 'cuda', 'cuda:N' "
                        "or 'auto'")


def _dtype_text(dtype: object) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, str) and re.fullmatch(r"[a-z0-9_]{1,16}", dtype):
        return dtype
    raise SettingsError(f"invalid export dtype {quoted(dtype)}: use 'auto', 'float32', "
                        "'float16' or 'bfloat16'")


# -- inputs and verification ---------------------------------------------------------------

def compute_dtype(module: torch.nn.Module) -> torch.dtype:
    for p in (*module.parameters(), *module.buffers()):
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def make_inputs(request: ExportRequest, dtype: torch.dtype, device: torch.device,
                grow: int = 0, seed: int = _SEED) -> tuple[torch.Tensor, ...]:
    """Random inputs of the requested shapes; each dynamic dim grown by ``grow``, and raised to
    at least 2 when ``grow`` is 0 on the tracing inputs (exporters specialize sizes 0 and 1)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, spec in enumerate(request.inputs):
        shape = list(spec.shape)
        for d in spec.dynamic:
            shape[d] = shape[d] + grow
        example = None if request.examples is None else request.examples[i]
        if example is not None and tuple(shape) == tuple(example.shape):
            out.append(example.to(device))
            continue
        dt = spec.dtype or dtype
        if dt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        elif dt == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            high = int(example.max().item()) + 1 if example is not None and example.numel() else 2
            t = torch.randint(0, max(high, 1), shape, generator=gen, dtype=dt)
        out.append(t.to(device))
    return tuple(out)


def trace_inputs(request: ExportRequest, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, ...]:
    """The inputs the exporter traces with: a dynamic dim of size 1 is traced at 2, because
    exporters specialize a dim they see as 0 or 1 into a constant."""
    small = [max((2 - s.shape[d] for d in s.dynamic), default=0) for s in request.inputs]
    return make_inputs(request, dtype, device, grow=max([0, *small]))


def check_inputs(request: ExportRequest, dtype: torch.dtype,
                 device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Inputs to verify on: the requested shapes, and grown dynamic dims when there are any."""
    batches = [make_inputs(request, dtype, device, seed=_SEED + 1)]
    if any(s.dynamic for s in request.inputs):
        batches.append(make_inputs(request, dtype, device, grow=2, seed=_SEED + 2))
    return batches


def leaves(output: Any) -> list[torch.Tensor]:
    """The tensors of a module's output (a tensor, tuple, list, dict or dataclass of them)."""
    from torch.utils import _pytree

    if hasattr(output, "to_tuple"):  # transformers ModelOutput
        output = output.to_tuple()
    return [t for t in _pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


def compare(fmt: str, expected: list[torch.Tensor], actual: list[torch.Tensor]) -> tuple[float,
                                                                                        float]:
    """(max |expected - actual|, largest |expected|) over every output."""
    if len(expected) != len(actual):
        raise ExportError(f"{fmt} artifact returns {len(actual)} outputs where the module "
                          f"returns {len(expected)}; the export is not faithful")
    diff, scale = 0.0, 0.0
    for e, a in zip(expected, actual, strict=True):
        e64, a64 = e.detach().cpu().double(), a.detach().cpu().double()
        if e64.shape != a64.shape:
            raise ExportError(f"{fmt} artifact returns an output of shape {tuple(a64.shape)} "
                              f"where the module returns {tuple(e64.shape)}")
        if e64.numel():
            diff = max(diff, float((e64 - a64).abs().max()))
            scale = max(scale, float(e64.abs().max()))
    return diff, scale


def tolerance_for(dtype: torch.dtype, scale: float) -> float:
    """The largest difference accepted: a dtype's resolution, scaled to the outputs' size."""
    return TOLERANCES.get(dtype, 1e-4) * max(1.0, scale)


def failure(fmt: str, ref: str, exc: BaseException, instead: str) -> ExportError:
    """An exporter's exception as an ExportError naming format, the failing op or line, and
    what to try instead."""
    text = f"{type(exc).__name__}: {exc}"
    where = re.findall(r'File "([^"]+)", line (\d+)', text)
    user = [w for w in where if "/torch/" not in w[0] and "site-packages" not in w[0]]
    ops = re.findall(r"(aten::[A-Za-z0-9_.]+|aten\.[A-Za-z0-9_.]+)", text)
    first = next((line.strip() for line in text.splitlines() if line.strip()), text)
    detail = first[:300]
    if user:
        detail += f" (at {user[-1][0]}:{user[-1][1]})"
    elif ops:
        detail += f" (op {ops[0]})"
    return ExportError(f"{fmt} export of {ref} failed: {detail}; {instead}")
