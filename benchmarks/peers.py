"""Peers (rows 14-16): the pull against the loaders a user would pick instead, from a local file
with the page cache warm and then cold, and from S3.

Peers (the ``bench`` extra): runai-model-streamer, tensorizer, fastsafetensors (CPU, no GDS) and
``torch.load(mmap=True)`` + ``load_state_dict(assign=True)``. Every case ends with a module
whose every byte was read once (``touch``), so a memory-mapped load is charged its page faults.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import registry
from registry import manifest as mf

from .helpers import (
    FACTORY,
    MB,
    Bench,
    Case,
    Size,
    build,
    clear_cache,
    duration,
    env,
    huge_mapped,
    interleaved,
    kwargs,
    local_backend,
    meta_module,
    touch_module,
)
from .report import Row
from .s3 import s3_endpoint, store_transfer_config

TORCH_FILE = "peers-state_dict.pt"  # the state dict torch.load(mmap) maps, in the scratch dir


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1")


def torch_mmap_module(pt: Path, size: Size) -> torch.nn.Module:
    """The module as ``torch.load(mmap=True)`` + ``load_state_dict(assign=True)`` builds it."""
    m = meta_module(size)
    m.load_state_dict(torch.load(pt, mmap=True, weights_only=True, map_location="cpu"),
                      assign=True)
    return m


def _huge_note(b: Bench, prepare: Callable[[], Any] | None) -> str:
    """How much of each mapped load's page cache maps by 2 MiB pages, after a touch."""
    loads = {"the pull's shard": lambda: b.reg.pull(b.ref, device="cpu"),
             "torch.load's file": lambda: torch_mmap_module(b.scratch(TORCH_FILE), b.size)}
    shown = []
    for what, load in loads.items():
        if prepare:
            prepare()
        module = load()
        touch_module(module)
        share = huge_mapped(module)
        shown.append(f"{what} {'unknown' if share is None else f'{share:.0%}'}")
    return ("Mapped by 2 MiB pages after a sample (FilePmdMapped / Rss in /proc/self/smaps; "
            "the rest costs a fault per 64 KiB): " + ", ".join(shown) + ".")


def peer_cases(blob: Path, size: Size, scratch: Callable[[str], Path],
               net: torch.nn.Module) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """``{peer: load}`` for every peer installed here, and notes on those that are not."""
    from safetensors import safe_open

    warnings.filterwarnings("ignore")
    with safe_open(str(blob), framework="pt") as fh:
        keys = list(fh.keys())
    cases: dict[str, Callable[[], Any]] = {}
    missing: list[str] = []

    pt = scratch(TORCH_FILE)
    torch.save(net.state_dict(), pt)

    def torch_mmap() -> float:
        return touch_module(torch_mmap_module(pt, size))

    cases["torch.load(mmap) + assign"] = torch_mmap
    try:
        from runai_model_streamer import SafetensorsStreamer

        def runai() -> float:
            state = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_file(str(blob))
                for key, tensor in streamer.get_tensors():
                    state[key] = tensor.clone()  # the streamer reuses its buffer
            m = meta_module(size)
            m.load_state_dict(state, assign=True)
            return touch_module(m)

        cases["runai-model-streamer"] = runai
    except ImportError as exc:
        missing.append(f"runai-model-streamer not installed ({exc})")
    try:
        from tensorizer import TensorDeserializer, TensorSerializer

        tz = scratch("peers-model.tensors")
        serializer = TensorSerializer(str(tz))
        serializer.write_module(net)
        serializer.close()

        def tensorizer() -> float:
            m = meta_module(size)
            deserializer = TensorDeserializer(str(tz), device="cpu")
            deserializer.load_into_module(m)
            deserializer.close()
            return touch_module(m)

        cases["tensorizer"] = tensorizer
    except ImportError as exc:
        missing.append(f"tensorizer not installed ({exc})")
    try:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def fastsafetensors() -> float:
            loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
            try:
                loader.add_filenames({0: [str(blob)]})
                buffers = loader.copy_files_to_device()
                m = meta_module(size)
                m.load_state_dict({k: buffers.get_tensor(k) for k in keys}, assign=True)
                acc = touch_module(m)  # before close(): the tensors live in its buffers
                buffers.close()
                return acc
            finally:
                loader.close()

        cases["fastsafetensors"] = fastsafetensors
    except ImportError as exc:
        missing.append(f"fastsafetensors not installed ({exc})")
    return cases, missing


