"""Which device and dtype a pull lands on: pure functions of what torch reports.

``TorchFacts.probe()`` asks torch once; everything else here takes those facts as an argument, so
the whole device and dtype policy is tested without a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..errors import DeviceUnavailableError, DtypeError, quoted

DeviceRequest = str | int | torch.device
DtypeRequest = str | torch.dtype

# Headroom kept free on a GPU when "auto" decides whether a model fits (activations, CUDA context).
AUTO_FIT_FRACTION = 0.9
# torch keeps a device index in an int8 (c10::DeviceIndex): anything larger names no device, and
# torch.device() would raise a bare RuntimeError/OverflowError for it.
_MAX_DEVICE_INDEX = 127
_MAX_DEVICE_NAME = 32


@dataclass(frozen=True)
class CudaDevice:
    index: int
    free_bytes: int
    total_bytes: int
    capability: tuple[int, int]


@dataclass(frozen=True)
class TorchFacts:
    """What this process can run on."""

    cuda: tuple[CudaDevice, ...] = ()
    cuda_current: int = 0
    mps: bool = False
    cpu_bytes: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def probe(cls) -> TorchFacts:
        cuda: list[CudaDevice] = []
        current = 0
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(index)
                cuda.append(CudaDevice(index, int(free), int(total),
                                       tuple(torch.cuda.get_device_capability(index))))  # type: ignore[arg-type]
            current = torch.cuda.current_device() if cuda else 0
        mps_backend = getattr(torch.backends, "mps", None)
        mps = bool(mps_backend and mps_backend.is_available())
        return cls(tuple(cuda), current, mps, _available_ram())

    def available(self) -> list[str]:
        return [*(f"cuda:{d.index}" for d in self.cuda), *(["mps"] if self.mps else []), "cpu"]

    def cuda_device(self, index: int) -> CudaDevice:
        return next(d for d in self.cuda if d.index == index)


def _available_ram() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_sort_key(device: str) -> tuple[str, int]:
    """Order device names as people list them: ``cpu``, ``cuda:0``, ``cuda:1``, ..., ``cuda:10``."""
    kind, _, index = device.partition(":")
    return (kind, int(index) if index.isdigit() else -1)


def resolve_device(request: DeviceRequest, model_bytes: int, facts: TorchFacts) -> torch.device:
    """Turn a device request into a concrete device that exists here; never substitute another."""
    if isinstance(request, str) and request == "auto":
        fitting = [d for d in facts.cuda if d.free_bytes * AUTO_FIT_FRACTION >= model_bytes]
        if fitting:
            best = max(fitting, key=lambda d: (d.free_bytes, -d.index))
            return torch.device("cuda", best.index)
        return torch.device("mps") if facts.mps else torch.device("cpu")
    device = _parse_device(request, facts)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not facts.cuda:
            raise DeviceUnavailableError(
                f"device {_show(request)} is not available: torch sees no CUDA device here; "
                f"available: {', '.join(facts.available())} (or use device='auto')"
            )
        index = facts.cuda_current if device.index is None else device.index
        if index not in {d.index for d in facts.cuda}:
            raise DeviceUnavailableError(
                f"device {_show(request)} does not exist: this machine has {len(facts.cuda)} CUDA "
                f"device(s); available: {', '.join(facts.available())}"
            )
        gpu = facts.cuda_device(index)
        if model_bytes > gpu.free_bytes:
            raise DeviceUnavailableError(
                f"device cuda:{index} has {_gib(gpu.free_bytes)} free but the model needs "
                f"{_gib(model_bytes)}; free memory there, pick another device "
                f"({', '.join(facts.available())}), or pass device_map='auto'"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        if not facts.mps:
            raise DeviceUnavailableError(
                f"device {_show(request)} is not available: torch reports no MPS backend here; "
                f"available: {', '.join(facts.available())}"
            )
        return torch.device("mps")
    raise DeviceUnavailableError(
        f"device {_show(request)} is not supported for pulls; available: "
        f"{', '.join(facts.available())}"
    )


def _parse_device(request: DeviceRequest, facts: TorchFacts) -> torch.device:
    if isinstance(request, bool):
        raise DeviceUnavailableError(f"invalid device {request!r}: use 'auto', 'cpu', 'cuda:N', "
                                     "'mps', an int or a torch.device")
    if isinstance(request, torch.device):
        return request
    if isinstance(request, int):
        if not 0 <= request <= _MAX_DEVICE_INDEX:
            raise DeviceUnavailableError(f"invalid device index {quoted(request)}; available: "
                                         f"{', '.join(facts.available())}")
        return torch.device("cuda", request)
    if isinstance(request, str) and len(request) <= _MAX_DEVICE_NAME:
        try:
            return torch.device(request)
        except (RuntimeError, ValueError, OverflowError):
            pass
    raise DeviceUnavailableError(
        f"invalid device {quoted(request, 60)}: use 'auto', 'cpu', 'cuda', 'cuda:N', 'mps', an "
        f"int or a torch.device; available here: {', '.join(facts.available())}"
    )


def _show(request: DeviceRequest) -> str:
    return quoted(str(request), 60) if not isinstance(request, int) else quoted(request, 60)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# -- dtypes -----------------------------------------------------------------------------------

# torch dtype -> safetensors dtype code, for every dtype both torch and safetensors know: the
# dtypes a version may store (their names are manifest.STORED_DTYPES, which needs no torch).
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        DTYPE_CODES[getattr(torch, _name)] = _code
CODE_DTYPES: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPE_CODES.items()}

_DTYPE_ALIASES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``"bfloat16"`` for ``torch.bfloat16``: how a manifest names a dtype."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(request: DtypeRequest) -> torch.dtype | None:
    """``"auto"`` -> None; a name or torch.dtype -> that floating dtype."""
    if isinstance(request, torch.dtype):
        if not request.is_floating_point:
            raise DtypeError(f"dtype {request} is not a floating-point type; pulls only cast "
                             "floating-point tensors (use float32, float16, bfloat16 or float64)")
        return request
    if isinstance(request, str):
        if request == "auto":
            return None
        name = request.removeprefix("torch.")
        if name in _DTYPE_ALIASES:
            return _DTYPE_ALIASES[name]
    raise DtypeError(
        f"invalid dtype {quoted(request, 60)}: use 'auto', 'float32', 'float16', 'bfloat16', "
        "'float64' or a torch.dtype"
    )


def auto_dtype(stored: torch.dtype, device: torch.device, facts: TorchFacts) -> torch.dtype:
    """The dtype ``dtype="auto"`` gives a stored dtype on ``device`` (the table in DOMAIN.md, with
    bfloat16 on the CPU made float32 as float16 is: issue #30)."""
    if not stored.is_floating_point:
        return stored
    if device.type == "cpu":
        # Half-precision weights meet float32 batches on the CPU ("Input type (float) and bias
        # type (c10::BFloat16) should be the same"), and CPU half arithmetic is slow: float32.
        return torch.float32 if stored in (torch.float16, torch.bfloat16) else stored
    if device.type == "cuda":
        if stored == torch.bfloat16:
            index = 0 if device.index is None else device.index
            gpu = next((d for d in facts.cuda if d.index == index), None)
            if gpu is not None and gpu.capability < (8, 0):
                return torch.float32
        return stored
    if device.type == "mps":
        return torch.float32 if stored == torch.float64 else stored
    return stored


def check_dtype_runs(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse an explicit dtype the device cannot hold at all."""
    if device.type == "mps" and dtype == torch.float64:
        raise DtypeError("dtype float64 is not supported on mps; use dtype='float32' or 'auto'")
