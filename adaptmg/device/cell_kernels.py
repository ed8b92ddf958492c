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

``cells_on_boundary``
    Whether a cell has a boundary face, :math:`b_K = \bigvee_{f} (\mathrm{id}_{K,f} \ge 0)`:
    one thread a cell reading its face ids (in the mesh's table, or in the forest's at the
    mesh's cells), so that the boundary faces are searched only in the rows that have one
    (a 42M-cell mesh on an H200: the mesh's table gathered from the forest's and every face
    slot searched, 2.3 + 1.5 ms; now 0.8 ms).

``cell_votes`` / ``majority``
    The rank holding most of a coarse cell's fine cells, :math:`r_K = \arg\max_r
    \#\{k : \pi(k) = K,\ \rho_k = r\}` (ties: the lowest rank): integer atomics a fine cell
    into ``(coarse cells, ranks)`` counts, then one thread a coarse cell, where ``bincount``
    (two host syncs for its bounds) and ``argmax`` over a two-wide axis took 1.7 ms (41M
    fine cells) and 4.0 ms (5.2M) on an H200; now 0.37 and 0.11 ms.

``parent_positions``
    The coarse cell holding each fine cell and the child index in it: :math:`(\ell(a), -1)`
    where the fine cell's forest id :math:`a` is active in the coarse mesh (:math:`\ell`: forest
    id -> coarse position, -1 elsewhere), else :math:`(\ell(\pi(a)), a - c_0(\pi(a)))` with
    :math:`\pi` the forest parent and :math:`c_0` its first child -- one thread a fine cell
    writing the int64 results and their compact copies, where a dozen whole-array passes
    did it (41M fine cells on an H200: 4.0 -> 0.9 ms).

On an H200, the 42M-cell replicated mesh of a two-rank set-up at 21M DoFs a rank
(``dev``-style sync timing): ``cells_with_vertex_in`` 3.8 -> 1.5 ms, the hanging search's
level jumps 10.2 -> 7.3 ms, the DoF owners 5.3 -> 3.4 ms.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, in_host_memory, scatter_max, scatter_min
from .deferred import check_later
from .index_kernels import kernel_factory

__all__ = ["cells_vertex_hit", "scatter_cells", "cells_on_boundary", "majority_ranks", "parent_positions",
           "FUSED", "KERNEL_NAMES"]

#: the fused functions of this module (the census counts a call as one launch)
FUSED = ("cells_vertex_hit", "cell_scatter", "cells_on_boundary", "cell_votes", "majority", "parent_positions")

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
    # one thread per cell (row i of ids, or row rows[i]): whether one of its w face ids is >= 0
    "cells_on_boundary": (
        "raw B ids, int32 w, raw R rows, int32 has_rows", "bool hit",
        "const long long o = (has_rows ? (long long)rows[i] : i) * (long long)w; bool h = false;"
        " for (int j = 0; j < w && !h; ++j) h = ids[o + j] >= 0;"
        " hit = h;"),
    # one thread per fine cell: its vote for its rank in its coarse cell's counts; a rank
    # outside 0 .. size - 1 sets the flag instead
    "cell_votes": (
        "raw P parent, raw R rank, int32 size", "raw int32 votes, raw int32 bad",
        "const long long r = (long long)rank[i];"
        " if (r < 0 || r >= size) bad[0] = 1;"
        " else atomicAdd(&votes[(long long)parent[i] * size + r], 1);"),
    # one thread per coarse cell: the first rank with the most votes
    "majority": (
        "raw int32 votes, int32 size", "int64 best",
        "const long long o = i * (long long)size; int b = 0; int bv = votes[o];"
        " for (int j = 1; j < size; ++j) { const int v = votes[o + j]; if (v > bv) { bv = v; b = j; } }"
        " best = b;"),
    # one thread per fine cell (forest id act[i]): its coarse position and child index, both
    # also in the compact dtypes; a cell with neither itself nor its parent in loc sets bad
    "parent_positions": (
        "raw A act, raw L loc, raw Q parent, raw Q child0", "int64 pos, int64 child, M pos_c, int8 child_c, raw int32 bad",
        "const long long a = (long long)act[i]; long long p = (long long)loc[a]; long long ch = -1;"
        " if (p < 0) { const long long q = (long long)parent[a]; p = q >= 0 ? (long long)loc[q] : -1;"
        " if (p < 0) bad[0] = 1; else ch = a - (long long)child0[q]; }"
        " pos = p; child = ch; pos_c = (M)p; child_c = (signed char)ch;"),
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


