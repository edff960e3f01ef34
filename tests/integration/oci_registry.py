"""The CNCF distribution registry (Debian's ``docker-registry``, 2.8) on loopback, for tests.

Started with a config of its own (filesystem storage under a temporary directory, optional
htpasswd or token auth, ``oci_token.py`` being the token server) and its access log kept, so a
test can count the blob uploads it received. A missing binary skips locally and fails under
``CI=true`` (``.ci/run`` installs the package).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import require_service

BINARY = "docker-registry"


@dataclass
class OciRegistry:
    host: str  # 127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    log: Path
    root: Path

    def ref(self, repo: str, tag: str = "") -> str:
        return f"oci://{self.host}/{repo}" + (f":{tag}" if tag else "")

    def completed_uploads(self) -> list[str]:
        """Digests of the blob uploads the registry completed (the final PUT ?digest=)."""
        text = self.log.read_text(errors="replace")
        return re.findall(r'http\.request\.method=PUT http\.request\.remoteaddr=\S+ '
                          r'http\.request\.uri="/v2/[^"]*/blobs/uploads/[^"]*digest='
                          r'(sha256(?::|%3A)[0-9a-f]{64})[^"]*"[^\n]*http\.response\.status=201',
                          text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd entry (the distribution registry reads only bcrypt)."""
    exe = shutil.which("htpasswd")
    if exe is not None:
        return subprocess.run([exe, "-nbB", user, password], check=True, capture_output=True,
                              text=True).stdout.strip()
    try:
        import bcrypt
    except ImportError:
        require_service("htpasswd", "neither apache2-utils' htpasswd nor python bcrypt found")
    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}"


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (a TLS registry is bound there:
    the client speaks plain HTTP to loopback hosts)."""
    found = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    for address in found:
        if address.count(".") == 3 and not address.startswith("127."):
            return address
    require_service("a non-loopback address", "`hostname -I` lists no IPv4 address")
    raise AssertionError("unreachable")


def tls_files(workdir: Path, address: str) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for ``address``: (ca.pem, cert.pem, key.pem)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from tests.keys import ca_and_leaf

    ca, cert, key = ca_and_leaf("registry test CA", address,
                                [x509.IPAddress(ipaddress.ip_address(address))])
    paths = (workdir / "ca.pem", workdir / "cert.pem", workdir / "key.pem")
    workdir.mkdir(parents=True, exist_ok=True)
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def start(workdir: Path, *, users: dict[str, str] | None = None, address: str = "127.0.0.1",
          tls: tuple[Path, Path] | None = None,
          token: dict[str, str] | None = None) -> OciRegistry:
    """``token``: the ``auth: token:`` settings (realm, service, issuer, rootcertbundle)."""
    exe = shutil.which(BINARY)
    if exe is None:
        require_service("distribution registry", f"{BINARY} not found "
                                                 "(apt-get install docker-registry)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    auth = ""
    if users:
        passwd = workdir / "htpasswd"
        passwd.write_text("".join(htpasswd_line(u, p) + "\n" for u, p in users.items()))
        auth = f"auth:\n  htpasswd:\n    realm: test-realm\n    path: {passwd}\n"
    if token:
        auth = "auth:\n  token:\n" + "".join(f"    {k}: {v}\n" for k, v in token.items())
    config = workdir / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}:{port}\n"
        + (f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n" if tls else "") + auth)
    log = workdir / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([exe, "serve", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = OciRegistry(f"{address}:{port}", proc, log, workdir / "data")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            require_service("distribution registry", f"it exited with {proc.returncode}: "
                                                     f"{log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.2):
            return server
        time.sleep(0.05)
    server.stop()
    require_service("distribution registry", "it did not listen within 30s")
    raise AssertionError("unreachable")
