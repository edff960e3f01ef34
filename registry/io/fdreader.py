"""safetensors' own reader over an open shard, for the dtypes the registry's reader
(:mod:`registry.io.weights`) does not map itself.

It reads through ``/proc/self/fd/N`` (``/dev/fd/N`` elsewhere), which opens the file the
descriptor holds: the file that was verified, not whatever its path names by now. Every failure
of safetensors (an unknown dtype, a shape whose product overflows, a malformed header) is a
:class:`ManifestError`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..errors import ManifestError


@contextlib.contextmanager
def read_open_file(fh: BinaryIO, shard: str, origin: str
                   ) -> Iterator[Mapping[str, Callable[[], torch.Tensor]]]:
    """``{key: make tensor}`` of the safetensors file open as ``fh`` (``shard`` names it in
    errors), read by safetensors itself."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    proc = Path(f"/proc/self/fd/{fh.fileno()}")
    name = str(proc if proc.exists() else f"/dev/fd/{fh.fileno()}")
    failures = (SafetensorError, RuntimeError, OverflowError, ValueError)

    def refused(exc: Exception) -> ManifestError:
        return ManifestError(
            f"{origin}: shard {shard} is not a valid safetensors file "
            f"({str(exc)[:160]}); the store was tampered with: push the model again")

    def get(st: Any, key: str) -> torch.Tensor:
        try:
            return st.get_tensor(key)
        except failures as exc:
            raise refused(exc) from None

    try:
        handle = safe_open(name, framework="pt", device="cpu")
    except failures as exc:
        raise refused(exc) from None
    with handle as st:
        yield {key: functools.partial(get, st, key)
               for key in st.keys()}  # noqa: SIM118 - safe_open is not iterable
