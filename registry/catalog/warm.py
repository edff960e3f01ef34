"""Resolves that skip the catalog's queries while an SQLite catalog has not changed.

Every pull resolves its ref: a snapshot transaction and two queries, 0.1 ms on a warm CPU and
0.6 ms right after a 200 MB model was read (benchmark row 17), a third of a small pull's fixed
cost. On SQLite, whether anything was committed since a read costs one ``PRAGMA data_version``
(about 3 us) on a connection of our own that never writes: its value changes whenever any other
connection, of this process or another, commits, checkpoints or rebuilds. While it and the
file's identity (device and inode: a catalog replaced by a new file) are what they were when a
ref was read, the row read then is still the row, so a deleted version or a moved alias is seen
by the very next resolve, as before.

What is kept is the row's text, never a parsed record: each hit parses the manifest and tags
again, so a caller that edits a record it was given cannot change the next one. PostgreSQL has
no such counter, and every resolve there queries.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import OrderedDict

from ..refs import Ref
from .lookup import Found

# Refs remembered per catalog, and the characters of their manifests (a 10,000-tensor model's
# is ~2 MB): the least recently used are dropped beyond either.
MAX_REMEMBERED = 128
MAX_REMEMBERED_CHARS = 32_000_000


class WarmResolves:
    """The rows of recently resolved refs of one SQLite file, kept while it is unchanged."""

    def __init__(self, database: str) -> None:
        self.path = os.path.abspath(database)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._rows: OrderedDict[Ref, tuple[tuple[int, int, int], Found]] = OrderedDict()
        self._chars = 0

    def stamp(self) -> tuple[int, int, int] | None:
        """What a row read from now on is valid for: the file's device, inode and data
        version; None where the file cannot be watched (then nothing is remembered)."""
        try:
            st = os.stat(self.path)
            with self._lock:
                conn = self._watcher()
                (version,) = conn.execute("PRAGMA data_version").fetchone()
        except (OSError, sqlite3.Error):
            return None
        return st.st_dev, st.st_ino, int(version)

    def get(self, ref: Ref, stamp: tuple[int, int, int] | None) -> Found | None:
        if stamp is None:
            return None
        with self._lock:
            kept = self._rows.get(ref)
            if kept is None or kept[0] != stamp:
                return None
            self._rows.move_to_end(ref)
            return kept[1]

    def put(self, ref: Ref, stamp: tuple[int, int, int] | None, found: Found) -> None:
        """Remember ``found``, read in a snapshot that began after ``stamp`` was taken: a
        commit in between changes the stamp too, so the row is read again next time."""
        if stamp is None:
            return
        with self._lock:
            self._drop(ref)
            if len(found.manifest or "") > MAX_REMEMBERED_CHARS:
                return  # kept, it would push out every other row
            self._rows[ref] = (stamp, found)
            self._chars += len(found.manifest or "")
            while len(self._rows) > MAX_REMEMBERED or self._chars > MAX_REMEMBERED_CHARS:
                self._drop(next(iter(self._rows)))

    def _drop(self, ref: Ref) -> None:
        kept = self._rows.pop(ref, None)
        if kept is not None:
            self._chars -= len(kept[1].manifest or "")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._rows.clear()
            self._chars = 0

    def _watcher(self) -> sqlite3.Connection:
        # A connection is not carried across fork (SQLite forbids it): a child opens its own
        # and leaves the parent's alone.
        if self._conn is None or self._pid != os.getpid():
            self._conn = sqlite3.connect(self.path, isolation_level=None,
                                         check_same_thread=False)
            self._pid = os.getpid()
            self._rows.clear()
            self._chars = 0
        return self._conn
