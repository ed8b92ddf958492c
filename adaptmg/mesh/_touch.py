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

:func:`touch_max` runs on the backend of ``cells`` (the scatters through
:func:`adaptmg.backend.scatter_max`: ``np.maximum.at`` / ``cupyx.scatter_max``).
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, in_host_memory, scatter_max, stable_argsort, to_host
from ..device.cell_kernels import cells_vertex_hit, scatter_cells
from ._xp import tuned, xp_of

SPARSE = 4           # the sparse path when at most num_cells / SPARSE cells exceed the minimum
_I32 = np.iinfo(np.int32)


def touch_max(cells: np.ndarray, num_nodes: int, links, values: np.ndarray) -> np.ndarray:
    """int64 (nc,): ``out(K)`` above for ``cells`` (nc, nv) node ids, the hanging ``links``
    (nodes, coarse cells) and ``values`` (nc,) (cast to int64), on the backend of ``cells``
    (``values`` and ``links`` are moved there).  The generic (device) variant scatters int32
    where the values fit (cupyx.scatter_max takes int64 only from CuPy's 2026 versions on);
    the maxima are the same integers."""
    xp = xp_of(cells)
    values = xp.asarray(values)
    nc, nv = cells.shape
    hn, hc = (xp.asarray(a) for a in links)
    low = int(values.min()) if values.size and values.dtype.kind in "iub" else None
    wt = np.int64
    if low is not None and not tuned(cells) and low > _I32.min and int(values.max()) <= _I32.max:
        wt = np.int32
    src = None if low is None else xp.flatnonzero(values > low)
    if src is None or src.size * SPARSE > nc:
        node = xp.full(num_nodes, np.iinfo(wt).min, dtype=wt)
        scatter_max(node, cells.ravel(), xp.repeat(values.astype(wt), nv))
        if hn.size:                                                 # coarse side -> hanging node
            scatter_max(node, hn, values[hc].astype(wt))
        out = node[cells].max(axis=1)
    else:
        node = xp.full(num_nodes, low, dtype=wt)
        scatter_max(node, xp.take(cells, src, axis=0).ravel(), xp.repeat(values[src].astype(wt), nv))
        if hn.size:
            scatter_max(node, hn, values[hc].astype(wt))
        rows = cells_with_vertex_in(cells, node > low)
        out = xp.full(nc, low, dtype=wt)
        out[rows] = xp.take(node, xp.take(cells, rows, axis=0)).max(axis=1)
    if hn.size:
        scatter_max(out, hc, node[hn])                              # hanging node -> coarse side
    return out.astype(np.int64, copy=False)


