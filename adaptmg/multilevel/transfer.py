r"""Prolongation and restriction between nested spaces of a global-coarsening hierarchy.

Between consecutive meshes Omega_{l-1} (coarse) and Omega_l (fine), every fine
cell F is either a coarse cell or one of the 2^d children of a coarse cell K.
The canonical embedding V_{l-1} -> V_l evaluates the coarse function at the fine
DoF nodes (seed 001 eq. (1)):

.. math::  u^{(l)}_i = \sum_j \chi_{ij} u^{(l-1)}_j, \qquad
           \chi_{ij} = \hat\phi^K_j\big((b + \hat x_i)/2\big),

where b are the child bits of F in K and \hat x_i the reference node of DoF i in
F.  On constrained vectors (hanging and Dirichlet entries excluded) this is

.. math::  P_l = Z_l \, (\chi \otimes I_c)\, H_{l-1} \, Z_{l-1},

with H_{l-1} the coarse hanging-node matrix (so coarse hanging values are
interpolated first) and Z the 0/1 diagonal of free DoFs.  The restriction
R_l = P_l^T is stored explicitly (a transposed SpMV is 2-3x slower on a GPU).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..fe.csr_ops import mask_rows_cols
from ..fe.space import Space
from ..mesh import reference as ref

__all__ = ["interpolation_matrix", "prolongation"]


def interpolation_matrix(coarse: Space, fine: Space, nodes=None, cells=None) -> sp.csr_matrix:
    """Node-level embedding chi (fine nodes x coarse nodes) of nested Q_k spaces.

    ``nodes`` (sorted fine nodes, optional): only these rows (a ``nodes.size x`` coarse nodes
    matrix), each node taken from the first of ``cells`` (fine cells, default all) that
    contains it -- the rows a rank of :mod:`adaptmg.distributed` needs, from its cells only.

    Each fine node is taken from one fine cell containing it (its first occurrence in
    ``fine.cell_dofs``); its row holds the nonzero weights of table row (child position of
    that cell, local index of the node), so the rows are built straight in CSR from the
    compressed nonzero pattern of the (2^d + 1) * nloc table rows -- no dense
    (nodes, nloc) weight and column arrays, no COO conversion.

    Q1 between meshes without hanging nodes (e.g. the hierarchy of a uniform mesh) takes
    :func:`_interpolation_q1_conforming` instead: the same CSR arrays from the forest's node
    parents, without the per-cell tables.
    """
    if not (isinstance(coarse, Space) and isinstance(fine, Space)):
        raise TypeError("interpolation_matrix expects two Space objects")
    if coarse.degree != fine.degree or coarse.dim != fine.dim:
        raise ValueError(f"spaces differ: Q{coarse.degree} in {coarse.dim}D vs Q{fine.degree} in {fine.dim}D")
    if fine.degree == 1 and nodes is None and cells is None:
        chi = _interpolation_q1_conforming(coarse, fine)
        if chi is not None:
            return chi
    cidx, child = fine.mesh.parent_of(coarse.mesh)
    el = fine.element
    d, nloc = fine.dim, el.num_local
    cor = ref.corners(d).astype(float)
    # weights table: [child 0..2^d-1, identity], row (table, j) = weights of local fine node j
    tables = [el.values((cor[b] + el.nodes) / 2.0) for b in range(2 ** d)] + [np.eye(nloc)]
    W = np.stack(tables).reshape(-1, nloc)                  # ((2^d + 1) * nloc, nloc)
    W[np.abs(W) < 1e-13] = 0.0
    kr, kc = np.nonzero(W)                                  # table row-major: row, then column
    wv = W[kr, kc]
    cnt_tab = np.bincount(kr, minlength=W.shape[0])
    start_tab = np.cumsum(cnt_tab) - cnt_tab
    sel = np.where(child < 0, 2 ** d, child)
    rows = fine.cell_dofs.ravel() if cells is None else fine.cell_dofs[cells].ravel()
    nf, ncn = fine.num_nodes, coarse.num_nodes
    # one (cell, local index) occurrence per fine node: later writes win, so write in reverse
    first = np.full(nf, -1, dtype=np.int64)
    first[rows[::-1]] = np.arange(rows.size - 1, -1, -1)
    if nodes is not None:
        first = first[np.asarray(nodes, dtype=np.int64)]
        nf = first.size
    if (first < 0).any():
        raise RuntimeError("fine space has DoF nodes outside its cells" if nodes is None else
                           "interpolation_matrix: a fine node lies in none of the given cells")
    pos = first // nloc                                     # position among the cells taken
    cell = pos if cells is None else np.asarray(cells, dtype=np.int64)[pos]
    key = sel[cell] * nloc + (first - pos * nloc)           # table row of each fine node
    cnt = cnt_tab[key]
    indptr = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(cnt, out=indptr[1:])
    t = np.repeat(start_tab[key] - indptr[:-1], cnt)        # entry e -> nonzero t of the table
    t += np.arange(t.size)
    flat = np.repeat(cidx[cell] * nloc, cnt)                # coarse cell_dofs entry of each entry
    flat += kc[t]
    idx_t = np.int32 if max(nf, ncn, t.size) <= np.iinfo(np.int32).max else np.int64
    A = sp.csr_matrix((wv[t], coarse.cell_dofs.ravel()[flat].astype(idx_t, copy=False),
                       indptr.astype(idx_t, copy=False)), shape=(nf, ncn))
    A.sort_indices()                                        # rows are distinct coarse nodes: no duplicates
    return A


def _sort_rows(a: np.ndarray) -> np.ndarray:
    """``np.sort(a, axis=1)`` for a few columns (2 or 4) by a min/max sorting network (a row-wise
    ``np.sort`` pays a call per row); other widths by ``np.sort``."""
    w = a.shape[1]
    if w == 2:
        return np.stack([np.minimum(a[:, 0], a[:, 1]), np.maximum(a[:, 0], a[:, 1])], axis=1)
    if w == 4:
        c = [a[:, j] for j in range(4)]
        for i, j in ((0, 1), (2, 3), (0, 2), (1, 3), (1, 2)):
            c[i], c[j] = np.minimum(c[i], c[j]), np.maximum(c[i], c[j])
        return np.stack(c, axis=1)
    return np.sort(a, axis=1)


def _interpolation_q1_conforming(coarse: Space, fine: Space):
    """chi of :func:`interpolation_matrix` for Q1 between meshes of one forest without hanging
    nodes (e.g. every step of a uniform mesh's hierarchy), from the forest's node parents
    instead of the per-cell tables; None when that does not apply (the caller takes the
    general path, which also reports meshes that are not one refinement apart).

    Every fine node is a coarse node (row: weight 1 on itself) or was created by splitting
    a coarse cell K: then it is the midpoint of an edge, face or of K, and its forest
    parents are that entity's 2^k corners, all coarse nodes (hence not hanging in a
    conforming coarse mesh), with the Q1 weights 2^-k -- exactly (dyadic) the nonzeros of
    the general path's table row, whichever cell that path takes.  The rows hold the
    parents' coarse indices sorted: the same CSR arrays as the general path.

    The checks below (one forest, no hanging nodes, every coarse node a fine node, every
    other fine node a midpoint whose parents are all coarse nodes) imply what
    ``fine.mesh.parent_of(coarse.mesh)`` checks: a fine cell refined twice has a vertex with
    a parent that is no coarse node (a midpoint of its parent, or a hanging node of the
    coarse mesh), and a coarse cell refined away in the fine mesh would leave coarse nodes
    (its parent's midpoints) that are no vertex of any fine cell.
    """
    fm, cm = fine.mesh, coarse.mesh
    F = fm._forest
    if cm._forest is not F:
        return None
    if fm.num_hanging_nodes or cm.num_hanging_nodes:
        return None
    fid = fm.node_ids
    cmap = cm._node_numbering[1]                       # forest id -> coarse node, -1 if absent
    pos = cmap[fid]
    new = np.flatnonzero(pos < 0)
    nf, ncn = fine.num_nodes, coarse.num_nodes
    if nf - new.size != ncn:
        return None
    fnew = fid[new]
    kind = F.node_kind[fnew].astype(np.int64)
    d = fine.dim
    if new.size and (kind.min() < 1 or kind.max() > d):
        return None
    cnt = np.ones(nf, dtype=np.int64)
    cnt[new] = np.left_shift(1, kind)
    nnz = int(cnt.sum())
    it = np.int32 if max(nf, ncn, nnz) <= np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(cnt, out=indptr[1:])
    indices = np.empty(nnz, dtype=it)
    data = np.empty(nnz)

    def put(r, cols, weight):
        # rows r (sorted) get the columns cols (r.size, w): one slice when the rows are
        # consecutive (the coarse mesh's own vertices, which the mesh numbers first), else
        # a scatter (nodes created by refinement are numbered along the cells' curve, so
        # the midpoints of one kind are interleaved with the other nodes)
        w = cols.shape[1]
        if r[-1] - r[0] == r.size - 1:
            sl = slice(int(indptr[r[0]]), int(indptr[r[0]]) + r.size * w)
            indices[sl] = cols.reshape(-1)
            data[sl] = weight
        else:
            dest = indptr[r][:, None] + np.arange(w)
            indices[dest] = cols
            data[dest] = weight

    old = np.flatnonzero(pos >= 0)
    if old.size:
        put(old, pos[old][:, None], 1.0)
    for k in range(1, d + 1):
        sel = np.flatnonzero(kind == k)
        if sel.size == 0:
            continue
        npar = 1 << k
        par = np.take(F.node_par, fnew[sel], axis=0)[:, :npar]
        if (par < 0).any():
            return None
        cp = np.take(cmap, par)
        if (cp < 0).any():
            return None
        put(new[sel], _sort_rows(cp), 0.5 ** k)
    A = sp.csr_matrix((data, indices, indptr.astype(it)), shape=(nf, ncn), copy=False)
    A.has_canonical_format = True                   # distinct parents, sorted
    return A


def prolongation(coarse: Space, fine: Space, coarse_free=None, fine_free=None, nodes=None,
                 cells=None) -> sp.csr_matrix:
    """P = Z_f (chi kron I_c) H_c Z_c on DoFs; ``*_free`` are boolean masks of free DoFs
    (default: all non-hanging DoFs).  ``nodes``, ``cells``: only the rows of the DoFs of the
    fine nodes ``nodes`` (node-major, as the DoF numbering), from the fine cells ``cells``
    (:func:`interpolation_matrix`)."""
    if coarse.components != fine.components:
        raise ValueError(f"component counts differ: {coarse.components} vs {fine.components}")
    chi = interpolation_matrix(coarse, fine, nodes, cells)
    c = fine.components
    if c > 1:
        chi = sp.kron(chi, sp.identity(c), format="csr")
    P = chi @ coarse.H if coarse.hanging_nodes.size else chi
    zf = ~fine.is_hanging if fine_free is None else np.asarray(fine_free, dtype=bool)
    if nodes is not None:
        zf = zf.reshape(-1, c)[np.asarray(nodes, dtype=np.int64)].ravel()
    zc = ~coarse.is_hanging if coarse_free is None else np.asarray(coarse_free, dtype=bool)
    P = mask_rows_cols(P, zf, zc, drop_zeros=True)     # = mask, then eliminate_zeros()
    P.sort_indices()                                 # no-op for sorted input (flag carried over)
    return P