def warm_and_cold(b: Bench) -> list[Row]:
    """Rows 14 and 15: a local pull of the default model, page cache warm and then cold."""
    cases, missing = peer_cases(b.blob, b.size, b.scratch, b.net)
    ours = {"pull": lambda: touch_module(b.reg.pull(b.ref, device="cpu"))}
    row14 = Row(14, f"local pull to CPU, warm page cache, {b.nbytes / MB:.0f} MB",
                "runai-model-streamer, tensorizer, fastsafetensors (CPU), torch.load(mmap) + "
                "assign", "<= 1.0x the fastest")
    row15 = Row(15, f"local pull to CPU, cold page cache, {b.nbytes / MB:.0f} MB",
                "the same four peers", "<= 0.9x the fastest")
    for row, cold in ((row14, False), (row15, True)):
        if cold and not can_drop_caches():
            row.notes.append("Skipped: dropping the page cache needs root "
                             "(/proc/sys/vm/drop_caches).")
            continue
        prepare = drop_caches if cold else None
        t = interleaved({name: Case(fn, prepare=prepare)
                         for name, fn in {**ours, **cases}.items()}, runs=b.runs)
        medians = {name: timing.median for name, timing in t.items()}
        peers = {k: v for k, v in medians.items() if k in cases}
        best_peer = min(peers, key=peers.__getitem__)
        pull = medians["pull"]
        row.measured = "; ".join(f"{name} {duration(v)}" for name, v in medians.items())
        row.ratio = f"{pull / peers[best_peer]:.2f}x {best_peer}"
        row.ok = pull / peers[best_peer] <= (0.9 if cold else 1.0)
        row.notes.append("Samples (s): " + "; ".join(f"{n} {t[n].spread()}" for n in t) + ".")
        row.notes.append(
            f"The pull maps its pages on {b.reg.settings.prefault_threads} threads, one where "
            "the shard is out of the page cache (registry/io/prefault.py), on top of the kernel's "
            f"readahead (this disk's window: {_read_ahead_kb()} KiB).")
        row.notes.append(_huge_note(b, prepare))
        if cold:
            row.notes.append("Before every sample: `sync; echo 1 > /proc/sys/vm/drop_caches`.")
        row.notes.extend(missing)
    row14.notes.append(
        "The peers copy every tensor into private memory (runai, tensorizer, fastsafetensors) "
        "and build the module on meta then assign; the pull and torch.load(mmap) map the file.")
    return [row14, row15]


def _read_ahead_kb() -> str:
    for path in Path("/sys/block").glob("*/queue/read_ahead_kb"):
        if not path.parts[3].startswith(("loop", "zram", "ram")):
            return path.read_text().strip()
    return "unknown"


# runai's S3 client (aws-c-http) drops a ranged GET that falls below its minimum throughput
# within 1 s; moto copies the whole object for every ranged GET, so it needs these to finish.
RUNAI_S3_ENV = {"RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": "120000",
                "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT": "1", "RUNAI_STREAMER_S3_TIMEOUT": "120",
                "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}


def s3_peer(b: Bench) -> list[Row]:
    """Row 16: a cold pull from S3 (moto) against runai-model-streamer and raw boto3."""
    row = Row(16, "S3 cold pull to CPU (moto on loopback)", "runai-model-streamer on the same "
              "object and endpoint; raw boto3 at the store's concurrency",
              "<= 0.9x runai; <= 1.1x boto3")
    try:
        from runai_model_streamer import SafetensorsStreamer
        from runai_model_streamer.s3_utils.s3_utils import S3Credentials
    except ImportError as exc:
        row.notes.append(f"runai-model-streamer (with runai-model-streamer-s3) not installed: "
                         f"{exc}")
        return [row]
    import boto3

    bucket = "registry-peers"
    with s3_endpoint() as endpoint, env(**RUNAI_S3_ENV):
        client = boto3.client("s3", endpoint_url=endpoint.url)
        client.create_bucket(Bucket=bucket)
        reg = registry.Registry(home=b.work / "s3-peers-home", store=f"s3://{bucket}/models")
        mv = reg.push(build(b.s3_size), "bench", factory=FACTORY,
                      factory_kwargs=kwargs(b.s3_size))
        nbytes = int(mv.metadata["files"][0]["size"])
        key = local_backend(reg).store.uri(mf.blob_key(mv.digest)).removeprefix(
            f"s3://{bucket}/")
        config = store_transfer_config(reg)
        target = b.scratch("peers-boto3")
        creds = S3Credentials(access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                              secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                              region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                              endpoint=endpoint.url)
        ref = str(mv)

        def runai() -> float:
            state = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_file(f"s3://{bucket}/{key}", s3_credentials=creds)
                for name, tensor in streamer.get_tensors():
                    state[name] = tensor.clone()
            m = meta_module(b.s3_size)
            m.load_state_dict(state, assign=True)
            return touch_module(m)

        t = interleaved({
            "pull": Case(lambda: touch_module(reg.pull(ref, device="cpu")),
                         prepare=lambda: clear_cache(reg)),
            "boto3": Case(lambda: client.download_file(bucket, key, str(target), Config=config),
                          cleanup=lambda: target.unlink(missing_ok=True)),
            "runai": Case(runai),
        }, runs=b.runs)
        reg.close()
    p, f, r = (t[k].median for k in ("pull", "boto3", "runai"))
    row.measured = (f"pull {duration(p)}, runai {duration(r)}, boto3 {duration(f)}; "
                    f"{nbytes / MB:.0f} MB model")
    row.ratio = f"{p / r:.2f}x runai; {p / f:.2f}x boto3"
    row.ok = p / r <= 0.9 and p / f <= 1.1
    row.notes.append(
        "Samples (s): " + "; ".join(f"{n} {t[n].spread()}" for n in t) + ". The pull starts "
        "from an empty cache (untimed), downloads, hashes, verifies and maps; boto3 only "
        "downloads, with the store's part size and concurrency; runai streams with its "
        "defaults (8 MiB parts, 8 S3 workers) into private memory. runai's S3 client needed "
        f"{', '.join(f'{k}={v}' for k, v in RUNAI_S3_ENV.items())} to finish against moto "
        "(without them it aborts with AWS_ERROR_HTTP_CHANNEL_THROUGHPUT_FAILURE): moto copies "
        "the whole object for every ranged GET, which penalises small parts. Not measured "
        "against s3rver or a real bucket here.")
    return [row]
