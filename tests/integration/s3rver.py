"""s3rver: a second, independent S3 implementation (node, from npm) on loopback.

moto and the registry both speak through botocore, so a bug they share would pass every moto
test; s3rver parses requests its own way. The test setup installs it (``npm install``, once, into
``.cache/s3rver`` at the repository root) and starts it on a free port. A missing node/npm or a
failed install skips locally and fails under ``CI=true`` (``require_service``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import require_service

VERSION = "3.7.1"
CREDENTIALS = ("S3RVER", "S3RVER")  # s3rver's fixed access key and secret
ROOT = Path(__file__).resolve().parents[2]
INSTALL_DIR = ROOT / ".cache" / "s3rver"


@dataclass
class S3rver:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def executable() -> Path:
    """The s3rver launcher, installed from npm on first use."""
    exe = INSTALL_DIR / "node_modules" / ".bin" / "s3rver"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        require_service("s3rver", "node and npm are needed to install it (apt install nodejs npm)")
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([str(npm), "install", "--prefix", str(INSTALL_DIR), "--no-audit",
                             "--no-fund", f"s3rver@{VERSION}"], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0 or not exe.exists():
        require_service("s3rver", f"npm install s3rver@{VERSION} failed:\n"
                                  f"{result.stderr[-2000:]}")
    return exe


def start(data_dir: Path, port: int) -> S3rver:
    exe = executable()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"s3rver-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), "-d", str(data_dir), "-a", "127.0.0.1", "-p",
                                 str(port), "--silent"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = S3rver(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            require_service("s3rver", f"it exited with {proc.returncode}: "
                                      f"{log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return server
        time.sleep(0.1)
    server.stop()
    require_service("s3rver", f"it did not listen on {server.url} within 60s")
    raise AssertionError("unreachable")
