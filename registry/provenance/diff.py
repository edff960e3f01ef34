"""The difference between two versions, tensor by tensor, reading only what may have changed.

Shards are compared by digest first: a tensor whose shard has the same digest in both versions
is unchanged and its bytes are never read. Every other shard is opened through the verified
cache (``open_blob``) and memory-mapped; a tensor whose bytes are equal in both is unchanged
after one ``memcmp``, any other is compared in float32 chunks by worker threads
(:mod:`.deltas`), so memory beyond the mapped pages is a few 256 KiB buffers. Per changed
tensor: the relative L2 norm of the change (``||b - a|| / ||a||``), the largest absolute
difference and the fraction of elements that differ; per module (the key without its last
part), the same over its changed tensors. A quantized version is compared through its
dequantized float32 weights; an adapter version against its base reports each adapted
module's effective change ``B @ A * scaling`` against the base weight.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, Literal

import torch

from ..backends import Backend
from ..catalog.records import VersionRecord
from ..files import VersionFile, weight_files
from ..formats import table as formats
from ..io.weights import load_shard
from ..pipelines import pull as pulling
from ..refs import Ref
from ..settings import Settings
from . import deltas
from .deltas import Sums

Mode = Literal["weights", "dequantized", "adapter"]
OpenBlob = Callable[[str, int], BinaryIO]


@dataclass(frozen=True)
class TensorChange:
    """One tensor present in both versions whose values, shape or dtype differ."""

    key: str
    shape: tuple[list[int], list[int]]
    dtype: tuple[str, str]
    relative_l2: float | None  # ||b - a|| / ||a||; None when the shapes differ (inf: a == 0)
    max_abs: float | None
    fraction_changed: float | None
    norm_delta: float | None = None


@dataclass(frozen=True)
class ModuleChange:
    """A module's changed tensors rolled up: ``relative_l2`` over all its compared tensors."""

    module: str
    tensors: int
    changed: int
    relative_l2: float
    max_abs: float


