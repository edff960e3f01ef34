"""S3 pulls (rows 5, 6 and 12) on a moto server on loopback: a cold pull against boto3 downloading
the same object with the store's transfer settings, the bytes a second pull reads from the store,
and a multi-shard model's cold pull against boto3 at the same concurrency.

Also the S3 setup other subjects use: :func:`s3_endpoint` (moto, with the registry pointed at
it) and :func:`store_transfer_config` (boto3's settings as the registry's S3 store uses them).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import registry
from registry import manifest as mf

from . import services
from .helpers import (
    FACTORY,
    MB,
    QUICK,
    S3_MODEL,
    Bench,
    Case,
    Timing,
    build,
    clear_cache,
    duration,
    env,
    fp16,
    interleaved,
    kwargs,
    local_backend,
    touch_module,
)
from .report import Row

# Row 12 runs on moto, which copies a whole object for every ranged GET: its objects stay small.
S3_SHARD = 64 * 2**20


@contextmanager
def s3_endpoint() -> Iterator[services.Endpoint]:
    """A moto S3 server on loopback, with ``REGISTRY_S3_ENDPOINT_URL`` pointing at it."""
    with services.moto_server() as endpoint, env(REGISTRY_S3_ENDPOINT_URL=endpoint.url):
        yield endpoint


def store_transfer_config(reg: registry.Registry) -> Any:
    """boto3's TransferConfig with the part size and concurrency the S3 store uses."""
    from boto3.s3.transfer import TransferConfig

    store = local_backend(reg).store
    part_size, concurrency = getattr(store, "part_size", None), getattr(store, "concurrency", None)
    if part_size is None or concurrency is None:
        return TransferConfig()
    return TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                          max_concurrency=concurrency, use_threads=True)


class CountingStore:
    """An ObjectStore wrapper that counts the bytes read from the store it wraps.

    ``local=False`` hides ``open_local`` so that a file store behaves like a remote one."""

    def __init__(self, inner: Any, *, local: bool = True) -> None:
        self.inner = inner
        self.url = inner.url
        self.local = local
        self.bytes_read = 0

    def __getattr__(self, name: str) -> Any:
        if name == "staging_dir":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def get_bytes(self, key: str) -> bytes:
        data = self.inner.get_bytes(key)
        self.bytes_read += len(data)
        return bytes(data)

    def get_to_file(self, key: str, path: Path, *,
                    progress: Callable[[int], None] | None = None,
                    size: int | None = None) -> Any:
        digest = self.inner.get_to_file(key, path, progress=progress, size=size)
        self.bytes_read += path.stat().st_size
        return digest

    def open_local(self, key: str) -> Path | None:
        path = self.inner.open_local(key) if self.local else None
        if path is not None:
            self.bytes_read += path.stat().st_size  # read in place
        return path


# -- rows 5 and 6: S3 pull, cold and then warm -----------------------------------------------------

def s3_rows(b: Bench) -> list[Row]:
    row5 = Row(5, "pull from S3 (moto on loopback), cold cache",
               "raw boto3 `download_file` of the same object, same endpoint", "<= 1.25x")
    row6 = Row(6, "second pull of the same version", "store reads counted",
               "0 bytes read from the store")
    if importlib.util.find_spec("registry.store.s3") is None:
        why = ("registry/store/s3.py is not in this checkout yet; the row runs as soon as it "
               "lands (REGISTRY_STORE_URL=s3://..., REGISTRY_S3_ENDPOINT_URL).")
        row5.notes.append(why)
        row6.notes.append("S3 unavailable, so measured on a file store with in-place reads "
                          "turned off (it then goes through the cache as a remote store does).")
        _second_pull(b, row6, remote=None)
        return [row5, row6]
    with s3_endpoint() as endpoint:
        _s3_pull(b, row5, row6, endpoint)
    return [row5, row6]


