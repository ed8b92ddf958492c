r"""Goal-oriented dual weighted residual (DWR) indicators.

For a linear goal functional :math:`J(u) = \int_\Omega w\,u\,dx` (``w`` a subdomain
weight or a point-value mollifier) the dual problem :math:`a(\varphi, z) = J(\varphi)`
for all test functions gives the error identity

.. math::

    J(u) - J(u_h) = \rho(u_h)(z - i_h z) - \int_{\Gamma_D} (g - u_h)\,\partial_n z \,ds,
    \qquad \rho(u_h)(\varphi) = (f,\varphi) - a(u_h,\varphi),

with :math:`i_h z` any function of the discrete space (Galerkin orthogonality); the
boundary term (Dirichlet data g interpolated by u_h) is included when ``g`` is given.

Choice of the dual weights.  The exact z is replaced by the dual solution
:math:`z_h^{(2)}` computed in **Q2 on the same mesh** (with the same geometric
multigrid as the primal problem, rediscretised on every level of the
global-coarsening hierarchy, CG for symmetric and GMRES for non-symmetric
operators), and :math:`i_h z` by its Q1 interpolant (nodal values at the
regular vertices, hanging vertices constrained by the Q1 hanging-node matrix
so that :math:`i_h z` is conforming and Galerkin orthogonality holds exactly).
We prefer this over patch-wise higher-order interpolation of a Q1 dual
solution because (i) it needs no patch structure of the mesh, which adaptive
meshes with hanging nodes and 2:1 closure do not have in general, (ii) near
singularities (the re-entrant corner) a Q2 solution is a better approximation
of z than a reconstruction from Q1 data, and (iii) it reuses the multigrid
machinery unchanged; the price is a dual solve about 2^d times larger.

Localisation.  Following the partition-of-unity localisation of Richter and
Wick (J. Comput. Appl. Math. 279, 2015) the nodal indicators are
:math:`\eta_i = \rho(u_h)\big((z^{(2)}_h - i_h z^{(2)}_h)\,\psi_i\big)` with the
(hanging-node constrained) Q1 basis :math:`\psi_i`, which sum to the global
estimate :math:`\eta = \sum_i \eta_i = \rho(u_h)(z_h^{(2)} - i_h z_h^{(2)})`.
Cell indicators share :math:`|\eta_i|` equally among the cells in the support
of :math:`\psi_i`; the boundary term is added per cell.
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import assemble as asm
from ..fe.quadrature import tensor_gauss
from ..fe.space import Space
from ..mesh import reference as ref
from .evaluation import evaluate
from .faces import face_quadrature, outward_normals, own_face_refs
from .inputs import check_coefficient, check_space, chunks, coefficient_at, nodal_values, to_host


def _q1_of_q2(s1: Space, s2: Space) -> np.ndarray:
    """For every Q1 node of s1 the index of the same point among the Q2 nodes of s2."""
    d = s1.dim
    corner_lat = (2 * ref.corners(d) * 3 ** np.arange(d)).sum(1)    # lattice index of each vertex
    m = np.empty(s1.num_nodes, dtype=np.int64)
    m[s1.cell_dofs.ravel()] = s2.cell_dofs[:, corner_lat].ravel()
    return m


def dwr_indicators(space, u, weight, *, f=0.0, k=1.0, b=None, c=None, dirichlet="all",
                   backend="auto", rtol=1e-8, maxiter=200, smoother="jacobi", quad_points=None,
                   return_dual=False, weight_quad_points=8, g=None):
    r"""Goal-oriented DWR indicators for :math:`J(u) = \int_\Omega w\,u\,dx` (module docstring).

    The primal problem is :math:`-\nabla\cdot(k\nabla u) + b\cdot\nabla u + c u = f` with
    Dirichlet conditions on ``dirichlet`` (any spec of :func:`adaptmg.dirichlet_dofs`);
    ``space`` must be scalar Q1 and ``u`` the full nodal vector of the primal solution.  The
    dual problem (adjoint operator, rediscretised on every multigrid level as the transpose
    of the primal matrix) is solved in Q2 on the same mesh with :func:`adaptmg.multigrid`
    (CG if b is None, else GMRES).  ``g(x)``: Dirichlet data, adds the boundary term.

    Returns ``(eta_K, estimate, info)``: non-negative cell indicators, the signed global
    estimate :math:`\eta \approx J(u) - J(u_h)`, and a dict with the dual multigrid
    iteration count ``dual_iterations``, ``dual_converged`` (False after a
    :class:`~adaptmg.linalg.ConvergenceWarning` naming the dual solve) and the dual DoFs (and
    ``z`` with ``return_dual``).
    """
    from .. import multigrid      # the package's public name: stable while the solver modules move
    check_space(space)
    if space.components != 1 or space.degree != 1:
        raise ValueError(f"dwr_indicators needs a scalar Q1 primal space, got Q{space.degree} "
                         f"with {space.components} components")
    if not callable(weight) and np.ndim(weight) != 0:
        raise TypeError("weight must be a constant or a callable w(x) of points (..., d) -> (...)")
    U = nodal_values(space, u)
    mesh, d = space.mesh, space.dim
    nc = mesh.num_cells
    for name, v in (("f", f), ("k", k), ("c", c)):
        check_coefficient(name, v, nc)
    check_coefficient("b", b, nc, (d,))
    s2 = Space(mesh, 2)

    def operator(s):
        A = asm.stiffness(s, k)
        if b is not None:
            A = A + asm.convection(s, b)
        if c is not None:
            A = A + asm.mass(s, c)
        return A.T.tocsr() if b is not None else A

    from ..multilevel.hierarchy import homogeneous
    ml = multigrid(s2, operator, dirichlet=homogeneous(dirichlet), backend=backend, smoother=smoother)
    rhs = ml.constrain(asm.load(s2, weight, quad_points=weight_quad_points))
    # a dual solve that misses its tolerance is reported, naming the dual problem (the
    # solver's own warning would not say which solve failed)
    from ..linalg import ConvergenceWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = ml.solve(rhs, rtol=rtol, maxiter=maxiter, accel="cg" if b is None else "gmres")
    converged = True
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            converged = False
            warnings.warn(ConvergenceWarning(
                f"dwr_indicators: the dual problem (Q2, {s2.num_dofs} DoFs) was not solved to "
                f"rtol={rtol:g} in maxiter={maxiter}: {w.message}; the indicators use this z"),
                stacklevel=2)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    dual_iterations = ml.last_iterations
    z = to_host(ml.expand(z))
    # conforming Q1 interpolant of z
    zi = z[_q1_of_q2(space, s2)]
    Iz = space.H @ zi
    # cell-wise quadrature of rho(u_h)((z - Iz) psi_v)
    nq = 4 if quad_points is None else int(quad_points)
    xi, wq = tensor_gauss(d, nq)
    el2, el1 = s2.element, space.element
    p2, g2 = el2.values(xi), el2.gradients(xi)
    p1, g1 = el1.values(xi), el1.gradients(xi)
    contrib = np.zeros((nc, 2 ** d))
    Z2 = z.reshape(-1, 1)
    for sl in chunks(nc):
        cells = np.arange(sl.start, sl.stop)
        ev = evaluate(space, U, cells, xi)
        dx = ev.detJ * wq
        G1 = np.einsum("nmba,mib->nmia", ev.invJ, g1)              # physical Q1 gradients
        G2 = np.einsum("nmba,mib->nmia", ev.invJ, g2)
        zc = Z2[s2.cell_dofs[cells], 0]                            # (n, 27|9)
        ic = Iz[space.cell_dofs[cells]]                            # (n, nv)
        wv = np.einsum("mi,ni->nm", p2, zc) - np.einsum("mi,ni->nm", p1, ic)
        wg = np.einsum("nmia,ni->nma", G2, zc) - np.einsum("nmia,ni->nma", G1, ic)
        kv = coefficient_at("k", k, cells, ev.x)
        src = coefficient_at("f", f, cells, ev.x)
        if b is not None:
            src = src - np.einsum("nma,nma->nm", coefficient_at("b", b, cells, ev.x, (d,)), ev.grad[:, :, 0])
        if c is not None:
            src = src - coefficient_at("c", c, cells, ev.x) * ev.u[:, :, 0]
        kg = kv[..., None] * ev.grad[:, :, 0]                      # k grad u_h
        # rho_K(w psi_v) = int src w psi_v - k grad u_h . (psi_v grad w + w grad psi_v)
        t1 = np.einsum("nm,nm,mv->nv", dx, src * wv - np.einsum("nma,nma->nm", kg, wg), p1)
        t2 = np.einsum("nm,nm,nma,nmva->nv", dx, wv, kg, G1)
        contrib[sl] = t1 - t2
    local = np.bincount(space.cell_dofs.ravel(), weights=contrib.ravel(), minlength=space.num_nodes)
    nodal = space.H_nodes.T @ local                                 # fold hanging nodes onto regular ones
    est = float(nodal.sum())
    M = (mesh.incidence @ space.H_nodes).tocsr()
    M.data[:] = 1.0
    share = np.asarray(M.sum(0)).ravel()
    share[share == 0] = 1.0
    eta = M @ (np.abs(nodal) / share)
    if g is not None:
        bterm = _dirichlet_data_term(space, U, s2, z, g, dirichlet)
        est += float(bterm.sum())
        eta = eta + np.abs(bterm)
    info = {"dual_iterations": dual_iterations, "dual_converged": converged, "dual_dofs": s2.num_dofs,
            "nodal": nodal}
    if return_dual:
        info["z"], info["dual_space"] = z, s2
    return eta, est, info


def _dirichlet_faces(s2, dirichlet):
    """(cells, local faces) of the boundary faces on which the dual problem is a Dirichlet
    problem: every Q2 node of the face is a DoF of :func:`adaptmg.dirichlet_dofs`."""
    from .. import dirichlet_dofs  # the package's public name: stable while the solver modules move
    fixed = np.zeros(s2.num_dofs, dtype=bool)
    fixed[dirichlet_dofs(s2, dirichlet)] = True
    cB, fB, _ = s2.mesh.boundary_faces()
    d = s2.dim
    lat = ref.lattice(d, 3)
    on_face = np.array([np.flatnonzero(lat[:, a] == 2 * s) for a in range(d) for s in (0, 1)])
    keep = fixed[s2.cell_dofs[cB[:, None], on_face[fB]]].all(1)
    return cB[keep], fB[keep]


def _dirichlet_data_term(space, U, s2, z, g, dirichlet):
    """Per-cell -int_{F} (g - u_h) dz/dn over the Dirichlet boundary faces F (outward n)."""
    mesh, d = space.mesh, space.dim
    cB, fB = _dirichlet_faces(s2, dirichlet)
    Nf, wf = face_quadrature(d, 4)
    out = np.zeros(mesh.num_cells)
    Z = z.reshape(-1, 1)
    for sl in chunks(cB.size):
        c, f = cB[sl], fB[sl]
        xi_s = np.einsum("qj,njd->nqd", Nf, own_face_refs(d, f))
        eu = evaluate(space, U, c, xi_s)
        ez = evaluate(s2, Z, c, xi_s)
        n, da = outward_normals(eu, f, d)
        gv = np.asarray(g(eu.x), dtype=float).reshape(eu.x.shape[:2])
        dzdn = np.einsum("nma,nma->nm", ez.grad[:, :, 0], n)
        val = -np.einsum("nm,m,nm->n", da, wf, (gv - eu.u[:, :, 0]) * dzdn)
        out += np.bincount(c, weights=val, minlength=mesh.num_cells)
    return out
