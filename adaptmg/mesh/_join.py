"""Cells that contain given sets of nodes, by a sorted-key join instead of a sparse product.

For sets S_r of nodes (row r of a 0/1 matrix P, P[r, i] = 1 for i in S_r) and the cells'
incidence N (N[K, i] = 1 if i is a vertex of cell K), the cells that hold all of S_r are the
entries of P N^T equal to |S_r|.  The product transposes the whole incidence (one entry per
(cell, vertex)); here only the occurrences of nodes of some S_r are gathered (a boolean
gather over the cells' vertices), sorted by node, joined with the (r, i) pairs and counted
per (r, K) by one sort of the keys r * nc + K.  Sorts, searchsorted, cumulative sums and a
repeat by counts of the inputs' array module: the same code on the host and the device.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, repeat, stable_argsort


def cells_holding(cells, rows, nodes, need, num_nodes: int):
    """(r, K) pairs, sorted by r then K, of the cells K (rows of ``cells``, (nc, nv) node ids
    with distinct vertices) that have exactly ``need[r]`` of the nodes of set r as vertices;
    the sets are the pairs (``rows[k]``, ``nodes[k]``), distinct.  K is int32 if nc < 2^31.
    NumPy or CuPy arrays (all of one module), the result of the same."""
    xp = backend_of(cells).xp
    nc, nv = cells.shape
    if rows.size == 0 or nc == 0:
        return xp.zeros(0, dtype=np.int64), xp.zeros(0, dtype=np.int32)
    mark = xp.zeros(num_nodes, dtype=bool)
    mark[nodes] = True
    flat = cells.reshape(-1)
    occ = xp.flatnonzero(mark.take(flat))                  # (cell, vertex) slots of set nodes
    occ_node = flat.take(occ)
    order = stable_argsort(occ_node)
    occ_node = occ_node.take(order)
    occ_cell = (occ // nv).take(order)
    start = xp.searchsorted(occ_node, nodes, side="left")
    cnt = xp.searchsorted(occ_node, nodes, side="right") - start
    first = xp.cumsum(cnt) - cnt
    total = int(cnt.sum())                                 # one read for both expansions
    slot = repeat(start - first, cnt, total)
    slot += xp.arange(slot.size, dtype=slot.dtype)
    key = repeat(rows.astype(np.int64), cnt, total) * nc + occ_cell.take(slot)
    key.sort()
    new = xp.empty(key.size, dtype=bool)
    new[:1] = True
    new[1:] = key[1:] != key[:-1]
    at = xp.flatnonzero(new)
    count = xp.diff(xp.concatenate([at, xp.full(1, key.size, dtype=at.dtype)]))
    uk = key.take(at)
    r, K = uk // nc, uk % nc
    hit = xp.flatnonzero(count == need.take(r))            # one read for both gathers
    K = K.take(hit)                                        # int32 where it fits, as scipy's indices
    return r.take(hit), (K.astype(np.int32) if nc <= np.iinfo(np.int32).max else K)
