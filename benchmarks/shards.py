"""Rows 10-13 (issue 10): a multi-shard fp16 model pushed, re-pushed as a fine-tune, pulled from
S3 and pulled locally, each against its floor in the same run.

The model is the benchmark MLP in float16, ~4 GB in a default run (15 blocks of 4096 -> 16384),
so every block is a shard of its own at the default 1 GiB target; ``--quick`` uses the quick
model with a target small enough to give several shards.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

import registry
from registry import manifest as mf

from . import measure, model, services
from .measure import Case, interleaved, touch, touch_module
from .report import Row

MB = 1e6
LARGE = model.Size("large", dim=4096, hidden=16384, blocks=15)  # ~4.0 GB of float16
# Row 12 runs on moto, which copies a whole object for every ranged GET: its objects stay small.
S3_SHARD = 64 * 2**20


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fp16(size: model.Size, seed: int = 0) -> model.BenchModel:
    return model.build(size, seed=seed).half()


def _store_files(reg: registry.Registry, mv: registry.ModelVersion) -> list[Path]:
    store = reg.backend.store  # type: ignore[attr-defined]
    paths = [store.open_local(mf.blob_key(f["digest"])) for f in mv.metadata["files"]]
    return [p for p in paths if p is not None]


def sharded_rows(b: Any) -> list[Row]:
    quick = b.size == model.QUICK
    size = model.QUICK if quick else LARGE
    shard_size = 4 * 2**20 if quick else 2**30
    net = _fp16(size)
    home = b.work / "shards-home"
    reg = registry.Registry(home=home)
    kwargs = model.kwargs(size)
    try:
        rows = _push_rows(b, reg, net, size, shard_size, kwargs)
        rows.append(_local_pull_row(b, reg, size))
        rows.insert(2, _s3_row(b, size if quick else model.S3, kwargs if quick else
                               model.kwargs(model.S3)))
        return rows
    finally:
        reg.close()


# -- rows 10 and 11: push and a fine-tune's re-push ------------------------------------------------

def _push_rows(b: Any, reg: registry.Registry, net: model.BenchModel, size: model.Size,
               shard_size: int, kwargs: dict[str, int]) -> list[Row]:
    from safetensors.torch import save_file

    mlflow = _quiet_mlflow(b)
    floor_file = b.scratch("shards-floor.safetensors")
    state = {k: v.contiguous() for k, v in net.state_dict().items()}

    def floor() -> str:
        save_file(state, str(floor_file), metadata={"format": "pt"})
        return measure.sha256_file(floor_file)

    def log_model() -> None:
        with mlflow.start_run(experiment_id=b.shards_experiment):
            mlflow.pytorch.log_model(net, name="model", serialization_format="pickle")

    def push(into: registry.Registry = reg) -> registry.ModelVersion:
        return into.push(net, "shards", factory=model.FACTORY, factory_kwargs=kwargs,
                         shard_size=shard_size)

    # Each timed push goes to a store of its own, empty: a push to a store holding these
    # weights compares them with the stored shards and writes nothing (registry/unchanged.py).
    fresh: list[registry.Registry] = []

    def new_store() -> None:
        shutil.rmtree(b.work / "shards-fresh", ignore_errors=True)
        fresh[:] = [registry.Registry(home=b.work / "shards-fresh")]
        os.sync()

    def drop_store() -> None:
        fresh.pop().close()
        shutil.rmtree(b.work / "shards-fresh", ignore_errors=True)

    t = interleaved({
        "floor": Case(floor, prepare=os.sync, cleanup=lambda: floor_file.unlink(missing_ok=True)),
        "push": Case(lambda: push(fresh[0]), prepare=new_store, cleanup=drop_store),
        "mlflow": Case(log_model, prepare=os.sync, cleanup=b.clear_shards_art),
    }, runs=b.runs)
    f, p, m = (t[k].median for k in ("floor", "push", "mlflow"))
    full = push()
    nbytes = int(full.metadata["push"]["bytes"])
    shards = int(full.metadata["push"]["shards"])
    row10 = Row(10, f"push of a {nbytes / MB:,.0f} MB fp16 model in {shards} shards",
                "floor: `save_file` + single-threaded sha256; peer: `mlflow.pytorch.log_model` "
                "default", "<= 0.75x floor; >= 3x faster than MLflow")
    row10.measured = f"push {_s(p)}, floor {_s(f)}, MLflow {_s(m)}"
    row10.ratio = f"{p / f:.2f}x floor; {m / p:.1f}x faster"
    row10.ok = p / f <= 0.75 and m / p >= 3
    row10.notes.append(
        f"Samples (s): push {t['push'].spread()}, floor {t['floor'].spread()}, MLflow "
        f"{t['mlflow'].spread()}. Shards are written and hashed on {os.cpu_count()} CPU(s) in "
        f"parallel threads; the floor writes one file and hashes it in one thread. Each push "
        "goes to a new, empty store (created and removed untimed), so every shard is written, "
        "hashed and stored.")

    # Row 11: the last block changes (a fine-tune of the head end); each run draws new values.
    last = f"blocks.{size.blocks - 1}."
    changed_bytes = sum(v.numel() * v.element_size() for k, v in state.items()
                        if k.startswith(last))
    uploaded: list[int] = []
    seeds = iter(range(1, 1000))

    def retune() -> None:
        with torch.no_grad():
            for p_ in net.blocks[-1].parameters():
                p_.add_(torch.randn(p_.shape, generator=torch.Generator().manual_seed(
                    next(seeds))).to(p_.dtype) * 1e-3)

    def repush() -> None:
        mv = push()
        uploaded.append(int(mv.metadata["push"]["bytes_uploaded"]))

    t2 = interleaved({"repush": Case(repush, prepare=retune)}, runs=b.runs)
    r = t2["repush"].median
    sent = statistics.median(uploaded)
    row11 = Row(11, "re-push of a fine-tune of row 10's model with only its last block changed",
                "the full push (row 10); bytes uploaded",
                "bytes <= 1.2x the changed groups'; time <= 0.5x the full push")
    row11.measured = (f"re-push {_s(r)} (full push {_s(p)}), uploaded {sent / MB:.0f} MB for "
                      f"{changed_bytes / MB:.0f} MB changed")
    row11.ratio = f"{sent / changed_bytes:.2f}x bytes; {r / p:.2f}x time"
    row11.ok = sent / changed_bytes <= 1.2 and r / p <= 0.5
    row11.notes.append(
        f"Samples (s): re-push {t2['repush'].spread()}. Each run perturbs the last block with "
        "new values first (untimed), so its shard is new every time. The other shards equal "
        "those of the version before, whose blobs are in the file store with verification "
        "memos: they are compared byte for byte with those blobs (read through the page "
        "cache) instead of being written and hashed; only the changed shard is.")
    return [row10, row11]


def _quiet_mlflow(b: Any) -> Any:
    import shutil

    from .rows import _quiet_mlflow as quiet

    mlflow = quiet()
    art = b.scratch("shards-mlflow-artifacts")
    mlflow.set_tracking_uri(f"sqlite:///{b.scratch('shards-mlflow.db')}")
    b.shards_experiment = mlflow.create_experiment(f"shards-{time.time_ns()}",
                                                   artifact_location=art.as_uri())
    b.clear_shards_art = lambda: shutil.rmtree(art, ignore_errors=True)
    return mlflow


# -- row 12: S3 cold pull of a multi-shard model ---------------------------------------------------

def _s3_row(b: Any, size: model.Size, kwargs: dict[str, int]) -> Row:
    import boto3

    from .rows import _clear_cache, _store_transfer_config

    row = Row(12, "S3 cold pull of a multi-shard model (moto on loopback)",
              "raw boto3 downloads of the same objects, same concurrency", "<= 1.2x")
    with services.moto_server() as endpoint:
        os.environ["REGISTRY_S3_ENDPOINT_URL"] = endpoint.url
        try:
            client = boto3.client("s3", endpoint_url=endpoint.url)
            client.create_bucket(Bucket="shards-bench")
            reg = registry.Registry(home=b.work / "shards-s3-home", store="s3://shards-bench/m")
            mv = reg.push(_fp16(size), "shards", factory=model.FACTORY, factory_kwargs=kwargs,
                          shard_size=S3_SHARD if size != model.QUICK else 2 * 2**20)
            store = reg.backend.store  # type: ignore[attr-defined]
            keys = [store.uri(mf.blob_key(f["digest"])).removeprefix("s3://shards-bench/")
                    for f in mv.metadata["files"]]
            nbytes = sum(int(f["size"]) for f in mv.metadata["files"])
            config = _store_transfer_config(reg)
            targets = [b.scratch(f"shards-boto3-{i}") for i in range(len(keys))]
            from registry.parallel import DOWNLOAD_CONCURRENCY as workers

            def boto3_all() -> None:
                with ThreadPoolExecutor(workers) as pool:
                    pairs = zip(keys, targets, strict=True)
                    list(pool.map(lambda kt: client.download_file(
                        "shards-bench", kt[0], str(kt[1]), Config=config), pairs))

            def remove() -> None:
                for target in targets:
                    target.unlink(missing_ok=True)

            t = interleaved({
                "floor": Case(boto3_all, cleanup=remove),
                "pull": Case(lambda: touch_module(reg.pull(str(mv), device="cpu",
                                                          dtype="float16")),
                             prepare=lambda: _clear_cache(reg)),
            }, runs=b.runs)
            reg.close()
        finally:
            os.environ.pop("REGISTRY_S3_ENDPOINT_URL", None)
    f, p = t["floor"].median, t["pull"].median
    row.measured = (f"pull {_s(p)}, boto3 {_s(f)}, {nbytes / MB:.0f} MB in {len(keys)} shards "
                    f"({nbytes / f / 1e9:.2f} GB/s on loopback)")
    row.ratio = f"{p / f:.2f}x"
    row.ok = p / f <= 1.2
    row.notes.append(
        f"Samples (s): pull {t['pull'].spread()}, boto3 {t['floor'].spread()}. Each pull starts "
        f"from an empty cache. boto3 downloads the same objects {workers} at a time with the "
        "store's transfer settings; the pull also hashes each shard as it arrives and loads it "
        "in its stored float16 (dtype='auto' would add a float32 conversion on the CPU). "
        f"Shards of {S3_SHARD // 2**20} MiB and a {nbytes / MB:.0f} MB model rather than 1 GB: "
        "moto copies the whole object for every ranged GET, so large objects measure moto.")
    return row


# -- row 13: local pull of the multi-shard model ---------------------------------------------

def _local_pull_row(b: Any, reg: registry.Registry, size: model.Size) -> Row:
    from safetensors.torch import load_file

    mv = reg.show("shards")
    files = _store_files(reg, mv)
    nbytes = sum(p.stat().st_size for p in files)
    t = interleaved({
        "floor": Case(lambda: sum(touch(load_file(str(p)).values()) for p in files)),
        "pull": Case(lambda: touch_module(reg.pull(str(mv), device="cpu", dtype="float16"))),
    }, runs=b.runs)
    f, p = t["floor"].median, t["pull"].median
    peaks = []
    for _ in range(b.runs):
        r = measure.probe("pull", home=str(b.work / "shards-home"), ref=str(mv),
                          dtype="float16")
        peaks.append(r["peak"] - r["baseline"])
    peak = statistics.median(peaks)
    row = Row(13, f"local pull of row 10's model to CPU in its stored float16 ({len(files)} "
                  "shards), every byte read",
              "floor: `load_file` of each shard + read every byte", "<= 1.15x; peak RSS <= 1.25x")
    row.measured = (f"pull {_s(p)}, floor {_s(f)}; peak RSS +{peak / MB:.0f} MB for "
                    f"{nbytes / MB:.0f} MB")
    row.ratio = f"{p / f:.2f}x; RSS {peak / nbytes:.2f}x"
    row.ok = p / f <= 1.15 and peak / nbytes <= 1.25
    row.notes.append(
        f"Samples (s): pull {t['pull'].spread()}, floor {t['floor'].spread()}. Peak RSS as row 3 "
        "(VmHWM after clear_refs, fresh interpreter per sample): the shards stay memory-mapped, "
        "so the pages counted are the page cache's. The pull asks for float16, the stored "
        "dtype, as `load_file` gives it: with dtype='auto' a pull to the CPU computes in "
        "float32 (the device policy), which converts every tensor and doubles the bytes.")
    return row
