"""The Hub door's derived revisions in the node cache (registry/doors/hubcache.py): listed by
``cache ls``, judged by ``cache prune`` with the blobs by last use, never removed while their
lock is held (a derivation in progress), and dead partial folders swept."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from registry.caching import cachedir
from registry.doors import hubcache


def _revision(hub: Path, seed: str, *, origin: tuple[str, int, str | None] | None,
              nbytes: int, age_days: float = 0) -> str:
    """A finished derived folder as hfderive writes it, last used ``age_days`` ago."""
    commit = hashlib.sha256(seed.encode()).hexdigest()[:40]
    root = hub / commit
    root.mkdir(parents=True)
    data = os.urandom(nbytes)
    (root / "model.safetensors").write_bytes(data)
    if origin is not None:
        hubcache.write_origin(root, *origin)
    hubcache.write_listing(root, {"model.safetensors": (hashlib.sha256(data).hexdigest(),
                                                        nbytes)})
    when = time.time() - age_days * 86400
    os.utime(root, (when, when))
    return commit


def _blob(cache: Path, nbytes: int, age_days: float) -> str:
    data = os.urandom(nbytes)
    digest = hashlib.sha256(data).hexdigest()
    path = cache / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    when = time.time() - age_days * 86400
    os.utime(path, (when, when))
    return f"sha256:{digest}"


def test_listing_names_each_revision_its_origin_bytes_and_last_use(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    half = _revision(hub, "a", origin=("net", 3, "float16"), nbytes=1000, age_days=2)
    plain = _revision(hub, "b", origin=("net", 3, None), nbytes=10)
    older = _revision(hub, "c", origin=None, nbytes=10)  # derived before origins were noted
    (hub / f".{half}-x1").mkdir()  # a derivation in progress: not a revision yet
    unfinished = hub / ("d" * 40)
    unfinished.mkdir()  # no listing: not whole
    listed = {r.commit: r for r in cachedir.listing(tmp_path).hub_revisions}
    assert set(listed) == {half, plain, older}
    assert (listed[half].origin, listed[plain].origin, listed[older].origin) == (
        "net:v3+float16", "net:v3", "")
    listing_size = (hub / half / hubcache.LISTING_NAME).stat().st_size
    origin_size = (hub / half / hubcache.ORIGIN_NAME).stat().st_size
    assert listed[half].bytes == 1000 + listing_size + origin_size
    assert listed[half].last_used < listed[plain].last_used - 86400
    whole = cachedir.listing(tmp_path)
    assert whole.hub_bytes == sum(r.bytes for r in listed.values())
    assert whole.total_bytes == whole.hub_bytes  # no blobs, memos or downloads here
    assert whole.to_dict()["hub_revisions"][0]["commit"] == sorted(listed)[0]


def test_prune_keeps_versions_asked_for_and_judges_revisions_with_blobs_by_last_use(
        tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    old_rev = _revision(hub, "old", origin=("net", 1, "float16"), nbytes=4000, age_days=5)
    kept_rev = _revision(hub, "kept", origin=("net", 2, "float16"), nbytes=4000, age_days=6)
    new_rev = _revision(hub, "new", origin=("net", 3, "bfloat16"), nbytes=4000, age_days=0.5)
    old_blob = _blob(tmp_path, 4000, age_days=4)
    new_blob = _blob(tmp_path, 4000, age_days=0)
    report = cachedir.prune(tmp_path, keep_versions={"net:v2"}, older_than=timedelta(days=3))
    assert report.hub_revisions == ["net:v1+float16"]
    assert report.removed == [old_blob]
    assert not (hub / old_rev).exists() and (hub / kept_rev).exists()
    assert report.freed_bytes >= 8000
    # --max-size: the least recently used goes first, a revision or a blob alike.
    report = cachedir.prune(tmp_path, keep_versions={"net:v2"}, max_size=4500 + 4000)
    assert report.hub_revisions == ["net:v3+bfloat16"] and report.removed == []
    assert (hub / kept_rev).exists() and not (hub / new_rev).exists()
    assert os.listdir(tmp_path / "blobs" / "sha256") == [new_blob[7:]]
    assert report.remaining_bytes == cachedir.listing(tmp_path).total_bytes


_HOLD = """
import sys, time
from pathlib import Path
from registry.doors import hubcache
with hubcache.locked(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_revision_being_derived_is_never_removed_and_dead_partials_are_swept(
        tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    busy = _revision(hub, "busy", origin=("net", 1, "float16"), nbytes=100)
    live = hub / f".{'e' * 40}-abc"  # a derivation running in another process
    live.mkdir()
    dead = hub / f".{'f' * 40}-abc"  # one whose process died
    (dead / "model.safetensors").parent.mkdir()
    (dead / "model.safetensors").write_bytes(b"x" * 100)
    gone = hub / f".gone-{busy}-abc"  # a removal that died halfway (its lock is busy's)
    gone.mkdir()
    holders = [subprocess.Popen([sys.executable, "-c", _HOLD, str(hub), commit],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
               for commit in (busy, "e" * 40)]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        report = cachedir.prune(tmp_path)
        assert report.hub_busy == [busy] and report.hub_revisions == []
        assert hubcache.remove(hub, busy) is None
        assert (hub / busy).exists() and live.exists() and gone.exists()
        assert not dead.exists() and report.temporary_files == 1
    finally:
        for holder in holders:
            holder.communicate("")
    report = cachedir.prune(tmp_path, older_than=timedelta(days=1),
                            now=datetime.now(timezone.utc) + timedelta(days=2))
    assert report.hub_revisions == ["net:v1+float16"] and report.temporary_files == 2
    assert sorted(os.listdir(hub)) == [hubcache.LOCKS]
