"""Webhooks without a catalog: the signature receivers verify, the SSRF guard, the sealed
secrets, what a subscription matches, and the backoff."""

from __future__ import annotations

import ipaddress
import os
import stat
import time
from pathlib import Path

import pytest

from registry.errors import SettingsError, WebhookSignatureError, WebhookTargetError
from registry.webhooks import verify
from registry.webhooks.local import BACKOFF_CAP_S, backoff, body_of
from registry.webhooks.records import check_events, check_models, matches
from registry.webhooks.sealing import Sealer
from registry.webhooks.sender import Sender
from registry.webhooks.signing import signature, signed_headers
from registry.webhooks.targets import check, refusal

SECRET = "whsec_test-secret-of-enough-length"


def test_a_delivery_verifies_with_its_secret_and_any_header_case() -> None:
    body = body_of({"kind": "alias.set", "name": "m"}, "wh_0123456789abcdef", "dl_1")
    headers = signed_headers(SECRET, "alias.set", "dl_1", body)
    verify(SECRET, headers, body)
    verify(SECRET, {k.lower(): v for k, v in headers.items()}, body.decode())
    import hashlib
    import hmac
    expected = "sha256=" + hmac.new(SECRET.encode(), headers["X-Registry-Timestamp"].encode()
                                    + b"." + body, hashlib.sha256).hexdigest()
    assert headers["X-Registry-Signature"] == expected


def test_verify_refuses_a_wrong_secret_a_changed_body_and_missing_headers() -> None:
    body = b'{"kind":"version.created"}'
    headers = signed_headers(SECRET, "version.created", "dl_1", body)
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify("another-secret-entirely", headers, body)
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify(SECRET, headers, body + b" ")
    with pytest.raises(WebhookSignatureError, match="no X-Registry-Signature"):
        verify(SECRET, {"X-Registry-Timestamp": headers["X-Registry-Timestamp"]}, body)
    with pytest.raises(WebhookSignatureError, match="not unix seconds"):
        verify(SECRET, {**headers, "X-Registry-Timestamp": "yesterday"}, body)


def test_verify_refuses_a_replay_outside_the_tolerance() -> None:
    body = b'{"kind":"alias.set"}'
    old = signed_headers(SECRET, "alias.set", "dl_1", body, now=time.time() - 3600)
    with pytest.raises(WebhookSignatureError, match="replayed"):
        verify(SECRET, old, body)
    verify(SECRET, old, body, tolerance=7200)  # the same delivery, within a wider window
    # A timestamp changed to pass the window breaks the signature instead.
    forged = {**old, "X-Registry-Timestamp": str(int(time.time()))}
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify(SECRET, forged, body)
    assert signature(SECRET, 1, b"x") != signature(SECRET, 2, b"x")


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.1.1", "100.64.0.1", "::1",
    "fe80::1", "fc00::1", "::ffff:127.0.0.1", "0.0.0.0", "224.0.0.1", "2002:7f00:1::1"])
def test_private_and_special_addresses_are_refused_by_default(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert refusal(ip, allow_private=False) is not None


def test_metadata_services_are_refused_even_where_private_addresses_are_allowed() -> None:
    for address in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        assert refusal(ipaddress.ip_address(address), allow_private=True) is not None
    assert refusal(ipaddress.ip_address("127.0.0.1"), allow_private=True) is None
    assert refusal(ipaddress.ip_address("8.8.8.8"), allow_private=False) is None


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://[::1]:8080/",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/x", "http://0x7f000001/",
    "http://2130706433/"])
def test_urls_reaching_inside_are_refused(url: str) -> None:
    with pytest.raises(WebhookTargetError, match="does not call it"):
        check(url, allow_private=False)


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd",
                                 "gopher://127.0.0.1/", "http://user:pw@example.com/"])
def test_only_plain_http_and_https_urls_are_taken(url: str) -> None:
    with pytest.raises(WebhookTargetError):
        check(url, allow_private=True)


def test_the_sender_records_a_refused_target_as_an_attempt_without_calling_it() -> None:
    attempt = Sender(allow_private=False).post("http://127.0.0.1:9/", b"{}", {})
    assert attempt.status is None and attempt.error and "loopback" in attempt.error


def test_secrets_are_sealed_with_a_0600_key_file_outside_the_catalog(tmp_path: Path) -> None:
    sealer = Sealer(None, tmp_path / "webhook.key")
    sealed = sealer.seal(SECRET)
    assert SECRET not in sealed and sealed.startswith("fernet:")
    assert stat.S_IMODE(os.stat(tmp_path / "webhook.key").st_mode) == 0o600
    assert Sealer(None, tmp_path / "webhook.key").open(sealed) == SECRET
    Sealer(None, tmp_path / "other.key").seal("x")  # makes a second key
    with pytest.raises(SettingsError, match="another key"):
        Sealer(None, tmp_path / "other.key").open(sealed)
    from cryptography.fernet import Fernet
    shared = Fernet.generate_key().decode()
    assert Sealer(shared, tmp_path / "unused").open(Sealer(shared, tmp_path / "no").seal("s")) \
        == "s"
    with pytest.raises(SettingsError, match="not a Fernet key"):
        Sealer("short", tmp_path / "x").seal("s")


def test_a_subscription_matches_kinds_and_model_patterns() -> None:
    assert matches(["*"], None, "alias.set", "m")
    assert matches(["alias.set"], ["resnet*"], "alias.set", "resnet18")
    assert not matches(["alias.set"], ["resnet*"], "alias.set", "bert")
    assert not matches(["version.created"], None, "alias.set", "m")
    assert not matches(["*"], ["m*"], "alias.set", None)
    assert check_events(["alias.set", "version.created"]) == ("alias.set",
                                                                    "version.created")
    assert check_events(["*", "alias.set"]) == ("*",)
    with pytest.raises(SettingsError, match="not an event"):
        check_events(["alias.set"], known=["version.created"])
    with pytest.raises(SettingsError):
        check_events([])
    with pytest.raises(SettingsError):
        check_models([""])


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    for attempts in range(1, 8):
        wait = backoff(attempts).total_seconds()
        ceiling = min(2 ** (attempts - 1), BACKOFF_CAP_S)
        assert ceiling / 2 <= wait <= ceiling
    assert backoff(100).total_seconds() <= BACKOFF_CAP_S
    assert len({backoff(5) for _ in range(20)}) > 1  # jitter
