r"""Hierarchical basis transform S and the partial Cholesky factor L (seed 003 §3).

With nodal coefficients :math:`x_h` and hierarchical coefficients :math:`\tilde x`,
:math:`x_h = S \tilde x`, :math:`S = S_J S_{J-1} \cdots S_1`.  :math:`S_k` is the identity
except in the rows of the nodes new on level k, which add the level-(k-1) interpolant:
weight 1/2 on the two ends of a refined edge (edge midpoint), 1/4 on the four vertices of a
refined cell (cell midpoint), seed 003 eq. (3).  Since the refinement is the same on every
macro cell in reference coordinates, S is built once on the reference lattice
(``local_transform``) and copied to every macro cell (``global_transform``).

Prehandled matrix: :math:`\tilde A = S^T A_h S` and

.. math::  \begin{pmatrix}\tilde A_{\mathcal C\mathcal C} & 0\\ 0 & \mathrm{diag}(\tilde A_{rest})\end{pmatrix} = L L^T,
           \qquad A = L^{-1} \tilde A L^{-T},\quad b = L^{-1} S^T b_h,\quad x_h = S L^{-T} x

(seed 003 eq. (5)); the level-0 block :math:`\tilde A_{\mathcal C\mathcal C}` is the coarse
stiffness matrix, so :math:`A_{\mathcal C\mathcal C} = I` and diag(A) = 1.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend, to_host

__all__ = ["local_transform", "global_transform", "fine_stiffness", "prehandled_matrix", "PartialCholesky"]


def local_transform(levels):
    """S on the reference lattice of one macro cell ((n+1)^2 square, CSR, n = 2^levels)."""
    n = 1 << levels
    nl = (n + 1) ** 2
    j, i = np.divmod(np.arange(nl), n + 1)
    S = sp.identity(nl, format="csr")
    for k in range(1, levels + 1):
        s = 1 << (levels - k)
        on = (i % s == 0) & (j % s == 0)
        oi, oj = (i // s) % 2 == 1, (j // s) % 2 == 1
        rows, cols, vals = [], [], []
        for sel, offs, w in (((on & oi & ~oj), [(-s, 0), (s, 0)], 0.5),
                             ((on & ~oi & oj), [(0, -s), (0, s)], 0.5),
                             ((on & oi & oj), [(-s, -s), (s, -s), (-s, s), (s, s)], 0.25)):
            p = np.flatnonzero(sel)
            for di, dj in offs:
                rows.append(p)
                cols.append(p + dj * (n + 1) + di)
                vals.append(np.full(p.size, w))
        W = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nl, nl))
        S = (sp.identity(nl, format="csr") + W) @ S
    return S.tocsr()


def global_transform(rm, S_loc=None):
    """S on the whole refined mesh (all nodes, Dirichlet ones included), CSR.

    Each node takes its row of S from one macro cell that holds it (a node's hierarchical
    ancestors lie in every macro cell that holds it); the columns map through the cell's
    local-to-global table.  Sparse products only: R (owner rows) @ kron(I, S_loc) @ Q.
    """
    cached = getattr(rm, "_global_transform", None)
    if cached is not None and S_loc is None:
        return cached
    S_loc = local_transform(rm.levels) if S_loc is None else S_loc
    G = rm.local_to_global
    m, nl = G.shape
    n_all = len(rm.points)
    _, first = np.unique(G.ravel(), return_index=True)               # one (cell, local) per node
    R = sp.csr_matrix((np.ones(n_all), (np.arange(n_all), first)), shape=(n_all, m * nl))
    Q = sp.csr_matrix((np.ones(m * nl), (np.arange(m * nl), G.ravel())), shape=(m * nl, n_all))
    S = (R @ sp.kron(sp.identity(m, format="csr"), S_loc, format="csr") @ Q).tocsr()
    rm._global_transform = S                   # the mesh is immutable: build S once
    return S


def fine_stiffness(rm):
    """The Q1 stiffness matrix A_h of the fine mesh on all nodes (adaptmg.assemble), CSR."""
    from ..assemble import stiffness
    from ..fe import Space
    from ..mesh import Mesh
    return stiffness(Space(Mesh.from_cells(rm.points, rm.cells), 1)).tocsr()


class PartialCholesky:
    r"""L = blockdiag(chol(A~_CC), sqrt(diag A~_rest)), stored as ``Linv_C`` (dense) and ``d``.

    ``apply_inv(v)`` = :math:`L^{-1} v`, ``apply_inv_t(v)`` = :math:`L^{-T} v`, v (N,) or (N, k).
    """

    def __init__(self, A_CC, d_rest, backend="cpu"):
        be = self.backend = get_backend(backend)
        xp = be.xp
        A_CC = be.asarray(A_CC, dtype=np.float64)
        self.n_C = A_CC.shape[0]
        if self.n_C:
            Lc = xp.linalg.cholesky(A_CC)
            self.Linv_C = xp.linalg.inv(Lc)
            self.Linv_C = xp.tril(self.Linv_C)
        else:
            self.Linv_C = xp.zeros((0, 0))
        d = be.asarray(d_rest, dtype=np.float64)
        if not bool((d > 0).all()):
            raise ValueError("the hierarchical matrix has a non-positive diagonal entry: not SPD")
        self.d = d

    def apply_inv(self, v):
        c = self.n_C
        head = self.Linv_C @ v[:c]
        tail = v[c:] / (self.d if v.ndim == 1 else self.d[:, None])
        return self.backend.xp.concatenate([head, tail])

    def apply_inv_t(self, v):
        c = self.n_C
        head = self.Linv_C.T @ v[:c]
        tail = v[c:] / (self.d if v.ndim == 1 else self.d[:, None])
        return self.backend.xp.concatenate([head, tail])

    def matrix_inv(self):
        """L^{-1} as a SciPy CSR matrix (for the assembled prehandled matrix)."""
        Lc = sp.csr_matrix(to_host(self.Linv_C))
        return sp.block_diag([Lc, sp.diags(1.0 / to_host(self.d))], format="csr") if self.n_C else \
            sp.diags(1.0 / to_host(self.d), format="csr")


def _drop_rounding(A, tol):
    """Drop entries |a_ij| <= tol sqrt(a_ii a_jj): cancellation left-overs of S^T A S
    (the couplings of seed 003 §4.1 that vanish in exact arithmetic)."""
    A = A.tocoo()
    dg = np.sqrt(np.abs(A.diagonal()))
    keep = np.abs(A.data) > tol * dg[A.row] * dg[A.col]
    return sp.csr_matrix((A.data[keep], (A.row[keep], A.col[keep])), shape=A.shape)


def prehandled_matrix(rm, A_h=None, *, cholesky=True, drop_tol=1e-12):
    r"""The assembled matrices of seed 003 on the unknowns 0..N-1 (C, E, I order), SciPy CSR.

    Returns ``(A_h, A_tilde, A, L)``: the nodal stiffness matrix, :math:`S^T A_h S`, the
    prehandled :math:`L^{-1} S^T A_h S L^{-T}` (``None`` unless ``cholesky``) and the
    :class:`PartialCholesky` ``L``.  Entries below ``drop_tol`` (relative to the diagonal)
    are rounding left-overs of exact cancellations and are dropped.  Builds
    :math:`O(N \log N)` nonzeros on distorted meshes: for small and medium levels.
    """
    N = rm.N
    A_full = fine_stiffness(rm) if A_h is None else A_h
    A_h = A_full[:N, :N].tocsr()
    S = global_transform(rm)[:N, :N].tocsr()
    At = _drop_rounding((S.T @ (A_h @ S)).tocsr(), drop_tol)
    if not cholesky:
        return A_h, At, None, None
    c = rm.n_C
    L = PartialCholesky(At[:c, :c].toarray(), np.sqrt(At.diagonal()[c:]))
    Li = L.matrix_inv()
    A = _drop_rounding((Li @ At @ Li.T).tocsr(), drop_tol)
    return A_h, At, A, L
