"""Webhooks end to end, with a real HTTP receiver on loopback (so these tests allow private
addresses, as REGISTRY_WEBHOOK_ALLOW_PRIVATE=1 does): every kind of the event log delivered,
signed; a receiver that was down gets every event afterwards, in order per model; a server
SIGKILLed after a commit delivers that event after its restart; a 410 disables the webhook;
the SSRF guard refuses what it must, embedded and through a server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

import registry
from registry.catalog.events import append_event
from registry.errors import ForbiddenError, NotFoundError, WebhookTargetError
from registry.events import KINDS
from registry.webhooks.sender import Sender
from registry.webhooks.worker import deliver_due
from server.auth import AuthFile, parse_scopes
from tests.helpers import clean_env
from tests.integration.serving import Service, registry_exe, start_registry_server
from tests.integration.webhook_receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.down()


@pytest.fixture
def reg(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[registry.Registry]:
    monkeypatch.setenv("REGISTRY_WEBHOOK_ALLOW_PRIVATE", "1")
    r = registry.Registry(home=home)
    yield r
    r.close()


def _deliver(reg: registry.Registry) -> None:
    deliver_due(reg.backend.webhooks)  # type: ignore[attr-defined]


def _deliver_until_done(reg: registry.Registry, timeout: float = 60.0) -> None:
    """Deliver, waiting out retries' backoff, until nothing is owed."""
    hooks = reg.backend.webhooks  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while hooks.pending() and time.monotonic() < deadline:
        deliver_due(hooks)
        time.sleep(0.1)
    assert hooks.pending() == 0


