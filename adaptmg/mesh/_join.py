"""Cells that contain given sets of nodes, by a sorted-key join instead of a sparse product.

For sets S_r of nodes (row r of a 0/1 matrix P, P[r, i] = 1 for i in S_r) and the cells'
incidence N (N[K, i] = 1 if i is a vertex of cell K), the cells that hold all of S_r are the
entries of P N^T equal to |S_r|.  The product transposes the whole incidence (one entry per
(cell, vertex)); here only the occurrences of nodes of some S_r are gathered (a boolean
gather over the cells' vertices), sorted by node, joined with the (r, i) pairs and counted
per (r, K) by one sort of the keys r * nc + K.
"""
from __future__ import annotations

import numpy as np


def cells_holding(cells: np.ndarray, rows: np.ndarray, nodes: np.ndarray, need: np.ndarray,
                  num_nodes: int):
    """(r, K) pairs, sorted by r then K, of the cells K (rows of ``cells``, (nc, nv) node ids
    with distinct vertices) that have exactly ``need[r]`` of the nodes of set r as vertices;
    the sets are the pairs (``rows[k]``, ``nodes[k]``), distinct.  K is int32 if nc < 2^31."""
    nc, nv = cells.shape
    if rows.size == 0 or nc == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    mark = np.zeros(num_nodes, dtype=bool)
    mark[nodes] = True
    flat = cells.reshape(-1)
    occ = np.flatnonzero(mark.take(flat))                  # (cell, vertex) slots of set nodes
    occ_node = flat.take(occ)
    order = np.argsort(occ_node, kind="stable")
    occ_node = occ_node.take(order)
    occ_cell = (occ // nv).take(order)
    start = np.searchsorted(occ_node, nodes, side="left")
    cnt = np.searchsorted(occ_node, nodes, side="right") - start
    tot = int(cnt.sum())
    first = np.cumsum(cnt) - cnt
    slot = np.arange(tot, dtype=np.int64) + np.repeat(start - first, cnt)
    key = np.repeat(np.asarray(rows, dtype=np.int64), cnt) * nc + occ_cell.take(slot)
    key.sort()
    new = np.empty(key.size, dtype=bool)
    new[:1] = True
    np.not_equal(key[1:], key[:-1], out=new[1:])
    at = np.flatnonzero(new)
    count = np.diff(np.append(at, key.size))
    uk = key.take(at)
    r, K = uk // nc, uk % nc
    hit = count == np.asarray(need).take(r)
    K = K[hit]                                             # int32 where it fits, as scipy's indices
    return r[hit], (K.astype(np.int32) if nc <= np.iinfo(np.int32).max else K)
