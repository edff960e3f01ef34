"""The Hub door (row 50): ``snapshot_download`` of the bench version from ``registry serve``
through ``HF_ENDPOINT`` (a fresh client cache each run), against ``curl`` of the same bytes
from the same server's plain blob route, and the registry's own client through that server
(``registry materialize --format safetensors``: the bench model is a plain module, so its
``--format hf`` folder is the same shard; a cold client cache each run).

The huggingface_hub client lives in one process of its own for the whole row (it reads
HF_ENDPOINT at import), and is told over a pipe to download into a new cache: its import is
not timed, as curl's start is (a few ms). All three read the blob the server verified once
(the warm-up), from the page cache."""

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
for line in sys.stdin:
    path = snapshot_download("bench", cache_dir=line.strip())
    print(path, flush=True)
"""


@contextlib.contextmanager
def _server(home: Path, log: Path) -> Iterator[str]:
    port = services.free_port()
    exe = Path(sys.executable).with_name("registry")
    env = {**os.environ, "REGISTRY_HOME": str(home)}
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
        client = subprocess.Popen(
            [sys.executable, "-c", _CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "HF_ENDPOINT": f"{url}/hf",
                            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"})
        ours = registry.Registry(url, home=b.work / "hub-client")
        assert client.stdin is not None and client.stdout is not None
        stdin, stdout = client.stdin, client.stdout

        def fresh() -> Path:
            scratch.mkdir(parents=True, exist_ok=True)
            return scratch / f"run-{next(counter)}"

        def hub() -> None:
            stdin.write(f"{fresh()}\n")
            stdin.flush()
            got = Path(stdout.readline().strip()) / "model.safetensors"
            assert got.stat().st_size == b.nbytes, got

        def curl() -> None:
            out = fresh()
            subprocess.run(["curl", "-sf", "-o", str(out), f"{url}/api/v1/blobs/{digest}"],
                           check=True)
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
                             "pull": Case(materialize, prepare=clean)}, runs=b.runs)
        finally:
            stdin.close()
            client.wait(timeout=60)
            ours.close()
            clean()
    h, c, p = t["hub"].median, t["curl"].median, t["pull"].median
    mb = b.nbytes / 1e6
    row.measured = (f"snapshot_download {duration(h)} ({mb / h:.0f} MB/s), curl {duration(c)} "
                    f"({mb / c:.0f} MB/s), registry materialize {duration(p)} "
                    f"({mb / p:.0f} MB/s)")
    row.ratio = f"{c / h:.2f}x curl"
    row.ok = c / h >= 0.9
    row.notes.append(
        f"Samples (s): snapshot_download {t['hub'].spread()}, curl {t['curl'].spread()}, "
        f"registry materialize {t['pull'].spread()}. {mb:.0f} MB, one shard; server, clients "
        "and page cache on one machine (loopback), the server's verification memo warm. The "
        "registry's client hashes what it downloads into its cache before it writes DEST.")
    return [row]


_ROWS = [
    (50, "snapshot_download of the version through HF_ENDPOINT (cold client cache)",
     "curl of the same bytes from the same server (and registry materialize through it)",
     ">= 0.9x curl's throughput"),
]
