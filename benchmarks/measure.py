"""Timing helpers: interleaved medians after a warm-up, reading every byte, peak RSS probes."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Case:
    """One thing to time. ``prepare`` and ``cleanup`` run around each run, untimed."""

    run: Callable[[], Any]
    prepare: Callable[[], Any] | None = None
    cleanup: Callable[[], Any] | None = None


@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def spread(self) -> str:
        return f"{min(self.samples):.3f}-{max(self.samples):.3f}"


def interleaved(cases: Mapping[str, Case], *, runs: int, warmup: int = 1) -> dict[str, Timing]:
    """Time each case ``runs`` times after ``warmup`` untimed runs, round-robin, so that drift in
    the machine's load hits every case alike. Returns the samples per case, in seconds."""
    out = {name: Timing() for name in cases}
    for i in range(warmup + runs):
        for name, case in cases.items():
            if case.prepare:
                case.prepare()
            gc.collect()
            start = time.perf_counter()
            result = case.run()
            elapsed = time.perf_counter() - start
            del result
            if case.cleanup:
                case.cleanup()
            gc.collect()
            if i >= warmup:
                out[name].samples.append(elapsed)
    return out


def sha256_file(path: Path) -> str:
    """The floor's hash: one thread, 8 MiB reads, the way a user would write it."""
    digest = hashlib.sha256()
    buf = bytearray(8 * 2**20)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(memoryview(buf)[:n])
    return digest.hexdigest()


def touch(tensors: Iterable[torch.Tensor]) -> int:
    """Read every byte of every tensor once (a memory-mapped load reads nothing until this).

    The bytes are OR-reduced as 64-bit words by numpy in this thread: the same cost for every
    dtype, at memory bandwidth, and free of the thread-pool wake-ups that make ``Tensor.sum``
    erratic on a small, busy machine."""
    acc = 0
    for t in tensors:
        raw = t.detach().reshape(-1).view(torch.uint8).numpy()
        words = raw[: raw.size - raw.size % 8].view(np.uint64)
        acc |= int(np.bitwise_or.reduce(words)) if words.size else 0
        acc |= int(np.bitwise_or.reduce(raw[words.size * 8:])) if raw.size % 8 else 0
    return acc


def touch_module(module: torch.nn.Module) -> float:
    return touch(module.state_dict().values())


def huge_mapped(module: torch.nn.Module) -> float | None:
    """The share of the file-backed memory under ``module``'s tensors that is mapped by 2 MiB
    pages (``FilePmdMapped`` over ``Rss`` of the mappings holding them, from /proc/self/smaps),
    read after a touch; None where smaps is missing or no tensor lies in a file mapping.

    A warm mapped load costs a page fault per folio of the page cache: 64 KiB of small folios
    per fault-around, 2 MiB per fault where the kernel holds the file in PMD-sized folios
    (large folios on ext4 since Linux 6.16). Which the page cache holds depends on how the file
    came in (written in large aligned writes, read ahead, or neither), so two loaders of the
    same bytes can differ by that alone."""
    import re

    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    ptrs = {t.data_ptr() for t in module.state_dict().values() if t.numel()}
    rss = huge = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        head = block.split(None, 6)
        if len(head) < 6 or not head[5].startswith("/"):  # anonymous or not a mapping line
            continue
        low, high = (int(x, 16) for x in head[0].split("-"))
        if not any(low <= p < high for p in ptrs):
            continue
        fields = dict(re.findall(r"^(Rss|FilePmdMapped):\s+(\d+) kB", block, re.M))
        rss += int(fields.get("Rss", 0))
        huge += int(fields.get("FilePmdMapped", 0))
    return huge / rss if rss else None


def pin_malloc_threshold() -> str:
    """Fix glibc's mmap threshold at its default (128 KiB) so large tensors always get fresh
    pages, as in a new process. Left dynamic, the threshold rises after the first large free and
    later runs recycle heap pages without page faults, so a case's time depends on which case
    ran before it. Returns a description for the report."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return "dynamic (glibc not found)"
    m_mmap_threshold = -3
    if ctypes.CDLL(name).mallopt(m_mmap_threshold, 128 * 1024) != 1:
        return "dynamic (mallopt refused)"
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # and in child processes
    return "fixed at 128 KiB (mallopt M_MMAP_THRESHOLD)"


# -- peak memory in a fresh process ------------------------------------------------------------

def probe(action: str, **options: Any) -> dict[str, Any]:
    """Run ``benchmarks.probe`` in a fresh interpreter; return the JSON it prints."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe", action, json.dumps(options)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"probe {action} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def subprocess_seconds(code: str) -> float:
    """Wall time of ``python -c code`` in a fresh interpreter."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start
