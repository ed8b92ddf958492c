"""Arrays that grow at their end in place, for the forest's append-only tables.

Refinement only appends rows to a forest's node and cell tables, and the forest that is
refined keeps its own (shorter) arrays.  Copying every table at every refinement costs
O(forest) per step, most of the time of a local refinement of a large mesh (2.6M cells,
70k refined: 0.4 s of copies for 0.1 s of new rows).  Here a table is a prefix view
``buf[:n]`` of a buffer with spare rows; ``grown(a, n2)`` returns ``buf[:n2]`` -- the old
rows shared, not copied -- if ``a`` is the longest prefix handed out of ``buf`` so far
(nobody wrote behind it) and the buffer is large enough, else a fresh buffer with the
rows of ``a`` copied and room for ``slack`` times more.  The rows of ``a`` are never
written, so every forest that holds a prefix sees the same values for ever; a second
refinement of the same forest finds the tail taken and copies.

On the device (and in the generic variant, :mod:`._xp`) every call makes a fresh array of
``n`` rows and copies ``a`` into it (one device copy; no buffer bookkeeping by address).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from ._xp import tuned, xp_of

SLACK = 0.5                   # spare rows of a fresh buffer, relative to the rows asked for
_ends: dict = {}              # id(buffer) -> rows handed out (the end of the longest prefix)
_lock = threading.Lock()


def _data(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def grown(a: np.ndarray, n: int) -> np.ndarray:
    """An array of ``n >= len(a)`` rows whose first ``len(a)`` rows are ``a``'s (shared with
    ``a``'s buffer where possible); the other rows are uninitialised."""
    k = a.shape[0]
    if n < k:
        raise ValueError(f"grown: {n} rows asked for an array of {k}")
    if not tuned(a):
        xp = xp_of(a)
        out = xp.empty((n,) + a.shape[1:], dtype=a.dtype)
        out[:k] = a
        return out
    buf = a.base
    with _lock:
        if (isinstance(buf, np.ndarray) and _ends.get(id(buf)) == k and buf.shape[0] >= n
                and buf.dtype == a.dtype and buf.shape[1:] == a.shape[1:]
                and a.flags.c_contiguous and _data(a) == _data(buf)):
            _ends[id(buf)] = n
            return buf[:n]
    buf = np.empty((n + int(SLACK * n),) + a.shape[1:], dtype=a.dtype)
    buf[:k] = a
    with _lock:
        _ends[id(buf)] = n
    weakref.finalize(buf, _ends.pop, id(buf), None)
    return buf[:n]
