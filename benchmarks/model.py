"""The benchmark model: blocks of Linear(d -> 4d) -> GELU -> Linear(4d -> d) + LayerNorm."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Size:
    """A model size: ``blocks`` blocks of width ``dim`` and hidden width ``hidden``."""

    label: str
    dim: int
    hidden: int
    blocks: int

    @property
    def parameters(self) -> int:
        per_block = 2 * self.dim * self.hidden + self.hidden + self.dim + 2 * self.dim
        return per_block * self.blocks

    @property
    def float32_bytes(self) -> int:
        return self.parameters * 4


FULL = Size("default", dim=2048, hidden=8192, blocks=6)   # ~806 MB of float32
QUICK = Size("quick", dim=512, hidden=2048, blocks=6)     # ~50 MB of float32
# The S3 rows' model in a default run: moto copies the whole object for every ranged GET, so
# its loopback throughput falls as objects grow (an 806 MB object took 50-80 s per download).
S3 = Size("s3", dim=1024, hidden=4096, blocks=6)          # ~201 MB of float32


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class BenchModel(nn.Module):
    """An MLP stack; an ``nn.Module`` subclass, so the registry may rebuild it from its path."""

    def __init__(self, dim: int = 2048, hidden: int = 8192, blocks: int = 6) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


FACTORY = "benchmarks.model:BenchModel"


def kwargs(size: Size) -> dict[str, int]:
    return {"dim": size.dim, "hidden": size.hidden, "blocks": size.blocks}


def build(size: Size, *, seed: int = 0) -> BenchModel:
    """A model with random weights (so compression or dedup cannot flatter anything)."""
    torch.manual_seed(seed)
    return BenchModel(**kwargs(size)).eval()