def _s3_pull(b: Bench, row5: Row, row6: Row, endpoint: services.Endpoint) -> None:
    import boto3

    bucket = "registry-bench"
    client = boto3.client("s3", endpoint_url=endpoint.url)
    client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/models"
    reg = registry.Registry(home=b.work / "s3-home", store=url)
    net = b.net if b.s3_size == b.size else build(b.s3_size)
    mv = reg.push(net, "bench", factory=FACTORY, factory_kwargs=kwargs(b.s3_size))
    del net
    nbytes = int(mv.metadata["files"][0]["size"])
    config = store_transfer_config(reg)
    key = local_backend(reg).store.uri(mf.blob_key(mv.digest)).removeprefix(f"s3://{bucket}/")
    ref = str(mv)
    target = b.scratch("boto3-download")

    def remove_target() -> None:
        target.unlink(missing_ok=True)

    t = interleaved({
        "floor": Case(lambda: client.download_file(bucket, key, str(target), Config=config),
                      cleanup=remove_target),
        "pull": Case(lambda: touch_module(reg.pull(ref, device="cpu")),
                     prepare=lambda: clear_cache(reg)),
    }, runs=b.runs)
    f, p = t["floor"].median, t["pull"].median
    row5.measured = (f"pull {duration(p)}, boto3 {duration(f)} ({nbytes / f / 1e9:.2f} GB/s "
                     f"on loopback), {nbytes / MB:.0f} MB model")
    row5.ratio = f"{p / f:.2f}x"
    row5.ok = p / f <= 1.25
    row5.notes.append(f"Samples (s): pull {t['pull'].spread()}, boto3 {t['floor'].spread()}. "
                      "Each pull starts from an empty cache (blobs and verification memos "
                      "removed, untimed). boto3 downloads with the transfer settings the store "
                      "uses (parts and concurrency from registry.store.s3), so the ratio is the "
                      "registry's own overhead; with boto3's defaults (8 MiB parts) moto is "
                      "slower still, because it copies the whole object for every ranged GET. "
                      f"That is also why these rows use a {nbytes / MB:.0f} MB model rather "
                      "than the default one.")
    if not row5.ok:
        row5.notes.append(_s3_note(reg, ref, f, p))
        row5.notes.append(_cpu_note(endpoint.pid, client, bucket, key, target, config, reg, ref))
    reg.close()
    _second_pull(b, row6, remote=(url, ref))


def _s3_note(reg: registry.Registry, ref: str, download: float, pull: float) -> str:
    """Split a cold S3 pull into download, hash and load, to say where the gap is."""
    from registry.io.digests import sha256_file

    clear_cache(reg)
    start = time.perf_counter()
    reg.pull(ref, device="cpu")
    cold = time.perf_counter() - start
    path = local_backend(reg).cache.path(reg.show(ref).digest)
    start = time.perf_counter()
    sha256_file(path)
    hashing = time.perf_counter() - start
    start = time.perf_counter()
    touch_module(reg.pull(ref, device="cpu"))
    warm = time.perf_counter() - start
    size = path.stat().st_size
    bound = max(download, hashing) + warm
    return (f"Where the time goes (one cold pull, {duration(cold)}): the download itself "
            f"(~{duration(download)}, as boto3) with sha256 computed on the parts as they "
            f"arrive, in order; sha256 alone over this file takes {duration(hashing)} "
            f"({size / hashing / 1e9:.2f} GB/s: this CPU has no SHA extensions); then the load "
            f"({duration(warm)} warm). So a verified pull costs at least max(download, hash) + "
            f"load = {duration(bound)} here, {bound / download:.2f}x the raw download"
            + (": the hash, not the transfer, is the bound, and only a faster sha256 (CPUs "
               "with SHA-NI run it at 1.5-2 GB/s) or skipping verification would close it."
               if hashing > download else
               "; what is left above that is the hash of the bytes that arrive after the "
               "parts before them (sha256 runs in order) and the cache rename.")
            )


def _cpu_note(moto_pid: int, client: Any, bucket: str, key: str, target: Path, config: Any,
              reg: registry.Registry, ref: str) -> str:
    """CPU seconds that a download and a cold pull cost, client and server, on this machine."""

    def cpu(action: Any) -> tuple[float, float, float]:
        wall, mine, server = time.perf_counter(), time.process_time(), \
            services.cpu_seconds(moto_pid)
        action()
        return (time.perf_counter() - wall, time.process_time() - mine,
                services.cpu_seconds(moto_pid) - server)

    w1, c1, s1 = cpu(lambda: client.download_file(bucket, key, str(target), Config=config))
    target.unlink(missing_ok=True)
    clear_cache(reg)
    w2, c2, s2 = cpu(lambda: touch_module(reg.pull(ref, device="cpu")))
    cores = os.cpu_count() or 1
    return (f"CPU, not the network, is the limit on this {cores}-core machine: the raw download "
            f"used {c1:.2f} s of client CPU and {s1:.2f} s of moto CPU in {w1:.2f} s; the cold "
            f"pull used {c2:.2f} s client and {s2:.2f} s moto in {w2:.2f} s. The "
            f"{c2 - c1:.2f} s of extra client CPU (mostly sha256) must share the cores with "
            "the server the bytes come from, so the overlap cannot be complete here; against a "
            "remote S3 or MinIO (the server's CPU elsewhere) the hash runs beside the transfer.")


