"""One puller process of tests/integration/test_node_cache.py (run as a script).

It reads a registry whose store is a file store seen as a remote one (:class:`CountingStore`:
nothing is read in place, so every blob goes through the verified cache) that logs each
download's start and end to a shared file and sleeps between chunks, so that several processes
overlap and a download can be killed halfway; with ``PULLER_HOLD`` set, each of its downloads
stops after its first chunk until that file exists. It waits for ``GO`` to exist (every puller
has imported what it needs by then), then pulls or prefetches, and prints a JSON line.

    python cache_puller.py HOME CACHE_DIR LOG GO DELAY_S MODE REF
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from registry.store import FileStore
from registry.store.base import Progress

CHUNK = 64 * 1024


class CountingStore(FileStore):
    """A file store that is read like a remote one, counting and slowing each download."""

    def __init__(self, root: Path, log: Path, delay_s: float, hold: str | None) -> None:
        super().__init__(root)
        self.log, self.delay_s = log, delay_s
        self.hold = Path(hold) if hold else None

    def open_local(self, key: str) -> Path | None:
        return None

    def _note(self, what: str, key: str) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{what} {os.getpid()} {key}\n".encode())
        finally:
            os.close(fd)

    def get_to_file(self, key: str, path: Path, *, progress: Progress | None = None,
                    size: int | None = None) -> str:
        self._note("start", key)
        source = super().open_local(key)
        assert source is not None
        sha = hashlib.sha256()
        with open(source, "rb") as src, open(path, "wb", buffering=0) as out:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                sha.update(chunk)
                time.sleep(self.delay_s)
                while self.hold is not None and not self.hold.exists():
                    time.sleep(0.01)
        self._note("done", key)
        return f"sha256:{sha.hexdigest()}"


def main() -> None:
    home, cache_dir, log, go, delay, mode, ref = sys.argv[1:8]
    os.environ["REGISTRY_HOME"] = home
    os.environ["REGISTRY_CACHE_DIR"] = cache_dir
    store = CountingStore(Path(home) / "objects", Path(log), float(delay),
                          os.environ.get("PULLER_HOLD"))
    if mode == "pull":
        import torch

        import registry

        reg: Any = registry.Registry(store=store)
    else:
        from registry.versions import Versions

        reg = Versions(store=store)
    Path(go).with_name(f"ready-{os.getpid()}").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    if mode == "pull":
        state = reg.pull_state_dict(ref, device="cpu")
        sums = {k: float(t.double().sum()) for k, t in state.items()
                if isinstance(t, torch.Tensor)}
        print(json.dumps({"pid": os.getpid(), "sums": sums}))
    else:
        report = reg.prefetch(ref)
        print(json.dumps({"pid": os.getpid(), "fetched": report.fetched, "files": report.files}))


if __name__ == "__main__":
    main()
