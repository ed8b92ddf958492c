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

__all__ = ["number_nodes", "first_occurrences"]


def number_nodes(F, acn):
    """``(ids, pos, cells)`` for the active cells with forest vertex ids ``acn`` (nc, 2^d) of
    the forest ``F``: the forest ids of the mesh nodes in mesh order, the map forest id ->
    mesh node (-1: none; forest size) and the cells in mesh node numbers (read-only), in
    O(n)."""
    flat = acn.ravel()                                  # (cell, vertex) occurrences, in order
    nn = F.num_nodes
    # the coarse mesh's vertices (kind 0) are the forest's first nodes: refinement
    # only appends nodes, so a comparison replaces a gather of node_kind
    nk = F.node_kind
    n_root = nn if nn == 0 or nk[-1] == 0 else int(np.argmax(nk != 0))
    if 8 * flat.size < nn:      # a coarse level of a large forest: no forest-size table,
        u, first = np.unique(flat, return_index=True)      # a sort (first occurrences)
        ids = np.concatenate([u[u < n_root], u[u >= n_root][np.argsort(first[u >= n_root])]])
    else:
        ids = first_occurrences(flat, nn, n_root)
    pos = np.full(nn, -1, dtype=np.int64)
    pos[ids] = np.arange(ids.size)
    c = np.take(pos, acn)
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
