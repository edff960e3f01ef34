"""Diff (row 51, issue 51): ``Registry.diff`` of two versions of the bench model (806 MB in a
default run) cut into one shard per block, the second a fine-tune of one block, against the
floor of reading the one shard that changed in each version (``load_file`` + every byte read).
The diff opens no shard both versions share (their digests are equal) and compares the changed
shard's tensors in one compiled pass (registry/provenance/kernel.py) on ``deltas.WORKERS`` threads,
the calling one among them; the floor reads on one thread, so the row also times the diff on one
thread, and by the numpy passes a process uses until it has loaded the kernel (notes, not the
ratio; the kernel's load is timed too).

The floor reads every byte: ``load_file`` maps each shard and ``touch`` OR-reduces every 8-byte
word of every tensor. Its speed depends on the page cache holding the shards in 2 MiB folios
(fresh from the push here), as the diff's does."""

from __future__ import annotations

import time

import torch
from safetensors.torch import load_file

from registry import manifest as mf
from registry.provenance import deltas

from .helpers import Bench, Case, build, duration, interleaved, local_backend, touch
from .report import Row


def diff_rows(b: Bench) -> list[Row]:
    row = Row(*_ROWS[0])
    net = build(b.size)
    block = sum(t.numel() * t.element_size() for t in net.blocks[0].state_dict().values())
    shard = f"{block + 2**20}B"  # one block per shard
    va = b.reg.push(net, "bench-diff", shard_size=shard)
    with torch.no_grad():
        for p in net.blocks[len(net.blocks) // 2].parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    vb = b.reg.push(net, "bench-diff", shard_size=shard)
    digests_a = {f["digest"] for f in va.metadata["files"]}
    changed = [f for f in vb.metadata["files"] if f["digest"] not in digests_a]
    before = [f for f in va.metadata["files"]
              if f["digest"] not in {g["digest"] for g in vb.metadata["files"]}]
    assert len(changed) == len(before) == 1, (changed, before)
    store = local_backend(b.reg).store
    paths = [store.open_local(mf.blob_key(f["digest"])) for f in (before[0], changed[0])]

    # A process loads the compiled kernel once its diffs have compared KERNEL_FROM elements (or
    # for one diff that large): this one as a server or notebook that keeps diffing has.
    started = time.perf_counter()
    assert deltas.fused(deltas.KERNEL_FROM) is not None
    load = time.perf_counter() - started

    def floor() -> int:
        return sum(touch(load_file(str(p)).values()) for p in paths)

    def one_thread() -> object:
        workers, deltas.WORKERS = deltas.WORKERS, 1
        try:
            return b.reg.diff(va.ref, vb.ref)
        finally:
            deltas.WORKERS = workers

    def numpy_passes() -> object:
        fused, deltas.fused = deltas.fused, lambda elements: None
        try:
            return b.reg.diff(va.ref, vb.ref)
        finally:
            deltas.fused = fused

    t = interleaved({
        "diff": Case(lambda: b.reg.diff(va.ref, vb.ref)),
        "floor": Case(floor),
        "one thread": Case(one_thread),
        "numpy": Case(numpy_passes),
    }, runs=b.runs)
    found = b.reg.diff(va.ref, vb.ref)
    d, f = t["diff"].median, t["floor"].median
    row.measured = (f"diff {duration(d)}, floor {duration(f)}; {len(found.changed)} tensors "
                    f"changed, {found.bytes_shared / 1e6:.0f} MB shared unread, "
                    f"{found.bytes_read / 1e6:.0f} MB read")
    row.ratio = f"{d / f:.2f}x"
    row.ok = d / f <= 1.2 and found.bytes_read == before[0]["size"] + changed[0]["size"]
    row.notes.append(
        f"Samples (s): diff {t['diff'].spread()}, floor {t['floor'].spread()}. Two versions of "
        f"{len(va.metadata['files'])} shards (one block each) differing in one; the floor "
        "reads that shard's bytes in both versions (the bytes a diff cannot avoid) on one "
        f"thread, the diff also computes each tensor's change norms in float32 on "
        f"{deltas.WORKERS} threads; on one thread it took {duration(t['one thread'].median)} "
        f"({t['one thread'].median / f:.2f}x). The diff is timed in a process that has loaded "
        f"the compiled kernel (numba, read from its disk cache here in {duration(load)}), as "
        f"one does once its diffs have compared {deltas.KERNEL_FROM:,} elements; a process "
        f"that has not (a one-off diff of this size, as from the CLI) compares by numpy "
        f"passes: {duration(t['numpy'].median)} ({t['numpy'].median / f:.2f}x). Page cache "
        "warm for both.")
    return [row]


_ROWS = [
    (51, "`Registry.diff` of two 806 MB versions differing in one shard (one block changed)",
     "floor: `load_file` + read every byte of the changed shard in each version",
     "<= 1.2x floor; no byte of the shared shards read"),
]
