"""The node numbering of a mesh of a refinement forest.

The coarse mesh's vertices come first, in their given order (an unrefined mesh keeps the
numbering of the points it was built from).  The nodes that refinement created follow in the
order in which the active cells first touch them: cell by cell in forest order (the children
of a cell are consecutive, so this is a space-filling curve inside each root cell) and,
within a cell, in its vertex order.  Nodes that share a cell then get close numbers, and so
do the column indices of each row of an assembled matrix: the vectors a sparse product
gathers stay in cache.  (Numbered by forest id -- creation order, one refinement after the
other -- a row of a uniformly refined mesh's matrix reached a quarter of the mesh away, and
the fine-level Jacobi kernels of a 1M-DoF V-cycle read 1.2-1.7x the bytes of their operands
from DRAM (ncu, H100).)
"""
from __future__ import annotations

import numpy as np

from ..backend import scatter_min, stable_argsort, unique_first

__all__ = ["number_nodes", "first_occurrences", "first_occurrences_xp"]


def number_nodes(F, acn):
    """``(ids, pos, cells)`` for the active cells with forest vertex ids ``acn`` (nc, 2^d) of
    the forest ``F``: the forest ids of the mesh nodes in mesh order, the map forest id ->
    mesh node (-1: none; forest size; int32 where the forest's nodes fit) and the cells in
    mesh node numbers (int64, read-only), in O(n).

    The same code runs on the device (``F.backend.xp`` CuPy, ``acn`` a CuPy array): there the
    first occurrences are a ``scatter_min`` of the occurrence positions
    (:func:`first_occurrences_xp`), and the arrays stay writeable (CuPy has no flags); the
    same integers as on the host."""
    be = F.backend
    xp = be.xp
    flat = acn.ravel()                                  # (cell, vertex) occurrences, in order
    nn = F.num_nodes
    n_root = F.n_root                                   # the coarse mesh's vertices
    if 8 * flat.size < nn:      # a coarse level of a large forest: no forest-size table,
        u, first, _ = unique_first(flat)                 # a sort (first occurrences)
        late = u >= n_root
        ids = xp.concatenate([u[~late], u[late][stable_argsort(first[late])]])
    elif not be.is_gpu:
        ids = first_occurrences(flat, nn, n_root)
    else:
        ids = first_occurrences_xp(flat, nn, n_root, xp)
    # int32 where the forest's nodes fit: the table is forest-sized on every level that keeps one
    pos = xp.full(nn, -1, dtype=np.int32 if nn < np.iinfo(np.int32).max else np.int64)
    pos[ids] = xp.arange(ids.size, dtype=pos.dtype)     # ids distinct: one write per entry
    c = xp.take(pos, acn).astype(np.int64, copy=False)
    if not be.is_gpu:
        c.flags.writeable = False
    return ids, pos, c


def first_occurrences(flat, nn, n_root):
    """The nodes of the occurrences ``flat``: the roots (ids below ``n_root``) by id, then
    the others by first occurrence, through a forest-size (``nn``) table."""
    it = np.int32 if max(flat.size, nn) <= np.iinfo(np.int32).max else np.int64
    occ = np.arange(flat.size, dtype=it)
    # the first occurrence of each node: written in reverse, so that the earliest write
    # lands last (NumPy does not promise an order for repeated indices; another order
    # would give another permutation, still a valid numbering).  np.minimum.at did the
    # same more slowly and holding the GIL (1M cells: 54 -> 39 ms with the view below)
    first = np.full(nn, -1, dtype=it)                  # -1: the node is no vertex here
    first[flat[::-1]] = occ[::-1]
    del occ
    root_ids = np.flatnonzero(first[:n_root] >= 0)      # numbered first, in their order
    # the other nodes in the order of their first occurrences: those sorted (one per
    # node; a SIMD sort of int32) instead of a gather over all occurrences
    fn = first[n_root:]
    fn = fn[fn >= 0]
    fn.sort()
    return np.concatenate([root_ids, flat.take(fn)])


def first_occurrences_xp(flat, nn, n_root, xp):
    """:func:`first_occurrences` for any array module ``xp`` (the device's): the first
    occurrence of each node is the minimum of its occurrence positions, a ``scatter_min``
    (a plain scatter keeps an unspecified one of the repeated writes on the device).  The
    same array as :func:`first_occurrences` (tested with NumPy)."""
    it = np.int32 if max(flat.size, nn) <= np.iinfo(np.int32).max else np.int64
    none = np.iinfo(it).max                             # the node is no vertex here
    first = xp.full(nn, none, dtype=it)
    scatter_min(first, flat, xp.arange(flat.size, dtype=it))
    # the vertices (one flatnonzero: one read of its size), the roots first by id, then the
    # others by first occurrence: keys id - n_root < 0 and first[id] >= 0, all distinct
    # (flat[first[id]] == id, so no gather of flat is needed)
    ids = xp.flatnonzero(first != none)
    key = xp.where(ids < n_root, ids - n_root, first.take(ids).astype(ids.dtype))
    return ids.take(xp.argsort(key))
