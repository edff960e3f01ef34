"""Webhook secrets sealed with a key kept outside the catalog, so a dump of the catalog (a
backup, a replica, a support bundle) does not reveal them.

The key is ``REGISTRY_WEBHOOK_KEY`` (a Fernet key: ``python -c "from cryptography.fernet
import Fernet; print(Fernet.generate_key().decode())"``), else the file
``$REGISTRY_HOME/webhook.key``, created with mode 0600 on first use. Every server replica on one
catalog must hold the same key (set the variable, or mount the same file): a replica with
another key cannot sign deliveries, and records that in each attempt instead.

A sealed secret is ``fernet:<token>`` (AES-128-CBC and HMAC-SHA256, from ``cryptography``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SettingsError

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

PREFIX = "fernet:"
KEY_FILE = "webhook.key"
# At most this many opened secrets are kept (one per webhook), so a server whose webhooks
# come and go does not keep every secret it ever opened.
_OPENED_KEPT = 1024


class Sealer:
    """Seals and opens secrets with the key from ``key`` (the variable's value), else the key
    file at ``path`` (made on the first seal)."""

    def __init__(self, key: str | None, path: Path) -> None:
        self.key = key
        self.path = path
        # Secrets opened before, by sealed form: a delivery worker opens its webhooks' secrets
        # once, not once per delivery (each costs a read of the key file and a decryption).
        self._opened: dict[str, str] = {}

    def seal(self, secret: str) -> str:
        return PREFIX + self._fernet(create=True).encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, sealed: str) -> str:
        """The secret; SettingsError when this key did not seal it."""
        if sealed in self._opened:
            return self._opened[sealed]
        from cryptography.fernet import InvalidToken

        if not sealed.startswith(PREFIX):
            raise SettingsError("a webhook secret in the catalog is not sealed; remove the "
                                "webhook and add it again")
        try:
            secret = self._fernet(create=False).decrypt(sealed[len(PREFIX):].encode("ascii")) \
                .decode("utf-8")
        except InvalidToken:
            raise SettingsError(
                f"webhook secrets were sealed with another key than {self._where()}; give "
                "every replica the same REGISTRY_WEBHOOK_KEY (or webhook.key file)") from None
        if len(self._opened) < _OPENED_KEPT:
            self._opened[sealed] = secret
        return secret

    def _where(self) -> str:
        return "REGISTRY_WEBHOOK_KEY" if self.key else str(self.path)

    def _fernet(self, *, create: bool) -> Fernet:
        from cryptography.fernet import Fernet

        key = self.key.encode("ascii") if self.key else self._file_key(create=create)
        try:
            return Fernet(key)
        except ValueError:
            raise SettingsError(f"{self._where()} is not a Fernet key (32 bytes, url-safe "
                                "base64); make one with `python -c \"from cryptography.fernet "
                                "import Fernet; print(Fernet.generate_key().decode())\"`") \
                from None

    def _file_key(self, *, create: bool) -> bytes:
        from cryptography.fernet import Fernet

        with contextlib.suppress(FileNotFoundError):
            return self.path.read_bytes().strip()
        if not create:
            raise SettingsError(f"no webhook key at {self.path} (nor REGISTRY_WEBHOOK_KEY) to "
                                "open the secrets sealed with it; restore the file or set the "
                                "variable")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = Fernet.generate_key()
        # Written whole under a temporary name, then linked into place: a process that races
        # this one reads a complete key (the first link wins), never an empty file.
        tmp = self.path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key + b"\n")
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            key = self.path.read_bytes().strip()
        finally:
            tmp.unlink(missing_ok=True)
        return key
