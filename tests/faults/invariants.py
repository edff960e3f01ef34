"""What must hold after every fault, each check returning the violations it found (strings that
say what and where), and the counting of trials and violations per scenario."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import registry
from registry.backends import LocalBackend
from registry.errors import RegistryError
from registry.files import version_files
from registry.gc import blob_digest
from registry.io.digests import sha256_file
from registry.refs import parse
from registry.store import layout
from tests.faults.worker import build, same_weights

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    """Trials and violations of one scenario; ``summary()`` is the line docs/reliability.md
    quotes."""

    scenario: str
    seed: int | None = None
    trials: int = 0
    notes: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def record(self, trial: str, found: list[str], note: str | None = None) -> None:
        self.trials += 1
        if note:
            self.notes[note] = self.notes.get(note, 0) + 1
        self.violations += [f"{trial}: {v}" for v in found]

    def summary(self) -> str:
        seed = f" seed={self.seed}" if self.seed is not None else ""
        notes = "".join(f" {k}={v}" for k, v in sorted(self.notes.items()))
        return (f"[faults] {self.scenario}:{seed} trials={self.trials} "
                f"violations={len(self.violations)}{notes}")

    def check(self) -> None:
        print(self.summary())
        assert not self.violations, self.summary() + "\n" + "\n".join(self.violations[:20])


def local(reg: registry.Registry) -> LocalBackend:
    backend = reg.backend
    assert isinstance(backend, LocalBackend)
    return backend


def visible_versions_intact(reg: registry.Registry, seen: dict[str, str] | None = None
                            ) -> list[str]:
    """Every listed version pulls, verified, with exactly the weights its push was given.

    A version already pulled in an earlier check (``seen``: ref -> digest) is only checked for
    the same digest and every blob still listed in the store (blobs are immutable: what a
    fault can do to an older version is lose a blob), which keeps 20 trials within the bound.
    """
    seen = {} if seen is None else seen
    backend = local(reg)
    stored = {blob_digest(key) for key in backend.store.list("blobs/")}
    found = []
    for name in reg.list_models():
        for v in reg.list_versions(name):
            if seen.get(v.ref) == v.digest:
                record = backend.resolve(parse(v.ref))
                found += [f"{v.ref} lost blob {f.digest}" for f in version_files(record.manifest)
                          if f.digest not in stored]
                continue
            try:
                state = reg.pull_state_dict(v.ref, device="cpu")
            except RegistryError as exc:
                found.append(f"{v.ref} is listed but does not pull: {type(exc).__name__}: {exc}")
                continue
            if not same_weights(state, int(v.tags["seed"])):
                found.append(f"{v.ref} pulls other weights than were pushed")
            else:
                seen[v.ref] = v.digest
    return found


def cache_clean(cache_dir: Path) -> list[str]:
    """Everything in cache/blobs hashes to its name (no partial or foreign file)."""
    found = []
    for path in sorted((cache_dir / "blobs").glob("**/*")):
        if path.is_dir():
            continue
        name = f"{path.parent.name}:{path.name}"
        if path.parent.parent != cache_dir / "blobs" or sha256_file(path) != name:
            found.append(f"cache file {path} does not hold blob {name}")
    return found


def no_temporaries(dirs: list[Path]) -> list[str]:
    return [f"temporary file left after gc: {p}" for d in dirs if d.is_dir()
            for p in sorted(d.rglob("*")) if p.is_file()]


def live_digests(backend: LocalBackend) -> set[str]:
    live: set[str] = set()
    for name in backend.list_models():
        for record in backend.list_versions(name):
            live |= {f.digest for f in version_files(record.manifest)}
    return live


def no_orphans(backend: LocalBackend) -> list[str]:
    """Every stored blob is referenced by a live version."""
    live = live_digests(backend)
    return [f"orphan blob after gc: {key}" for key in backend.store.list("blobs/")
            if blob_digest(key) not in live]


def catalog_state(backend: LocalBackend) -> dict[str, Any]:
    return {f"{r.name}:v{r.version}": (r.digest, sorted(r.aliases), r.tags)
            for name in backend.list_models() for r in backend.list_versions(name)}


def rebuild_agrees(backend: LocalBackend) -> list[str]:
    """``registry db rebuild`` from the store alone gives the catalog it replaced."""
    before, history = catalog_state(backend), backend.audit.events()
    try:
        backend.rebuild()
    except RegistryError as exc:
        return [f"db rebuild refused: {type(exc).__name__}: {exc}"]
    after = catalog_state(backend)
    if backend.audit.events() != history:
        return ["db rebuild did not restore the event log exactly"]
    if before == after:
        return []
    diff = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return [f"db rebuild disagrees with the catalog on {k}: catalog {before.get(k)}, "
            f"rebuilt {after.get(k)}" for k in diff]


def events_agree(backend: LocalBackend) -> list[str]:
    """The event log says what the catalog holds: one version.created per visible version (and
    none for a version that never became visible), the alias tables are the replay of the alias
    events, and (after gc) the store holds a copy of every event and no other."""
    found: list[str] = []
    events = backend.audit.events()
    made: dict[tuple[str, int], int] = {}
    aliases: dict[str, dict[str, int]] = {}
    for e in events:
        if e.kind == "version.created":
            made[(e.name, e.version)] = made.get((e.name, e.version), 0) + 1  # type: ignore
        elif e.kind == "version.deleted":
            made.pop((e.name, e.version), None)  # type: ignore[arg-type]
        elif e.kind == "alias.set":
            table = aliases.setdefault(e.name, {})
            if table.get(e.alias) != e.previous:  # type: ignore[arg-type]
                found.append(f"event {e.id} says {e.name}@{e.alias} was v{e.previous}, the log "
                             f"before it says v{table.get(e.alias)}")  # type: ignore[arg-type]
            table[e.alias] = e.version  # type: ignore[index,assignment]
        elif e.kind == "alias.deleted":
            aliases.setdefault(e.name, {}).pop(e.alias, None)  # type: ignore[arg-type]
    visible = {(r.name, r.version) for name in backend.list_models()
               for r in backend.list_versions(name)}
    found += [f"{n}:v{v} is visible without its version.created event"
              for n, v in sorted(visible - set(made))]
    found += [f"{n}:v{v} has a version.created event but is not visible"
              for n, v in sorted(set(made) - visible)]
    found += [f"{k[0]}:v{k[1]} has {c} version.created events" for k, c in made.items() if c > 1]
    for name in backend.list_models():
        if backend.catalog.aliases(name) != aliases.get(name, {}):
            found.append(f"{name}'s aliases {backend.catalog.aliases(name)} are not the replay "
                         f"of its events {aliases.get(name, {})}")
    stored = sorted(backend.store.list(layout.EVENTS))
    if stored != [layout.event_key(e.id) for e in events]:
        found.append(f"the store holds {len(stored)} event copies for {len(events)} events")
    return found


def next_push_and_pull(reg: registry.Registry, name: str, seed: int) -> list[str]:
    try:
        v = reg.push(build(seed), name, tags={"seed": str(seed)}, aliases=["production"])
        ok = same_weights(reg.pull_state_dict(v.ref, device="cpu"), seed)
    except RegistryError as exc:
        return [f"the next push/pull failed: {type(exc).__name__}: {exc}"]
    return [] if ok else [f"the next push {v.ref} pulled other weights"]


def after_fault(reg: registry.Registry, name: str, next_seed: int,
                seen: dict[str, str] | None = None) -> list[str]:
    """All of the checks, in order: nothing half visible, no partial cache file, the next push
    and pull work, gc leaves no orphan and no temporary file, rebuild agrees."""
    backend = local(reg)
    found = visible_versions_intact(reg, seen) + cache_clean(backend.cache.root)
    found += next_push_and_pull(reg, name, next_seed)
    backend.gc()
    temporary = [backend.cache.root / "tmp"]
    staging = getattr(backend.store, "staging_dir", None)
    if staging is not None:
        temporary.append(Path(staging))
    found += no_orphans(backend) + no_temporaries(temporary) + events_agree(backend)
    found += rebuild_agrees(backend)
    return found


# -- the zygote -----------------------------------------------------------------------------

class Zygote:
    """tests/faults/worker.py in a subprocess: runs jobs in forked children it can report."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        env = {**env, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [env.get("PYTHONPATH")])])}
        self._log = open(log, "ab")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.faults.worker import main; main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=ROOT,
            bufsize=0)
        self._buffer = b""

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"the worker said nothing for {timeout}s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the worker died (see {self._log.name})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def run(self, job: dict[str, Any], *, kill_after: float | None = None,
            timeout: float = 120) -> tuple[str, float]:
        """Run ``job``; SIGKILL it ``kill_after`` seconds after it started. Returns how it
        ended ("killed", "ok", "failed") and how long it ran."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        pid = self._line(timeout=180)["pid"]  # the first job waits for torch to import
        start = time.monotonic()
        if kill_after is not None:
            time.sleep(kill_after)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        status = self._line(timeout)["status"]
        elapsed = time.monotonic() - start
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            return "killed", elapsed
        return ("ok" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "failed"), \
            elapsed

    def log_tail(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-3000:]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

