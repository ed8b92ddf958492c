r"""Kernels over a mesh's cells and their vertices (``cells`` (nc, nv) node ids), each with its
NumPy twin (the tests compare them; the census of ``scripts/census_device_ops.py`` counts a
call as one launch):

``cells_vertex_hit``
    Whether a cell has a vertex in a node mask, :math:`h_K = \bigvee_{i \in V(K)} m_i`: one
    thread a cell reading its vertices, where a gather wrote and a reduction read a bool per
    (cell, vertex) slot (a 42M-cell mesh's cells near a refined ball on an H200: 3.8 ms that
    way).

``cell_scatter``
    Every cell's value into its vertices' minimum and / or maximum,
    :math:`\ell_i = \min(\ell_i, \min_{K \ni i} v_K)`, :math:`u_i = \max(u_i, \max_{K \ni i} v_K)`:
    one thread a (cell, vertex) slot with integer atomics (exact, in any order), where the
    values were first repeated to one per slot and scattered once per bound.

On an H200, the 42M-cell replicated mesh of a two-rank set-up at 21M DoFs a rank
(``dev``-style sync timing): ``cells_with_vertex_in`` 3.8 -> 1.5 ms, the hanging search's
level jumps 10.2 -> 7.3 ms, the DoF owners 5.3 -> 3.4 ms.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, in_host_memory, scatter_max, scatter_min
from .index_kernels import kernel_factory

__all__ = ["cells_vertex_hit", "scatter_cells", "FUSED", "KERNEL_NAMES"]

#: the fused functions of this module (the census counts a call as one launch)
FUSED = ("cells_vertex_hit", "cell_scatter")

_SPECS = {
    # one thread per cell: whether one of its nv vertices is in the node mask
    "cells_vertex_hit": (
        "raw C cells, raw bool mask, int32 nv", "bool hit",
        "const long long o = i * (long long)nv; bool h = false;"
        " for (int j = 0; j < nv && !h; ++j) h = mask[(long long)cells[o + j]];"
        " hit = h;"),
    # one thread per (cell, vertex) slot: the cell's value into its vertex's minimum (ops & 1)
    # and maximum (ops & 2)
    "cell_scatter": (
        "raw C cells, raw V val, int32 nv, int32 ops", "raw V lo, raw V hi",
        "long long n = (long long)cells[i]; V v = val[i / nv];"
        " if (ops & 1) atomicMin(&lo[n], v);"
        " if (ops & 2) atomicMax(&hi[n], v);"),
}

KERNEL_NAMES = tuple(f"adaptmg_{n}" for n in _SPECS)

_kernel = kernel_factory(_SPECS)


def cells_vertex_hit(cells, mask):
    """bool (nc,): whether a vertex of each cell (rows of ``cells``, (nc, nv) node ids) is in
    the node mask ``mask`` -- the module's ``cells_vertex_hit``.  One kernel on the device;
    the twin a gather of the vertex slots and ``any``."""
    xp = backend_of(cells).xp
    if not in_host_memory(cells):
        cells = xp.ascontiguousarray(cells)
        hit = xp.empty(cells.shape[0], dtype=bool)
        if hit.size:
            _kernel("cells_vertex_hit")(cells, xp.ascontiguousarray(mask, dtype=bool), np.int32(cells.shape[1]), hit)
        return hit
    return xp.take(mask, cells).any(axis=1)


def scatter_cells(cells, values, lo=None, hi=None):
    """``lo[i] = min(lo[i], values[K])`` and / or ``hi[i] = max(hi[i], values[K])`` for every
    vertex i of every cell K (rows of ``cells``, (nc, nv) node ids; ``lo`` / ``hi`` None: that
    bound is not wanted) -- the module's ``cell_scatter``, in place.  On the device one kernel
    with integer atomics (``values``, ``lo`` and ``hi`` int32 or int64 of one dtype); the
    twin repeats the values to the slots and scatters them (``np.minimum.at`` /
    ``np.maximum.at``, :func:`~adaptmg.backend.scatter_min`)."""
    xp = backend_of(cells).xp
    nv = cells.shape[1]
    if not in_host_memory(cells):
        outs = [a for a in (lo, hi) if a is not None]
        if any(a.dtype != values.dtype for a in outs) or values.dtype not in (np.int32, np.int64):
            raise TypeError(f"scatter_cells: values and bounds must share an int32 / int64 dtype, got "
                            f"{values.dtype} and {[a.dtype for a in outs]}")
        ops = (lo is not None) + 2 * (hi is not None)
        if cells.size and ops:
            dummy = outs[0]
            _kernel("cell_scatter")(xp.ascontiguousarray(cells), values, np.int32(nv), np.int32(ops),
                                    dummy if lo is None else lo, dummy if hi is None else hi, size=cells.size)
        return lo, hi
    flat = cells.reshape(-1)
    rep = xp.repeat(values, nv)
    if lo is not None:
        scatter_min(lo, flat, rep)
    if hi is not None:
        scatter_max(hi, flat, rep)
    return lo, hi
