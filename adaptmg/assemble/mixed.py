r"""Coupling operators of the Q1-iso-Q2 velocity/pressure pair (seed 001 §5.3): pressure
gradient ``B`` and divergence ``D = B^T`` between a coarse Q1 pressure space and the Q1
velocity space on its uniform refinement, assembled over the fine cells (vectorised, as
:mod:`.forms`).
"""
from __future__ import annotations

import numpy as np

from ..fe.element import LagrangeQ
from ..fe.geometry import matmul_serial
from ..fe.sparsity import get_pattern
from .forms import _SpaceInfo

__all__ = ["gradient_iso", "divergence_iso"]


def _child_bits(child, dim):
    return np.stack([(child >> a) & 1 for a in range(dim)], axis=-1).astype(np.float64)


def gradient_iso(space_p, space_u, parent, child, *, quad_points=None):
    r"""Pressure-gradient matrix of the Q1-iso-Q2 pair (seed 001 §5.3), CSR (num_dofs_u x num_dofs_p).

    ``space_p``: scalar Q1 pressure on a mesh Mc; ``space_u``: Q1 velocity with
    c = dim components on Mf, the uniform refinement of Mc. ``parent[f]`` is the
    coarse cell containing fine cell f and ``child[f]`` its position in it (bit a
    set = upper half along axis a). Then

    .. math:: B_{(i,k),j} = -(p_j, \partial_k v_i), \qquad (B p)_{(i,k)} = -(p_h, \mathrm{div}(\phi_i e_k)),

    so :math:`B p` is the pressure term :math:`-(p, \mathrm{div}\,\chi)` of the momentum
    equation. Integration runs over fine cells; the coarse basis is evaluated at
    the fine quadrature points through the reference map
    :math:`\hat x_{coarse} = (\text{bits}(child) + \hat x_{fine})/2` (exact for the
    nested multilinear refinement). Row (i, k) = i*dim + k.
    """
    pi = _SpaceInfo(space_p, "space_p")
    ui = _SpaceInfo(space_u, "space_u")
    d = ui.dim
    if pi.dim != d:
        raise ValueError(f"space_p.mesh.dim ({pi.dim}) != space_u.mesh.dim ({d})")
    if pi.degree != 1 or pi.components != 1:
        raise ValueError(f"space_p must be scalar Q1, got degree {pi.degree}, components {pi.components}")
    if ui.degree != 1 or ui.components != d:
        raise ValueError(f"space_u must be Q1 with components == dim == {d}, got degree {ui.degree}, "
                         f"components {ui.components}")
    parent = np.asarray(parent)
    child = np.asarray(child)
    nf = ui.num_cells
    for name, a, hi in (("parent", parent, pi.num_cells), ("child", child, 2 ** d)):
        if a.shape != (nf,):
            raise ValueError(f"{name} must have shape (num_fine_cells,) = ({nf},), got {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
        if nf and (a.min() < 0 or a.max() >= hi):
            raise ValueError(f"{name} values must lie in [0, {hi}), got range [{a.min()}, {a.max()}]")
    xi, w = ui.quadrature(quad_points)
    nq = len(w)
    dphi = ui.element.gradients(xi)                       # (nq, 2^d, d)
    nloc = ui.nloc
    q1 = LagrangeQ(1, d)
    bits = _child_bits(np.arange(2 ** d), d)               # (2^d, d)
    # T[ch][q, e, i, j] = dphi_i[q, e] * p_j((bits[ch] + xi_q)/2)
    L = nloc * nloc
    Tq = np.stack([np.einsum("qie,qj->qeij", dphi, q1.values((bits[ch] + xi) / 2)).reshape(nq, d, L)
                   for ch in range(2 ** d)])                # (children, nq, d, L)
    T_full = np.ascontiguousarray(Tq.reshape(2 ** d, nq * d, L))
    T_aff = np.einsum("q,cqeL->ceL", w, Tq)
    pat = get_pattern(ui.cell_dofs, pi.cell_dofs[parent], ui.num_nodes, pi.num_nodes)
    data = [pat.new_data() for _ in range(d)]
    step = ui.chunk_size(xi, L)
    fbuf = np.empty((step, nq * d))
    kbuf = np.empty((step, L))
    for sl, g in ui.chunks(xi, L, affine=True):
        n = g.num_cells
        wdet = g.detJ if g.affine else g.detJ * w
        T = T_aff if g.affine else T_full
        # group the chunk's cells by child position: one product per (child, k)
        order = np.argsort(child[sl], kind="stable")
        bounds = np.searchsorted(child[sl][order], np.arange(2 ** d + 1))
        invJ = g.invJ[order]
        wdet = -wdet[order]
        posc = pat.cell_slice(sl).reshape(n, L)[order].reshape(-1)   # 1-D: add.at's fast path
        F = fbuf[:n, :g.num_points * d].reshape(n, g.num_points, d)
        for k in range(d):
            np.multiply(invJ[..., k], wdet[:, :, None], out=F)      # F[f, q, e] = -w det J invJ[e, k]
            Fk = F.reshape(n, -1)
            for c_ in range(2 ** d):                                 # loop over the 2^d child positions
                lo, hi = bounds[c_], bounds[c_ + 1]
                if hi > lo:
                    matmul_serial(Fk[lo:hi], T[c_], out=kbuf[lo:hi])
            np.add.at(data[k], posc, kbuf[:n].reshape(-1))
    return pat.block_csr(np.stack(data, axis=1), d, 1)


def divergence_iso(space_p, space_u, parent, child, *, quad_points=None):
    r"""Transpose of :func:`gradient_iso`, CSR (num_dofs_p x num_dofs_u).

    :math:`D_{j,(i,k)} = -(\partial_k v_i, p_j)`, i.e. :math:`(D u)_j = -(\mathrm{div}\,u_h, p_j)`.
    """
    return gradient_iso(space_p, space_u, parent, child, quad_points=quad_points).T.tocsr()