def cells_on_boundary(ids, rows=None):
    """bool (nc,): whether each cell has a boundary face -- ``ids`` (nc, 2d) the cells' faces'
    boundary ids (``>= 0`` on the boundary), or with ``rows`` (nc,) the cells are those rows
    of ``ids`` (a forest's table: no gather of the mesh's rows first) -- the module's
    ``cells_on_boundary``.  One kernel on the device; the twin ``(ids[rows] >= 0).any(axis=1)``."""
    xp = backend_of(ids).xp
    if not in_host_memory(ids):
        ids = xp.ascontiguousarray(ids)
        hit = xp.empty(ids.shape[0] if rows is None else rows.size, dtype=bool)
        if hit.size:
            sel = hit if rows is None else xp.ascontiguousarray(rows)
            _kernel("cells_on_boundary")(ids, np.int32(ids.shape[1]), sel, np.int32(rows is not None), hit)
        return hit
    return ((ids if rows is None else xp.take(ids, rows, axis=0)) >= 0).any(axis=1)


def majority_ranks(parent, ranks, num_coarse: int, size: int):
    """int64 (num_coarse,): for every coarse cell the rank in ``0 .. size - 1`` that holds most
    of its fine cells (``parent`` (nf,) each fine cell's coarse cell, ``ranks`` (nf,) its
    rank; ties and coarse cells without a fine cell: the lowest) -- the module's
    ``cell_votes`` and ``majority``.  A rank outside ``0 .. size - 1`` is a ValueError (on the
    device by a flag, read as :func:`adaptmg.device.deferred.check_later` reads it).  The
    twin ``bincount`` and ``argmax``."""
    xp = backend_of(parent).xp
    ranks = xp.asarray(ranks)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"majority_ranks: size must be a positive integer, got {size!r}")

    def bad():
        return ValueError(f"majority_ranks: every rank must be in 0 .. {size - 1} (size {size})")
    if not in_host_memory(parent):
        votes = xp.zeros(int(num_coarse) * int(size), dtype=np.int32)
        flag = xp.zeros(1, dtype=np.int32)
        if parent.size:
            _kernel("cell_votes")(xp.ascontiguousarray(parent), xp.ascontiguousarray(ranks), np.int32(size),
                                  votes, flag, size=parent.size)
        best = xp.empty(int(num_coarse), dtype=np.int64)
        if best.size:
            _kernel("majority")(votes, np.int32(size), best)
        check_later(flag[0], bad)
        return best
    if ranks.size and (int(ranks.min()) < 0 or int(ranks.max()) >= size):
        raise bad()
    votes = xp.bincount(parent * size + ranks, minlength=int(num_coarse) * int(size))
    return votes.reshape(int(num_coarse), int(size)).argmax(axis=1)


def parent_positions(act, loc, parent, child0, compact=np.int32):
    """For fine cells with forest ids ``act``, in a forest with ``parent`` / ``child0`` (each
    forest cell's parent, -1 for a root, and first child), with ``loc`` (forest id -> position
    among the coarse mesh's active cells, -1 where not active there): ``(pos, child, pos_c,
    child_c, ok)`` -- the coarse position holding each fine cell and its child index in it (-1
    where the fine cell is the coarse cell itself) as int64, the same in ``compact`` and int8,
    and whether every cell was found (a host bool: one read) -- the module's
    ``parent_positions``.  One kernel on the device; the twin whole-array gathers."""
    xp = backend_of(act).xp
    if not in_host_memory(act):
        n = act.size
        pos, child = xp.empty(n, dtype=np.int64), xp.empty(n, dtype=np.int64)
        pos_c, child_c = xp.empty(n, dtype=compact), xp.empty(n, dtype=np.int8)
        bad = xp.zeros(1, dtype=np.int32)
        if child0.dtype != parent.dtype:          # (one type for both in the kernel)
            child0 = child0.astype(parent.dtype)
        if n:
            _kernel("parent_positions")(xp.ascontiguousarray(act), loc, parent, child0, pos, child, pos_c, child_c, bad)
        return pos, child, pos_c, child_c, not bool(bad[0])
    p = loc.take(act)
    same = p >= 0
    par = parent.take(act)
    pp = loc.take(par)                            # a root's -1 reads the last entry: reset
    pp[par < 0] = -1
    ok = bool((same | (pp >= 0)).all())
    pos = xp.where(same, p, pp).astype(np.int64, copy=False)
    child = xp.where(same, -1, act - child0.take(xp.maximum(par, 0))).astype(np.int64, copy=False)
    return pos, child, pos.astype(compact), child.astype(np.int8), ok
