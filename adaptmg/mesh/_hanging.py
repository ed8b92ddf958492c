"""Hanging nodes of a mesh of a refinement forest, in the forest's node ids.

A vertex of an active cell hangs when it lies inside an edge (weights 1/2, 1/2) or a face (4 x
1/4) of a coarser active cell.  Its parents (the edge's ends, the face's corners) are then
vertices of active cells of two levels; on a 2:1 mesh of one forest the hanging node is a
vertex of one of the fine cells beside the coarse edge/face, and each of those holds one of
the parents.  So: the nodes where cells of two levels meet (:func:`._touch.level_jumps`), the
cells touching them, the edge midpoints and face centres among those cells' vertices whose
parents all are such nodes, and the active cell that holds all of a candidate's parents
(:func:`._join.cells_holding`).  No numbering of the mesh's nodes is needed: this runs on the
forest ids of the cells' vertices and can go beside the numbering.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, repeat, stable_argsort
from ..device.index_kernels import hanging_candidates
from . import _touch
from ._join import cells_holding

__all__ = ["hanging_in_forest", "number_hanging", "hanging_weights"]


def hanging_in_forest(F, cells, levels):
    """``(nodes, parents (nh, 4) -1 padded, owner cell, (node, cell) pairs)`` of the hanging
    nodes of the mesh whose active cells have the forest vertex ids ``cells`` (nc, 2^d) and
    the refinement ``levels``: forest node ids, nodes ascending; the owner is the first
    active cell (index into ``cells``) holding all the node's parents, the pairs list every
    such cell.  A mesh whose cells all have one level has none (returned at once: uniform
    meshes, e.g. every level of a global-coarsening hierarchy of a uniform mesh).  Arrays of
    the forest's backend (NumPy or CuPy; the same integers), O(levels) scalars to the host."""
    xp = F.backend.xp
    if levels.size == 0 or bool(levels.min() == levels.max()):
        e64, e32 = xp.zeros(0, dtype=np.int64), xp.zeros(0, dtype=np.int32)
        return e64, xp.zeros((0, 4), dtype=np.int64), e32, (e64.copy(), e32.copy())
    d, nf, nc = F.dim, F.num_nodes, cells.shape[0]
    jump, rows = _touch.level_jumps(cells, nf, levels.astype(F.cell_level.dtype))
    sub = cells if rows is None else xp.take(cells, rows, axis=0)
    # candidates: edge midpoints and face centres among the vertices of those cells
    seen = xp.zeros(nf, dtype=bool)
    seen[sub] = True
    cand = hanging_candidates(seen, F.node_kind, F.node_par, jump, d)
    gpar = F.node_par[cand, :4].astype(np.int64)
    valid = gpar >= 0
    npar = valid.sum(1)                                   # 2 for an edge midpoint, 4 for a face centre
    vat = xp.flatnonzero(valid.ravel())                   # the parents, row by row: gpar[valid]
    rows_h = repeat(xp.arange(cand.size), npar, vat.size)
    # the holder of a hanging node's parents is coarser than the cells with the node as a
    # vertex, which are among these cells too: none of their finest level holds one (after a
    # local refinement of a uniform mesh: the join runs over the few coarse cells beside it)
    lsub = levels if rows is None else levels.take(rows)
    own = xp.flatnonzero(lsub < lsub.max())
    r, c = cells_holding(xp.take(sub, own, axis=0), rows_h, gpar.ravel().take(vat), npar, nf)
    c = own.take(c) if rows is None else rows.take(own.take(c))
    c = c.astype(np.int32 if nc <= np.iinfo(np.int32).max else np.int64)
    first = xp.ones(r.size, dtype=bool)
    first[1:] = r[1:] != r[:-1]
    first = xp.flatnonzero(first)                         # one read for both gathers
    rows_h = r.take(first)
    return cand[rows_h], xp.where(valid[rows_h], gpar[rows_h], -1), c.take(first), (cand[r], c)


def number_hanging(found, pos):
    """:func:`hanging_in_forest`'s ``found`` in the mesh's node numbering ``pos`` (forest id
    -> mesh node): nodes ascending, the parents and owners with them, the (node, cell) pairs
    by node then cell (O(hanging nodes); the arrays' module)."""
    nodes, parents, owner, (pn, pc) = found
    if nodes.size == 0:
        return found
    xp = backend_of(pos).xp
    ln = pos.take(nodes)
    order = stable_argsort(ln)
    lp = xp.where(parents >= 0, pos.take(xp.maximum(parents, 0)), -1)
    qn = pos.take(pn)
    po = xp.lexsort(xp.stack([pc.astype(qn.dtype), qn]))   # pairs by (node, cell)
    return ln.take(order), lp.take(order, axis=0), owner.take(order), (qn.take(po), pc.take(po))


def hanging_weights(parents):
    """(nh, 4) Q1 interpolation weights of the hanging nodes with the -1 padded ``parents``:
    1/2 for the 2 ends of an edge, 1/4 for the 4 corners of a face, 0 in the padding."""
    n = (parents >= 0).sum(1, keepdims=True)
    return backend_of(parents).xp.where(parents >= 0, 1.0 / n, 0.0)
