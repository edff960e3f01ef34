"""Fan-out (row 37): eight processes on one node pulling one cold version at once, through a
registry server over S3 (moto on loopback), into one shared cache; and the same eight with a
cache each against eight processes downloading the same blobs with boto3.

The bytes read from the store are counted by a TCP forwarder in front of moto (the server's
S3 endpoint, so the presigned URLs clients download from point at it too): every byte moto sends
passes it. Each process imports what it needs, says it is ready, and starts when all are (a
file appears): the wall time is from that moment to the last process's end, so eight
interpreters importing torch on a small machine are not what is measured.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import registry
from registry import manifest as mf

from . import services
from .helpers import MB, QUICK, ROOT, S3_MODEL, Bench, Size, duration, env, fp16, local_backend
from .report import Row
from .s3 import s3_endpoint, store_transfer_config

PROCESSES = 8
BUCKET = "fanout-bench"
CPU: dict[str, list[float]] = {}  # CPU seconds per puller, by kind and count (for the notes)

# One puller: a registry pull (REGISTRY_URI and REGISTRY_CACHE_DIR from the environment), every
# byte read; or boto3 downloading the blobs with the store's transfer settings. It prints the
# time it ended.
_PULLER = r"""
import os, sys, time
from pathlib import Path
mode, go, ref = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if mode == "registry":
    import torch, registry
    from benchmarks.helpers import touch
    reg = registry.Registry()
    reg.show(ref)  # the HTTP client and its TLS context made, as a serving process has them
    def run():
        # In the stored float16, as row 12 loads it: dtype="auto" would add each process's
        # private float32 copy on the CPU, work that grows with the processes whatever the
        # cache does (docs/performance.md, row 37).
        state = reg.pull_state_dict(ref, device="cpu", dtype="float16")
        touch(t for t in state.values() if isinstance(t, torch.Tensor))
else:
    import boto3
    from boto3.s3.transfer import TransferConfig
    from concurrent.futures import ThreadPoolExecutor
    client = boto3.client("s3", endpoint_url=os.environ["BENCH_S3"])
    part, concurrency, workers = (int(x) for x in sys.argv[4:7])
    out = Path(sys.argv[7])
    config = TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                            max_concurrency=concurrency, use_threads=True)
    keys = sys.argv[8:]
    def run():
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda k: client.download_file(
                ref, k, str(out / k.rsplit("/", 1)[1]), Config=config), keys))
go.with_name(f"ready-{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.005)
cpu = time.process_time()
run()
print(time.process_time() - cpu, time.time(), flush=True)
"""


class CountingForwarder:
    """A loopback TCP forwarder to ``target`` that counts the bytes the target sends back."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self.sent = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True
                             ).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True
                             ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 20):
                dst.sendall(data)
                if count:
                    with self._lock:
                        self.sent += len(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _server(home: Path, store_url: str, s3_url: str) -> Iterator[str]:
    port = services.free_port()
    env = {**os.environ, "REGISTRY_HOME": str(home), "REGISTRY_STORE_URL": store_url,
           "REGISTRY_S3_ENDPOINT_URL": s3_url}
    exe = Path(sys.executable).with_name("registry")
    proc = subprocess.Popen([str(exe), "serve", "--port", str(port), "--allow-anonymous"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"{url}/healthz", timeout=1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("registry serve did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _wave(work: Path, argvs: list[list[str]], envs: list[dict[str, str]]) -> float:
    """Start one process per argv, release them together; the wall time until the last ends.
    The CPU seconds each used once released go to ``CPU``, by kind and count."""
    sync = work / f"wave-{time.monotonic_ns()}"
    sync.mkdir(parents=True)
    go = sync / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _PULLER, argv[0], str(go), *argv[1:]],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv, env in zip(argvs, envs, strict=True)]
    deadline = time.monotonic() + 600
    while len(list(sync.glob("ready-*"))) < len(procs):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"a puller failed: {[p.communicate()[1][-800:] for p in procs]}")
        time.sleep(0.01)
    start = time.time()
    go.touch()
    ends = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"a puller failed: {err[-800:]}")
        cpu, end = (float(x) for x in out.split()[-2:])
        ends.append(end)
        CPU.setdefault(f"{argvs[0][0]}x{len(procs)}", []).append(cpu)
    return max(ends) - start


