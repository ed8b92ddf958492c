"""Host threads of the set-up and of host block solves: how many, an order-keeping
parallel map, and row chunks of large blocks on one shared pool (:func:`map_rows`).

NumPy and SciPy release the GIL inside their large array operations, so a few Python
threads overlap the host set-up's independent pieces of work (the per-level tasks of
:func:`adaptmg.multilevel.multigrid`, the cell geometry of the next assembly chunks while
the current one is reduced and scattered).
"""
from __future__ import annotations

import collections
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

__all__ = ["default_threads", "ordered_map", "host_pool", "map_rows", "pool_map", "Done", "InlineExecutor"]


class Done:
    """A task run at once: ``fn(*args)``'s value behind a future's ``result()``."""

    def __init__(self, fn, args):
        self._value = fn(*args)

    def result(self):
        return self._value


class InlineExecutor:
    """Executor stand-in that runs each task at once, in the calling thread (one thread)."""

    def submit(self, fn, *args):
        return Done(fn, args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def default_threads() -> int:
    """Worker threads for the host set-up: ``ADAPTMG_THREADS`` if set, else
    min(4, usable CPUs)."""
    env = os.environ.get("ADAPTMG_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"ADAPTMG_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise ValueError(f"ADAPTMG_THREADS must be a positive integer, got {env!r}")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:                      # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def ordered_map(fn, items, *, workers, ahead=None):
    """``fn(item)`` for each of ``items``, in order, computed by ``workers`` threads up to
    ``ahead`` items (default ``2 * workers``) ahead of the caller.

    A generator: the results come in the order of ``items``; an exception raised by
    ``fn`` is raised here at that item's place, after the results before it.  Closing the
    generator early (``break``, an exception in the loop body) cancels what has not started
    and waits for what has.  Use it where ``fn`` is NumPy work that releases the GIL.
    """
    workers = int(workers)
    if workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    ahead = 2 * workers if ahead is None else max(1, int(ahead))
    it = iter(items)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="adaptmg-map")

    def results():
        pending = collections.deque()
        try:
            for item in itertools.islice(it, ahead):
                pending.append(pool.submit(fn, item))
            while pending:
                res = pending.popleft().result()
                for item in itertools.islice(it, 1):       # keep `ahead` items in flight
                    pending.append(pool.submit(fn, item))
                yield res
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True)
    return results()


_POOL = []

#: blocks with at least this many entries (rows x columns) are split over the host threads
#: by :func:`map_rows`
ROW_SPLIT_ENTRIES = 1 << 18


def host_pool():
    """The host threads of the block solves' array work (made on first use,
    :func:`default_threads` of them)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=default_threads(),
                                        thread_name_prefix="adaptmg-rows"))
    return _POOL[0]


def map_rows(fn, rows, entries):
    """``[fn(a, b)]`` over contiguous row ranges ``[a, b)`` of ``rows`` rows, one range per
    host thread when ``entries`` (the block's size) reaches :data:`ROW_SPLIT_ENTRIES`,
    else ``[fn(0, rows)]``.  ``fn`` should be NumPy/SciPy work that releases the GIL on
    disjoint rows."""
    T = default_threads()
    if T < 2 or entries < ROW_SPLIT_ENTRIES or rows < 2 * T:
        return [fn(0, rows)]
    cuts = [rows * i // T for i in range(T + 1)]
    return pool_map(lambda ab: fn(*ab), list(zip(cuts[:-1], cuts[1:])))


def pool_map(fn, items):
    """``[fn(item) for item in items]``, every item a task of :func:`host_pool`, all
    submitted before the first result is awaited."""
    futures = [host_pool().submit(fn, item) for item in items]
    return [f.result() for f in futures]
