"""The demo `make demo` runs: push a small model, pull it back with device="auto", show it."""

from __future__ import annotations

import torch
from tinynet import TinyNet  # importable by name, so pull can rebuild it
from torch import nn

import registry
from registry.display import version_table


def main() -> None:
    torch.manual_seed(0)
    model = TinyNet()
    # As it might come out of training: wrapped in DataParallel, weights in float16.
    trained = nn.DataParallel(model.half())
    mv = registry.push(trained, "tinynet", tags={"dataset": "demo"}, aliases=["staging"],
                       factory=TinyNet, factory_kwargs={"num_classes": 10})
    print(f"pushed {mv} ({mv.digest})")

    pulled = registry.pull("tinynet@staging", device="auto")
    device = next(pulled.parameters()).device
    dtype = next(pulled.parameters()).dtype
    out = pulled(torch.randn(2, 3, 32, 32, device=device, dtype=dtype))
    print(f"pulled {pulled.registry_ref} onto {device} as {dtype}; output shape "
          f"{tuple(out.shape)}\n")
    print(version_table(registry.show("tinynet")))


if __name__ == "__main__":
    main()