@dataclass(frozen=True)
class VersionDiff:
    """What changed from version ``a`` to version ``b``."""

    a: str
    b: str
    mode: Mode
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[TensorChange] = field(default_factory=list)
    unchanged: int = 0
    modules: list[ModuleChange] = field(default_factory=list)
    bytes_shared: int = 0  # in shards both versions hold (same digest): never read
    bytes_read: int = 0

    @property
    def reshaped(self) -> list[TensorChange]:
        """Tensors whose shape or dtype changed."""
        return [c for c in self.changed if c.shape[0] != c.shape[1] or c.dtype[0] != c.dtype[1]]

    def top(self, n: int) -> list[TensorChange]:
        """The ``n`` changed tensors with the largest relative change."""
        return sorted(self.changed, key=_rank, reverse=True)[:n]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``registry diff --json`` prints (an infinite ratio is null)."""
        out = asdict(self)
        for c in out["changed"]:
            c["shape"], c["dtype"] = list(c["shape"]), list(c["dtype"])
        for item in (*out["changed"], *out["modules"]):
            for k, v in item.items():
                if isinstance(v, float) and not math.isfinite(v):
                    item[k] = None
        return out


def _rank(c: TensorChange) -> float:
    return math.inf if c.relative_l2 is None else c.relative_l2


def between(backend: Backend, settings: Settings, a: str | Ref, b: str | Ref) -> VersionDiff:
    """:func:`compare` of the versions ``a`` and ``b`` name, each resolved as a pull resolves
    it (checked, and passed by the signature policy) and read through ``backend``'s verified
    cache."""
    ra, rb = (pulling.resolve(backend, settings, r) for r in (a, b))
    return compare(ra, rb, backend.open_blob, lambda r: pulling.state_dict(
        backend, settings, r, "cpu", "float32"))


def compare(a: VersionRecord, b: VersionRecord, open_blob: OpenBlob,
            dequantized: Callable[[VersionRecord], Mapping[str, Any]]) -> VersionDiff:
    """The diff of two checked records: an adapter against its base, dequantized weights
    where either is quantized, else the stored tensors (unchanged shards unread)."""
    with _one_thread():
        for first, second, adapter_first in ((a, b, True), (b, a, False)):
            spec = first.manifest.get("adapter")
            if isinstance(spec, dict) and "adapter" not in second.manifest \
                    and spec.get("base", {}).get("digest") == second.digest:
                return adapter_over_base(first, second, open_blob, adapter_first=adapter_first)
        if "quantization" in a.manifest or "quantization" in b.manifest:
            return states(a, b, dequantized(a), dequantized(b))
        return weights(a, b, open_blob)


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch's intra-op threads off while comparing: the diff's own workers share out the
    pieces (:mod:`.deltas`), and torch's only work is widening a 128 Ki-element chunk, too short
    to share out: waking a pool of threads for each cost 10-100x the work on a busy machine
    here (a 17 MB diff: 3-40 ms on one thread, 0.5-4.7 s on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# -- the comparison -------------------------------------------------------------------------

def _change(key: str, a: torch.Tensor, b: torch.Tensor, sums: Sums | None) -> TensorChange:
    shapes = (list(a.shape), list(b.shape))
    dtypes = (str(a.dtype).removeprefix("torch."), str(b.dtype).removeprefix("torch."))
    if sums is None:
        return TensorChange(key, shapes, dtypes, None, None, None)
    return TensorChange(key, shapes, dtypes, sums.relative, sums.max_abs,
                        sums.differ / sums.numel if sums.numel else 0.0, math.sqrt(sums.delta2))


def module_of(key: str) -> str:
    """The module a tensor key belongs to: the key without its last part."""
    return key.rsplit(".", 1)[0] if "." in key else ""


class _Rollup:
    """Per module: its tensors, how many changed, and the sums of the changed ones (so a
    module's ``relative_l2`` is its changed tensors' ``||b - a|| / ||a||``, whichever shards
    the unchanged ones lie in)."""

    def __init__(self) -> None:
        self.sums: dict[str, Sums] = defaultdict(Sums)
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def add(self, key: str, sums: Sums | None, changed: bool) -> None:
        module = module_of(key)
        self.counts[module][0] += 1
        self.counts[module][1] += int(changed)
        if sums is not None and changed:
            self.sums[module].add(sums)

    def modules(self) -> list[ModuleChange]:
        return [ModuleChange(m, n, c, self.sums[m].relative, self.sums[m].max_abs)
                for m, (n, c) in sorted(self.counts.items()) if c]


def weights(a: VersionRecord, b: VersionRecord, open_blob: OpenBlob) -> VersionDiff:
    """The diff of two float (or same-scheme) versions, reading only shards whose digests
    differ."""
    ta, tb = a.manifest["tensors"], b.manifest["tensors"]
    shard_a, shard_b = _shard_of(a.manifest), _shard_of(b.manifest)
    common = sorted(ta.keys() & tb.keys())
    to_read = [k for k in common if shard_a[k].digest != shard_b[k].digest]
    reading = set(to_read)
    digests_b = {f.digest for f in weight_files(b.manifest)}
    shared = sum(f.size for f in weight_files(a.manifest) if f.digest in digests_b)
    rollup = _Rollup()
    changed: list[TensorChange] = []
    unchanged = len(common) - len(to_read)
    for key in common:
        if key not in reading:
            rollup.add(key, None, False)
    with ExitStack() as stack:
        left = _mapped(a, {shard_a[k] for k in to_read}, open_blob, stack)
        right = _mapped(b, {shard_b[k] for k in to_read}, open_blob, stack)
        unchanged += _tally([(k, left.tensor(k), right.tensor(k)) for k in to_read],
                            rollup, changed)
        read = left.read + right.read
    return VersionDiff(_ref(a), _ref(b), "weights", sorted(tb.keys() - ta.keys()),
                       sorted(ta.keys() - tb.keys()), changed, unchanged, rollup.modules(),
                       shared, read)


def _tally(items: list[tuple[str, torch.Tensor, torch.Tensor]], rollup: _Rollup,
           changed: list[TensorChange]) -> int:
    """Compare each ``(key, a, b)``, add the changed ones to ``changed`` (in key order) and
    ``rollup``; returns how many are unchanged."""
    alike = [(k, x, y) for k, x, y in items if x.shape == y.shape]
    found = [_change(k, x, y, None) for k, x, y in items if x.shape != y.shape]
    for change in found:
        rollup.add(change.key, None, True)
    unchanged = 0
    for (key, x, y), sums in zip(alike, deltas.compare([(x, y) for _, x, y in alike]),
                                 strict=True):
        is_changed = sums is not None and (sums.differ > 0 or x.dtype != y.dtype)
        rollup.add(key, sums, is_changed)
        if is_changed:
            found.append(_change(key, x, y, sums))
        else:
            unchanged += 1
    changed.extend(sorted(found, key=lambda c: c.key))
    return unchanged


def states(a: VersionRecord, b: VersionRecord, sa: Mapping[str, Any],
           sb: Mapping[str, Any]) -> VersionDiff:
    """The diff of two dequantized state dicts (a quantized version against its float or
    dtype-cast sibling)."""
    ka = {k for k, v in sa.items() if isinstance(v, torch.Tensor)}
    kb = {k for k, v in sb.items() if isinstance(v, torch.Tensor)}
    rollup, changed = _Rollup(), list[TensorChange]()
    unchanged = _tally([(k, sa[k], sb[k]) for k in sorted(ka & kb)], rollup, changed)
    read = sum(f.size for r in (a, b) for f in weight_files(r.manifest))
    return VersionDiff(_ref(a), _ref(b), "dequantized", sorted(kb - ka), sorted(ka - kb),
                       changed, unchanged, rollup.modules(), 0, read)


def adapter_over_base(adapter: VersionRecord, base: VersionRecord, open_blob: OpenBlob,
                      *, adapter_first: bool) -> VersionDiff:
    """Each adapted module's effective change ``B @ A * scaling`` against its base weight."""
    origin = _ref(adapter)
    config = formats.adapter(adapter.manifest, origin).record["config"]
    pairs = _lora_pairs(adapter.manifest["tensors"])
    rollup, changed = _Rollup(), []
    with ExitStack() as stack:
        lora = _mapped(adapter, set(weight_files(adapter.manifest)), open_blob, stack)
        shard_b = _shard_of(base.manifest)
        wanted = {f"{m}.weight" for m in pairs} & shard_b.keys()
        plain = _mapped(base, {shard_b[k] for k in wanted}, open_blob, stack)
        for module, (key_a, key_b) in sorted(pairs.items()):
            weight_key = f"{module}.weight"
            if weight_key not in wanted:
                continue
            w = plain.tensor(weight_key)
            low = lora.tensor(key_a).to(torch.float32)
            high = lora.tensor(key_b).to(torch.float32)
            delta = (high @ low) * _scaling(config, module)
            if config.get("fan_in_fan_out"):
                delta = delta.T
            if delta.shape != w.shape:
                continue
            sums = deltas.compare([(None, delta)])[0] or Sums(numel=delta.numel())
            sums.base2 = deltas.norm2(w)
            rollup.add(weight_key, sums, sums.differ > 0)
            if sums.differ:
                changed.append(TensorChange(
                    weight_key, (list(w.shape), list(w.shape)),
                    (str(w.dtype).removeprefix("torch."),) * 2, sums.relative, sums.max_abs,
                    sums.differ / sums.numel, math.sqrt(sums.delta2)))
        read = lora.read + plain.read
    first, second = (adapter, base) if adapter_first else (base, adapter)
    return VersionDiff(_ref(first), _ref(second), "adapter", [], [], changed, 0,
                       rollup.modules(), 0, read)


