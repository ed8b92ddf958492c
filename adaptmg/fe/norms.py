r"""Error norms of finite element functions by Gauss quadrature.

For u_h = sum_j u_j phi_j (``u`` a full nodal vector, e.g. ``Constraints.expand(x)``)
and an exact solution u:

.. math::  \|u - u_h\|_{L^2}^2 = \sum_K \sum_q w_q |\det J_K(\hat x_q)|\, |u(x_q) - u_h(x_q)|^2,
.. math::  |u - u_h|_{H^1}^2 = \sum_K \sum_q w_q |\det J_K|\, |\nabla u(x_q) - J_K^{-T}\hat\nabla u_h(\hat x_q)|^2 .

With the multilinear cell map, :math:`x_q = \sum_v X_v \hat N_v(\hat x_q)` and
:math:`J_K = \sum_v X_v \hat\nabla \hat N_v^T`; the reference gradient of :math:`u_h` is
formed first (:math:`\hat\nabla u_h = \sum_j u_j \hat\nabla\hat\phi_j`) and mapped once
per point.  Cells are processed in chunks to bound memory; every step is array code on
the backend's array module, so on the GPU backend the norms are computed on the device.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, call_points, constant, get_backend, to_host
from .geometry import _det_inv, jacobian_error, q1_tables
from .quadrature import tensor_gauss

__all__ = ["errors", "integrate"]


def _chunks(n, size):
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


def errors(space, u, exact=None, grad=None, *, points=None, chunk=None, backend=None, cells=None):
    """Return {"L2": ||u - u_h||, "H1": |u - u_h|_1} (keys present for the callables given).

    ``exact(x)``: (..., d) -> (...) or (..., c); ``grad(x)``: (..., d) -> (..., d) or (..., c, d).
    ``u``: the full nodal vector (host or device array).  ``backend``: where to compute
    (default: where ``u`` lives; for a space on a mesh on the GPU, ``mesh.to("gpu")``, the
    mesh's backend, ``"cpu"`` a ValueError); on the GPU the callables receive CuPy arrays (NumPy
    ufuncs such as ``np.sin`` dispatch to CuPy); one that raises TypeError on them is
    evaluated on host copies of the points (:func:`adaptmg.backend.call_points`).  ``points``: Gauss points per direction
    (default degree + 3); ``chunk``: cells per batch (default 2^16 on the CPU; on the GPU
    as many as keep the Jacobians within 128 MB).  ``cells``: integrate over these cells
    only (indices; default all), e.g. a rank's owned cells of a distributed forest's local
    mesh, whose squared norms then add up across ranks.
    """
    for name, fn in (("exact", exact), ("grad", grad)):
        if fn is not None and not callable(fn):
            raise TypeError(f"errors: {name} must be a callable of the points x (..., d), got {type(fn).__name__}")
    be = get_backend(backend) if backend is not None else backend_of(u)
    mb = space.mesh.backend
    if mb.is_gpu:                  # a mesh on the device: its arrays are read where they are
        if not be.is_gpu:
            raise ValueError(f"errors: the space's mesh lives on the GPU, so the norms are computed "
                             f"there: backend must be None or 'gpu', got {backend!r}; or use mesh.to('cpu')")
        be = mb
    xp = be.xp
    if tuple(u.shape if hasattr(u, "shape") else np.shape(u)) != (space.num_dofs,):
        raise ValueError(f"u must have shape ({space.num_dofs},), got {np.shape(to_host(u))}")
    c = space.components
    U = be.asarray(u, dtype=np.float64).reshape(space.num_nodes, c)
    d = space.dim
    n = points or space.degree + 3
    xi, w = tensor_gauss(d, n)
    N, dN = q1_tables(d, xi)                                  # (nq, nv), (nq, nv, d)
    nq, nv = N.shape
    # the tables as right-hand GEMM operands (once per device): u_h at the points is one
    # (m c, nloc) x (nloc, nq) product and the reference gradients one (m c, nloc) x
    # (nloc, nq d) product -- not m batched products of tiny matrices (on the GPU ~10x slower)
    phiT = constant(np.ascontiguousarray(space.element.values(xi).T), xp)          # (nloc, nq)
    dphiM = constant(np.ascontiguousarray(space.element.gradients(xi).transpose(1, 0, 2)
                                          .reshape(-1, nq * d)), xp)               # (nloc, nq d)
    # J[c, q, a, b] = sum_v X[c, v, a] dN[q, v, b]: (c, d, nv) @ (nv, nq*d)
    dNm = constant(np.ascontiguousarray(dN.transpose(1, 0, 2).reshape(nv, nq * d)), xp)
    NT = constant(np.ascontiguousarray(N.T), xp)
    wq = constant(w, xp)
    P = be.asarray(space.mesh.points, dtype=np.float64)
    nc = space.mesh.num_cells
    if cells is None:
        sel = None
    else:
        sel = np.asarray(to_host(cells))
        if sel.ndim != 1 or sel.dtype.kind not in "iu" or (sel.size and (sel.min() < 0 or sel.max() >= nc)):
            raise ValueError(f"errors: cells must be a 1-D array of cell indices in [0, {nc}), got "
                             f"{sel.dtype} array of shape {sel.shape}")
    cells, cdofs = be.asarray(space.mesh.cells), be.asarray(space.cell_dofs)
    if sel is not None:
        sel = be.asarray(sel)
        cells, cdofs = cells[sel], cdofs[sel]
    # CPU: 2^16 cells; GPU: the largest batch whose Jacobians take <= 2^24 numbers (128 MB)
    size = int(chunk) if chunk else (max(1, (1 << 24) // (nq * d * d)) if be.is_gpu else 1 << 16)
    e2 = h2 = 0.0
    for sl in _chunks(cells.shape[0], size):
        XT = P[cells[sl]].transpose(0, 2, 1)                  # (m, d, nv)
        m = XT.shape[0]
        J = (XT @ dNm).reshape(m, d, nq, d).transpose(0, 2, 1, 3)
        det, inv = _det_inv(J)
        invT = inv.swapaxes(-1, -2)
        bad = ~(det > 0).all(axis=1)
        if bool(bad.any()):
            raise jacobian_error(to_host(bad))
        wd = det * wq                                         # (m, nq)
        x = (XT @ NT).transpose(0, 2, 1)                      # (m, nq, d)
        Ut = U[cdofs[sl]].transpose(0, 2, 1).reshape(m * c, -1)          # (m c, nloc)
        if exact is not None:
            uh = (Ut @ phiT).reshape(m, c, nq).transpose(0, 2, 1)          # (m, nq, c)
            ue = call_points(exact, x, xp=xp).reshape(uh.shape)
            e2 += (wd[..., None] * (ue - uh) ** 2).sum()
        if grad is not None:
            gref = (Ut @ dphiM).reshape(m, c, nq, d).transpose(0, 2, 1, 3)    # (m, nq, c, d): reference
            # gh[.., c, a] = sum_b invT[.., a, b] gref[.., c, b]: element-wise, d <= 3 terms
            gh = (invT[:, :, None] * gref[:, :, :, None, :]).sum(axis=-1)     # (m, nq, c, d)
            ge = call_points(grad, x, xp=xp).reshape(gh.shape)
            h2 += (wd[..., None, None] * (ge - gh) ** 2).sum()
    out = {}
    if exact is not None:
        out["L2"] = float(np.sqrt(float(e2)))
    if grad is not None:
        out["H1"] = float(np.sqrt(float(h2)))
    return out


def integrate(space, u, *, chunk=65536):
    """Integral of the FE function with nodal values ``u`` (one value per component)."""
    from .geometry import CellGeometry
    u = np.asarray(u, dtype=float).reshape(space.num_nodes, space.components)
    xi, w = tensor_gauss(space.dim, space.degree + 1)
    phi = space.element.values(xi)
    X = space.mesh.points[space.mesh.cells]
    tot = np.zeros(space.components)
    for sl in _chunks(space.mesh.num_cells, chunk):
        g = CellGeometry(X[sl], xi)
        tot += np.einsum("cq,qj,cjk->k", g.detJ * w, phi, u[space.cell_dofs[sl]])
    return tot if space.components > 1 else float(tot[0])
