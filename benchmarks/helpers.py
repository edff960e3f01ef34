"""What every subject's rows share: units, the timing and reading helpers, the benchmark model,
and the :class:`Bench` each row function receives.

Timing: interleaved medians after a warm-up (:func:`interleaved`), reading every byte
(:func:`touch`), peak RSS in a fresh interpreter (:func:`probe`). The model: blocks of
Linear(d -> 4d) -> GELU -> Linear(4d -> d) + LayerNorm, with random weights.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import registry
from registry import manifest as mf
from registry.backends import LocalBackend

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6


def duration(seconds: float, *, ms_below: float = 1.0, digits: int = 2) -> str:
    """``412 ms`` under ``ms_below`` seconds, ``1.27 s`` (``digits`` decimals) from there on."""
    return f"{seconds * 1000:.0f} ms" if seconds < ms_below else f"{seconds:.{digits}f} s"


# -- the benchmark model --------------------------------------------------------------------------

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
S3_MODEL = Size("s3", dim=1024, hidden=4096, blocks=6)          # ~201 MB of float32
# Rows 10-13's multi-shard model in a default run, in float16: one block per 1 GiB shard.
LARGE = Size("large", dim=4096, hidden=16384, blocks=15)  # ~4.0 GB of float16


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


FACTORY = "benchmarks.helpers:BenchModel"


def kwargs(size: Size) -> dict[str, int]:
    return {"dim": size.dim, "hidden": size.hidden, "blocks": size.blocks}


def build(size: Size, *, seed: int = 0) -> BenchModel:
    """A model with random weights (so compression or dedup cannot flatter anything)."""
    torch.manual_seed(seed)
    return BenchModel(**kwargs(size)).eval()


def fp16(size: Size, *, seed: int = 0) -> BenchModel:
    """The model in float16, as rows 10-13 store it."""
    return build(size, seed=seed).half()


def meta_module(size: Size) -> BenchModel:
    """The model built on ``meta``, for a peer's ``load_state_dict(assign=True)``."""
    with torch.device("meta"):
        return BenchModel(**kwargs(size))


# -- what every row shares ------------------------------------------------------------------------

@dataclass
class Bench:
    """What every row shares: sizes, run counts, the pushed model and its store file."""

    size: Size
    runs: int
    work: Path
    net: BenchModel
    reg: registry.Registry
    ref: str
    blob: Path
    nbytes: int
    s3_size: Size

    @classmethod
    def create(cls, size: Size, runs: int, work: Path, s3_size: Size) -> Bench:
        net = build(size)
        reg = registry.Registry(home=work / "home")
        mv = reg.push(net, "bench", factory=FACTORY, factory_kwargs=kwargs(size))
        blob = local_backend(reg).store.open_local(mf.blob_key(mv.digest))
        assert blob is not None
        return cls(size, runs, work, net, reg, str(mv), blob, blob.stat().st_size, s3_size)

    @property
    def quick(self) -> bool:
        return self.size == QUICK

    @property
    def sharded(self) -> tuple[Size, int]:
        """Rows 10, 11 and 13's multi-shard model (in float16): its size and shard target. A
        quick run uses the quick model with a target small enough to give several shards."""
        return (QUICK, 4 * 2**20) if self.quick else (LARGE, 2**30)

    def scratch(self, name: str) -> Path:
        path = self.work / "scratch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def local_backend(reg: registry.Registry) -> LocalBackend:
    backend = reg.backend
    assert isinstance(backend, LocalBackend)
    return backend


def clear_cache(reg: registry.Registry) -> None:
    """Empty the registry's cache (blobs and verification memos), so the next pull is cold."""
    cache = reg.settings.cache_dir
    for sub in ("blobs", "verified", "tmp"):
        target = cache / sub
        if target.exists():
            for path in target.rglob("*"):
                if path.is_file():
                    path.chmod(0o644)
            shutil.rmtree(target)


@contextmanager
def env(**values: str) -> Iterator[None]:
    """Set environment variables for the block; restore what was there after."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def quiet_mlflow() -> Any:
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    warnings.filterwarnings("ignore")
    import mlflow
    import mlflow.pytorch

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return mlflow


def mlflow_experiment(b: Bench, prefix: str) -> tuple[Any, str, Callable[[], None]]:
    """MLflow on a SQLite tracking store in the scratch dir: the module, a new experiment's id,
    and a function that removes the experiment's artifacts."""
    mlflow = quiet_mlflow()
    art = b.scratch(f"{prefix}mlflow-artifacts")
    mlflow.set_tracking_uri(f"sqlite:///{b.scratch(f'{prefix}mlflow.db')}")
    name = f"{prefix.rstrip('-') or 'bench'}-{time.time_ns()}"
    experiment = mlflow.create_experiment(name, artifact_location=art.as_uri())
    return mlflow, experiment, lambda: shutil.rmtree(art, ignore_errors=True)


# -- timing ---------------------------------------------------------------------------------------

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
    the machine's load hits every case alike, and each round starting one case further on, so
    that no case always runs first or last in a round (on this machine one pull measured up to
    5% apart by its place in a fixed round). Returns the samples per case, in seconds."""
    out = {name: Timing() for name in cases}
    names = list(cases)
    for i in range(warmup + runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            case = cases[name]
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


# -- fresh interpreters ---------------------------------------------------------------------------

def probe(action: str, **options: Any) -> dict[str, Any]:
    """Run ``benchmarks.probe`` in a fresh interpreter; return the JSON it prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe", action, json.dumps(options)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        check=False,
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
