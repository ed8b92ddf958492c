r"""Hanging-node constraints of nodal Q_k on GLL points (2:1 adaptive meshes).

On a mesh with hanging nodes :class:`~adaptmg.spectral.space.SpectralSpace` numbers the
GLL nodes cell-wise as on a conforming mesh (nodes shared by cells that share a vertex,
edge or face), so the fine side of a hanging edge/face has GLL nodes of its own.  A fine
cell's entity E (vertex, edge or face) is *hanging* when it lies inside an edge/face of
a coarser active cell K; every GLL node of E's interior then takes the value of K's
polynomial there (the coarse side's Q_k trace):

.. math::  u(x_h) = \sum_{j \in K} \hat\phi_j(\hat x_h)\, u_j,
           \qquad \hat\phi_j(\hat x) = \prod_{a<d} \ell_{j_a}(\hat x_a),

with :math:`\ell_p` the 1D Lagrange basis on the k+1 GLL points and :math:`\hat x_h`
the reference point of the node in K.  E's vertices have reference points
:math:`y_v` in K (a vertex of K: its corner; a hanging mesh node: the mean of its
parents' corners), and the fine cell is a half-size sub-box of its parent, which
shares the face with K, so :math:`\hat x_h` is the multilinear (here affine)
interpolation of the :math:`y_v` at the node's GLL position in E: half of K's
face, offset 0 or 1/2.  Fine nodes that coincide with coarse nodes get the weight 1
on that coarse node.

The square matrix H (identity rows on regular DoFs, the weights above on hanging
rows, zero hanging columns) maps the values x at regular DoFs to the continuous
function ``u = H x``; the constrained operator is :math:`H^T A H`, as in
:mod:`adaptmg.fe.constraints` for Q1/Q2.  Vectorised over cells; the loops run over the
<= 3^d entities of the reference cell.  A mesh that breaks the 2:1 rule raises ValueError.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..fe.space import constraint_matrix
from ..mesh import reference as ref
from ..patch.tensor import lagrange_eval
from .basis import gll_points, local_indices

__all__ = ["check_two_to_one", "hanging_matrix"]


def check_two_to_one(mesh) -> None:
    """ValueError unless every two touching active cells differ by at most one level."""
    lv = np.asarray(mesh.levels, dtype=np.int64)
    jump = mesh.touch_max(lv) - lv
    if jump.size and jump.max() > 1:
        bad = np.flatnonzero(jump > 1)
        raise ValueError(f"spectral Q_k on adaptive meshes needs the 2:1 rule (touching cells differ by "
                         f"at most one level); {bad.size} cell(s) touch cells {int(jump.max())} levels "
                         f"finer (first: cell {bad[0]}); refine with Mesh.refine, which keeps it")


def _tensor_values(k, xi):
    """(n, (k+1)^d) values of the Q_k GLL basis (lexicographic, x fastest) at points xi (n, d)."""
    n, d = xi.shape
    out = np.ones((n, 1))
    for ax in range(d):                                         # x fastest: the last factor varies slowest
        out = (lagrange_eval(k, xi[:, ax])[:, :, None] * out[:, None, :]).reshape(n, -1)
    out[np.abs(out) < 1e-13] = 0.0
    return out


def _hanging_rows(space):
    """(rows, cols (nh, (k+1)^d), weights (nh, (k+1)^d)) of the hanging GLL DoFs, one per DoF."""
    mesh, d, k = space.mesh, space.dim, space.degree
    cells = np.asarray(mesh.cells, dtype=np.int64)
    nc = cells.shape[0]
    nn = int(cells.max()) + 1
    hn, par, owner = mesh.hanging_nodes, mesh.hanging_parents, mesh.hanging_owner
    npar = np.zeros(nn, dtype=np.int64)
    npar[hn] = (par >= 0).sum(1)
    own = np.full(nn, -1, dtype=np.int64)
    own[hn] = owner
    hpar = np.full((nn, 4), -1, dtype=np.int64)
    hpar[hn] = par
    cor = ref.corners(d).astype(float)
    t = gll_points(k)
    local = local_indices(k, d)
    rows, cols, ws = [], [], []
    for pattern in itertools.product((0, 1, 2), repeat=d):      # 0/1: fixed side, 2: free axis
        free = [ax for ax in range(d) if pattern[ax] == 2]
        m = len(free)
        if m == d:
            continue                                            # cell interiors never hang
        sel = np.ones(len(local), bool)
        for ax in range(d):
            sel &= ((local[:, ax] > 0) & (local[:, ax] < k)) if pattern[ax] == 2 else \
                (local[:, ax] == pattern[ax] * k)
        idx = np.flatnonzero(sel)
        if idx.size == 0:
            continue
        bits = list(itertools.product((0, 1), repeat=m))        # entity vertices, bit b along free[b]
        vloc = [sum((b[free.index(ax)] if ax in free else pattern[ax]) << ax for ax in range(d))
                for b in bits]
        V = cells[:, vloc]                                      # (nc, 2^m) mesh nodes of E
        best = np.argmax(npar[V], axis=1)                       # the vertex with most parents
        hv = V[np.arange(nc), best]
        cand = np.flatnonzero(npar[hv] > 0)
        if cand.size == 0:
            continue
        K = own[hv[cand]]
        CK = cells[K]                                           # (nc', 2^d)
        Vc = V[cand]
        # reference point of every vertex of E in K: a vertex of K, or a hanging node whose
        # parents are all vertices of K (mean of their corners); otherwise E is not in K
        is_v = Vc[:, :, None] == CK[:, None, :]                 # (nc', 2^m, 2^d)
        P = hpar[Vc]                                            # (nc', 2^m, 4)
        hitp = P[:, :, :, None] == CK[:, None, None, :]         # (nc', 2^m, 4, 2^d)
        np_ = npar[Vc]
        in_par = (hitp.any(3) | (P < 0)).all(2) & (np_ > 0)
        ok_v = is_v.any(2) | in_par
        y = np.where(is_v.any(2)[..., None], np.einsum("cvw,wd->cvd", is_v.astype(float), cor),
                     np.einsum("cvpw,wd->cvd", hitp.astype(float), cor) / np.maximum(np_, 1)[..., None])
        keep = ok_v.all(1)
        cand, K, y = cand[keep], K[keep], y[keep]
        if cand.size == 0:
            continue
        # node positions in E (free coordinates t_a) -> multilinear weights of E's vertices
        a = local[idx][:, free]                                 # (nl, m)
        s = t[a]
        N = np.ones((idx.size, len(bits)))
        for j, b in enumerate(bits):
            for q in range(m):
                N[:, j] *= s[:, q] if b[q] else 1.0 - s[:, q]
        xi = np.einsum("lv,cvd->cld", N, y)                     # (nc', nl, d)
        W = _tensor_values(k, xi.reshape(-1, d))
        rows.append(space.cell_dofs[cand[:, None], idx[None, :]].ravel())
        cols.append(np.repeat(space.cell_dofs[K], idx.size, axis=0))
        ws.append(W)
    n1 = (k + 1) ** d
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, n1), np.int64), np.zeros((0, n1))
    r, c, w = np.concatenate(rows), np.concatenate(cols), np.concatenate(ws)
    r, first = np.unique(r, return_index=True)                 # a node seen from several fine cells
    return r, c[first], w[first]


def hanging_matrix(space):
    """``(H, hanging)``: the CSR constraint matrix (num_dofs x num_dofs) and the sorted
    hanging DoFs of ``space`` (module docstring); H is the identity without hanging nodes."""
    check_two_to_one(space.mesh)
    hd, cols, W = _hanging_rows(space)
    return constraint_matrix(space.num_dofs, hd, cols, W), hd
