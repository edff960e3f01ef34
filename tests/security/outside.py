"""Proof that nothing outside a registry home is created, changed or removed.

Every security test runs under a sentinel: before it starts, the tree around its registry home
(its ``tmp_path``, minus ``home/`` and the ``work/`` folder the test writes its own inputs to) is
seeded with files that hostile paths aim at (``victim``, ``outside/secret.txt``...) and
snapshotted; after it ends, the same tree must be identical, file by file: type, size, mode,
mtime and sha256. Servers started by the suite register their own root the same way (their
``home/`` and ``logs/`` excluded).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

# What a traversal would hit: ``sha256:../../../../victim`` from a cache under home/ lands on
# ``victim`` at the root; names like ``../../evil`` on ``evil``.
SENTINELS = {
    "victim": b"victim: must never change\n",
    "evil": b"a file named like the traversal target\n",
    "outside/secret.txt": b"secret\n",
    "outside/nested/deep.bin": bytes(range(256)),
}


def seed(root: Path) -> None:
    for rel, data in SENTINELS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(data)
    readonly = root / "outside" / "readonly"
    if not readonly.exists():
        readonly.write_bytes(b"read-only\n")
        readonly.chmod(0o444)


def snapshot(root: Path, allowed: frozenset[str]) -> dict[str, tuple[object, ...]]:
    """Every path under ``root`` except the top-level names in ``allowed``."""
    seen: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirs[:] = [d for d in dirs if d not in allowed]
            files = [f for f in files if f not in allowed]
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            st = path.lstat()
            entry: tuple[object, ...] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                         st.st_mtime_ns)
            if stat.S_ISREG(st.st_mode):
                entry += (st.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(path),)
            seen[str(rel_dir / name)] = entry
    return seen


def differences(before: dict[str, tuple[object, ...]],
                after: dict[str, tuple[object, ...]]) -> list[str]:
    out = [f"created {p}" for p in sorted(set(after) - set(before))]
    out += [f"removed {p}" for p in sorted(set(before) - set(after))]
    out += [f"changed {p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return out


@dataclass
class Outside:
    """Roots to watch, each with the top-level names inside it that belong to a registry."""

    roots: dict[Path, frozenset[str]] = field(default_factory=dict)

    def watch(self, root: Path, allowed: set[str]) -> None:
        seed(root)
        self.roots[root] = frozenset(allowed)

    def snapshot(self) -> dict[Path, dict[str, tuple[object, ...]]]:
        return {root: snapshot(root, allowed) for root, allowed in self.roots.items()}

    def check(self, before: dict[Path, dict[str, tuple[object, ...]]]) -> list[str]:
        found: list[str] = []
        for root, allowed in self.roots.items():
            found += [f"{root}: {d}" for d in
                      differences(before.get(root, {}), snapshot(root, allowed))]
        return found


# Roots of servers started for a whole module; the per-test sentinel checks them too.
SHARED = Outside()
