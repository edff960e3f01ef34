"""The walk of a call through the package, followed call by call: the rooms it enters and how
often it climbs back up into one it had left (issue #47; tests/integration/test_push_walk.py).

:func:`follow` runs a call under ``sys.setprofile`` and sees every Python call and return, on the
calling thread, of a function defined in a module of ``registry``. From them it builds the walk:
the tree of visits to rooms, in the order they were made (:meth:`Walk.render` draws it).

- **Room**: a module of the package (``registry.normalize``, ``registry.pipelines.push``).
- **Entry**: a call from a function of one room into a function of another opens a visit of that
  room. Calls inside a room are the room's own business. Three things are not new entries: a call
  into the room the caller entered last, with no other room entered in between (a loop calling
  one helper per tensor uses that room once); a generator resumed (a context manager's exit, the
  next item of an iterator), which continues the visit it began in; and the methods a dataclass
  generates (``__init__``, ``__eq__``, ``__hash__``: code compiled from ``<string>``), since
  building a record is not going into its module (a ``__post_init__`` someone wrote is).
- **Climb back up**: an entry into a room the walk had entered before: the walk returns into a
  module it had already left for another, either coming back to it from elsewhere after its visit
  ended or called back from deeper while it is still below on the stack (a callback, a lower layer
  calling an upper one), and goes on from there. So ``climbs == sum(entries) - len(rooms)``: a
  walk that enters each room once has none, however many steps its conductor runs in turn (a
  return into the conductor, which the walk never left, is no climb).
- **Ports** (``registry.backends``, ``registry.http.remote``: the ``Backend`` a pipeline is given)
  are
  not followed: calls into them are neither rooms nor entries. Behind them are the catalog, the
  store, publish and the transport, the storage layer with its own contract suite; the walk of a
  push is the pipeline's, from the model to the commit.
- Threads the call starts (the digests of shards written side by side) are not followed.
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

PACKAGE = "registry"
PORTS = ("registry.backends", "registry.http.remote")


@dataclass
class Visit:
    """One stay of the walk in a room; ``children``: the rooms it entered from there, in order."""

    room: str
    parent: Visit | None = None
    children: list[Visit] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


@dataclass
class Walk:
    root: Visit  # the caller of the followed call (outside the package)
    result: Any = None

    def visits(self) -> list[Visit]:
        """Every visit, in the order the walk made them (depth first)."""
        found: list[Visit] = []

        def down(visit: Visit) -> None:
            for child in visit.children:
                found.append(child)
                down(child)

        down(self.root)
        return found

    @property
    def entries(self) -> Counter[str]:
        return Counter(v.room for v in self.visits())

    @property
    def rooms(self) -> list[str]:
        return list(dict.fromkeys(v.room for v in self.visits()))

    @property
    def climbs(self) -> int:
        return sum(self.entries.values()) - len(self.entries)

    def render(self) -> str:
        """The walk as an indented tree of rooms, each with the functions called in it."""
        lines: list[str] = []

        def down(visit: Visit, depth: int) -> None:
            for child in visit.children:
                lines.append("  " * depth + child.room.removeprefix(PACKAGE + ".") + "  "
                             + ", ".join(dict.fromkeys(child.functions)))
                down(child, depth + 1)

        down(self.root, 0)
        return "\n".join(lines)

    def summary(self) -> str:
        most = ", ".join(f"{r.removeprefix(PACKAGE + '.')} x{n}"
                         for r, n in self.entries.most_common() if n > 1)
        return (f"{len(self.entries)} rooms, {self.climbs} climbs back up"
                + (f" (entered more than once: {most})" if most else ""))


def follow(call: Callable[[], Any], *, package: str = PACKAGE,
           ports: tuple[str, ...] = PORTS) -> Walk:
    """Run ``call()`` and return its walk through ``package`` (``Walk.result``: what ``call``
    returned), not followed behind ``ports``."""
    root = Visit("<caller>")
    stack: list[Visit] = [root]
    # Per open frame of the package: whether it put a visit on the stack.
    frames: list[tuple[FrameType, bool]] = []
    resumable: dict[FrameType, Visit] = {}  # generator frames -> the visit they belong to

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event not in ("call", "return"):
            return
        room = frame.f_globals.get("__name__", "")
        if room != package and not room.startswith(package + "."):
            return
        if event == "return":
            while frames:
                done, pushed = frames.pop()
                if pushed:
                    stack.pop()
                if done is frame:
                    break
            return
        here = stack[-1]
        code = frame.f_code
        if here.room in ports or code.co_filename == "<string>":
            frames.append((frame, False))  # behind a port; a record's generated method
            return
        if frame in resumable:  # a generator resumed (a context manager's exit, a next item)
            visit = resumable[frame]
        elif room == here.room:
            here.functions.append(code.co_name)
            frames.append((frame, False))
            _remember(frame, here, resumable)
            return
        elif room in ports:  # the storage port: followed no further, no room of the walk
            visit = Visit(room, here)
        elif here.children and here.children[-1].room == room:
            visit = here.children[-1]  # the same room again, nothing else between: one entry
        else:
            visit = Visit(room, here)
            here.children.append(visit)
        visit.functions.append(code.co_name)
        stack.append(visit)
        frames.append((frame, True))
        _remember(frame, visit, resumable)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(previous)
    return Walk(root, result)


_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _remember(frame: FrameType, visit: Visit, resumable: dict[FrameType, Visit]) -> None:
    if frame.f_code.co_flags & _RESUMABLE:
        resumable.setdefault(frame, visit)
