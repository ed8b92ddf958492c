r"""Residual (Kelly-type) error indicators for scalar elliptic problems and linear elasticity.

For :math:`-\nabla\cdot(k\nabla u) + b\cdot\nabla u + c\,u = f` with a Q_p finite element
solution :math:`u_h` the indicator of a cell K is

.. math::

    \eta_K^2 = h_K^2 \,\| f + \nabla\cdot(k\nabla u_h) - b\cdot\nabla u_h - c u_h\|_K^2
             + \tfrac12 \sum_{F \subset \partial K \setminus \partial\Omega} h_F\,
               \| [\![ k\,\partial_n u_h ]\!] \|_F^2
             + \sum_{F \subset \Gamma_N} h_F \,\| g - k\,\partial_n u_h\|_F^2 ,

:math:`h_K` the cell diameter, :math:`h_F` the face diameter, and the global estimate
:math:`\eta = (\sum_K \eta_K^2)^{1/2}`.  The cell residual uses the Hessian of
:math:`u_h` (:mod:`.evaluation`) and :math:`\nabla\cdot(k\nabla u_h) = k\Delta u_h +
\nabla k\cdot\nabla u_h` (:math:`\nabla k` by central differences when k is a callable
and no ``k_grad`` is given).  The jumps are integrated with Gauss points on conforming
faces and on fine sub-faces (:mod:`.faces`); a sub-face contributes
:math:`\tfrac12 h_F \|[\![k\partial_n u_h]\!]\|_F^2` to both the fine and the coarse cell.

For linear elasticity, :math:`\sigma(u) = 2\mu\varepsilon(u) + \lambda\,\mathrm{tr}\,\varepsilon(u)\,I`,
the flux is :math:`\sigma(u_h) n` and the cell residual :math:`f + \nabla\cdot\sigma(u_h)
= f + \mu\Delta u_h + (\lambda + \mu)\nabla(\nabla\cdot u_h)`.

Everything is vectorised over cells and faces (loops run over chunks only).
"""
from __future__ import annotations

import numpy as np

from ..fe.quadrature import tensor_gauss
from .evaluation import evaluate
from .faces import (face_diameters, face_pairs, face_point_tables, face_quadrature, outward_normals,
                    own_face_refs)
from .inputs import (check_coefficient, check_space, chunks, coefficient_at, coefficient_gradient,
                     nodal_values)


def cell_diameters(mesh) -> np.ndarray:
    """Diameter h_K of every active cell (largest distance between two of its vertices)."""
    X = mesh.points[mesh.cells]
    diff = X[:, :, None, :] - X[:, None, :, :]
    return np.sqrt((diff ** 2).sum(-1)).max(axis=(1, 2))


def jump_terms(space, U, flux, nq, neumann=None, neumann_ids=None):
    """Face part of eta_K^2: (1/2) sum h_F ||[flux . n]||^2 (+ Neumann faces).

    ``flux(grad, x, cells)`` maps gradients (n, m, c, d) to fluxes (n, m, c, d); ``neumann``
    is the prescribed normal flux g(x, n) (or a constant) on the faces with ``neumann_ids``."""
    mesh, d = space.mesh, space.dim
    out = np.zeros(mesh.num_cells)
    fp = face_pairs(mesh)
    Nf, wf = face_quadrature(d, nq)
    for sl in chunks(fp.cell.size):
        c, f, nb = fp.cell[sl], fp.face[sl], fp.nb[sl]
        ts, xi_s = face_point_tables(space, own_face_refs(d, f), Nf)
        tn, xi_n = face_point_tables(space, fp.R_nb[sl], Nf)
        es = evaluate(space, U, c, xi_s, tables=ts)
        en = evaluate(space, U, nb, xi_n, tables=tn)
        n, da = outward_normals(es, f, d)
        jump = np.einsum("nmca,nma->nmc", flux(es.grad, es.x, c) - flux(en.grad, es.x, nb), n)
        val = 0.5 * face_diameters(mesh, c, f) * np.einsum("nm,m,nmc->n", da, wf, jump ** 2)
        out += np.bincount(c, weights=val, minlength=mesh.num_cells)
        hang = fp.hanging[sl]
        out += np.bincount(nb[hang], weights=val[hang], minlength=mesh.num_cells)
    if neumann_ids is not None:
        cN, fN, _ = mesh.boundary_faces(neumann_ids)
        for sl in chunks(cN.size):
            c, f = cN[sl], fN[sl]
            xi_s = np.einsum("qj,njd->nqd", Nf, own_face_refs(d, f))
            es = evaluate(space, U, c, xi_s)
            n, da = outward_normals(es, f, d)
            r = -np.einsum("nmca,nma->nmc", flux(es.grad, es.x, c), n)
            if neumann is not None:
                g = neumann(es.x, n) if callable(neumann) else np.asarray(neumann, dtype=float)
                r = r + np.broadcast_to(np.asarray(g, dtype=float).reshape(r.shape[:2] + (-1,)), r.shape)
            val = face_diameters(mesh, c, f) * np.einsum("nm,m,nmc->n", da, wf, r ** 2)
            out += np.bincount(c, weights=val, minlength=mesh.num_cells)
    return out


