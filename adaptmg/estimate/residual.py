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

Everything is vectorised over cells and faces: the loops run over chunks and over the few
face *runs* (:func:`.faces.face_runs`: faces with the same own local face and the same
neighbour point set), each evaluated with basis tables shared by all its faces
(:func:`.evaluation.point_fields`, arrays laid out cells last).  Every interior face is
integrated once, on its fine (or either conforming) side, and its contribution
:math:`\tfrac12 h_F\|[\![k\partial_n u_h]\!]\|_F^2` is added to both cells.
"""
from __future__ import annotations

import numpy as np

from ..fe.quadrature import tensor_gauss
from .evaluation import gather_cells, hessian, laplacian, point_fields, ref_tables, serial_chunk
from .faces import face_diameters, face_quadrature, face_runs, own_face_refs
from .inputs import (check_coefficient, check_space, chunks, coefficient_at, coefficient_gradient,
                     nodal_values)


def cell_diameters(mesh) -> np.ndarray:
    """Diameter h_K of every active cell (largest distance between two of its vertices)."""
    Xt = np.ascontiguousarray(mesh.points.T)[:, mesh.cells.T]      # (d, nv, nc)
    nv = Xt.shape[1]
    best = None
    for i in range(nv):                  # loop over the vertex pairs of the reference cell only
        for j in range(i + 1, nv):
            diff = Xt[:, i] - Xt[:, j]
            s2 = diff[0] * diff[0]
            for a in range(1, diff.shape[0]):
                s2 += diff[a] * diff[a]
            best = s2 if best is None else np.maximum(best, s2, out=best)
    return np.sqrt(best)


def _dot(a, b):
    """sum_i a[i] * b[i] over the (small) leading axis, as element-wise adds."""
    t = a[0] * b[0]
    for i in range(1, len(a)):
        t += a[i] * b[i]
    return t


def _nm(a):
    """Cells-last (k, m, n) -> (n, m, k) view, the layout of user callables."""
    return a.transpose(2, 1, 0)


def _at(name, v, cells, x, tail=()):
    """Coefficient at the points, cells last: a float for a scalar constant, else an array
    broadcastable to tail + (m, n)."""
    if v is None:
        return 0.0
    if not callable(v):
        a = np.asarray(v, dtype=float)
        if a.shape == tuple(tail):
            return float(a) if not tail else a.reshape(a.shape + (1, 1))
        return np.moveaxis(a[cells], 0, -1)[..., None, :]         # (*tail, 1, n)
    val = coefficient_at(name, v, cells, _nm(x), tail)              # (n, m, *tail)
    return np.moveaxis(val, (0, 1), (-1, -2))


def _neumann_values(neumann, x, nrm, c):
    """Prescribed normal flux g(x, n) (or a constant of shape () or (c,)), shape (c, m, n)."""
    if not callable(neumann):
        return np.asarray(neumann, dtype=float).reshape(-1, 1, 1)
    m, n = nrm.shape[1:]
    g = np.asarray(neumann(_nm(x), _nm(nrm)), dtype=float)
    if g.shape == (n, m):
        g = g[..., None]
    try:
        g = np.broadcast_to(g, (n, m, c))
    except ValueError:
        raise ValueError(f"neumann(x, n) must return shape {(n, m)} or {(n, m, c)} for x of shape "
                         f"{(n, m, x.shape[0])}, got {g.shape}") from None
    return g.transpose(2, 1, 0)


def _check_neumann(neumann, neumann_ids, c):
    if neumann is None or callable(neumann):
        if neumann is not None and neumann_ids is None:
            raise ValueError("neumann data given without neumann_ids (the boundary ids it applies to)")
        return
    if neumann_ids is None:
        raise ValueError("neumann data given without neumann_ids (the boundary ids it applies to)")
    a = np.asarray(neumann)
    if a.dtype.kind not in "fiu" or a.shape not in ((), (c,)):
        raise ValueError(f"a constant neumann datum must be a number{' or of shape (%d,)' % c if c > 1 else ''}, "
                         f"got {a.dtype} array of shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("neumann contains NaN or Inf")


def _own_side(space, Ut, Pt, tab, cells, face, need_x):
    """Own side of faces ``face`` of ``cells``: fields, unit outward normal (d, m, n) and
    surface element (m, n) by Nanson's formula, n = J^{-T} e / |J^{-T} e|, e = +-e_axis."""
    ev = point_fields(tab, gather_cells(space, Ut, cells, Pt), x=need_x, grad=True)
    axis, sign = face // 2, 2.0 * (face % 2) - 1.0
    nvec = ev.invJ[axis]                                            # (J^{-T} e_axis)_a = inv[axis, a]
    norm = np.sqrt(_dot(nvec, nvec))
    return ev, nvec * (sign / norm), ev.detJ * norm


