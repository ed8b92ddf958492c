"""Maximum of integer cell values over the touching cells, through the nodes; the nodes
where cells of two levels meet (:func:`level_jumps`).

For active cells K with vertex sets V(K) and hanging links (node h, coarse cell C whose
edge/face holds h):

    node(i)  = max(values[K] : i in V(K))  (and max with values[C] for links (i, C)),
    out(K)   = max(node(i) : i in V(K))    (and max with node(h) for links (h, K)).

Most calls (the 2:1 closure of a local refinement, the blocked families of global
coarsening) raise few cells above the smallest value m: then only those *sources* are
scattered, ``node = m`` elsewhere, and only the cells with a vertex above m are gathered
(found by one boolean gather of the vertex slots, read 8 bytes per cell), instead of a
scatter and a gather over every (cell, vertex) pair.  Same result, element for element.
"""
from __future__ import annotations

import numpy as np

SPARSE = 4           # the sparse path when at most num_cells / SPARSE cells exceed the minimum


def touch_max(cells: np.ndarray, num_nodes: int, links, values: np.ndarray) -> np.ndarray:
    """int64 (nc,): ``out(K)`` above for ``cells`` (nc, nv) node ids, the hanging ``links``
    (nodes, coarse cells) and ``values`` (nc,) (cast to int64)."""
    values = np.asarray(values)
    nc, nv = cells.shape
    hn, hc = links
    low = int(values.min()) if values.size and values.dtype.kind in "iub" else None
    src = None if low is None else np.flatnonzero(values > low)
    if src is None or src.size * SPARSE > nc:
        node = np.full(num_nodes, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(node, cells.ravel(), np.repeat(values.astype(np.int64), nv))
        np.maximum.at(node, hn, values[hc].astype(np.int64))          # coarse side -> hanging node
        out = node[cells].max(axis=1)
    else:
        node = np.full(num_nodes, low, dtype=np.int64)
        np.maximum.at(node, np.take(cells, src, axis=0).ravel(),
                      np.repeat(values[src].astype(np.int64), nv))
        np.maximum.at(node, hn, values[hc].astype(np.int64))
        rows = cells_with_vertex_in(cells, node > low)
        out = np.full(nc, low, dtype=np.int64)
        out[rows] = np.take(node, np.take(cells, rows, axis=0)).max(axis=1)
    np.maximum.at(out, hc, node[hn])                                # hanging node -> coarse side
    return out


def cells_with_vertex_in(cells: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sorted rows of ``cells`` (nc, nv) node ids with a vertex in the node mask ``mask``: one
    boolean gather of the vertex slots, 4 or 8 of them read as one word per cell."""
    hit = np.take(mask, cells)
    nv = cells.shape[1]
    if nv in (4, 8):
        return np.flatnonzero(hit.view(f"u{nv}").ravel())
    return np.flatnonzero(hit.any(axis=1))


#: no hanging-node links: what :func:`touch_max_vertices` passes
_NO_LINKS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32))


def touch_max_vertices(cells: np.ndarray, num_nodes: int, values: np.ndarray) -> np.ndarray:
    """:func:`touch_max` through the shared vertices only, exact on the meshes of a
    refinement forest (2:1, cells of one level meeting in whole edges/faces): if a vertex
    ``h`` of a cell F hangs on an edge/face ``e`` of a coarser cell K, then F is one of the
    children of a cell of K's level that hold ``h`` -- the 2 along ``e`` (an edge midpoint)
    or the 4 beside it (a face centre) -- and each of those has a corner of ``e``, a vertex
    of K, as a vertex; so the hanging links add no touching pair and need not be computed."""
    return touch_max(cells, num_nodes, _NO_LINKS, values)


def level_jumps(cells: np.ndarray, num_nodes: int, levels: np.ndarray):
    """``(jump, rows)``: ``jump[i]`` whether cells of two levels share node ``i`` (the maximum
    minus the minimum of ``levels`` over the cells with vertex ``i`` is positive), and the
    sorted cells having a vertex that a cell off the most common level touches -- every cell
    with a jump vertex is one of them -- or None (all cells).

    A node jumps iff the cells of at least two levels have it as a vertex: per level ``L``
    the boolean mask of its cells' vertices (one boolean scatter of those cells), summed
    over the levels (O(levels) steps; every cell scattered once) -- no ``ufunc.at`` over
    every (cell, vertex) pair.  Mostly one level dominates (a local refinement, its
    hierarchy): only the vertices of the other cells can jump, so those are marked (the
    minor levels' masks), the cells touching them found by one boolean gather of the
    vertex slots (8 bytes a cell), and the major level's mask scattered from those cells
    only.  The same mask either way."""
    nc, nv = cells.shape
    lv = np.asarray(levels)
    if nc == 0:
        return np.zeros(num_nodes, dtype=bool), None
    low = int(lv.min())
    per_level = np.bincount(lv - low) if lv.dtype.itemsize <= 2 else np.bincount((lv - low).astype(np.intp))
    major = int(np.argmax(per_level))
    rest = np.flatnonzero(lv != low + major) if per_level[major] < nc else np.zeros(0, dtype=np.intp)
    if rest.size * SPARSE > nc:                    # no dominant level: every cell, by level
        return _distinct_levels(cells, num_nodes, np.arange(nc), lv) >= 2, None
    count = _distinct_levels(cells, num_nodes, rest, lv)      # the minor levels' vertices
    rows = cells_with_vertex_in(cells, count > 0)
    on_major = rows.take(np.flatnonzero(lv.take(rows) == low + major))
    mark = np.zeros(num_nodes, dtype=bool)
    mark[np.take(cells, on_major, axis=0)] = True
    count += mark
    return count >= 2, rows


def _distinct_levels(cells, num_nodes, which, lv) -> np.ndarray:
    """uint8 (num_nodes,): how many distinct levels the cells ``which`` (rows of ``cells``)
    with vertex ``i`` have, by one boolean scatter of each level's cells (cells grouped by
    a stable sort of their small-integer levels: a radix sort)."""
    count = np.zeros(num_nodes, dtype=np.uint8)
    if which.size == 0:
        return count
    wl = lv.take(which)
    order = np.argsort(wl, kind="stable")
    wl = wl.take(order)
    cut = np.flatnonzero(wl[1:] != wl[:-1]) + 1
    mark = np.empty(num_nodes, dtype=bool)
    for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [wl.size]])):
        mark.fill(False)
        mark[np.take(cells, which.take(order[a:b]), axis=0)] = True
        count += mark
    return count