def _second_pull(b: Bench, row: Row, remote: tuple[str, str] | None) -> None:
    from registry.store import open_store

    if remote is None:
        home = b.work / "home"
        inner = open_store((home / "objects").as_uri())
        counting = CountingStore(inner, local=False)
        reg = registry.Registry(home=home, store=counting)
        ref = b.ref
    else:
        url, ref = remote
        home = b.work / "s3-home"
        base = registry.Registry(home=home, store=url)
        counting = CountingStore(local_backend(base).store)
        reg = registry.Registry(home=home, store=counting)
    clear_cache(reg)
    touch_module(reg.pull(ref, device="cpu"))
    first = counting.bytes_read
    reads = []
    times = Timing()
    for _ in range(b.runs):
        counting.bytes_read = 0
        start = time.perf_counter()
        touch_module(reg.pull(ref, device="cpu"))
        times.samples.append(time.perf_counter() - start)
        reads.append(counting.bytes_read)
    clear_cache(reg)
    reg.close()
    worst = max(reads)
    row.measured = (f"{worst} B on each of {len(reads)} second pulls ({duration(times.median)}); "
                    f"first pull read {first / MB:.0f} MB")
    row.ratio = f"{worst} B"
    row.ok = worst == 0
    row.notes.append("Bytes are counted by a wrapper around the store (every `get_bytes`, "
                     "`get_to_file` and in-place `open_local` read).")


# -- row 12: S3 cold pull of a multi-shard model ---------------------------------------------------

def sharded_s3_pull(b: Bench) -> list[Row]:
    import boto3

    from registry.io.parallel import DOWNLOAD_CONCURRENCY as workers

    # In a default run the S3 model, not the ~4 GB one of rows 10-11: see S3_SHARD.
    size = QUICK if b.quick else S3_MODEL
    row = Row(12, "S3 cold pull of a multi-shard model (moto on loopback)",
              "raw boto3 downloads of the same objects, same concurrency", "<= 1.1x")
    with s3_endpoint() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint.url)
        client.create_bucket(Bucket="shards-bench")
        reg = registry.Registry(home=b.work / "shards-s3-home", store="s3://shards-bench/m")
        mv = reg.push(fp16(size), "shards", factory=FACTORY, factory_kwargs=kwargs(size),
                      shard_size=S3_SHARD if size != QUICK else 2 * 2**20)
        store = local_backend(reg).store
        keys = [store.uri(mf.blob_key(f["digest"])).removeprefix("s3://shards-bench/")
                for f in mv.metadata["files"]]
        nbytes = sum(int(f["size"]) for f in mv.metadata["files"])
        config = store_transfer_config(reg)
        targets = [b.scratch(f"shards-boto3-{i}") for i in range(len(keys))]

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
            "pull": Case(lambda: touch_module(reg.pull(str(mv), device="cpu", dtype="float16")),
                         prepare=lambda: clear_cache(reg)),
        }, runs=b.runs)
        reg.close()
    f, p = t["floor"].median, t["pull"].median
    row.measured = (f"pull {duration(p)}, boto3 {duration(f)}, {nbytes / MB:.0f} MB in "
                    f"{len(keys)} shards ({nbytes / f / 1e9:.2f} GB/s on loopback)")
    row.ratio = f"{p / f:.2f}x"
    row.ok = p / f <= 1.1
    row.notes.append(
        f"Samples (s): pull {t['pull'].spread()}, boto3 {t['floor'].spread()}. Each pull starts "
        f"from an empty cache. boto3 downloads the same objects {workers} at a time with the "
        "store's transfer settings; the pull also hashes each shard as it arrives and loads it "
        "in its stored float16 (dtype='auto' would add a float32 conversion on the CPU). "
        f"Shards of {S3_SHARD // 2**20} MiB and a {nbytes / MB:.0f} MB model rather than 1 GB: "
        "moto copies the whole object for every ranged GET, so large objects measure moto.")
    return [row]
