"""The four sums of a changed chunk ``b - a`` in one pass over its bytes, compiled by numba.

numpy has no single pass that keeps several sums: the same sums in numpy are six passes over
each chunk (``a . a``, ``b - a``, its absolute value, its dot product, max and count), about
2x the CPU of reading the two chunks. Here each block of ``len(delta)`` elements is read once
into a loop that keeps ``a . a`` and ``d . d`` in SIMD lanes and writes ``d`` into ``delta``
(a buffer that stays in L1), and a second loop over ``delta``'s bits counts the elements that
changed and keeps the largest ``|d|``, both as integers. On 269 MB of float32 that is faster
than an OR over every word of the same bytes.

Compiled on first use in a process and cached on disk by numba (``cache=True``: beside this
file, or in the user's cache when this file's folder is read-only): ~1 s more the first time on
a machine, 0.5-0.8 s to import and load in each new process after. ``deltas.fused`` loads it
once a process's diffs have lost that much without it, and keeps the numpy passes where numba
cannot load.

``fastmath`` lets the sums be reordered into lanes (``reassoc``) and nothing else that
changes a value: no ``nnan``/``ninf``, so NaN and infinities are what IEEE makes them, and the
caller sees them as a top at or above ``0x7F800000``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

_LANES = {"reassoc", "contract", "arcp", "nsz"}
_SIGNLESS = np.int32(0x7FFFFFFF)


@njit(nogil=True, cache=True, fastmath=_LANES, boundscheck=False)
def _block(xa: np.ndarray, xb: np.ndarray, delta: np.ndarray,
           bits: np.ndarray) -> tuple[Any, Any, Any, Any]:
    base2 = np.float32(0.0)
    delta2 = np.float32(0.0)
    for i in range(xa.size):
        x = xa[i]
        d = xb[i] - x
        base2 += x * x
        delta2 += d * d
        delta[i] = d
    differ = np.int32(0)
    top = np.int32(0)
    for i in range(xa.size):
        v = bits[i] & _SIGNLESS
        differ += np.int32(v != np.int32(0))
        top = v if v > top else top
    return base2, delta2, differ, top


@njit(nogil=True, cache=True, fastmath=_LANES, boundscheck=False)
def sums(a: np.ndarray, b: np.ndarray, delta: np.ndarray) -> tuple[float, float, int, int]:
    """``(a . a, d . d, elements whose d is not zero, the bits of the largest |d|)`` of
    ``d = b - a`` over two float32 arrays of one length, ``delta`` (float32) as the block.
    Each block's sums are in float32 lanes, added up in float64."""
    bits = delta.view(np.int32)
    base2 = 0.0
    delta2 = 0.0
    differ = 0
    top = 0
    for start in range(0, a.size, delta.size):
        end = min(start + delta.size, a.size)
        pb, pd, pc, pt = _block(a[start:end], b[start:end], delta, bits)
        base2 += pb
        delta2 += pd
        differ += pc
        top = max(top, pt)
    return base2, delta2, differ, top
