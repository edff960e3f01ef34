"""`registry ui` under a supervisor: SIGTERM (docker stop, systemd) ends MLflow and every
process it started, not only the `registry` process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import clean_env
from tests.integration.conftest import free_port
from tests.integration.serving import Service, registry_exe, wait_until_up


def _children() -> dict[int, int]:
    """pid -> parent pid of every process on this machine."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry.name)] = int(fields[1])
    return table


def _descendants(pid: int) -> set[int]:
    parents = _children()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_registry_ui_leaves_no_child(home: Path, tmp_path: Path) -> None:
    """SIGINT and SIGHUP take the same path (registry/cli/service.py run_process_group)."""
    sig = signal.SIGTERM
    port = free_port()
    log = tmp_path / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*registry_exe(), "ui", "--port", str(port)],
                                env=clean_env(home), stdout=out, stderr=subprocess.STDOUT)
    service = Service(f"http://127.0.0.1:{port}", proc, log)
    children: set[int] = set()
    try:
        wait_until_up(service, "/health", 180, "registry ui")
        children = _descendants(proc.pid)
        assert children, "mlflow server should run as a child of registry ui"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        left = sorted(p for p in children if _alive(p))
        assert not left, f"processes left after {sig.name}: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children | _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
