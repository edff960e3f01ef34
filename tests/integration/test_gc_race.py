"""gc beside pushes, and after crashes (registry/gc.py): young blobs stay, a reused blob is
touched, a blob deleted under a commit is caught and stored again, and what crashed pushes and
downloads leave is removed once it is older than the grace.

The interleavings are forced with a store that runs a step of the other party at an exact point
(no sleeps, no luck): each test fails if the rule it names is taken out of the code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.errors import MissingBlobError, NotFoundError
from registry.files import VersionFile
from tests.helpers import assert_same_state, clean_env, trained_mlp

HOUR = 3600


class SteppedStore:
    """A store that calls ``hooks[method](key)`` once, before the real call with that key."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hooks: dict[str, Callable[[str], None]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("modified", "touch", "put_bytes", "has", "delete") or not callable(attr):
            return attr

        def stepped(key: str, *args: Any, **kwargs: Any) -> Any:
            hook = self.hooks.get(name)
            if hook is not None and _matches(hook, key):
                if getattr(hook, "skip", 0):
                    hook.skip -= 1  # type: ignore[attr-defined]
                    return attr(key, *args, **kwargs)
                del self.hooks[name]
                hook(key)
            return attr(key, *args, **kwargs)
        return stepped


def _matches(hook: Callable[[str], None], key: str) -> bool:
    prefix = getattr(hook, "prefix", "")
    return key.startswith(prefix)


def on(prefix: str, fn: Callable[[str], None], *, skip: int = 0) -> Callable[[str], None]:
    """``fn`` as a hook for keys under ``prefix``, run at the call after ``skip`` of them."""
    fn.prefix = prefix  # type: ignore[attr-defined]
    fn.skip = skip  # type: ignore[attr-defined]
    return fn


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _blob(home: Path, digest: str) -> Path:
    return home / "objects" / mf.blob_key(digest)


@pytest.fixture
def graced(home: Path, monkeypatch: pytest.MonkeyPatch) -> registry.Registry:
    """An embedded registry with the default grace of 6h, its store stepped."""
    monkeypatch.delenv("REGISTRY_GC_GRACE")
    reg = registry.Registry(home=home)
    reg.backend.store = SteppedStore(reg.backend.store)  # type: ignore[attr-defined]
    return reg


def _deleted_and_old(reg: registry.Registry, home: Path, name: str) -> str:
    """Push ``name``, delete it, and age its blob past the grace: a gc candidate."""
    v1 = reg.push(trained_mlp(), name)
    reg.delete_version(f"{name}:v1")
    _age(_blob(home, v1.digest), 7 * HOUR)
    return v1.digest


def test_a_young_unreferenced_blob_is_kept_until_the_grace_has_passed(
        graced: registry.Registry, home: Path) -> None:
    v1 = graced.push(trained_mlp(), "young")
    graced.delete_version("young:v1")
    report = graced.gc()
    assert report.deleted == [] and report.young == 1
    assert _blob(home, v1.digest).exists()
    _age(_blob(home, v1.digest), 7 * HOUR)
    assert graced.gc().deleted == [v1.digest]
    assert not _blob(home, v1.digest).exists()


def test_a_push_reusing_a_blob_gc_has_chosen_keeps_it(graced: registry.Registry,
                                                      home: Path) -> None:
    """gc chose the blob (unreferenced, old) and is about to check its age for the last time;
    right then a push of the same weights reuses it. The push touched it, so gc finds it
    young and keeps it: the new version loads."""
    digest = _deleted_and_old(graced, home, "reuse")
    pushed: list[registry.ModelVersion] = []
    graced.backend.store.hooks["modified"] = on(  # type: ignore[attr-defined]
        "blobs/", lambda key: pushed.append(graced.push(trained_mlp(), "reuse")))
    report = graced.gc()
    (v2,) = pushed
    assert v2.ref == "reuse:v2" and v2.digest == digest
    assert v2.metadata["push"]["shards_uploaded"] == 0  # it was reused, not uploaded
    assert report.deleted == [] and report.young == 1
    assert_same_state(graced.pull_state_dict("reuse:v2", device="cpu"),
                      trained_mlp().state_dict())


