r"""Values, gradients and Hessians of a finite element function at reference points of cells.

For cells K with the multilinear (Q1) geometry map :math:`x = F_K(\hat x)`, Jacobian
:math:`J = \hat\nabla F_K` and a function :math:`u_h|_K = \sum_j U_j \hat\varphi_j \circ F_K^{-1}`
of the space's element, :func:`evaluate` returns at reference points :math:`\hat x`

.. math::

    x = F_K(\hat x), \qquad u_h = \sum_j U_j \hat\varphi_j, \qquad
    \nabla u_h = J^{-T} \sum_j U_j \hat\nabla\hat\varphi_j, \qquad
    \nabla^2 u_h = J^{-T} \Big(\sum_j U_j \hat\nabla^2\hat\varphi_j\Big) J^{-1}.

The Hessian formula is exact on parallelogram / parallelepiped cells; on a non-affine
multilinear map the curvature term of :math:`F_K` is dropped.  The reference points are
either shared by all cells (``(m, d)``, cell quadrature) or given per cell
(``(n, m, d)``, points on faces seen from a neighbour).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fe.element import LagrangeQ, lagrange_1d, lagrange_1d_derivative
from ..fe.geometry import _det_inv


@dataclass
class PointValues:
    """Geometry and u_h at m points of each of n cells (c components, dimension d)."""
    x: np.ndarray        # (n, m, d) physical points
    J: np.ndarray        # (n, m, d, d)
    detJ: np.ndarray     # (n, m)
    invJ: np.ndarray     # (n, m, d, d)
    u: np.ndarray        # (n, m, c)
    grad: np.ndarray     # (n, m, c, d)
    hess: np.ndarray | None = None   # (n, m, c, d, d)


def _second_derivatives_1d(nodes, x):
    """l_i''(x) of the 1-D Lagrange basis, shape (len(x), len(nodes))."""
    out = np.zeros((x.size, nodes.size))
    for i in range(nodes.size):          # loop over the k+1 basis functions only
        others = np.delete(nodes, i)
        c = np.poly(others) / np.prod(nodes[i] - others)
        out[:, i] = np.polyval(np.polyder(c, 2), x) if c.size > 2 else 0.0
    return out


def reference_hessians(el: LagrangeQ, xi):
    """Reference Hessians d^2 phi_j / dxi_a dxi_b, shape (nq, nloc, d, d)."""
    d, mi = el.dim, el.multi_index
    v = [lagrange_1d(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    d1 = [lagrange_1d_derivative(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    d2 = [_second_derivatives_1d(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    out = np.empty((xi.shape[0], el.num_local, d, d))
    for a in range(d):
        for b in range(d):
            g = np.ones((xi.shape[0], el.num_local))
            for e in range(d):
                if a == b == e:
                    g = g * d2[e]
                elif e == a or e == b:
                    g = g * d1[e]
                else:
                    g = g * v[e]
            out[:, :, a, b] = g
    return out


def basis_tables(space, xi):
    """Q1 values/gradients and element values/gradients at points xi (..., d)."""
    d = space.dim
    pts = xi.reshape(-1, d)
    q1, el = LagrangeQ(1, d), space.element
    lead = xi.shape[:-1]
    return (q1.values(pts).reshape(lead + (-1,)), q1.gradients(pts).reshape(lead + (-1, d)),
            el.values(pts).reshape(lead + (-1,)), el.gradients(pts).reshape(lead + (-1, d)))


def evaluate(space, U, cells, xi, hessian=False, tables=None) -> PointValues:
    """u_h, grad u_h (and the affine Hessian) at reference points xi: shared (m, d) or per cell
    (n, m, d); ``U`` the nodal values (num_nodes, c); ``tables`` optionally gives the per-cell
    basis tables of :func:`basis_tables`."""
    mesh, d = space.mesh, space.dim
    shared = xi.ndim == 2
    n = cells.size
    m = xi.shape[-2]
    pts = xi if shared else xi.reshape(-1, d)
    q1 = LagrangeQ(1, d)
    el = space.element
    X = mesh.points[mesh.cells[cells]]                          # (n, nv, d)
    Uc = U[space.cell_dofs[cells]]                               # (n, nloc, c)
    if tables is not None and not shared:
        N, dN, phi, dphi = tables                                # (n, m, ...) per-cell tables
    elif shared:
        N, dN = q1.values(pts), q1.gradients(pts)                # (m, nv), (m, nv, d)
        phi, dphi = el.values(pts), el.gradients(pts)
    else:
        N, dN, phi, dphi = basis_tables(space, xi)
    # batched matmuls: faster than the equivalent einsums for these tiny blocks
    x = np.matmul(N, X)                                          # (n, m, d)
    J = np.matmul(X.transpose(0, 2, 1)[:, None], dN)             # J[n,m,a,b] = sum_v X[n,v,a] dN[m,v,b]
    u = np.matmul(phi, Uc)                                       # (n, m, c)
    gref = np.matmul(Uc.transpose(0, 2, 1)[:, None], dphi)       # reference gradient of u_h (n, m, c, d)
    detJ, invJ = _det_inv(J)            # explicit cofactor formulas (np.linalg.inv is slow on 2x2 stacks)
    if not (detJ > 0).all():
        raise ValueError("non-positive Jacobian determinant at an estimator quadrature point")
    grad = np.einsum("nmba,nmcb->nmca", invJ, gref)   # J^{-T} reference gradient
    hess = None
    if hessian:
        if shared:
            Hh = reference_hessians(el, pts)
            Hr = np.einsum("mibe,nic->nmcbe", Hh, Uc)
        else:
            Hh = reference_hessians(el, pts).reshape(n, m, -1, d, d)
            Hr = np.einsum("nmibe,nic->nmcbe", Hh, Uc)
        hess = np.einsum("nmba,nmcbe,nmef->nmcaf", invJ, Hr, invJ, optimize=True)
    return PointValues(x, J, detJ, invJ, u, grad, hess)
