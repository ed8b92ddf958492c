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


def interpolation_matrix(coarse: Space, fine: Space) -> sp.csr_matrix:
    """Node-level embedding chi (fine nodes x coarse nodes) of nested Q_k spaces.

    Each fine node is taken from one fine cell containing it (its first occurrence in
    ``fine.cell_dofs``); its row holds the nonzero weights of table row (child position of
    that cell, local index of the node), so the rows are built straight in CSR from the
    compressed nonzero pattern of the (2^d + 1) * nloc table rows -- no dense
    (nodes, nloc) weight and column arrays, no COO conversion.
    """
    if not (isinstance(coarse, Space) and isinstance(fine, Space)):
        raise TypeError("interpolation_matrix expects two Space objects")
    if coarse.degree != fine.degree or coarse.dim != fine.dim:
        raise ValueError(f"spaces differ: Q{coarse.degree} in {coarse.dim}D vs Q{fine.degree} in {fine.dim}D")
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
    rows = fine.cell_dofs.ravel()
    nf, ncn = fine.num_nodes, coarse.num_nodes
    # one (cell, local index) occurrence per fine node: later writes win, so write in reverse
    first = np.full(nf, -1, dtype=np.int64)
    first[rows[::-1]] = np.arange(rows.size - 1, -1, -1)
    if (first < 0).any():
        raise RuntimeError("fine space has DoF nodes outside its cells")
    cell = first // nloc
    key = sel[cell] * nloc + (first - cell * nloc)          # table row of each fine node
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


def prolongation(coarse: Space, fine: Space, coarse_free=None, fine_free=None) -> sp.csr_matrix:
    """P = Z_f (chi kron I_c) H_c Z_c on DoFs; ``*_free`` are boolean masks of free DoFs
    (default: all non-hanging DoFs)."""
    if coarse.components != fine.components:
        raise ValueError(f"component counts differ: {coarse.components} vs {fine.components}")
    chi = interpolation_matrix(coarse, fine)
    c = fine.components
    if c > 1:
        chi = sp.kron(chi, sp.identity(c), format="csr")
    P = chi @ coarse.H if coarse.hanging_nodes.size else chi
    zf = ~fine.is_hanging if fine_free is None else np.asarray(fine_free, dtype=bool)
    zc = ~coarse.is_hanging if coarse_free is None else np.asarray(coarse_free, dtype=bool)
    P = mask_rows_cols(P, zf, zc)
    P.eliminate_zeros()
    P.sort_indices()
    return P
