"""Work spread over threads that can be interrupted: Ctrl-C must not wait for remote commands to end."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int,
                 on_abort: Callable[[], None] = lambda: None) -> list[R]:
    """`[fn(x) for x in items]` on up to `workers` threads. If it is interrupted (or one call raises),
    `on_abort` runs first: closing the SSH connections makes threads blocked on remote commands return
    at once, so the pool can be left without waiting for them."""
    items = list(items)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items) or 1)))
    try:
        return list(pool.map(fn, items))
    except BaseException:
        on_abort()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=False)
