"""CUDA (row 18): a pull to CUDA against pinned host-to-device bandwidth, runai and fastsafetensors.

Runs only where ``torch.cuda.is_available()``; elsewhere the row says it was not run. Every
case ends with ``torch.cuda.synchronize()`` so its time includes the copies it queued, and
every case reads the same file with the page cache warm (the host side of a cold read is rows
14 and 15).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

import registry

from .helpers import MB, Bench, Case, duration, interleaved, meta_module
from .report import Row


def _duration(seconds: float) -> str:
    """Row 18's times: in ms up to 10 s (a GPU load of the model takes tens of ms)."""
    return duration(seconds, ms_below=10, digits=1)


def cuda_pull(b: Bench) -> list[Row]:
    row = Row(18, "pull to `cuda`, warm page cache", "pinned host-to-device copy of the same "
              "bytes; runai-model-streamer; fastsafetensors (no GDS); safetensors load_file "
              "onto cuda", ">= 0.8x bandwidth; ahead of both peers")
    if not torch.cuda.is_available():
        row.notes.append("Not run: torch reports no CUDA device on this machine.")
        return [row]
    warnings.filterwarnings("ignore")
    from safetensors import safe_open
    from safetensors.torch import load_file

    device = torch.device("cuda", 0)
    with safe_open(str(b.blob), framework="pt") as fh:
        keys = list(fh.keys())
    blob, nbytes, ref = b.blob, b.blob.stat().st_size, b.ref
    reg = registry.Registry(home=b.work / "home")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.copy_(torch.frombuffer(bytearray(blob.read_bytes()), dtype=torch.uint8))

    def done(result: Any) -> Any:
        torch.cuda.synchronize(device)
        return result

    def pinned_copy() -> Any:
        return done(host.to(device, non_blocking=True))

    def pull() -> Any:
        return done(reg.pull(ref, device=device))

    def safetensors_cuda() -> Any:
        m = meta_module(b.size)
        m.load_state_dict(load_file(str(blob), device=str(device)), assign=True)
        return done(m)

    cases: dict[str, Case] = {
        "pinned copy": Case(pinned_copy),
        "pull": Case(pull),
        "load_file(cuda)": Case(safetensors_cuda),
    }
    try:
        from runai_model_streamer import SafetensorsStreamer

        def runai() -> Any:
            state = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_file(str(blob))
                for key, tensor in streamer.get_tensors():
                    state[key] = tensor.to(device)  # as vLLM does with each streamed tensor
            m = meta_module(b.size)
            m.load_state_dict(state, assign=True)
            return done(m)

        cases["runai-model-streamer"] = Case(runai)
    except ImportError as exc:
        row.notes.append(f"runai-model-streamer not installed ({exc}).")
    try:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def fastsafetensors() -> Any:
            loader = SafeTensorsFileLoader(SingleGroup(), str(device), nogds=True)
            try:
                loader.add_filenames({0: [str(blob)]})
                buffers = loader.copy_files_to_device()
                m = meta_module(b.size)
                state = {k: buffers.get_tensor(k).clone() for k in keys}
                buffers.close()
                m.load_state_dict(state, assign=True)
                return done(m)
            finally:
                loader.close()

        cases["fastsafetensors"] = Case(fastsafetensors)
    except ImportError as exc:
        row.notes.append(f"fastsafetensors not installed ({exc}).")
    with contextlib.closing(reg):
        t = interleaved(cases, runs=b.runs, warmup=1)
    medians = {name: timing.median for name, timing in t.items()}
    p, bw = medians["pull"], medians["pinned copy"]
    peers = {k: v for k, v in medians.items()
             if k in ("runai-model-streamer", "fastsafetensors")}
    row.measured = (f"pull {_duration(p)} ({nbytes / p / 1e9:.1f} GB/s), pinned copy "
                    f"{_duration(bw)} "
                    f"({nbytes / bw / 1e9:.1f} GB/s); "
                    + ", ".join(f"{k} {_duration(v)}" for k, v in medians.items()
                                if k not in ("pull", "pinned copy")))
    row.ratio = f"{bw / p:.2f}x bandwidth" + "".join(
        f"; {v / p:.2f}x faster than {k}" for k, v in peers.items())
    row.ok = bw / p >= 0.8 and all(v > p for v in peers.values()) and len(peers) == 2
    row.notes.append(
        f"{torch.cuda.get_device_name(device)}; {nbytes / MB:.0f} MB float32 file; samples (s): "
        + "; ".join(f"{k} {timing.spread()}" for k, timing in t.items()) + ". The pull "
        "stages through two pinned 32 MiB buffers (registry/io/staging.py); the pinned copy is one "
        "host-to-device copy of the whole file from memory already pinned, a floor no loader "
        "that reads a file can reach.")
    return [row]