def jump_terms(space, U, flux_n, nq, neumann=None, neumann_ids=None, need_x=False):
    """Face part of eta_K^2: (1/2) sum h_F ||[flux . n]||^2 (+ Neumann faces).

    ``flux_n(grad, nrm, x, cells)`` maps gradients (c, d, m, n) and unit normals (d, m, n)
    (cells last, x (d, m, n) the points or None) to the normal fluxes (c, m, n); ``neumann``
    is the prescribed normal flux g(x, n) (or a constant) on the faces with ``neumann_ids``.
    Each interior face is integrated once (:func:`.faces.face_runs`) on its own side, with the
    neighbour evaluated at the same points, and the value is added to both cells."""
    mesh, d = space.mesh, space.dim
    c = space.components
    _check_neumann(neumann, neumann_ids, c)
    el = space.element
    Ut = np.ascontiguousarray(U.T)
    Pt = np.ascontiguousarray(mesh.points.T)
    fr = face_runs(mesh)
    Nf, wf = face_quadrature(d, nq)
    val = np.empty(fr.cell.size)
    for s, e, f, g in fr.runs:
        ta = ref_tables(el, Nf @ own_face_refs(d, np.array([f]))[0])
        tb = ref_tables(el, Nf @ fr.R_sets[g])
        for sl in chunks(e - s, serial_chunk(ta, components=c)):
            sl = slice(s + sl.start, s + sl.stop)
            a, b = fr.cell[sl], fr.nb[sl]
            ea, nrm, da = _own_side(space, Ut, Pt, ta, a, f, need_x)
            eb = point_fields(tb, gather_cells(space, Ut, b, Pt), grad=True)
            jump = flux_n(ea.grad, nrm, ea.x, a) - flux_n(eb.grad, nrm, ea.x, b)    # (c, m, n)
            val[sl] = 0.5 * fr.h[sl] * (wf @ (da * _dot(jump, jump)))
    out = np.zeros(mesh.num_cells)
    out += np.bincount(fr.cell, weights=val, minlength=mesh.num_cells)
    out += np.bincount(fr.nb, weights=val, minlength=mesh.num_cells)
    if neumann_ids is not None:
        cN, fN, _ = mesh.boundary_faces(neumann_ids)
        cN, fN = np.asarray(cN), np.asarray(fN)
        need_xn = need_x or callable(neumann)
        valN = np.zeros(cN.size)
        for f in range(2 * d):            # loop over the 2d local faces only
            sel = np.flatnonzero(fN == f)
            if sel.size == 0:
                continue
            ta = ref_tables(el, Nf @ own_face_refs(d, np.array([f]))[0])
            for sl in chunks(sel.size, serial_chunk(ta, components=c)):
                cells = cN[sel[sl]]
                ea, nrm, da = _own_side(space, Ut, Pt, ta, cells, f, need_xn)
                r = -flux_n(ea.grad, nrm, ea.x, cells)
                if neumann is not None:
                    r = r + _neumann_values(neumann, ea.x, nrm, c)
                hF = face_diameters(mesh, cells, np.full(cells.size, f))
                valN[sel[sl]] = hF * (wf @ (da * _dot(r, r)))
        out += np.bincount(cN, weights=valN, minlength=mesh.num_cells)
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
    neumann, neumann_ids : flux data g(x, n) = k du/dn (or a constant) on the boundary faces
        with these ids
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
    _check_neumann(neumann, neumann_ids, 1)
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    tab = ref_tables(space.element, xi)
    h = cell_diameters(mesh)
    Ut = np.ascontiguousarray(U.T)
    Pt = np.ascontiguousarray(mesh.points.T)
    need_x = any(callable(v) for v in (f, k, b, c))
    need_grad = callable(k) or b is not None
    cell_part = np.empty(nc)
    for sl in chunks(nc, serial_chunk(tab, hessian=True)):
        cells = np.arange(sl.start, sl.stop)
        ev = point_fields(tab, gather_cells(space, Ut, cells, Pt), x=need_x, value=c is not None,
                          grad=need_grad, hessian=True)
        R = _at("k", k, cells, ev.x) * laplacian(ev)[0]
        R = R + _at("f", f, cells, ev.x)
        G = ev.grad[0] if need_grad else None                       # (d, m, n)
        if callable(k):
            gk = np.moveaxis(np.asarray(k_grad(_nm(ev.x)), float), (0, 1), (-1, -2)) if k_grad is not None \
                else _nm(coefficient_gradient(k, _nm(ev.x), 1e-6 * h[sl]))
            R = R + _dot(gk, G)
        if b is not None:
            R = R - _dot(_at("b", b, cells, ev.x, (d,)), G)
        if c is not None:
            R = R - _at("c", c, cells, ev.x) * ev.u[0]
        cell_part[sl] = h[sl] ** 2 * (w @ (ev.detJ * R * R))

    def flux_n(grad, nrm, x, cells):
        return _at("k", k, cells, x) * _dot(grad[0], nrm)[None]

    face_part = jump_terms(space, U, flux_n, space.degree + 1, neumann, neumann_ids, need_x=callable(k))
    eta = np.sqrt(cell_part + face_part)
    return (eta, cell_part, face_part) if parts else eta


