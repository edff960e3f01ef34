"""Shared test helpers: small models, CUDA-tagged checkpoints, faked torch device facts."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.serialization
from torch import nn


class MLP(nn.Module):
    """A small model with a BatchNorm (int64 num_batches_tracked) and a non-persistent buffer."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width * 2)
        self.bn = nn.BatchNorm1d(width * 2)
        self.fc2 = nn.Linear(width * 2, classes)
        self.register_buffer("scale", torch.full((classes,), 2.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x)))) * self.scale


class TiedLM(nn.Module):
    """Embedding and output head sharing one weight, as language models do."""

    def __init__(self, vocab: int = 16, dim: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(self.embed(ids)))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def make_mlp(width: int = 8) -> MLP:
    """A factory function (not a class), as torchvision's are."""
    return MLP(width)


def trained_mlp(seed: int = 0) -> MLP:
    """An MLP whose BatchNorm statistics have moved, so a bad load is visible."""
    torch.manual_seed(seed)
    model = MLP()
    model.train()
    for _ in range(3):
        model(torch.randn(16, 8))
    return model.eval()


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key].cpu(), b[key].cpu()), key


@contextlib.contextmanager
def storage_location(tag: str) -> Iterator[None]:
    """Make torch.save write every storage as if it lived on ``tag`` (e.g. "cuda:3")."""
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: tag  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.serialization.location_tag = original  # type: ignore[assignment]


# What torch.load(weights_only=True) raises for a CUDA-tagged file on a machine without CUDA:
# a RuntimeError since torch 2.5, an UnpicklingError carrying the same message before.
CUDA_LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError)


def save_as_if_on(obj: object, path: Path, tag: str) -> Path:
    with storage_location(tag):
        torch.save(obj, path)
    return path


def fake_devices(monkeypatch, *, cuda: list[tuple[int, tuple[int, int]]] = (),  # type: ignore[assignment]
                 mps: bool = False) -> None:
    """Make torch report CUDA devices as (free_bytes, capability) pairs, and MPS."""
    devices = list(cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(devices))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda i=0: (devices[i][0], max(devices[i][0], 80 * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: devices[i][1])
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


def run_cli(*args: str, env: dict[str, str], cwd: Path | None = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real `registry` console script in a subprocess."""
    exe = Path(sys.executable).with_name("registry")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "registry.cli"]
    result = subprocess.run([*command, *args], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"registry {' '.join(args)} failed:\n{result.stderr}")
    return result


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    env["REGISTRY_HOME"] = str(home)
    env["REGISTRY_GC_GRACE"] = "0"  # as in tests/conftest.py: gc frees what a test deleted
    env["REGISTRY_TRASH_DAYS"] = "0"  # and purges what it deleted (tests/conftest.py)
    env.update(extra)
    return env


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(torch.relu(self.attn(x)))


class BlockLM(nn.Module):
    """A language-model shape: embedding, numbered blocks, a norm and a head tied to the
    embedding (so shards cut at ``layers.N`` and a tied pair spans two groups)."""

    def __init__(self, layers: int = 4, dim: int = 32, vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def block_lm(seed: int = 0, **kwargs: int) -> BlockLM:
    torch.manual_seed(seed)
    return BlockLM(**kwargs).eval()
