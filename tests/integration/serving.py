"""Real services for the server tests: `registry serve` and `mlflow server` as subprocesses on
free loopback ports, started and torn down by the tests that need them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import require_service
from tests.helpers import clean_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def registry_exe() -> list[str]:
    exe = Path(sys.executable).with_name("registry")
    return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                            "from registry.cli import main; main()"]


@dataclass
class Service:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def wait_until_up(service: Service, probe: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise AssertionError(f"{what} exited with {service.proc.returncode}:\n"
                                 f"{service.output()[-3000:]}")
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(service.url + probe, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    service.stop()
    raise AssertionError(f"{what} did not answer {probe} within {timeout:.0f}s:\n"
                         f"{service.output()[-3000:]}")


def start_registry_server(home: Path, log_dir: Path, *args: str, env_extra: dict[str, str]
                          | None = None, timeout: float = 90) -> Service:
    port = free_port()
    env = clean_env(home, **(env_extra or {}))
    log = log_dir / f"registry-serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*registry_exe(), "serve", "--port", str(port), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    service = Service(f"http://127.0.0.1:{port}", proc, log)
    wait_until_up(service, "/healthz", timeout, "registry serve")
    return service


@contextlib.contextmanager
def registry_server(home: Path, log_dir: Path, *args: str,
                    env_extra: dict[str, str] | None = None) -> Iterator[Service]:
    service = start_registry_server(home, log_dir, *args, env_extra=env_extra)
    try:
        yield service
    finally:
        service.stop()


def start_mlflow_server(db: Path, log_dir: Path, timeout: float = 120) -> Service:
    mlflow_exe = Path(sys.executable).with_name("mlflow")
    if not mlflow_exe.exists():
        require_service("mlflow server", "the mlflow package is not installed (pip install "
                                         "-e '.[dev]')")
    port = free_port()
    log = log_dir / f"mlflow-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(mlflow_exe), "server", "--backend-store-uri",
                                 f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port),
                                 "--workers", "1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=str(log_dir), start_new_session=True)
    service = Service(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_until_up(service, "/health", timeout, "mlflow server")
    except AssertionError as exc:
        require_service("mlflow server", str(exc)[:500])
    return service


def stop_group(service: Service) -> None:
    """Stop a service started in its own session, with the workers it forked."""
    if service.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.proc.pid, signal.SIGTERM)
        try:
            service.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.proc.pid, signal.SIGKILL)
            service.proc.wait(timeout=10)
