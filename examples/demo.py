"""The demo `make demo` runs: a checkpoint saved on a GPU box, pushed and pulled on this machine.

The checkpoint is written the way a training job on ``cuda:0`` writes it (DataParallel keys,
fp16 weights, CUDA storage tags), so plain ``torch.load`` fails on a CPU-only machine; the
registry pushes it, pulls it with ``device="auto"`` and shows what it recorded.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.serialization
from tinynet import TinyNet  # importable by name, so pull can rebuild it
from torch import nn

import registry
from registry.display import version_table


def save_like_a_gpu_job(model: nn.Module, path: Path) -> None:
    """torch.save as it happens on cuda:0, without needing a GPU here."""
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"  # type: ignore[assignment]
    try:
        torch.save(nn.DataParallel(model).state_dict(), path)
    finally:
        torch.serialization.location_tag = original  # type: ignore[assignment]


def main() -> None:
    torch.manual_seed(0)
    workdir = Path(os.environ.get("REGISTRY_HOME", ".demo"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "trained_on_gpu.pth"
    save_like_a_gpu_job(TinyNet().half(), checkpoint)

    # The failure the registry exists for, shown on purpose: plain torch.load of a checkpoint
    # written on a GPU, on a machine without one.
    try:
        torch.load(checkpoint, weights_only=True)
        print("torch.load: loaded (this machine has a GPU)")
    except RuntimeError as exc:
        print("torch.load without the registry fails here, as expected on a machine without a "
              f"GPU:\n  expected error: {str(exc).splitlines()[0][:100]}...")

    mv = registry.push(checkpoint, "tinynet", tags={"dataset": "demo"}, aliases=["staging"],
                       factory=TinyNet, factory_kwargs={"num_classes": 10},
                       precision="amp-fp16")
    print(f"pushed  {mv} ({mv.digest})")

    pulled = registry.pull("tinynet@staging", device="auto")
    param = next(pulled.parameters())
    out = pulled(torch.randn(2, 3, 32, 32, device=param.device, dtype=param.dtype))
    print(f"pulled  {pulled.registry_ref} onto {param.device} as {param.dtype}; "
          f"forward pass gives {tuple(out.shape)}\n")
    print(version_table(registry.show("tinynet")))
    print(f"\nThis demo's registry is {workdir} (REGISTRY_HOME); without REGISTRY_HOME yours is "
          "~/.registry.\nTry: REGISTRY_HOME=.demo .venv/bin/registry ls tinynet")


if __name__ == "__main__":
    main()