def fanout(b: Bench) -> list[Row]:
    row = Row(37, f"{PROCESSES} processes pulling one cold version at once through a server "
              "over S3 (moto), one shared cache",
              "one pull alone; the bytes of the version; and the same "
              f"{PROCESSES} with a cache each against {PROCESSES} boto3 downloads",
              "store bytes 1.00x the version; wall <= 1.3x one pull")
    size = QUICK if b.quick else S3_MODEL
    rounds = 1 if b.quick else 3
    with s3_endpoint() as endpoint:
        proxy = CountingForwarder(endpoint.url)
        try:
            _measure(b, row, size, rounds, endpoint.url, proxy)
        finally:
            proxy.close()
    return [row]


def _measure(b: Bench, row: Row, size: Size, rounds: int, moto: str,
             proxy: CountingForwarder) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=moto)
    client.create_bucket(Bucket=BUCKET)
    home, store_url = b.work / "fanout-home", f"s3://{BUCKET}/m"
    with env(REGISTRY_S3_ENDPOINT_URL=moto):
        reg = registry.Registry(home=home, store=store_url)
        mv = reg.push(fp16(size), "fanout", shard_size=16 * 2**20)
        store = local_backend(reg).store
        config = store_transfer_config(reg)
        reg.close()
    files = mv.metadata["files"]
    nbytes = sum(int(f["size"]) for f in files)
    keys = [store.uri(mf.blob_key(f["digest"])).removeprefix(f"s3://{BUCKET}/") for f in files]
    from registry.io.parallel import DOWNLOAD_CONCURRENCY

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # benchmarks.helpers
    with _server(home, store_url, proxy.url) as url:
        def pullers(n: int, shared: bool, tag: str) -> tuple[float, int]:
            caches = [b.scratch(f"fanout-{tag}-{i if not shared else 0}") for i in range(n)]
            envs = [{**os.environ, "REGISTRY_URI": url, "REGISTRY_HOME": str(c.parent / "h"),
                     "REGISTRY_CACHE_DIR": str(c), "PYTHONPATH": path} for c in caches]
            before = proxy.sent
            wall = _wave(b.work, [["registry", str(mv)]] * n, envs)
            return wall, proxy.sent - before

        def boto3s(n: int, tag: str) -> float:
            outs = [b.scratch(f"fanout-boto3-{tag}-{i}") for i in range(n)]
            for out in outs:
                out.mkdir(parents=True, exist_ok=True)
            argv = ["boto3", BUCKET, str(config.multipart_chunksize), str(config.max_concurrency),
                    str(DOWNLOAD_CONCURRENCY)]
            env = {**os.environ, "BENCH_S3": proxy.url}
            return _wave(b.work, [[*argv, str(o), *keys] for o in outs], [env] * n)

        pullers(1, True, "warm-up")  # the server's first presign loads boto3: not a pull's cost
        one, shared, each, floor, read = [], [], [], [], []
        for r in range(rounds):
            one.append(pullers(1, True, f"one{r}")[0])
            wall, moved = pullers(PROCESSES, True, f"shared{r}")
            shared.append(wall)
            read.append(moved)
            each.append(pullers(PROCESSES, False, f"each{r}")[0])
            floor.append(boto3s(PROCESSES, f"{r}"))
    o, s, e, f = (statistics.median(x) for x in (one, shared, each, floor))
    bytes_ratio = max(read) / nbytes
    row.measured = (f"{nbytes / MB:.0f} MB in {len(files)} shards: store sent "
                    f"{max(read) / MB:.1f} MB to {PROCESSES} pullers sharing a cache; all "
                    f"{PROCESSES} {duration(s)}, one alone {duration(o)}; a cache each "
                    f"{duration(e)}, {PROCESSES} boto3 {duration(f)}")
    row.ratio = (f"bytes {bytes_ratio:.2f}x, wall {s / o:.2f}x; "
                 f"cache each vs boto3 {e / f:.2f}x")
    row.ok = bytes_ratio < 1.01 and s / o <= 1.3
    row.notes.append(
        f"Samples (s): one {[round(x, 3) for x in one]}, shared {[round(x, 3) for x in shared]}"
        f", each {[round(x, 3) for x in each]}, boto3 {[round(x, 3) for x in floor]}. Bytes "
        "are what moto sent through a counting forwarder (headers included, so a hair above "
        "1.00x); the server hands clients presigned URLs through the same forwarder. Every "
        "process reads every byte of the state dict it pulled (helpers.touch). The wall of one "
        "pull and of eight is measured from the moment all were ready (after an untimed pull "
        "that warms the server); on a machine with few cores the "
        f"{PROCESSES} verifying processes share them, which one alone does not: CPU seconds "
        "per process once released (a registry puller's lazy imports on its first pull "
        "included) were "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in CPU.items())
        + f" on {os.cpu_count()} cores.")
