"""The node cache: one download per blob per cache across processes, a killed downloader's
waiters finishing, prefetch, and ``cache ls`` / ``cache prune`` beside running pulls.

Pullers are real processes (tests/integration/cache_puller.py) reading a file store seen as a
remote one, which logs every download at the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import registry
from registry.caching.cache import BlobCache
from registry.io.digests import sha256_file
from tests.helpers import clean_env, run_cli

PULLER = Path(__file__).with_name("cache_puller.py")
ROOT = Path(__file__).resolve().parents[2]


def _push(reg: registry.Registry, tmp_path: Path, shards: int = 3) -> registry.ModelVersion:
    torch.manual_seed(0)
    config = tmp_path / "config.json"
    config.write_text('{"hidden": 1024}')
    state = {f"w{i}": torch.randn(256, 1024) for i in range(shards)}  # 1 MiB each
    return reg.push(state, "fan", shard_size="1MiB", files={"config.json": config})


def _start(home: Path, cache: Path, log: Path, go: Path, delay: float, mode: str,
           ref: str = "fan:v1", hold: Path | None = None) -> subprocess.Popen[str]:
    env = {**clean_env(home), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if hold is not None:  # each download stops after its first chunk until ``hold`` exists
        env["PULLER_HOLD"] = str(hold)
    return subprocess.Popen([sys.executable, str(PULLER), str(home), str(cache), str(log),
                             str(go), str(delay), mode, ref], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_until(condition, what: str, procs: list[subprocess.Popen[str]]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 120
    while not condition():
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise AssertionError(f"a puller failed while waiting for {what}: "
                                     f"{p.stderr.read() if p.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def _results(procs: list[subprocess.Popen[str]]) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _log(log: Path) -> list[tuple[str, int, str]]:
    if not log.exists():
        return []
    return [(w, int(pid), key) for w, pid, key in
            (line.split() for line in log.read_text().splitlines())]


def _blobs_held(cache: Path) -> dict[str, str]:
    folder = cache / "blobs" / "sha256"
    return {p.name: sha256_file(p) for p in folder.iterdir()} if folder.is_dir() else {}


def test_pullers_of_one_cold_version_download_each_blob_once(
        reg: registry.Registry, tmp_path: Path, home: Path) -> None:
    mv = _push(reg, tmp_path)
    expected = {k: float(t.double().sum()) for k, t in reg.pull_state_dict(mv.ref).items()}
    cache, log, go = tmp_path / "node-cache", tmp_path / "store.log", tmp_path / "sync" / "go"
    go.parent.mkdir()
    procs = [_start(home, cache, log, go, 0.01, "pull") for _ in range(4)]
    _wait_until(lambda: len(list(go.parent.glob("ready-*"))) == len(procs), "pullers ready",
                procs)
    go.touch()  # all four ask at once
    results = _results(procs)

    assert all(r["sums"] == expected for r in results)
    starts = Counter(key for what, _, key in _log(log) if what == "start")
    shards = [f["digest"] for f in mv.metadata["files"]]
    assert len(shards) == 3
    assert {f"blobs/sha256/{d[7:]}" for d in shards} == set(starts)
    assert set(starts.values()) == {1}, starts  # one download per blob, four pullers
    held = _blobs_held(cache)
    assert all(f"sha256:{name}" == digest for name, digest in held.items())
    assert not list((cache / "tmp").iterdir())


def _blocked_on(lock: Path) -> int:
    """How many lock requests wait on ``lock`` now (/proc/locks lists them with ``->``)."""
    inode = lock.stat().st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and line.split()[-3].endswith(f":{inode}"))


def test_a_killed_downloader_leaves_its_waiters_finishing(
        reg: registry.Registry, tmp_path: Path, home: Path) -> None:
    mv = _push(reg, tmp_path, shards=1)
    (shard,) = [f["digest"] for f in mv.metadata["files"]]
    cache, log, go = tmp_path / "node-cache", tmp_path / "store.log", tmp_path / "sync" / "go"
    go.parent.mkdir()
    go.touch()
    # The first downloader: 16 chunks of the 1 MiB shard, slowly.
    first = _start(home, cache, log, go, 0.5, "prefetch")
    key = f"blobs/sha256/{shard[7:]}"
    _wait_until(lambda: any(w == "start" and k == key for w, _, k in _log(log)),
                "the first download", [first])
    tmp = cache / "tmp"
    _wait_until(lambda: any(p.stat().st_size > 0 for p in tmp.iterdir()), "a partial file",
                [first])
    waiters = [_start(home, cache, log, go, 0.0, "prefetch") for _ in range(2)]
    lock = BlobCache(cache).lock_path(shard)
    _wait_until(lambda: _blocked_on(lock) == 2, "both waiters blocked on the lock", waiters)
    first.send_signal(signal.SIGKILL)
    first.wait()
    results = _results(waiters)

    downloads = [(w, pid) for w, pid, k in _log(log) if k == key]
    assert downloads[0] == ("start", first.pid)
    # The shard was downloaded once more, by one of the waiters, to the end; the other waited.
    takeover = [pid for w, pid in downloads[1:] if w == "start"]
    assert len(takeover) == 1 and takeover[0] in {p.pid for p in waiters}
    assert ("done", takeover[0]) in downloads
    assert [r["files"] for r in results] == [2, 2]  # the shard and config.json, each
    assert _blobs_held(cache)[shard[7:]] == shard  # the verified bytes, not the partial file
    # The killed downloads' partial files are left (the shard's, and config.json's when the
    # killed prefetch had begun that one too: its jobs run side by side); prune removes them
    # (no lock holds them).
    partials = list(tmp.iterdir())
    assert 1 <= len(partials) <= 2, partials
    env = clean_env(home, REGISTRY_CACHE_DIR=str(cache))
    out = run_cli("cache", "prune", "--older-than", "1d", "--json", env=env, check=True)
    assert json.loads(out.stdout)["temporary_files"] == len(partials)
    assert not list(tmp.iterdir())
    assert _blobs_held(cache)[shard[7:]] == shard  # used just now: not older than a day


def test_prefetch_then_prune_beside_a_running_pull(reg: registry.Registry, tmp_path: Path,
                                                   home: Path) -> None:
    mv = _push(reg, tmp_path)
    cache, log, go = tmp_path / "node-cache", tmp_path / "store.log", tmp_path / "sync" / "go"
    go.parent.mkdir()
    go.touch()
    (first,) = _results([_start(home, cache, log, go, 0.0, "prefetch")])
    assert (first["fetched"], first["files"]) == (4, 4)  # three shards and config.json
    (second,) = _results([_start(home, cache, log, go, 0.0, "prefetch")])
    assert second["fetched"] == 0  # nothing to do the second time
    assert len(_log(log)) == 8  # four downloads, started and done, all by the first

    env = clean_env(home, REGISTRY_CACHE_DIR=str(cache))
    listed = json.loads(run_cli("cache", "ls", "--json", env=env, check=True).stdout)
    (version,) = listed["versions"]
    assert version["ref"] == "fan:v1" and version["complete"]
    assert version["held_bytes"] == sum(f["size"] for f in mv.metadata["files"]) + len(
        '{"hidden": 1024}')
    assert listed["blob_bytes"] == version["held_bytes"]

    # A pull holds one shard open (as while it maps it): prune removes the rest, not that one.
    shards = [f for f in mv.metadata["files"]]
    cache_view = BlobCache(cache)
    held = cache_view.open(shards[0]["digest"], lambda tmp: None, shards[0]["size"])
    try:
        out = json.loads(run_cli("cache", "prune", "--json", env=env, check=True).stdout)
        assert out["busy"] == [shards[0]["digest"]]
        assert len(out["removed"]) == 3
        assert shards[0]["digest"][7:] in _blobs_held(cache)
        assert held.read(8) == (cache / "blobs" / "sha256" / shards[0]["digest"][7:]).read_bytes(
            )[:8]
    finally:
        held.close()
    out = json.loads(run_cli("cache", "prune", "--json", env=env, check=True).stdout)
    assert out["removed"] == [shards[0]["digest"]] and out["busy"] == []
    assert _blobs_held(cache) == {}
    assert json.loads(run_cli("cache", "ls", "--json", env=env, check=True).stdout)[
        "versions"] == []


def test_a_prefetch_and_a_prune_beside_a_pull_that_is_downloading(
        reg: registry.Registry, tmp_path: Path, home: Path) -> None:
    mv = _push(reg, tmp_path)
    expected = {k: float(t.double().sum()) for k, t in reg.pull_state_dict(mv.ref).items()}
    shards = [f["digest"] for f in mv.metadata["files"]]
    config = mv.metadata["attachments"][0]["digest"]
    cache, log, go = tmp_path / "node-cache", tmp_path / "store.log", tmp_path / "sync" / "go"
    go.parent.mkdir()
    go.touch()
    hold = tmp_path / "hold"
    # The pull begins all three shards and stops each after its first chunk.
    puller = _start(home, cache, log, go, 0.0, "pull", hold=hold)
    procs = [puller]
    try:
        tmp = cache / "tmp"
        _wait_until(lambda: len([w for w, _, _ in _log(log) if w == "start"]) == 3
                    and len([p for p in tmp.iterdir() if p.stat().st_size > 0]) == 3,
                    "the pull's three downloads under way", procs)
        prefetcher = _start(home, cache, log, go, 0.0, "prefetch")
        procs.append(prefetcher)
        locks = [BlobCache(cache).lock_path(d) for d in shards]
        _wait_until(lambda: all(_blocked_on(lock) == 1 for lock in locks),
                    "the prefetch waiting on each of the pull's downloads", procs)

        # A prune now removes nothing being downloaded: no partial file of a live download
        # is swept, and the shards are not in blobs/ yet (only config.json may be, the
        # prefetch's).
        env = clean_env(home, REGISTRY_CACHE_DIR=str(cache))
        out = json.loads(run_cli("cache", "prune", "--json", env=env, check=True).stdout)
        assert out["temporary_files"] == 0 and len(list(tmp.iterdir())) == 3
        assert set(out["removed"]) <= {config} and out["busy"] == []
        hold.touch()
        pulled, prefetched = _results(procs)
    finally:  # a failed check leaves no process held
        hold.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert pulled["sums"] == expected
    assert prefetched["files"] == 4  # the three shards (the pull's downloads) and config.json
    downloads = [(w, pid, key) for w, pid, key in _log(log) if key != f"blobs/sha256/{config[7:]}"]
    # Each shard downloaded once, by the pull, to the end: the prefetch waited for them.
    assert sorted(downloads) == sorted([(w, puller.pid, f"blobs/sha256/{d[7:]}")
                                        for d in shards for w in ("start", "done")])
    held = _blobs_held(cache)
    assert {f"sha256:{name}" for name in held} >= set(shards)
    assert all(f"sha256:{name}" == digest for name, digest in held.items())
    assert not list(tmp.iterdir())


@pytest.mark.s3
def test_prefetch_and_prune_over_s3_keep_refs_and_bound_size(
        s3_store_url: str, s3_endpoint: str, tmp_path: Path, home: Path) -> None:
    reg = registry.Registry(home=home, store=s3_store_url)
    mv = _push(reg, tmp_path)
    other = reg.push({"x": torch.ones(128, 1024)}, "other")
    reg.close()
    cache = tmp_path / "node-cache"
    env = clean_env(home, REGISTRY_CACHE_DIR=str(cache), REGISTRY_STORE_URL=s3_store_url,
                    REGISTRY_S3_ENDPOINT_URL=s3_endpoint)
    for ref in ("fan:v1", "other:v1"):
        assert "fetched" in run_cli("prefetch", ref, env=env, check=True).stdout
    again = run_cli("prefetch", "fan:v1", "other", env=env, check=True).stdout
    assert again.count("nothing fetched") == 2
    fan = {f["digest"]: f["size"] for f in mv.metadata["files"] + mv.metadata["attachments"]}
    # --keep holds other:v1 whatever the bound; fan's blobs go, least recently used first.
    out = json.loads(run_cli("cache", "prune", "--keep", "other", "--max-size", "1KiB",
                             "--json", env=env, check=True).stdout)
    assert out["kept"] == 1
    assert set(out["removed"]) == set(fan) and out["freed_bytes"] == sum(fan.values())
    assert set(_blobs_held(cache)) == {f["digest"][7:] for f in other.metadata["files"]}
    listed = json.loads(run_cli("cache", "ls", "--json", env=env, check=True).stdout)
    assert [v["ref"] for v in listed["versions"]] == ["other:v1"]
    bad = run_cli("cache", "prune", "--max-size", "lots", env=env)
    assert bad.returncode != 0 and "'lots' is not a size" in bad.stderr
    assert set(_blobs_held(cache)) == {f["digest"][7:] for f in other.metadata["files"]}


def test_ls_and_prune_count_signature_memos_and_spare_recent_blobs(
        reg: registry.Registry, tmp_path: Path, home: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from registry.caching import cachedir
    from registry.caching.cache import SIGNATURE_MEMOS

    mv = _push(reg, tmp_path, shards=2)
    cache, log, go = tmp_path / "node-cache", tmp_path / "store.log", tmp_path / "sync" / "go"
    go.parent.mkdir()
    go.touch()
    _results([_start(home, cache, log, go, 0.0, "prefetch")])
    memos = cache / SIGNATURE_MEMOS
    memos.mkdir(parents=True, exist_ok=True)
    (memos / "a").write_text("{}")  # what a passed signature check leaves (signing/memo.py)
    listed = cachedir.listing(cache)
    assert (listed.signature_memos, listed.signature_bytes) == (1, 2)
    assert listed.total_bytes == listed.blob_bytes + 2

    # A day from now, everything is older than a day but the blob a pull holds open.
    shard = mv.metadata["files"][1]
    held = BlobCache(cache).open(shard["digest"], lambda tmp: None, shard["size"])
    try:
        later = datetime.now(timezone.utc) + timedelta(days=2)
        assert cachedir.prune(cache, older_than=timedelta(days=1), now=datetime.now(
            timezone.utc)).removed == []  # nothing is a day old yet
        report = cachedir.prune(cache, older_than=timedelta(days=1), now=later)
    finally:
        held.close()
    assert report.busy == [shard["digest"]]
    assert report.signature_memos == 1 and not any(memos.iterdir())
    assert set(_blobs_held(cache)) == {shard["digest"][7:]}
    (version,) = cachedir.listing(cache).versions
    assert (version.ref, version.held_files, version.complete) == ("fan:v1", 1, False)


def test_prefetchers_through_a_server_ask_it_for_each_blob_once(
        reg: registry.Registry, tmp_path: Path, home: Path) -> None:
    from tests.integration.serving import registry_server

    mv = _push(reg, tmp_path)
    cache = tmp_path / "node-cache"
    with registry_server(home, tmp_path, "--allow-anonymous") as server:
        env = {**clean_env(tmp_path / "client-home", REGISTRY_URI=server.url,
                           REGISTRY_CACHE_DIR=str(cache))}
        exe = Path(sys.executable).with_name("registry")
        procs = [subprocess.Popen([str(exe), "prefetch", "fan:v1"], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(4)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        log = server.output()
    digests = [f["digest"] for f in mv.metadata["files"] + mv.metadata["attachments"]]
    # The access log names each blob as sha256%3A<hex>: its link, then its bytes (a file store
    # has no presigned URLs, so the bytes come through the server too).
    def asked(suffix: str) -> Counter[str]:
        return Counter(d for d in digests for line in log.splitlines()
                       if f"GET /api/v1/blobs/sha256%3A{d[7:]}{suffix} HTTP" in line)
    # One download per blob, four prefetchers: each blob's link and bytes asked for once.
    assert asked("/link") == Counter({d: 1 for d in digests}), log[-3000:]
    assert asked("") == Counter({d: 1 for d in digests}), log[-3000:]
    assert {p.name for p in (cache / "blobs" / "sha256").iterdir()} == {d[7:] for d in digests}
