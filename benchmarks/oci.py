"""OCI (rows 19-21): the OCI door against the CNCF distribution registry on loopback.

19: ``push_oci`` of the bench version against oras-py pushing the same files (both into an
    empty registry each run). 20: a pull to CPU against oras-py fetching the same layers plus
    ``safetensors.load_file`` and ``load_state_dict(assign=True)``, every byte touched. 21: the
    re-push of a version whose one block was fine-tuned: bytes uploaded / changed shard bytes.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import registry
from registry.files import version_files

from .helpers import (
    FACTORY,
    Bench,
    Case,
    build,
    clear_cache,
    duration,
    interleaved,
    kwargs,
    meta_module,
    touch_module,
)
from .report import Row


@contextlib.contextmanager
def distribution(root: Path) -> Iterator[tuple[dict[str, Any], Callable[[], str]]]:
    """``docker-registry`` (Debian's distribution 2.8) on a free loopback port; yields its
    host and a function that empties its storage (a restart on a fresh directory)."""
    exe = shutil.which("docker-registry")
    if exe is None:
        raise RuntimeError("docker-registry not installed (apt-get install docker-registry)")
    state: dict[str, Any] = {}

    def start() -> None:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        (root / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: 127.0.0.1:{port}\n")
        state["proc"] = subprocess.Popen([exe, "serve", str(root / "config.yml")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state["host"] = f"127.0.0.1:{port}"
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), .1):
                return
            time.sleep(0.02)

    def stop() -> None:
        state["proc"].terminate()
        state["proc"].wait(10)

    def fresh() -> str:
        stop()
        start()
        return str(state["host"])

    start()
    try:
        yield state, fresh
    finally:
        stop()


def oci_rows(b: Bench) -> list[Row]:
    rows = [Row(19, "push to the local distribution registry (OCI, ModelPack)",
                "oras-py pushing the same files to an empty registry", "<= 1.1x"),
            Row(20, "pull from it to CPU", "oras-py pull of the same layers + load_file + "
                "load_state_dict(assign)", "<= 1.0x"),
            Row(21, "OCI re-push after a one-block fine-tune",
                "bytes uploaded / changed shard bytes", "<= 1.2x")]
    try:
        import oras.provider
    except ImportError as exc:
        for row in rows:
            row.notes.append(f"oras-py not installed: {exc}")
        return rows
    if shutil.which("docker-registry") is None:
        for row in rows:
            row.notes.append("docker-registry not installed (apt-get install docker-registry)")
        return rows
    reg = b.reg
    files = [(f, reg.backend.blob_path(f.digest, f.size))
             for f in version_files(reg.show(b.ref).metadata)]
    memo = reg.settings.cache_dir / "oci"
    with distribution(b.work / "oci-registry") as (state, fresh):
        def ours() -> Any:
            return reg.push_oci(b.ref, f"oci://{state['host']}/bench/model:v1")

        def oras_push() -> Any:
            client = oras.provider.Registry(hostname=state["host"], insecure=True)
            return client.push(target=f"{state['host']}/bench/oras:v1",
                               files=[str(p) for _, p in files],
                               disable_path_validation=True)

        def fresh_registry_and_memo() -> None:
            fresh()
            shutil.rmtree(memo, ignore_errors=True)

        t = interleaved({"ours": Case(ours, prepare=fresh_registry_and_memo),
                         "oras": Case(oras_push, prepare=fresh)}, runs=b.runs)
        _fill(rows[0], t["ours"].median, t["oras"].median, "push_oci", "oras-py push",
              b.nbytes)

        ours()  # the artifact both pulls read
        oras_push()
        target = f"oci://{state['host']}/bench/model:v1"
        scratch = b.work / "oci-oras-pull"

        def our_pull() -> float:
            return touch_module(reg.pull(target, device="cpu"))

        def oras_pull() -> float:
            from safetensors.torch import load_file

            client = oras.provider.Registry(hostname=state["host"], insecure=True)
            container = f"{state['host']}/bench/model:v1"
            manifest = client.get_manifest(container)
            state_dict: dict[str, torch.Tensor] = {}
            for layer in manifest["layers"]:
                path = scratch / layer["annotations"]["org.cncf.model.filepath"]
                client.download_blob(container, layer["digest"], str(path))
                if path.suffix == ".safetensors":
                    state_dict.update(load_file(path))
            m = meta_module(b.size)
            m.load_state_dict(state_dict, assign=True)
            return touch_module(m)

        def empty_scratch() -> None:
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)

        t = interleaved({"ours": Case(our_pull, prepare=lambda: clear_cache(reg)),
                         "oras": Case(oras_pull, prepare=empty_scratch)}, runs=b.runs)
        _fill(rows[1], t["ours"].median, t["oras"].median, "pull", "oras-py pull + load",
              b.nbytes)
        rows[2] = _repush(rows[2], b, state["host"])
    return rows


def _fill(row: Row, ours: float, peer: float, name: str, peer_name: str, nbytes: int) -> None:
    ratio = ours / peer
    row.measured = (f"{name} {duration(ours)} ({nbytes / ours / 1e6:.0f} MB/s), {peer_name} "
                    f"{duration(peer)} ({nbytes / peer / 1e6:.0f} MB/s)")
    row.ratio = f"{ratio:.2f}x"
    row.ok = ratio <= float(row.target.removeprefix("<= ").removesuffix("x"))


def _repush(row: Row, b: Bench, host: str) -> Row:
    reg = registry.Registry(home=b.work / "oci-repush-home")
    net = build(b.size)
    shard = max(b.nbytes // 8, 2**20)
    v1 = reg.push(net, "tuned", shard_size=shard, factory=FACTORY,
                  factory_kwargs=kwargs(b.size))
    reg.push_oci("tuned:v1", f"oci://{host}/bench/tuned")
    with torch.no_grad():
        for p in net.blocks[-1].parameters():
            p.add_(0.01)
    v2 = reg.push(net, "tuned", shard_size=shard, factory=FACTORY,
                  factory_kwargs=kwargs(b.size))
    done = reg.push_oci("tuned:v2", f"oci://{host}/bench/tuned")
    old = {f.digest for f in version_files(v1.metadata)}
    changed = sum(f.size for f in version_files(v2.metadata) if f.digest not in old)
    reg.close()
    ratio = done.bytes_uploaded / changed
    row.measured = (f"{done.bytes_uploaded / 1e6:.2f} MB uploaded ({done.uploaded} of "
                    f"{done.layers} layers) for {changed / 1e6:.2f} MB of changed shards")
    row.ratio = f"{ratio:.3f}x"
    row.ok = ratio <= 1.2
    return row