def test_every_kind_of_the_log_is_delivered_signed(reg: registry.Registry,
                                                   receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    assert hook.secret and hook.id.startswith("wh_")
    # Changes made through the facade, each appending its event...
    reg.push({"w": torch.ones(2)}, "kinds")
    reg.set_alias("kinds", "production", 1)
    reg.set_tags("kinds:v1", {"team": "vision"})
    reg.delete_alias("kinds", "production")
    # ...and every kind the log knows, appended as the catalog does.
    catalog = reg.backend.catalog  # type: ignore[attr-defined]
    with catalog.session() as s:
        for kind in KINDS:
            append_event(s, kind=kind, name="kinds", version=1,
                         alias="production" if kind.startswith("alias.") else None,
                         actor="test")
    _deliver(reg)
    events = receiver.events(hook.secret)  # each verified with the secret
    assert {e["kind"] for e in events} == set(KINDS)
    assert [e["kind"] for e in events[:4]] == ["version.created", "alias.set", "tags.set",
                                               "alias.deleted"]
    history = [e.to_dict() for e in reg.backend.catalog.history("kinds")]  # type: ignore[attr-defined]
    for sent, logged in zip(events, history, strict=True):
        assert sent["webhook_id"] == hook.id and sent["delivery_id"].startswith("dl_")
        assert {k: v for k, v in sent.items() if k not in ("webhook_id", "delivery_id")} \
            == logged
    assert all(d.state == "delivered" and d.attempts[-1].status == 200
               for d in reg.webhook_deliveries(hook.id, limit=1000))


def test_subscriptions_filter_by_kind_and_model(reg: registry.Registry,
                                                receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, ["alias.set"], models=["prod-*"])
    reg.push({"w": torch.ones(2)}, "prod-a")
    reg.push({"w": torch.ones(2)}, "dev-a")
    reg.set_alias("prod-a", "production", 1)
    reg.set_alias("dev-a", "production", 1)
    _deliver(reg)
    events = receiver.events(hook.secret)
    assert [(e["kind"], e["name"], e["alias"]) for e in events] == [
        ("alias.set", "prod-a", "production")]


def test_a_receiver_down_for_a_while_gets_every_event_afterwards_in_order_per_model(
        reg: registry.Registry, receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    receiver.down()
    for i in range(3):
        for name in ("left", "right"):
            reg.push({"w": torch.full((2,), float(i))}, name)
            reg.set_alias(name, "latest-good", i + 1)
    _deliver(reg)  # refused: every first delivery of a model fails, the rest wait behind it
    attempted = [d for d in reg.webhook_deliveries(hook.id, limit=100) if d.attempts]
    assert len(attempted) == 2 and {d.model for d in attempted} == {"left", "right"}
    assert all(d.state == "pending" and d.attempts[0].status is None for d in attempted)
    receiver.up()
    _deliver_until_done(reg)
    events = receiver.events(hook.secret)
    assert len(events) == 12
    for name in ("left", "right"):
        mine = [(e["kind"], e["version"]) for e in events if e["name"] == name]
        assert mine == [(k, v) for v in (1, 2, 3)
                        for k in ("version.created", "alias.set")]
    assert len({e["delivery_id"] for e in events}) == 12


def test_a_410_disables_the_webhook_and_other_statuses_retry(reg: registry.Registry,
                                                             receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    receiver.status = 500
    reg.push({"w": torch.ones(2)}, "gone")
    _deliver(reg)
    (delivery,) = reg.webhook_deliveries(hook.id)
    assert delivery.state == "pending" and delivery.attempts[0].status == 500
    assert delivery.attempts[0].answer == "not now"
    receiver.status = 410
    _deliver_until_done(reg, timeout=30)
    (listed,) = reg.list_webhooks()
    assert not listed.enabled and "410" in (listed.disabled_reason or "")
    reg.set_alias("gone", "production", 1)  # nothing is queued for a disabled webhook
    assert reg.backend.webhooks.pending() == 0  # type: ignore[attr-defined]


def test_test_webhook_pings_now_and_remove_forgets_it(reg: registry.Registry,
                                                      receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, ["version.created"], secret="s" * 32)
    assert hook.secret == "s" * 32
    assert reg.test_webhook(hook.id) == 200
    (ping,) = receiver.events("s" * 32)
    assert ping["kind"] == "ping" and ping["webhook_id"] == hook.id
    receiver.status = 503
    assert reg.test_webhook(hook.id) == 503
    assert [d.kind for d in reg.webhook_deliveries(hook.id)] == ["ping", "ping"]
    reg.remove_webhook(hook.id)
    assert reg.list_webhooks() == []
    with pytest.raises(NotFoundError, match="webhook ls"):
        reg.test_webhook(hook.id)


def test_the_catalog_holds_no_secret_in_the_clear(reg: registry.Registry, home: Path,
                                                  receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    assert hook.secret is not None
    reg.close()
    for path in home.glob("registry.db*"):
        assert hook.secret.encode() not in path.read_bytes()
    assert all(w.secret is None for w in registry.Registry(home=home).list_webhooks())


def test_ssrf_targets_are_refused_without_allow_private(home: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        receiver: Receiver) -> None:
    monkeypatch.delenv("REGISTRY_WEBHOOK_ALLOW_PRIVATE", raising=False)
    strict = registry.Registry(home=home)
    for url in (receiver.url, "http://localhost:9/x", "http://169.254.169.254/latest/",
                "http://10.0.0.1/hook", "file:///etc/passwd"):
        with pytest.raises(WebhookTargetError):
            strict.add_webhook(url, "*")
    assert strict.list_webhooks() == []
    # One added while private addresses were allowed is not called once they are not.
    monkeypatch.setenv("REGISTRY_WEBHOOK_ALLOW_PRIVATE", "1")
    hook = registry.Registry(home=home).add_webhook(receiver.url, "*")
    strict.push({"w": torch.ones(2)}, "guarded")
    deliver_due(strict.backend.webhooks)  # type: ignore[attr-defined]
    assert receiver.received == []
    (delivery,) = strict.webhook_deliveries(hook.id)
    assert "loopback" in (delivery.attempts[0].error or "")
    strict.close()


# -- through a server -----------------------------------------------------------------------

def _serve(home: Path, log_dir: Path, **env: str) -> Service:
    return start_registry_server(home, log_dir, env_extra={
        "REGISTRY_WEBHOOK_ALLOW_PRIVATE": "1", **env})


def test_a_server_sigkilled_after_a_commit_delivers_that_event_after_restart(
        tmp_path: Path, receiver: Receiver) -> None:
    home = tmp_path / "home"
    server = _serve(home, tmp_path)
    try:
        remote = registry.Registry(server.url)
        hook = remote.add_webhook(receiver.url, ["version.created"])
        assert hook.secret is not None
        assert [w.id for w in remote.list_webhooks()] == [hook.id]
        receiver.down()  # the commit's delivery cannot go out before the kill
        remote.push({"w": torch.ones(3)}, "survivor")
        remote.close()
    finally:
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=30)
    assert receiver.received == []
    receiver.up()
    server = _serve(home, tmp_path)
    try:
        receiver.wait_for(1)
        (event,) = receiver.events(hook.secret)
        assert (event["kind"], event["name"], event["version"]) == \
            ("version.created", "survivor", 1)
        remote = registry.Registry(server.url)
        (delivery,) = remote.webhook_deliveries(hook.id)
        assert delivery.state == "delivered" and delivery.id == event["delivery_id"]
        assert remote.test_webhook(hook.id) == 200
        remote.remove_webhook(hook.id)
        assert remote.list_webhooks() == []
        remote.close()
    finally:
        server.stop()


def test_the_server_refuses_ssrf_targets_and_asks_for_admin(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.json"
    tokens = {name: AuthFile(auth_file).create(name, parse_scopes(name))
              for name in ("write", "admin")}
    server = start_registry_server(tmp_path / "home", tmp_path,
                                   env_extra={"REGISTRY_AUTH_FILE": str(auth_file)})
    try:
        writer = registry.Registry(server.url, token=tokens["write"])
        boss = registry.Registry(server.url, token=tokens["admin"])
        with pytest.raises(ForbiddenError):
            writer.list_webhooks()
        with pytest.raises(ForbiddenError):
            writer.add_webhook("https://deploy.example/hook", "*")
        with pytest.raises(WebhookTargetError, match="loopback"):
            boss.add_webhook("http://127.0.0.1:9/hook", "*")
        with pytest.raises(WebhookTargetError, match="metadata"):
            boss.add_webhook("http://169.254.169.254/latest/meta-data/", "*")
        assert boss.list_webhooks() == []
        writer.close()
        boss.close()
    finally:
        server.stop()


def test_the_cli_adds_lists_tests_shows_deliveries_delivers_and_removes(
        tmp_path: Path, receiver: Receiver) -> None:
    home = tmp_path / "home"
    env = clean_env(home, REGISTRY_WEBHOOK_ALLOW_PRIVATE="1")
    secret_file = tmp_path / "secret"
    secret_file.write_text("a-secret-from-a-file-0123456789\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*registry_exe(), "webhook", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    added = cli("add", receiver.url, "--events", "version.created,alias.set",
                "--models", "cli-*", "--secret-file", str(secret_file))
    assert added.returncode == 0, added.stderr
    hook_id = added.stdout.strip()
    assert "secret" not in added.stdout  # the caller's own secret is not echoed
    listed = cli("ls")
    assert hook_id in listed.stdout and "models=cli-*" in listed.stdout
    assert cli("test", hook_id).stdout.strip() == f"{hook_id}: receiver answered 200"
    reg = registry.Registry(home=home)
    reg.push({"w": torch.ones(2)}, "cli-model")
    reg.close()
    delivered = cli("deliver")
    assert delivered.returncode == 0 and "delivered 1," in delivered.stdout, delivered.stderr
    shown = json.loads(cli("deliveries", hook_id, "--json").stdout)
    assert [d["kind"] for d in shown] == ["version.created", "ping"]
    assert shown[0]["attempts"][0]["status"] == 200
    events = receiver.events("a-secret-from-a-file-0123456789")
    assert [e["kind"] for e in events] == ["ping", "version.created"]
    bad = cli("add", "ftp://example.com/", "--events", "*")
    assert bad.returncode == 2 and "not http or https" in bad.stderr
    assert cli("rm", hook_id).returncode == 0
    assert cli("ls").stdout.strip() == ""
    missing = cli("test", hook_id)
    assert missing.returncode == 3 and "not found" in missing.stderr


def test_deliver_follow_runs_until_terminated(tmp_path: Path, receiver: Receiver,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = clean_env(home, REGISTRY_WEBHOOK_ALLOW_PRIVATE="1")
    monkeypatch.setenv("REGISTRY_WEBHOOK_ALLOW_PRIVATE", "1")
    reg = registry.Registry(home=home)
    hook = reg.add_webhook(receiver.url, "*")
    follower = subprocess.Popen([*registry_exe(), "webhook", "deliver", "--follow"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        reg.push({"w": torch.ones(2)}, "followed")
        receiver.wait_for(1)
        assert [e["kind"] for e in receiver.events(hook.secret or "")] == ["version.created"]
    finally:
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=30) == 0
        reg.close()
    assert os.path.exists(home / "webhook.key")


def test_db_rebuild_keeps_the_webhooks_and_sends_no_event_again(reg: registry.Registry,
                                                                receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    reg.push({"w": torch.ones(2)}, "rebuilt")
    reg.set_alias("rebuilt", "production", 1)
    _deliver(reg)
    assert len(receiver.events(hook.secret or "")) == 2
    assert reg.backend.rebuild() == 1  # type: ignore[attr-defined]
    assert [w.id for w in reg.list_webhooks()] == [hook.id]
    _deliver(reg)
    assert len(receiver.events(hook.secret or "")) == 2  # restoring the log invents nothing
    reg.set_alias("rebuilt", "staging", 1)
    _deliver(reg)
    assert [e["alias"] for e in receiver.events(hook.secret or "")][-1] == "staging"


# -- one attempt's bounds (registry/webhooks/sender.py) ----------------------------------------

@pytest.fixture
def raw_server() -> Iterator[tuple[socket.socket, list[bytes]]]:
    """A listening socket the test answers by hand (``answer`` set below), and what it read."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    yield sock, []
    sock.close()


def _serve_once(sock: socket.socket, answer: bytes | None, got: list[bytes]) -> threading.Thread:
    def run() -> None:
        conn, _ = sock.accept()
        with conn:
            got.append(conn.recv(65536))
            if answer is None:
                time.sleep(3)  # never answers within the sender's time bound
                return
            with contextlib.suppress(OSError):
                conn.sendall(answer)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_attempt_reads_a_bounded_answer_and_follows_no_redirect(
        raw_server: tuple[socket.socket, list[bytes]]) -> None:
    sock, got = raw_server
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/hooks"
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 50000000\r\n\r\n" + b"x" * 4_000_000
    thread = _serve_once(sock, huge, got)
    attempt = Sender(allow_private=True).post(url, b"{}", {"Content-Type": "application/json"})
    thread.join(timeout=30)
    assert attempt.status == 200 and attempt.answer == "x" * 1024
    assert got[0].startswith(b"POST /hooks HTTP/1.1")
    moved = b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n"
    thread = _serve_once(sock, moved, got)
    attempt = Sender(allow_private=True).post(url, b"{}", {})
    thread.join(timeout=30)
    assert attempt.status == 302 and len(got) == 2  # one request: the redirect not followed


def test_an_attempt_gives_up_at_its_time_bound(
        raw_server: tuple[socket.socket, list[bytes]]) -> None:
    sock, got = raw_server
    thread = _serve_once(sock, None, got)
    attempt = Sender(allow_private=True, timeout=0.5).post(
        f"http://127.0.0.1:{sock.getsockname()[1]}/", b"{}", {})
    thread.join(timeout=30)
    assert attempt.status is None and "timed out" in (attempt.error or "")


def test_deliveries_done_long_ago_are_forgotten_and_pending_ones_never(
        reg: registry.Registry, receiver: Receiver) -> None:
    hook = reg.add_webhook(receiver.url, "*")
    reg.push({"w": torch.ones(2)}, "pruned")
    _deliver(reg)
    receiver.down()
    reg.set_alias("pruned", "production", 1)
    _deliver(reg)  # refused: stays pending
    rows = reg.backend.catalog.webhooks  # type: ignore[attr-defined]
    later = datetime.now(timezone.utc) + timedelta(days=1)
    assert rows.prune(later) == 1
    (left,) = reg.webhook_deliveries(hook.id)
    assert left.kind == "alias.set" and left.state == "pending" and left.attempts
    assert reg.backend.webhooks.prune() == 0  # type: ignore[attr-defined]
