"""Cell-set computations on a distributed forest's local mesh (:mod:`.forest`): the cells
beside a set of cells (the ghost layer kept after a refinement), the (new owner, cell) pairs
a re-cut sends to build the new ghost layers (:func:`_layer_pairs`), the owner -> ghost-holder
exchange of per-cell values (:class:`CellHalo`), and the incremental blocking test of global
coarsening (:class:`_StayingLevels`); and the forest's small collectives (sums, an exclusive
scan, the agreed ValueError of bad input and RuntimeError of an inconsistency).  All host
NumPy, vectorised."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import scatter_max
from ..mesh._touch import SPARSE, cells_with_vertex_in
from .comm import agree, alltoallv

__all__ = ["CellHalo"]


def _allsum(comm, x):
    return x if comm.Get_size() == 1 else comm.allreduce(x)


def _exscan(comm, x):
    """Sum of ``x`` over the lower ranks (0 on rank 0)."""
    if comm.Get_size() == 1:
        return 0
    s = comm.exscan(x)
    return 0 if s is None else s


def _agree(comm, ok, message):
    """ValueError on every rank if ``ok`` is False on any (:func:`.comm.agree`)."""
    if comm.Get_size() == 1:
        if not ok:
            raise ValueError(message)
    else:
        agree(comm, ok, message)


def _check(comm, ok, message):
    """RuntimeError on every rank (an internal inconsistency, not bad input) if ``ok`` is False
    on any: no rank is left waiting in the next collective."""
    mine = None if ok else message
    bad = [m for m in ([mine] if comm.Get_size() == 1 else comm.allgather(mine)) if m]
    if bad:
        raise RuntimeError(bad[0])


def _touching(cells: np.ndarray, num_nodes: int, sel: np.ndarray) -> np.ndarray:
    """Sorted rows of ``cells`` (node ids) sharing a vertex with a row of ``sel``."""
    mark = np.zeros(num_nodes, dtype=bool)
    mark[np.take(cells, sel, axis=0)] = True
    return cells_with_vertex_in(cells, mark)


def _owned_and_layer(cells: np.ndarray, num_nodes: int, owner: np.ndarray, rank: int) -> np.ndarray:
    """Sorted rows of ``cells`` owned by ``rank`` or sharing a vertex with one that is: the
    owned cells beside the others are found first (few), then the others beside them."""
    other = np.flatnonzero(owner != rank)
    near = _touching(cells, num_nodes, other)
    edge = near[owner[near] == rank]
    mark = np.zeros(num_nodes, dtype=bool)
    mark[np.take(cells, edge, axis=0)] = True
    keep = owner == rank
    keep[other] = mark[np.take(cells, other, axis=0)].any(axis=1)
    return np.flatnonzero(keep)


def _group_pairs(group: np.ndarray):
    """All index pairs ``(i, j)`` with ``group[i] == group[j]`` for a sorted ``group``."""
    n = group.size
    start = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]])) if n else np.zeros(0, np.int64)
    cnt = np.diff(np.append(start, n))
    g = np.repeat(np.arange(start.size), cnt)
    rep = cnt[g]
    i = np.repeat(np.arange(n), rep)
    k = np.arange(i.size) - np.repeat(np.cumsum(rep) - rep, rep)
    return i, start[g[i]] + k


def _layer_pairs(acn: np.ndarray, num_nodes: int, newown: np.ndarray, size: int, sent_here):
    """(new owner q, cell) pairs, distinct, of a local mesh with vertex table ``acn`` and new
    owners ``newown``: at the vertices ``sent_here(rows, sub)`` (a node mask; this rank's
    duty: vertices of its old owned leaves, where it has every leaf) where leaves of several
    new owners meet, each leaf there that ``q`` will not own."""
    nv = acn.shape[1]
    # new owners differ only at vertices of cells off the most common new owner: the cells
    # there first (one boolean gather of the vertex slots), the rest among them only
    major = int(np.argmax(np.bincount(newown))) if newown.size else 0   # none: an idle rank
    mark = np.zeros(num_nodes, dtype=bool)
    mark[np.take(acn, np.flatnonzero(newown != major), axis=0)] = True
    rows = cells_with_vertex_in(acn, mark)
    sub = np.take(acn, rows, axis=0)
    rep = np.repeat(newown[rows], nv)
    lo = np.full(num_nodes, size, dtype=np.int64)
    hi = np.full(num_nodes, -1, dtype=np.int64)
    np.minimum.at(lo, sub.reshape(-1), rep)
    np.maximum.at(hi, sub.reshape(-1), rep)
    bnd = sent_here(rows, sub) & (lo != hi)          # every cell at such a vertex is in rows
    at = cells_with_vertex_in(sub, bnd)
    rows, sub = rows[at], sub[at]
    hit = bnd[sub]
    node, cell = sub[hit], np.repeat(rows, nv)[hit.reshape(-1)]
    o = np.argsort(node, kind="stable")
    node, cell = node[o], cell[o]
    i, j = _group_pairs(node)
    dest, other = newown[cell[i]], cell[j]
    sel = newown[other] != dest
    n = acn.shape[0]
    u = np.unique(dest[sel] * n + other[sel])
    return u // n, u % n


class _StayingLevels:
    r"""The blocking test of global coarsening, incrementally: ``node[i]`` the highest level of
    the staying cells (those not coarsened) with vertex ``i``, raised as cells are found to
    stay; a family cell ``K`` (level ``l``) is *bad* when a staying cell of level ``l + 1`` touches
    it, i.e. :math:`\max_{i \in V(K)} \mathrm{node}[i] \ge l + 1` (vertex-balanced 2:1 forest:
    a touching cell's level is ``l - 1 .. l + 1``).  :meth:`Mesh.touch_max` over all cells
    each round computes the same; here the first round scatters only the staying cells whose
    level is one above a candidate's, and a later round only the cells that stopped being
    coarsened; only the candidates at their vertices are tested (all of them where the first
    round's sources are more than a ``SPARSE``-th of the cells: one gather instead of a boolean
    one and a gather), since the maxima only grow: a candidate not bad before is bad now only
    there."""

    def __init__(self, cells, num_nodes, lv, cand):
        self.cells, self.lv = cells, lv
        self.node = np.full(num_nodes, -1, dtype=np.int64)
        top = int(lv.max()) + 2 if lv.size else 1
        self.useful = np.zeros(top, dtype=bool)   # levels one above a candidate's
        self.useful[lv[cand] + 1] = True
        self.first = True

    def add(self, staying, cand):
        """Raise the maxima by the cells of the mask ``staying``; return the cells of the mask
        ``cand`` (the candidates left) that are bad now."""
        cells, n = self.cells, self.lv.size
        src = np.flatnonzero(staying & self.useful[self.lv])
        first, self.first = self.first, False
        if src.size == 0:
            return np.zeros(0, dtype=np.int64)
        sc = np.take(cells, src, axis=0)
        scatter_max(self.node, sc.reshape(-1), np.repeat(self.lv[src], cells.shape[1]))
        if first and src.size * SPARSE > n:           # sources everywhere: every candidate
            rows = np.flatnonzero(cand)
        else:                                         # the candidates at the sources' vertices
            hit = np.zeros(self.node.size, dtype=bool)
            hit[sc] = True
            rows = cells_with_vertex_in(cells, hit)
            rows = rows[cand[rows]]
        top = np.take(self.node, np.take(cells, rows, axis=0)).max(axis=1) if rows.size else rows
        return rows[top >= self.lv[rows] + 1]


class CellHalo:
    """Owner -> ghost-holder exchange of per-cell values on a distributed forest's local mesh
    (module docstring): ``send_cells`` / ``send_dest`` the (owned cell, rank) pairs, sorted by
    rank and key; ``recv_cells`` the local ghost each received row goes to.  Built
    collectively (one ``Alltoallv`` of keys)."""

    def __init__(self, comm, cells: np.ndarray, num_nodes: int, owner: np.ndarray, keys: np.ndarray):
        self.comm = comm
        me, P = comm.Get_rank(), comm.Get_size()
        nv = cells.shape[1]
        ghost = np.flatnonzero(owner != me)
        # only owned cells with a vertex of a ghost can be ghosts elsewhere: R[v, q] a ghost of
        # rank q has vertex v, (those owned cells x nodes) @ R the ranks each one touches
        owned = _touching(cells, num_nodes, ghost) if ghost.size else np.zeros(0, dtype=np.int64)
        owned = owned[owner[owned] == me]
        R = sp.csr_matrix((np.ones(ghost.size * nv, dtype=np.int32),
                           (np.take(cells, ghost, axis=0).reshape(-1), np.repeat(owner[ghost], nv))),
                          shape=(num_nodes, P))
        O = sp.csr_matrix((np.ones(owned.size * nv, dtype=np.int32), np.take(cells, owned, axis=0).reshape(-1),
                           np.arange(0, owned.size * nv + 1, nv)), shape=(owned.size, num_nodes))
        S = (O @ R).tocoo()
        cells_s, dest = owned[S.row], S.col.astype(np.int64)
        o = np.lexsort((keys[cells_s], dest))
        self.send_cells, self.send_dest = cells_s[o], dest[o]
        (rkeys,) = alltoallv(comm, self.send_dest, keys[self.send_cells])
        gk = keys[ghost]
        go = np.argsort(gk)
        at = np.searchsorted(gk[go], rkeys)
        ok = rkeys.size == ghost.size and bool((gk[go][np.minimum(at, max(ghost.size - 1, 0))] == rkeys).all())
        _check(comm, ok, f"CellHalo: rank {me} received {rkeys.size} ghost keys for {ghost.size} ghosts "
                         "(the ranks' ghost layers disagree)")
        self.recv_cells = ghost[go[at]]

    def send(self, rows: np.ndarray) -> np.ndarray:
        """The rows of ``send_cells`` (``rows``, in that order) to their destinations: the rows
        received, one per ghost of ``recv_cells`` (in that order)."""
        return alltoallv(self.comm, self.send_dest, rows)[0]

    def exchange(self, values: np.ndarray) -> np.ndarray:
        """A copy of ``values`` (one row per local cell) whose ghost rows hold their owners' rows."""
        values = np.asarray(values)
        out = values.copy()
        out[self.recv_cells] = self.send(values[self.send_cells])
        return out