def elasticity_indicators(space, u, lam, mu, *, f=None, traction=None, neumann_ids=None,
                          quad_points=None):
    r"""Residual indicators for linear elasticity :math:`-\nabla\cdot\sigma(u) = f`,
    :math:`\sigma = 2\mu\varepsilon + \lambda\,\mathrm{tr}\,\varepsilon\, I` (constant lam, mu):
    :math:`\eta_K^2 = h_K^2\|f + \nabla\cdot\sigma(u_h)\|_K^2 + \frac12\sum h_F\|[\![\sigma n]\!]\|_F^2
    + \sum_{F\subset\Gamma_N} h_F\|t - \sigma n\|_F^2` (``traction`` t(x, n) -> (..., d) or a
    constant (d,), default 0)."""
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
    _check_neumann(traction, neumann_ids, d)
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    tab = ref_tables(space.element, xi)
    h = cell_diameters(mesh)
    Ut = np.ascontiguousarray(U.T)
    Pt = np.ascontiguousarray(mesh.points.T)
    cell_part = np.empty(nc)
    for sl in chunks(nc, serial_chunk(tab, hessian=True, components=d)):
        cells = np.arange(sl.start, sl.stop)
        ev = point_fields(tab, gather_cells(space, Ut, cells, Pt), x=callable(f), hessian=True)
        H = hessian(ev)                                            # (c, d, d, m, n)
        lap = np.trace(H, axis1=1, axis2=2)                        # (c, m, n)
        graddiv = np.einsum("ssr...->r...", H)
        R = mu * lap + (lam + mu) * graddiv
        if f is not None:
            R = R + _at("f", f, cells, ev.x, (d,))
        cell_part[sl] = h[sl] ** 2 * (w @ (ev.detJ * _dot(R, R)))

    def flux_n(grad, nrm, x, cells):
        # sigma n = mu (grad u + grad u^T) n + lam (div u) n
        div = sum(grad[a, a] for a in range(d))                   # (m, n)
        gn = _dot(grad.swapaxes(0, 1), nrm[:, None])                # (grad u) n
        gtn = _dot(grad, nrm[:, None])                              # (grad u)^T n
        return mu * (gn + gtn) + lam * div * nrm

    face_part = jump_terms(space, U, flux_n, space.degree + 1, traction, neumann_ids)
    return np.sqrt(cell_part + face_part)
