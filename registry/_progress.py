"""Progress bars for transfers: shown on a terminal for anything over 64 MiB, silent otherwise."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

THRESHOLD_BYTES = 64 * 2**20


@contextlib.contextmanager
def transfer(total: int, description: str) -> Iterator[Callable[[int], None]]:
    """Yield a callback taking byte counts; draws a tqdm bar when it is worth drawing."""
    if total < THRESHOLD_BYTES or not sys.stderr.isatty():
        yield lambda _n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, leave=False) as bar:
        yield bar.update
