r"""The space-filling curve keys of a mesh's active cells in one cell kernel (issue 37).

:func:`adaptmg.distributed.partition.curve_order` orders the active cells of a forest mesh by
``(root rank, c_1, c_2, ...)``, the child digits ``c_j`` of the cell's refinement path (the
Morton digit of a child in its parent), missing digits read as 0.  With ``L`` the deepest
level and ``d`` the dimension, the order is that of the integer keys

.. math::  \mathrm{key}(c) = r \cdot 2^{dL} + \sum_{j=1}^{k} c_j\, 2^{d (L - j)}

of a cell ``c`` of level ``k`` below the root of rank ``r``.  One thread per active cell walks
from the cell up to its root (``k`` steps, ``k <= L``): the digit of the step from ``c`` to its
parent ``p`` is ``c - child0[p]`` (children are consecutive forest ids).  The host's
top-down expansion (:func:`~adaptmg.distributed.partition._curve_keys`) visits the forest
level by level instead -- ~10 array passes a level over fronts of up to all cells, and one
read a level: measured on an H200, the 41M cells of the weak-scaling mesh of two ranks in
12 ms; with the walk 4 ms (the whole :func:`~adaptmg.distributed.partition._curve_keys`,
its root ranks included).  The walk needs no tiling check: it computes, for any mesh of the
forest, the keys of the host's fallback walk
(:func:`~adaptmg.distributed.partition._curve_order_walk`), which the top-down keys equal.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["walk_keys", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_curve_walk_keys",)

_SRC = r"""
extern "C" __global__ void adaptmg_curve_walk_keys(long long n, const long long* __restrict__ ids,
                                                   const long long* __restrict__ parent,
                                                   const long long* __restrict__ child0,
                                                   const short* __restrict__ level,
                                                   const long long* __restrict__ root_rank,
                                                   int d, int L, long long* __restrict__ key)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long c = ids[i];
    int shift = d * (L - level[c]);
    long long k = 0;
    for (int j = level[c]; j > 0; --j) {           // up to the root, one digit a step
        const long long p = parent[c];
        k |= (c - child0[p]) << shift;
        shift += d;
        c = p;
    }
    key[i] = k | (root_rank[c] << shift);           // shift == d L at the root
}
"""

_BLOCK = 256


@functools.lru_cache(maxsize=None)
def _module(xp):
    return xp.RawModule(code=_SRC)


def walk_keys(xp, ids, parent, child0, level, root_rank, d: int, L: int):
    """The keys of the active cells ``ids`` (forest ids, int64) on the array module ``xp``:
    ``parent`` / ``child0`` (int64) and ``level`` (int16) the forest's cell arrays,
    ``root_rank`` (int64) the rank of every root indexed by its forest id (other entries
    unread), ``L`` the deepest level among ``ids``, ``r 2^{dL}`` below 2^63 (the caller
    checks).  int64, one per cell."""
    n = int(ids.shape[0])
    key = xp.empty(n, dtype=np.int64)
    if n:
        _module(xp).get_function("adaptmg_curve_walk_keys")(
            ((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,),
            (np.int64(n), ids, parent, child0, level, root_rank, np.int32(d), np.int32(L), key))
    return key
