"""Hanging nodes of a mesh of a refinement forest, in the forest's node ids.

A vertex of an active cell hangs when it lies inside an edge (weights 1/2, 1/2) or a face (4 x
1/4) of a coarser active cell.  The forest registers the midpoint of every edge and the centre
of every face it ever split, keyed by the edge's end points / the face's smallest corner and
the corner diagonally opposite (:mod:`._tree`).  So the hanging nodes are the registered
midpoints and centres of the edges and faces of active cells that are vertices of active
cells: one lookup per (cell, edge) and (cell, face) in the sorted registries (one kernel on
the device, :func:`~adaptmg.device.index_kernels.registry_midpoints`).  Only cells
that can take part are looked at: on a 2:1 mesh a hanging node and its parents are vertices
of cells beside a level jump (:func:`._touch.level_jumps`), and the cell whose edge/face
holds it is coarser than the finest of those.  The parents (the edge's ends, the face's
corners) must be jump nodes too, where cells of two levels meet: on a whole mesh they always
are (the fine cells on both halves of the edge, or all four quarters of the face, touch
them); on a mesh of part of a forest's leaves -- a rank's owned cells and ghosts
(:mod:`adaptmg.distributed.forest`) -- a midpoint on the rim whose other half's fine cells
are not there does not hang on that mesh.  No numbering of the mesh's nodes is needed:
this runs on the forest ids of the cells' vertices and can go beside the numbering.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, stable_argsort
from ..device.index_kernels import registry_midpoints
from . import _touch
from . import reference as ref

__all__ = ["hanging_in_forest", "number_hanging", "hanging_weights"]


@functools.lru_cache(maxsize=None)
def _entities(dim):
    """``[(ent, kind)]``: the local vertices (ne, 4) int32 of a cell's edges (``[a, b, -1, -1]``)
    and, in 3-D, faces (4 corners, lexicographic), with the registry that keys them."""
    e = ref.edges(dim)
    out = [(np.concatenate([e, np.full((e.shape[0], 2), -1)], axis=1).astype(np.int32), "edge")]
    if dim == 3:
        out.append((ref.face_vertices(3).astype(np.int32), "face"))
    return out


def hanging_in_forest(F, cells, levels):
    """``(nodes, parents (nh, 4) -1 padded, owner cell, (node, cell) pairs)`` of the hanging
    nodes of the mesh whose active cells have the forest vertex ids ``cells`` (nc, 2^d) and
    the refinement ``levels``: forest node ids, nodes ascending; the owner is the first
    active cell (index into ``cells``) whose edge/face holds the node, the pairs list every
    such cell (by node, then cell).  A mesh whose cells all have one level has none (returned
    at once: uniform meshes, e.g. every level of a global-coarsening hierarchy of a uniform
    mesh).  Arrays of the forest's backend (NumPy or CuPy; the same integers), O(1) scalars
    to the host."""
    xp = F.backend.xp
    if levels.size == 0 or bool(levels.min() == levels.max()):
        e64, e32 = xp.zeros(0, dtype=np.int64), xp.zeros(0, dtype=np.int32)
        return e64, xp.zeros((0, 4), dtype=np.int64), e32, (e64.copy(), e32.copy())
    d, nf, nc = F.dim, F.num_nodes, cells.shape[0]
    jump, rows = _touch.level_jumps(cells, nf, levels.astype(F.cell_level.dtype))
    if rows is None:
        # no dominant level: the cells with a jump vertex, not every cell.  A cell holding a
        # hanging node has its edge's / face's corners among the jump nodes (the registry
        # lookup asks for that), and each finer cell at the node has one of those corners
        # as a vertex: the same nodes, owners and pairs from a fraction of the cells (two
        # refined balls on a rank: 0.43 -> 0.03 s on the host)
        rows = _touch.cells_with_vertex_in(cells, jump)
    sub = xp.take(cells, rows, axis=0)
    seen = xp.zeros(nf, dtype=bool)                       # vertices of the cells beside a jump
    seen[sub] = True
    lsub = levels.take(rows)
    own = xp.flatnonzero(lsub < lsub.max())               # the cells that may hold one
    K = xp.take(sub, own, axis=0)
    regs = {"edge": (F.edge_keys, F.edge_nodes), "face": (F.face_keys, F.face_nodes)}
    # each (cell, edge / face): its registered midpoint / centre if that is a vertex here, else -1
    M = [registry_midpoints(K, ent, *regs[kind], seen, jump) for ent, kind in _entities(d)]
    ne = [int(m.shape[1]) for m in M]
    M = xp.concatenate(M, axis=1) if len(M) > 1 else M[0]
    at = xp.flatnonzero(M.ravel() >= 0)
    node, cell = M.ravel().take(at), own.take(at // sum(ne))
    cell = rows.take(cell)
    # by node, then cell (a cell holds a node on one edge/face at most: the pairs are distinct):
    # one sort of the packed pairs (node ids < 2^31), unless the cells need more than 32 bits
    if nc < 2 ** 32:
        key = (node << 32) | cell
        key.sort()
        node, cell = key >> 32, key & 0xFFFFFFFF
    else:
        order = xp.lexsort(xp.stack([cell, node]))
        node, cell = node.take(order), cell.take(order)
    cell = cell.astype(np.int32 if nc <= np.iinfo(np.int32).max else np.int64)
    first = xp.ones(node.size, dtype=bool)
    first[1:] = node[1:] != node[:-1]
    first = xp.flatnonzero(first)
    nodes = node.take(first)
    parents = F.node_par.take(nodes, axis=0)[:, :4].astype(np.int64)    # -1 padded past 2 (edges)
    return nodes, parents, cell.take(first), (node, cell)


def number_hanging(found, pos):
    """:func:`hanging_in_forest`'s ``found`` in the mesh's node numbering ``pos`` (forest id
    -> mesh node): nodes ascending, the parents and owners with them, the (node, cell) pairs
    by node then cell (O(hanging nodes); the arrays' module)."""
    nodes, parents, owner, (pn, pc) = found
    if nodes.size == 0:
        return found
    xp = backend_of(pos).xp
    ln = pos.take(nodes).astype(np.int64, copy=False)     # (pos may be int32)
    order = stable_argsort(ln)
    lp = xp.where(parents >= 0, pos.take(xp.maximum(parents, 0)), -1).astype(np.int64, copy=False)
    qn = pos.take(pn).astype(np.int64, copy=False)
    po = xp.lexsort(xp.stack([pc.astype(qn.dtype), qn]))   # pairs by (node, cell)
    return ln.take(order), lp.take(order, axis=0), owner.take(order), (qn.take(po), pc.take(po))


def hanging_weights(parents):
    """(nh, 4) Q1 interpolation weights of the hanging nodes with the -1 padded ``parents``:
    1/2 for the 2 ends of an edge, 1/4 for the 4 corners of a face, 0 in the padding."""
    n = (parents >= 0).sum(1, keepdims=True)
    return backend_of(parents).xp.where(parents >= 0, 1.0 / n, 0.0)
