"""The Hub door (row 50): ``snapshot_download`` of the bench version from ``registry serve``
through ``HF_ENDPOINT`` (a fresh client cache each run), against ``curl`` of the same bytes
from the same server's plain blob route, and the registry's own client through that server
(``registry materialize --format safetensors``: the bench model is a plain module, so its
``--format hf`` folder is the same shard; a cold client cache each run).

The huggingface_hub client lives in one process of its own for the whole row (it reads
HF_ENDPOINT at import), and is told over a pipe to download into a new cache: its import is
not timed, as curl's start is (a few ms). All read the blob the server verified once (the
warm-up), from the page cache.

A fourth figure splits the gap: the same client's own download loop
(``huggingface_hub.file_download.http_get``, what ``hf_hub_download`` runs per file) fetching
curl's URL into a file. ``snapshot_download`` over it is what the door's protocol costs
(``model_info``, a HEAD per file, the card, the client's cache layout); curl over it is what
the client costs beside curl, which no server can change. Most of that is system time, not
Python: the client re-assembles 64 KiB reads into 10 MiB chunks (a ``BytesIO``, ``getvalue``,
slices), and glibc's malloc, by default, gives those buffers back to the kernel and faults
them in again for every chunk (measured 2026-11-28: client system time 1.3-2.2 s against
curl's 0.65 s for the 806 MB). A fifth figure runs the same ``snapshot_download`` in a second
client process with :data:`CLIENT_MALLOC`, what docs/hub.md tells a downloading process to set.

The server and the first client run with glibc's default (dynamic) mmap threshold, as a user's
``registry serve`` and ``hf download`` do, not the 128 KiB the other rows pin for their
in-process loads (helpers.pin_malloc_threshold): pinned there, the client's loop took the same
time within the noise (medians 2.25 and 2.27 s pinned, 2.52 and 2.33 s dynamic)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import registry

from . import services
from .helpers import Bench, Case, duration, interleaved
from .report import Row

_CLIENT = """
import sys
from huggingface_hub import snapshot_download
from huggingface_hub.file_download import http_get
for line in sys.stdin:
    kind, url, path = line.split()
    if kind == "get":
        with open(path, "wb") as fh:
            http_get(url, fh)
    else:
        path = snapshot_download("bench", cache_dir=path)
    print(path, flush=True)
