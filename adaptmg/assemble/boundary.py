r"""Boundary (Neumann) load vectors, vectorised over the boundary faces.

For a natural boundary condition :math:`k\,\partial u/\partial n = g` on
:math:`\Gamma_N` the weak form gains

.. math::

    b_{(i,r)} = \int_{\Gamma_N} g_r\,\phi_i\,ds
              = \sum_{F\subset\Gamma_N}\sum_q w_q\, g_r(x_q, n_q)\,\phi_i(\hat x_q)\,
                |\det J(\hat x_q)|\,\bigl|J^{-T}(\hat x_q)\,e_a\bigr| ,

where face :math:`F` of a cell is the reference face :math:`\hat x_a = s`
(local face ``2a + s``), :math:`\hat x_q` its Gauss points, and
:math:`|\det J|\,|J^{-T}e_a|` the surface measure of the multilinear map
(Nanson's formula); the outward unit normal is
:math:`n = (2s - 1)\,J^{-T}e_a / |J^{-T}e_a|`.
"""
from __future__ import annotations

import inspect

import numpy as np

from ..fe.geometry import cell_geometry
from ..fe.quadrature import tensor_gauss

__all__ = ["boundary_load"]


def _takes_normal(g) -> bool:
    """True if the callable ``g`` takes two positional arguments (x, n)."""
    try:
        params = inspect.signature(g).parameters.values()
    except (TypeError, ValueError):
        return False
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(pos) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def boundary_load(space, g, ids=None, *, quad_points=None):
    r"""Neumann load :math:`b_{(i,r)} = \int_{\Gamma_N} g_r\,\phi_i\,ds` (module docstring).

    ``ids``: the boundary ids or names (``mesh.boundary_names``) of :math:`\Gamma_N`; None:
    the whole boundary.  ``g``: a constant (scalar, or shape (c,) for c components) or a
    callable ``g(x)`` or ``g(x, n)`` (x the points, n the outward unit normals, both
    (..., dim)) returning (...) or (..., c).  Returns a 1-D array of length num_dofs, to
    add to :func:`adaptmg.assemble.load`.
    """
    mesh, d, c = space.mesh, space.dim, space.components
    if not callable(g):
        gc = np.asarray(g, dtype=float)
        if gc.shape not in ((), (c,)) or not np.isfinite(gc).all():
            raise ValueError(f"boundary_load: g must be a finite number{f' or shape ({c},)' if c > 1 else ''} "
                             f"or a callable, got shape {gc.shape}")
    nq = space.degree + 1 if quad_points is None else int(quad_points)
    s, w = tensor_gauss(d - 1, nq)
    cB, fB, _ = mesh.boundary_faces(ids)
    cdofs = np.asarray(space.cell_dofs)
    out = np.zeros(space.num_dofs)
    with_n = callable(g) and _takes_normal(g)
    for f in range(2 * d):                                  # the 2d local faces
        cells = cB[fB == f]
        if cells.size == 0:
            continue
        a, side = divmod(f, 2)
        xi = np.insert(s, a, float(side), axis=1)           # (nq, d) points of the reference face
        geo = cell_geometry(mesh, xi, cells)
        v = geo.invJT[..., :, a]                            # J^{-T} e_a, (nf, nq, d)
        m = np.linalg.norm(v, axis=-1)
        ds = geo.detJ * m * w                               # (nf, nq)
        if callable(g):
            args = (geo.x, (2 * side - 1) * v / m[..., None]) if with_n else (geo.x,)
            gv = np.asarray(g(*args), dtype=float)
            if gv.shape not in (ds.shape, ds.shape + (c,)):
                raise ValueError(f"boundary_load: g must return shape {ds.shape} or {ds.shape + (c,)} for "
                                 f"points of shape {geo.x.shape}, got {gv.shape}")
            if not np.isfinite(gv).all():
                raise ValueError("boundary_load: g returned NaN or Inf")
        else:
            gv = gc
        gv = np.broadcast_to(gv[..., None] if gv.shape == ds.shape else gv, ds.shape + (c,))
        phi = space.element.values(xi)                       # (nq, nloc)
        loc = np.einsum("kqr,qi->kir", gv * ds[..., None], phi)
        idx = (cdofs[cells][:, :, None].astype(np.int64) * c + np.arange(c)).ravel()
        out += np.bincount(idx, weights=loc.ravel(), minlength=space.num_dofs)
    return out