def test_a_blob_deleted_while_a_push_commits_is_stored_again(graced: registry.Registry,
                                                             home: Path) -> None:
    """A gc that chose the blob before the push reserved it deletes it between the push's
    dedup check and its commit (here: right before the last check ahead of the catalog
    commit; the push asked the store twice in begin and once in its first check). The
    re-check catches it, the embedded push stores the blob again, and the version loads."""
    digest = _deleted_and_old(graced, home, "vanish")
    graced.backend.store.hooks["has"] = on(  # type: ignore[attr-defined]
        "blobs/", lambda key: _blob(home, digest).unlink(), skip=3)
    v2 = graced.push(trained_mlp(), "vanish")
    assert v2.ref == "vanish:v2" and _blob(home, digest).exists()
    assert_same_state(graced.pull_state_dict("vanish:v2", device="cpu"),
                      trained_mlp().state_dict())


def test_a_commit_whose_blob_vanished_is_undone(graced: registry.Registry, home: Path) -> None:
    """What a server does on the same race: commit_push raises MissingBlobError, and neither
    the version nor its manifest is left visible."""
    v1 = graced.push(trained_mlp(), "undone")
    stored = mf.loads((home / "objects" / mf.manifest_key("undone", 1)).read_bytes(),
                      origin="test")
    graced.delete_version("undone:v1")
    _age(_blob(home, v1.digest), 7 * HOUR)
    backend: Any = graced.backend
    size = _blob(home, v1.digest).stat().st_size
    number, missing = backend.begin_push(
        "undone", None, [VersionFile("weights", "model.safetensors", v1.digest, size)])
    assert missing == []  # reused, so the push uploads nothing
    backend.store.hooks["has"] = on(  # after the first check, before the last one
        "blobs/", lambda key: _blob(home, v1.digest).unlink(), skip=1)
    with pytest.raises(MissingBlobError, match="vanished from the store"):
        backend.commit_push("undone", number, {**stored, "version": number}, {}, [])
    assert not (home / "objects" / mf.manifest_key("undone", number)).exists()
    assert "undone" not in graced.list_models()
    with pytest.raises(NotFoundError):
        graced.show(f"undone:v{number}")


def test_gc_removes_what_crashed_pushes_and_downloads_left(graced: registry.Registry,
                                                          home: Path) -> None:
    graced.push(trained_mlp(), "tidy")
    staging = home / "objects" / "tmp"
    partial = home / "cache" / "tmp"
    staging.mkdir(parents=True, exist_ok=True)
    partial.mkdir(parents=True, exist_ok=True)
    old_push = staging / "push-dead.safetensors"
    old_push.write_bytes(b"x" * 1000)
    old_download = partial / "download-dead"
    old_download.write_bytes(b"y" * 500)
    live_push = staging / "push-live.safetensors"
    live_push.write_bytes(b"z" * 10)
    _age(old_push, 7 * HOUR)
    _age(old_download, 7 * HOUR)
    report = graced.gc()
    assert report.temporary_files == 2 and report.temporary_bytes == 1500
    assert not old_push.exists() and not old_download.exists()
    assert live_push.exists()  # a push still writing it is younger than the grace
    assert_same_state(graced.pull_state_dict("tidy:v1", device="cpu"),
                      trained_mlp().state_dict())


_PUSH_FOREVER = """
import sys, torch, registry
from torch import nn
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(24)])  # ~100 MB of float32
registry.push(model, "killed")
"""


def test_a_push_killed_after_staging_leaves_nothing_that_gc_keeps(tmp_path: Path,
                                                                  home: Path) -> None:
    """SIGKILL a real push once its staging file exists: no version is visible, gc (grace 0
    here) removes the staging file and the reservation, and the next push works."""
    env = clean_env(home)
    proc = subprocess.Popen([sys.executable, "-c", _PUSH_FOREVER], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    staging = home / "objects" / "tmp"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and any(p.name.startswith("push-") for p in staging.iterdir()):
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the push ended before it could be killed: {proc.stderr}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    reg = registry.Registry(home=home)
    try:
        assert "killed" not in reg.list_models()
        report = reg.gc()
        assert report.temporary_files >= 1
        assert not any(staging.glob("push-*"))
        v = reg.push(trained_mlp(), "killed")
        assert v.ref.startswith("killed:v")
        assert_same_state(reg.pull_state_dict(v.ref, device="cpu"), trained_mlp().state_dict())
    finally:
        reg.close()
