"""Running one I/O-bound call per file on a few threads: a version's shards are hashed, uploaded,
checked and downloaded side by side (file I/O, sockets and hashlib release the GIL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Files in flight at once. Each S3 transfer runs its own parts concurrently, so a few files
# already fill a link; more would only add memory and connections.
UPLOAD_CONCURRENCY = 4
DOWNLOAD_CONCURRENCY = 4
CHECK_CONCURRENCY = 16


def concurrently(fn: Callable[[T], R], items: Sequence[T], *,
                 workers: int = CHECK_CONCURRENCY) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads, in order. The first error is
    raised once every call already started has finished (nothing keeps running behind it)."""
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)),
                            thread_name_prefix="registry-io") as pool:
        futures = [pool.submit(fn, x) for x in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in futures:
            if future in done and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


def as_ready(fn: Callable[[T], R], items: Sequence[T], *,
             workers: int = DOWNLOAD_CONCURRENCY) -> Iterator[tuple[T, R]]:
    """``(x, fn(x))`` as each call finishes, on up to ``workers`` threads: a pull loads each
    shard as soon as it is verified while the others still download."""
    if len(items) <= 1 or workers <= 1:
        for x in items:
            yield x, fn(x)
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)),
                              thread_name_prefix="registry-io")
    futures: dict[Future[R], T] = {pool.submit(fn, x): x for x in items}
    try:
        remaining = set(futures)
        while remaining:
            done, remaining = wait(remaining, return_when="FIRST_COMPLETED")
            for future in done:
                yield futures[future], future.result()
    finally:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