def cells_with_vertex_in(cells: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sorted rows of ``cells`` (nc, nv) node ids with a vertex in the node mask ``mask``: one
    boolean gather of the vertex slots, on the host 4 or 8 of them read as one word per
    cell."""
    xp = xp_of(cells)
    if not in_host_memory(cells):        # one kernel a cell (no bool per vertex slot)
        return xp.flatnonzero(cells_vertex_hit(cells, mask))
    hit = xp.take(mask, cells)
    nv = cells.shape[1]
    if nv in (4, 8) and tuned(hit):
        return np.flatnonzero(hit.view(f"u{nv}").ravel())
    return xp.flatnonzero(hit.any(axis=1))


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


def level_jumps(cells, num_nodes: int, levels):
    """``(jump, rows)``: ``jump[i]`` whether cells of two levels share node ``i`` (the maximum
    minus the minimum of ``levels`` over the cells with vertex ``i`` is positive), and the
    sorted cells having a vertex that a cell off the most common level touches -- every cell
    with a jump vertex is one of them -- or None (all cells).

    The cells are taken level by level (:func:`_stamp_levels`): each node keeps the last
    level that had it as a vertex, and a node that a second level reaches jumps -- a gather
    and two scatters of each cell's vertices, no ``ufunc.at`` over every (cell, vertex) pair
    and no pass over all nodes per level (the forest's nodes: a small coarse level of a large
    forest paid them).  Mostly one level dominates (a local refinement, its hierarchy): only
    the vertices of the other cells can jump, so those are stamped first, the cells touching
    them found by one boolean gather of the vertex slots (8 bytes a cell), and of the
    dominant level only those cells stamped.  The same mask either way.  On the device
    (CuPy arrays) atomic minima and maxima instead (:func:`_jumps_by_scatter`); O(1) scalars
    to the host there, O(levels) on the host."""
    be = backend_of(cells)
    xp = be.xp
    nc, nv = cells.shape
    jump = xp.zeros(num_nodes, dtype=bool)
    if nc == 0:
        return jump, None
    if be.is_gpu:
        return _jumps_by_scatter(cells, num_nodes, levels)
    low = int(levels.min())
    major = low + int(xp.argmax(xp.bincount((levels - low).astype(np.intp, copy=False))))
    rest = xp.flatnonzero(levels != major)
    last = xp.full(num_nodes, -1, dtype=np.int16 if int(levels.max()) < np.iinfo(np.int16).max else np.int64)
    if rest.size * SPARSE > nc:                    # no dominant level: every cell
        _stamp_levels(cells, xp.arange(nc), levels, last, jump)
        return jump, None
    _stamp_levels(cells, rest, levels, last, jump)     # the other levels' vertices: last >= 0
    rows = cells_with_vertex_in(cells, last >= 0)
    _stamp_levels(cells, rows.take(xp.flatnonzero(levels.take(rows) == major)), levels, last, jump)
    return jump, rows


def _jumps_by_scatter(cells, num_nodes, levels):
    """:func:`level_jumps` on the device: the minimum and the maximum level at every node by
    one kernel of atomic minima and maxima over the (cell, vertex) slots
    (:func:`~adaptmg.device.cell_kernels.scatter_cells`) -- no loop over the mesh's levels with a
    few launches and a host read each (an adaptive loop's mesh has 10-20 levels, and every
    level of its hierarchy asks); ``rows`` the cells with a vertex of a cell off the dominant
    level (the first most common one, as the host's ``argmax`` of its ``bincount``), None when
    that level does not dominate.  When it dominates only ``rows`` are scattered: a node where
    two levels meet is a vertex of a cell off the dominant level, so every cell at it is one of
    ``rows``, and the other nodes of ``rows`` see one level.  The levels' histogram by CuPy's
    ``bincount`` (CUB's histogram, per-block counts summed: one read of the largest level for
    its size; an atomic scatter of every cell into the few level bins serialised on them: this
    function took 45 ms for the six levels of a 38M-cell hierarchy on an H200 with it, 15 ms
    with ``bincount``), and one read, the dominant level's size.  The host's mask and rows."""
    xp = backend_of(cells).xp
    nc = cells.shape[0]
    hist = xp.bincount(levels.astype(np.intp, copy=False))
    major = xp.argmax(hist)
    rest_size = nc - int(hist.max())
    rows = None
    if rest_size * SPARSE <= nc:                    # a dominant level: only the cells near the others
        rest = xp.flatnonzero(levels != major)
        touched = xp.zeros(num_nodes, dtype=bool)
        touched[xp.take(cells, rest, axis=0).reshape(-1)] = True       # one value written
        rows = cells_with_vertex_in(cells, touched)
        cells, levels = xp.take(cells, rows, axis=0), levels.take(rows)
    lo, hi = scatter_cells(cells, levels.astype(np.int32),
                           xp.full(num_nodes, np.iinfo(np.int32).max, dtype=np.int32), xp.full(num_nodes, -1, dtype=np.int32))
    return hi > lo, rows                            # not a vertex: -1 > max is False


def _stamp_levels(cells, which, lv, last, jump) -> None:
    """For the cells ``which`` (rows of ``cells``), level by level (grouped by a stable sort of
    their small-integer levels: a radix sort): set ``jump`` on the vertices whose ``last``
    level is another one, then ``last`` to this level (every write of a scatter the same
    value: no order of repeated indices is relied on).  The levels' bounds come to the host
    at once (O(levels) integers)."""
    if which.size == 0:
        return
    xp = backend_of(cells).xp
    wl = lv.take(which)
    order = stable_argsort(wl)
    wl = wl.take(order)
    cut = xp.flatnonzero(wl[1:] != wl[:-1]) + 1
    bounds = to_host(xp.concatenate([xp.zeros(1, dtype=cut.dtype), cut,
                                     xp.full(1, wl.size, dtype=cut.dtype)])).tolist()
    values = to_host(wl.take(xp.asarray(bounds[:-1]))).tolist()
    for a, b, L in zip(bounds[:-1], bounds[1:], values):
        nodes = xp.take(cells, which.take(order[a:b]), axis=0).reshape(-1)
        seen = last.take(nodes)
        jump[nodes[(seen >= 0) & (seen != L)]] = True
        last[nodes] = L