def residual_indicators(space, u, *, f=0.0, k=1.0, b=None, c=None, k_grad=None,
                        neumann=None, neumann_ids=None, quad_points=None, parts=False):
    r"""Residual indicators :math:`\eta_K` (module docstring) for a scalar elliptic or
    transport-diffusion problem :math:`-\nabla\cdot(k\nabla u) + b\cdot\nabla u + c u = f`.

    Parameters
    ----------
    space : scalar :class:`~adaptmg.Space` (Q1 or Q2)
    u : full nodal vector (num_dofs,), e.g. ``Constraints.expand(x)`` (numpy or cupy)
    f, k, c : constant, per-cell array (num_cells,) or callable of points (..., d) -> (...)
    b : constant (d,), per-cell (num_cells, d) or callable (..., d) -> (..., d); None = 0
    k_grad : callable (..., d) -> (..., d), gradient of a callable k (default: central differences)
    neumann, neumann_ids : flux data g(x, n) = k du/dn on the boundary faces with these ids
    quad_points : Gauss points per direction in the cells (default degree + 2)
    parts : also return (cell residual part, face part) of eta_K^2

    Returns eta (num_cells,) with :math:`\eta = (\sum_K\eta_K^2)^{1/2}` the global estimate.
    """
    check_space(space)
    if space.components != 1:
        raise ValueError(f"residual_indicators is for scalar spaces, got {space.components} components "
                         "(use elasticity_indicators for vector problems)")
    U = nodal_values(space, u)
    mesh, d = space.mesh, space.dim
    nc = mesh.num_cells
    for name, v in (("f", f), ("k", k), ("c", c)):
        check_coefficient(name, v, nc)
    check_coefficient("b", b, nc, (d,))
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    h = cell_diameters(mesh)
    cell_part = np.zeros(nc)
    for sl in chunks(nc):
        cells = np.arange(sl.start, sl.stop)
        ev = evaluate(space, U, cells, xi, hessian=True)
        kv = coefficient_at("k", k, cells, ev.x)
        lap = np.trace(ev.hess[:, :, 0], axis1=-2, axis2=-1)
        R = coefficient_at("f", f, cells, ev.x) + kv * lap
        if callable(k):
            gk = np.asarray(k_grad(ev.x), float) if k_grad is not None else \
                coefficient_gradient(k, ev.x, 1e-6 * h[sl])
            R = R + np.einsum("nma,nma->nm", gk, ev.grad[:, :, 0])
        if b is not None:
            R = R - np.einsum("nma,nma->nm", coefficient_at("b", b, cells, ev.x, (d,)), ev.grad[:, :, 0])
        if c is not None:
            R = R - coefficient_at("c", c, cells, ev.x) * ev.u[:, :, 0]
        cell_part[sl] = h[sl] ** 2 * np.einsum("nm,m,nm->n", ev.detJ, w, R ** 2)

    def flux(grad, x, cells):
        return coefficient_at("k", k, cells, x)[..., None, None] * grad

    face_part = jump_terms(space, U, flux, space.degree + 1, neumann, neumann_ids)
    eta = np.sqrt(cell_part + face_part)
    return (eta, cell_part, face_part) if parts else eta


def elasticity_indicators(space, u, lam, mu, *, f=None, traction=None, neumann_ids=None,
                          quad_points=None):
    r"""Residual indicators for linear elasticity :math:`-\nabla\cdot\sigma(u) = f`,
    :math:`\sigma = 2\mu\varepsilon + \lambda\,\mathrm{tr}\,\varepsilon\, I` (constant lam, mu):
    :math:`\eta_K^2 = h_K^2\|f + \nabla\cdot\sigma(u_h)\|_K^2 + \frac12\sum h_F\|[\![\sigma n]\!]\|_F^2
    + \sum_{F\subset\Gamma_N} h_F\|t - \sigma n\|_F^2` (``traction`` t(x, n) -> (..., d), default 0)."""
    check_space(space)
    d = space.dim
    if space.components != d:
        raise ValueError(f"elasticity_indicators needs space.components == dim == {d}, got {space.components}")
    if not (np.isscalar(lam) and np.isscalar(mu)):
        raise TypeError(f"lam and mu must be constants, got {type(lam).__name__}, {type(mu).__name__}")
    U = nodal_values(space, u)
    mesh = space.mesh
    nc = mesh.num_cells
    check_coefficient("f", f, nc, (d,))
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    h = cell_diameters(mesh)
    cell_part = np.zeros(nc)
    for sl in chunks(nc):
        cells = np.arange(sl.start, sl.stop)
        ev = evaluate(space, U, cells, xi, hessian=True)
        H = ev.hess                                                # (n, m, c, d, d)
        lap = np.trace(H, axis1=-2, axis2=-1)                     # (n, m, c)
        graddiv = np.einsum("nmssr->nmr", H)
        R = mu * lap + (lam + mu) * graddiv
        if f is not None:
            R = R + coefficient_at("f", f, cells, ev.x, (d,))
        cell_part[sl] = h[sl] ** 2 * np.einsum("nm,m,nmc->n", ev.detJ, w, R ** 2)

    eye = np.eye(d)

    def flux(grad, x, cells):
        eps = 0.5 * (grad + grad.swapaxes(-1, -2))
        return 2 * mu * eps + lam * np.trace(eps, axis1=-2, axis2=-1)[..., None, None] * eye

    face_part = jump_terms(space, U, flux, space.degree + 1, traction, neumann_ids)
    return np.sqrt(cell_part + face_part)