"""


# What docs/hub.md tells a downloading process to set: glibc then keeps what the client frees
# (buffers of up to 32 MiB from the heap, 128 MiB of it kept) instead of unmapping it.
CLIENT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


def _unpinned() -> dict[str, str]:
    """This environment without the pinned mmap threshold (module docstring)."""
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    return env


@contextlib.contextmanager
def _server(home: Path, log: Path) -> Iterator[str]:
    port = services.free_port()
    exe = Path(sys.executable).with_name("registry")
    env = {**_unpinned(), "REGISTRY_HOME": str(home)}
    env.pop("REGISTRY_AUTH_FILE", None)
    env.pop("REGISTRY_URI", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), "serve", "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(url + "/healthz", timeout=2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"registry serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def hub_rows(b: Bench) -> list[Row]:
    row = Row(*_ROWS[0])
    if shutil.which("curl") is None:
        row.notes.append("not run: curl is not installed")
        return [row]
    digest = b.reg.show(b.ref).metadata["files"][0]["digest"]  # the one shard's blob
    scratch = b.scratch("hub")
    counter = itertools.count()
    with _server(b.work / "home", b.work / "hub-serve.log") as url:
        hub_env = {**_unpinned(), "HF_ENDPOINT": f"{url}/hf", "HF_HUB_DISABLE_TELEMETRY": "1",
                   "HF_HUB_DISABLE_XET": "1"}
        clients = [subprocess.Popen([sys.executable, "-c", _CLIENT], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env)
                   for env in (hub_env, {**hub_env, **CLIENT_MALLOC})]
        ours = registry.Registry(url, home=b.work / "hub-client")

        def fresh() -> Path:
            scratch.mkdir(parents=True, exist_ok=True)
            return scratch / f"run-{next(counter)}"

        blob_url = f"{url}/api/v1/blobs/{digest}"

        def ask(kind: str, target: str, client: int = 0) -> Path:
            stdin, stdout = clients[client].stdin, clients[client].stdout
            assert stdin is not None and stdout is not None
            stdin.write(f"{kind} {target} {fresh()}\n")
            stdin.flush()
            return Path(stdout.readline().strip())

        def hub() -> None:
            got = ask("snapshot", "bench") / "model.safetensors"
            assert got.stat().st_size == b.nbytes, got

        def hub_tuned() -> None:
            got = ask("snapshot", "bench", client=1) / "model.safetensors"
            assert got.stat().st_size == b.nbytes, got

        def loop() -> None:
            assert ask("get", blob_url).stat().st_size == b.nbytes

        def curl() -> None:
            out = fresh()
            subprocess.run(["curl", "-sf", "-o", str(out), blob_url], check=True)
            assert out.stat().st_size == b.nbytes

        def materialize() -> None:
            written = ours.materialize_uri("registry://bench", fresh(), format="safetensors")
            assert written[0].stat().st_size == b.nbytes

        def clean() -> None:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(b.work / "hub-client" / "cache", ignore_errors=True)
            os.sync()

        try:
            t = interleaved({"hub": Case(hub, prepare=clean), "curl": Case(curl, prepare=clean),
                             "tuned": Case(hub_tuned, prepare=clean),
                             "loop": Case(loop, prepare=clean),
                             "pull": Case(materialize, prepare=clean)}, runs=b.runs)
        finally:
            for client in clients:
                assert client.stdin is not None
                client.stdin.close()
                client.wait(timeout=60)
            ours.close()
            clean()
    h, c, p, g = t["hub"].median, t["curl"].median, t["pull"].median, t["loop"].median
    tuned = t["tuned"].median
    mb = b.nbytes / 1e6
    row.measured = (f"snapshot_download {duration(h)} ({mb / h:.0f} MB/s), with the client's "
                    f"malloc set as docs/hub.md shows {duration(tuned)} ({mb / tuned:.0f} MB/s: "
                    f"{c / tuned:.2f}x curl), curl {duration(c)} ({mb / c:.0f} MB/s), "
                    f"registry materialize {duration(p)} ({mb / p:.0f} MB/s); the client's "
                    f"http_get of curl's URL {duration(g)}")
    row.ratio = f"{c / h:.2f}x curl"
    row.ok = c / h >= 0.9
    row.notes.append(
        f"Samples (s): snapshot_download {t['hub'].spread()}, the same with "
        f"{' '.join(f'{k}={v}' for k, v in CLIENT_MALLOC.items())} {t['tuned'].spread()}, "
        f"curl {t['curl'].spread()}, http_get {t['loop'].spread()}, registry materialize "
        f"{t['pull'].spread()}. The ratio is the client's as users run it, by default; with "
        f"the two glibc settings its malloc no longer gives its 10 MiB download buffers back to "
        f"the kernel and faults them in again for every chunk, which is most of its system "
        f"time. snapshot_download takes {h / g:.2f}x the client's own download loop on curl's "
        f"URL (the door's protocol), which takes {g / c:.2f}x curl (the client). "
        f"{mb:.0f} MB, one shard; server, clients and page cache on one machine (loopback), "
        "the server's verification memo warm, glibc's default mmap threshold in the server "
        "and the client. The registry's client hashes what it downloads into its cache "
        "before it writes DEST.")
    return [row]


_ROWS = [
    (50, "snapshot_download of the version through HF_ENDPOINT (cold client cache)",
     "curl of the same bytes from the same server (and registry materialize through it)",
     ">= 0.9x curl's throughput"),
]
