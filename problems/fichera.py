r"""Poisson problem on the Fichera cube: (-1,1)^3 minus the octant [0,1)^3.

.. math::  -\Delta u = 1 \ \text{in}\ \Omega,\qquad u = 0 \ \text{on}\ \partial\Omega .

The three re-entrant edges (the positive coordinate half-axes) carry edge
singularities :math:`\sim \rho^{2/3}` and the Fichera corner at the origin a vertex
singularity, so uniform Q1 refinement converges like :math:`N^{-2/9}` in the energy
norm, adaptive refinement like :math:`N^{-1/3}` (optimal for Q1 in 3-D).

No closed-form solution, but the energy error is computable from one number:
with f = 1, Galerkin orthogonality gives

.. math::  \|\nabla(u - u_h)\|^2 = \|\nabla u\|^2 - \|\nabla u_h\|^2 = J(u) - J(u_h), \qquad J(v) = \int_\Omega v\,dx,

so the reference value ``J_REF`` of :math:`J(u) = \|\nabla u\|^2` gives the true energy
error of every u_h.  ``J_REF`` is *not* an independent literature value: it was obtained by
extrapolating J(u_h) from an adaptive Q1 sequence (see :func:`reference_value`:
J(u) - J(u_h) = C N^{-2/3} fitted over the last steps); the errors reported with it are
therefore reliable only while they are well above the extrapolation uncertainty
(``J_REF_UNCERTAINTY``).
"""
from __future__ import annotations

import time

import numpy as np

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import get_backend, to_host
from adaptmg.estimate import AdaptiveProblem, adaptive_loop, residual_indicators

# J(u) = ||grad u||^2 extrapolated from an adaptive Q1 run (Doerfler theta = 0.5, 15 steps, up to
# 739,234 DoFs, estimate 0.146): two-parameter fits J(u_h) = J - C N^(-2/3) over the last 3, 4,
# 5 and 6 steps give 0.39798 .. 0.39812; free-exponent fits 0.3977 .. 0.3985 (unstable).
J_REF = 0.39803
J_REF_UNCERTAINTY = 2e-4


def coarse_mesh(backend="cpu") -> Mesh:
    """7 unit cubes: the cube (-1,1)^3 without the octant x, y, z > 0 (on ``backend``, "cpu"
    or "gpu")."""
    g = np.array([-1.0, 0.0, 1.0])
    X, Y, Z = np.meshgrid(g, g, g, indexing="ij")
    pts = np.stack([X.ravel(order="F"), Y.ravel(order="F"), Z.ravel(order="F")], axis=1)
    cells = []
    for k in range(2):
        for j in range(2):
            for i in range(2):
                if i == j == k == 1:
                    continue
                b = i + 3 * j + 9 * k
                cells.append([b, b + 1, b + 3, b + 4, b + 9, b + 10, b + 12, b + 13])
    mesh = Mesh.from_cells(pts, np.array(cells))
    return mesh if get_backend(backend).name == "cpu" else mesh.to(backend)


def solve(mesh, backend="cpu", rtol=1e-9):
    """Q1 solution of -Laplace u = 1, u = 0 on the boundary; on a mesh on the GPU the load
    vector and ``u`` stay on the device."""
    space = Space(mesh, 1)
    ml = multigrid(space, assemble.stiffness, dirichlet="all", backend=backend)
    b = assemble.load(space, 1.0)
    t0 = time.perf_counter()
    x = ml.solve(ml.constrain(b), rtol=rtol, accel="cg")
    ml.backend.synchronize()
    t_mg = time.perf_counter() - t0
    u = ml.expand(mesh.backend.asarray(x)) if mesh.backend.is_gpu else to_host(ml.expand(x))
    return space, u, {"iterations": ml.last_iterations, "levels": len(ml.spaces), "t_mg": t_mg, "J": float(b @ u),
                      "backend": ml.backend}


def problem(mesh_backend="cpu") -> AdaptiveProblem:
    def estimate(space, u, info):
        eta = residual_indicators(space, u, f=1.0, backend=info.get("backend"))
        return eta, float(np.sqrt((eta ** 2).sum())), {"J": info["J"]}

    def error(space, u, info):
        if J_REF is None:
            return {}
        return {"energy": float(np.sqrt(max(J_REF - info["J"], 0.0)))}

    return AdaptiveProblem("fichera", coarse_mesh(mesh_backend), solve, estimate, error)


def run(steps=6, backend="cpu", quiet=False, out=None, *, strategy="doerfler", theta=0.5, max_dofs=None,
        mesh_backend=None):
    """Adaptive Q1 solution; returns the dict of :func:`adaptmg.estimate.adaptive_loop`
    (``mesh_backend`` as in :func:`adaptmg_problems.lshape.run`: by default the mesh lives
    on the GPU when ``backend`` is the GPU)."""
    from .lshape import mesh_backend_for
    return adaptive_loop(problem(mesh_backend_for(backend, mesh_backend)), steps=steps, strategy=strategy, theta=theta, backend=backend,
                         quiet=quiet, out=out, max_dofs=max_dofs)


def reference_value(steps=14, last=5, quiet=True):
    """Extrapolate J(u) from an adaptive run: fit J(u_h) = J - C N^{-2/3} over the ``last`` steps.

    Returns (J, spread) where spread is the change of the extrapolated value when one
    fewer step is used (a crude uncertainty)."""
    h = run(steps=steps, quiet=quiet)["history"]
    N = np.array([r["dofs"] for r in h], float)
    J = np.array([r["J"] for r in h])

    def fit(n, j):
        A = np.stack([np.ones_like(n), -n ** (-2.0 / 3.0)], axis=1)
        return np.linalg.lstsq(A, j, rcond=None)[0][0]
    a = fit(N[-last:], J[-last:])
    b = fit(N[-last - 1:-1], J[-last - 1:-1])
    return float(a), float(abs(a - b))