def _lora_pairs(tensors: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """module path in the base -> (lora_A key, lora_B key)."""
    out = {}
    for key in tensors:
        if key.endswith(".lora_A.weight"):
            module = key.removesuffix(".lora_A.weight")
            other = f"{module}.lora_B.weight"
            if other in tensors:
                out[module.removeprefix("base_model.model.")] = (key, other)
    return out


def _scaling(config: Mapping[str, Any], module: str) -> float:
    """PEFT's ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), per-module patterns included."""
    def pattern(table: object, default: float) -> float:
        if isinstance(table, dict):
            for name, value in table.items():
                if module == name or module.endswith(f".{name}"):
                    return float(value)
        return default

    r = pattern(config.get("rank_pattern"), float(config.get("r") or 8))
    alpha = pattern(config.get("alpha_pattern"), float(config.get("lora_alpha") or 8))
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


# -- reading --------------------------------------------------------------------------------

def _shard_of(manifest: Mapping[str, Any]) -> dict[str, VersionFile]:
    return {key: f for f in weight_files(manifest) for key in f.tensors}


class _Opened:
    """The mapped tensors of some shards of one version."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.read = 0

    def tensor(self, key: str) -> torch.Tensor:
        return self.tensors[key]


def _mapped(record: VersionRecord, shards: set[VersionFile], open_blob: OpenBlob,
            stack: ExitStack) -> _Opened:
    """Map ``shards`` of ``record`` from the verified cache: tensors are views of the mapped
    files (pages are read as the comparison touches them, never copied whole)."""
    opened = _Opened()
    specs = record.manifest["tensors"]
    for shard in sorted(shards, key=lambda f: f.name):
        fh = stack.enter_context(open_blob(shard.digest, shard.size))
        opened.tensors.update(load_shard(fh, {k: specs[k] for k in shard.tensors},
                                         lambda _k: torch.device("cpu"),
                                         lambda _k, stored, _d: stored, origin=_ref(record)))
        opened.read += shard.size
    return opened


def _ref(record: VersionRecord) -> str:
    return f"{record.name}:v{record.version}"
