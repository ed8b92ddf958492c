r"""Transfers between consecutive levels of a distributed forest's global-coarsening
hierarchy: owned rows of ``P_l`` and ``R_l = P_l^T`` in global node ids (Q1 scalar).

The serial convention (:mod:`adaptmg.multilevel.transfer`) on constrained vectors:

.. math::  P_l = Z_f\, \chi\, H_c\, Z_c, \qquad R_l = P_l^T,

``chi`` the Q1 embedding (row of fine node ``i``: the coarse cell's basis functions at
node ``i``), ``H_c`` the coarse hanging-node matrix (coarse hanging vertices replaced by
their parents' combination), ``Z`` the 0/1 diagonals of the free nodes (rows of non-free
fine nodes are zero, columns of non-free coarse nodes dropped).

Each level is a :class:`~.forest.DistributedForest` of its own (``coarse =
fine.coarsen_once()``).  The coarse cell of a fine leaf ``K`` is ``K`` itself or its parent,
whichever is a coarse leaf: the largest coarse leaf key ``<= key(K)`` (keys sort in
preorder, an ancestor just before its descendants, and no coarse leaf lies inside the
coarse cell), owned by the rank whose first owned key is the largest one ``<= key(K)``.
So row ``i`` (an owned free fine node) is asked for by key: the fine rank picks an owned leaf
``K`` with vertex ``j = i`` and sends ``(key(K), j)`` to that coarse rank (one
``Alltoallv``); there the coarse leaf ``C`` is found by a binary search among the owned
keys, the weights of ``C``'s vertices at vertex ``j`` of ``K`` read from the table

.. math::  W_{b,j,v} = \hat\phi_v\bigl((c_b + c_j) / 2\bigr)

(``c_b`` the corner of child digit ``b`` of ``K`` in ``C``; the identity when ``K = C``),
and the row is ``W E_c Z_c`` with ``E_c`` the coarse local mesh's ``H`` rows in global
columns (:class:`~.forest_rows.Expansion`: exact for the vertices of owned leaves) -- one
sparse product for all requests; its entries go back (one ``Alltoallv``).  The coarse level
is cut along the same curve, so nearly every request is the asking rank's own: those are
answered where they are asked, only the others (the cut) travel.  The weights are dyadic, so
the rows equal the serial ones bit for bit.

``R``'s owned rows (coarse owned nodes): the entries of ``P``'s owned rows in this rank's
columns kept, the others sent to the owners of their columns (one ``Alltoallv``); sorted.

On the GPU (``backend``) the own requests' rows are formed on the device (the coarse level's
local mesh and expansion there: :meth:`~.forest.DistributedForest.local_space`,
:meth:`~.forest_rows.Expansion.on`), ``P`` and ``R`` are device CSR, and only the cut's
requests and entries cross to the host.

A coarse level gathered on rank 0 (:func:`gather_level`): rank 0 rebuilds a serial
:class:`~adaptmg.mesh.Mesh` from the leaf keys (:func:`.cellkeys.build_local`) and maps its
nodes to the global ids through the gathered vertex ids of every leaf; that level's global
numbering is then the serial mesh's (``g2s`` broadcast: the level is small).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import CPU, backend_of, get_backend, scatter_min, to_host
from ..mesh import reference as ref
from .cellkeys import build_local
from .comm import alltoallv
from .forest import _check

__all__ = ["weight_table", "prolongation_rows", "restriction_rows", "gather_level"]


def weight_table(dim: int) -> np.ndarray:
    """``(2^d + 1, 2^d, 2^d)`` Q1 weights: ``W[b, j, v]`` is the coarse basis function of vertex
    ``v`` at vertex ``j`` of child ``b`` (reference corners ``c``: ``prod_a`` of ``x_a`` or
    ``1 - x_a`` at ``x = (c_b + c_j) / 2``); ``W[2^d]`` the identity (the fine leaf is the
    coarse leaf)."""
    cor = ref.corners(dim).astype(float)
    x = (cor[:, None, :] + cor[None, :, :]) / 2.0                         # (b, j, axis)
    W = np.prod(np.where(cor[None, None, :, :] == 1, x[:, :, None, :], 1.0 - x[:, :, None, :]), axis=-1)
    return np.concatenate([W, np.eye(2 ** dim)[None]])


def _first_owned_leaf(forest, nodes, be=CPU):
    """For local nodes ``nodes`` (vertices of owned leaves; an array of ``be``): the first owned
    leaf having each as a vertex (its position in ``owned_cells``) and the vertex index there --
    on the GPU from the local mesh there, by a scatter-min."""
    xp = be.xp
    cells = xp.take(forest.local_space(be).mesh.cells, forest.owned_cells_on(be), axis=0)
    nv = cells.shape[1]
    flat = cells.reshape(-1)
    if be.is_gpu:
        first = xp.full(forest.num_local_nodes, flat.size, dtype=np.int64)
        scatter_min(first, flat, xp.arange(flat.size, dtype=np.int64))
    else:
        first = np.full(forest.num_local_nodes, flat.size, dtype=np.int64)
        first[flat[::-1]] = np.arange(flat.size - 1, -1, -1)  # later writes win: the first one
    pos = first[nodes]
    _check(forest.comm, bool((pos < flat.size).all()), "prolongation_rows: an owned node is no vertex of an owned leaf")
    return pos // nv, pos % nv


def _coarse_rows(coarse, keys, j, EZ, ub, table, be=CPU):
    """At the coarse rank: the rows ``W E_c Z_c`` of the requests ``(keys, j)`` (module doc), as
    COO ``(request, global column, value)`` -- arrays of ``be``: on the GPU the requests are
    moved there (if not there already), the coarse leaves found among the owned keys there and
    their vertices read from the coarse local mesh there, and ``W E_c Z_c`` is one device
    product (``EZ``, ``ub``: :meth:`~.forest_rows.Expansion.masked`, ``u`` there)."""
    codec = coarse.codec
    xp = be.xp
    if keys.size == 0:              # (its collective check still taken)
        _check(coarse.comm, True, "")
        z = xp.zeros(0, dtype=np.int64)
        return z, z, xp.zeros(0)
    okeys, keys, j = coarse._moved("owned_keys", be), be.asarray(keys), be.asarray(j)
    at = xp.searchsorted(okeys, keys, side="right") - 1
    C = okeys[xp.maximum(at, 0)]
    lc, lk = codec.level(C), codec.level(keys)
    s = codec._shift(lc)
    ok = (at >= 0) & ((((keys >> s) << s) | lc) == C)
    ok &= (lk - lc >= 0) & (lk - lc <= 1)
    _check(coarse.comm, bool(ok.all()), f"prolongation_rows: rank {coarse.rank} got fine leaves whose "
                                        "coarse cell it does not own (not one coarsening apart?)")
    nv = 2 ** coarse.dim
    digit = xp.where(lk > lc, (keys >> codec._shift(lk)) & (nv - 1), nv)
    m = keys.size
    W = be.asarray(table)[digit, j]                                        # (m, nv)
    # the coarse leaf's vertices from the local mesh (on the GPU its copy there)
    vtx = xp.take(coarse.local_space(be).mesh.cells, xp.take(coarse.owned_cells_on(be), at), axis=0)
    nz = W != 0
    rows = xp.repeat(xp.arange(m), nv).reshape(m, nv)
    Wm = be.sparse.csr_matrix(be.sparse.coo_matrix((W[nz], (rows[nz], vtx[nz])), shape=(m, coarse.num_local_nodes)))
    R = (Wm @ EZ).tocoo()
    keep = R.data != 0
    return R.row[keep], ub[R.col[keep]], R.data[keep]


def prolongation_rows(fine, coarse, free_f, coarse_ex, col_map=None, backend=CPU):
    """Owned rows of ``P = Z_f chi H_c Z_c`` (module doc): CSR (fine owned nodes x coarse
    global nodes), sorted columns, on ``backend`` (SciPy on the CPU, cupyx on the GPU).

    ``fine``, ``coarse``: consecutive forests (``coarse = fine.coarsen_once()``, any
    partitions); ``free_f``: free mask of the fine owned nodes; ``coarse_ex``: the coarse
    level's :class:`~.forest_rows.Expansion` (:func:`.forest_rows.prepare`); ``col_map``:
    optional map of the coarse global ids to another numbering (a gathered level's
    ``g2s``).  Collective: the requests for coarse leaves of another rank (the cut) go there by
    key and their rows come back (two ``Alltoallv``); the others -- nearly all: the coarse
    level is cut along the same curve -- are answered here, on the device on the GPU (the
    coarse level's local mesh and expansion there)."""
    be = get_backend(backend)
    xp = be.xp
    comm = fine.comm
    rank = comm.Get_rank()
    own = fine.owned_nodes_on(be)
    want = xp.flatnonzero(be.asarray(free_f))      # non-free rows stay empty
    leaf, j = _first_owned_leaf(fine, own[want], be)
    keys = fine._moved("owned_keys", be)[leaf]
    # a rank idle on a folded coarse level (one of the last ones) owns no key: it gets none
    ck = coarse.owned_keys
    k0 = int(ck[0]) if ck.size else np.iinfo(np.int64).max
    firsts = np.asarray(comm.allgather(k0) if comm.Get_size() > 1 else [k0], dtype=np.int64)
    dest = xp.searchsorted(be.asarray(firsts), keys, side="right") - 1
    here = dest == rank
    table = weight_table(fine.dim)
    EZ, ub = coarse_ex.masked(be), coarse_ex.on(be)[2]
    # the requests of other ranks (the cut): there and back through the host
    go = xp.flatnonzero(~here)
    rk, rj, rid, src = alltoallv(comm, *(to_host(a[go]) for a in (dest, keys, j, want)),
                                 np.full(int(go.size), rank, dtype=np.int64))
    r, c, v = (to_host(a) for a in _coarse_rows(coarse, rk, rj, EZ, ub, table, be))
    row_r, col_r, val_r = alltoallv(comm, src[r], rid[r], c, v)
    # this rank's own requests, answered here
    hi = xp.flatnonzero(here)
    r, col, val = _coarse_rows(coarse, keys[hi], j[hi], EZ, ub, table, be)
    row = want[hi][r]
    row, col, val = (be.xp.concatenate([a, be.asarray(b)]) for a, b in ((row, row_r), (col, col_r), (val, val_r)))
    Nc = coarse.num_global_nodes
    if row.size == 0:               # no entry (e.g. an idle rank): a host matrix
        return sp.csr_matrix((own.size, Nc))
    if col_map is not None:
        col = be.asarray(col_map)[col]
    P = be.sparse.coo_matrix((val, (row, col)), shape=(own.size, Nc)).tocsr()
    P.sum_duplicates()
    return P


def restriction_rows(P_o, row_gids, col_layout, n_rows_global):
    """Owned rows of ``R = P^T`` on ``col_layout`` (the coarse level's
    :class:`~.csr.RangeLayout`): the entries of ``P``'s owned rows (global ids ``row_gids``) in
    this rank's columns kept, the others sent to the owners of their columns (one
    ``Alltoallv``: the cut).  CSR (coarse owned x fine global) on ``P_o``'s backend (host or
    device), sorted columns."""
    be = backend_of(P_o.data)
    xp = be.xp
    T = P_o.tocoo()
    c = T.col.astype(np.int64)
    f = be.asarray(row_gids)[T.row]
    mine = (c >= col_layout.lo) & (c < col_layout.hi)
    go = xp.flatnonzero(~mine)
    gc, gf, gv = (to_host(a[go]) for a in (c, f, T.data))
    r, fr, v = alltoallv(col_layout.comm, col_layout.owner_of(gc), gc, gf, gv)
    keep = xp.flatnonzero(mine)
    if keep.size + r.size == 0:      # no entry: a host matrix
        return sp.csr_matrix((col_layout.n, n_rows_global))
    rows = xp.concatenate([c[keep], be.asarray(r)]) - col_layout.lo
    cols = xp.concatenate([f[keep], be.asarray(fr)])
    vals = xp.concatenate([T.data[keep], be.asarray(v)])
    R = be.sparse.coo_matrix((vals, (rows, cols)), shape=(col_layout.n, n_rows_global)).tocsr()
    R.sum_duplicates()
    return R


def gather_level(forest):
    """The forest's leaves on rank 0 as a serial mesh (module doc; collective, one gather of the
    owned keys and their vertex ids and one broadcast): ``(mesh, g2s)`` -- ``mesh`` the serial
    :class:`~adaptmg.mesh.Mesh` on rank 0 (None elsewhere), ``g2s`` on every rank the serial
    node of each global id."""
    comm = forest.comm
    cells = forest.owned_cells
    vg = forest.node_gid[forest.mesh.cells.take(cells, axis=0)]
    keys = forest.keys[cells]
    N = forest.num_global_nodes
    P = comm.Get_size()
    got = comm.gather((keys, vg), root=0) if P > 1 else [(keys, vg)]
    mesh, ok, g2s = None, True, np.empty(N, dtype=np.int64)
    if forest.rank == 0:
        keys = np.concatenate([k for k, _ in got])
        vg = np.concatenate([v for _, v in got])
        if P == 1:
            # the forest's own local mesh: its leaves are these keys (any mesh of them serves:
            # s2g below is built and checked from the keys)
            mesh, fkey = forest.mesh, forest._fkey
        else:
            mesh, fkey = build_local(forest.coarse, forest.codec, forest.root_pos, keys)
        o = np.argsort(keys)
        ck = fkey[mesh.cell_ids]
        at = o[np.minimum(np.searchsorted(keys[o], ck), keys.size - 1)]
        s2g = np.full(mesh.num_nodes, -1, dtype=np.int64)
        s2g[mesh.cells] = vg[at]
        ok = bool((keys[at] == ck).all() and (s2g[mesh.cells] == vg[at]).all() and mesh.num_nodes == N
                  and (s2g >= 0).all() and np.array_equal(np.sort(s2g), np.arange(N)))
        if ok:
            g2s[s2g] = np.arange(N)
    _check(comm, ok, "gather_level: the gathered leaves' vertex ids do not number the serial mesh's nodes")
    if P > 1:
        comm.Bcast(g2s, root=0)
    return mesh, g2s
