"""What several formats share: the checked record a rebuild builds on (:class:`Checked`) and
the fields every ``quantization`` record has. No format module is imported here; each builds
on this one (and on ``base.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import QuantizationError, quoted
from .base import Runs

MAX_CONFIG_CHARS = 4096  # a recorded config's JSON, per tensor (x16 for a whole model's)
MAX_NESTING = 8


# -- push: the fields every quantization record has ----------------------------------------------

def param_count(module: nn.Module) -> int:
    """The module's parameters, each shared one counted once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def quantization_record(library: str, version: str, method: str, runs: Runs,
                        flat: Mapping[str, Any], group_sizes: Iterable[int],
                        float_params: int) -> dict[str, Any]:
    """The fields every ``quantization`` record opens with, in the order manifests hold them."""
    tensors = [t for t in flat.values() if isinstance(t, torch.Tensor)]
    return {
        "library": library,
        "library_version": version,
        "method": method,
        "group_sizes": sorted(group_sizes),
        "float_params": float_params,
        "stored_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "devices": runs.labels(),
    }


def check_counts(record: Mapping[str, Any]) -> str | None:
    """Why a record's counts are not counts, or None."""
    for count in ("float_params", "stored_bytes"):
        value = record.get(count)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"has {count} {quoted(value)}, not a count"
    return None


# -- pull: the steps a format takes --------------------------------------------------------------

@dataclass(frozen=True)
class Checked:
    """A version's quantization record once checked: each format's rebuild builds on it."""

    record: dict[str, Any]
    origin: str

    @property
    def name(self) -> str:
        return f"{self.record['library']} {self.record['method']}"

    def pretrained(self, requested: torch.dtype | None
                   ) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """A format whose components transformers cannot load quantized has no directory."""
        raise QuantizationError(
            f"{self.origin} is quantized with {self.name} without a transformers "
            "quantization_config, so transformers could not load it quantized; pull it with "
            "registry.pull(), or push a model loaded with quantization_config=TorchAoConfig(...)")


def keep_stored(origin: str, requested: torch.dtype | None) -> None:
    """A ``from_pretrained`` directory of a quantized version holds its components as stored."""
    if requested is not None:
        raise QuantizationError(f"{origin} is quantized: a from_pretrained directory keeps its "
                                "stored components; pass dtype='auto'")
