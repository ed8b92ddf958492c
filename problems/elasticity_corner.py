r"""Linear elasticity on the L-shaped domain: stress singularity at the re-entrant corner.

.. math::  -\nabla\cdot\sigma(u) = f \ \text{in}\ \Omega = (-1,1)^2\setminus[0,1)\times(-1,0],\qquad
           \sigma(u) = 2\mu\varepsilon(u) + \lambda\,\mathrm{tr}\,\varepsilon(u)\, I,

clamped (u = 0) on the top edge y = 1 (boundary "clamped", id 1), traction free elsewhere
("free", id 0),
gravity-like load f = (0, -1), E = 1, nu = 0.3 (plane strain Lame constants).  The
re-entrant corner at the origin makes the stresses singular (Williams exponent
~0.54 for mode I), so uniform refinement converges sub-optimally and the
residual estimator (:func:`adaptmg.estimate.elasticity_indicators`: cell residual,
stress-jump and traction terms) concentrates the refinement at the corner.

No closed-form solution: ``run`` reports the estimate and the compliance
:math:`\int f\cdot u_h` (which increases monotonically to its limit under refinement).
Vector Q1, geometric multigrid with point-block Jacobi smoothing (2x2 node blocks) as a
CG preconditioner.
"""
from __future__ import annotations

import time

import numpy as np

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import to_host
from adaptmg.estimate import AdaptiveProblem, adaptive_loop, elasticity_indicators
from adaptmg.mesh import reference as ref

E, NU = 1.0, 0.3
LAM = E * NU / ((1 + NU) * (1 - 2 * NU))
MU = E / (2 * (1 + NU))
LOAD = np.array([0.0, -1.0])


def coarse_mesh(n=2) -> Mesh:
    from .lshape import coarse_mesh as lmesh
    m = lmesh(n)
    cells, pts = m.cells, m.points
    fc = pts[cells[:, ref.face_vertices(2)]].mean(axis=2)          # (nc, 4, 2) face centres
    bid = np.where(np.isclose(fc[..., 1], 1.0), 1, 0)
    return Mesh.from_cells(pts, cells, bid, boundary_names={"free": 0, "clamped": 1})


def solve(mesh, backend="cpu", rtol=1e-9):
    space = Space(mesh, 1, components=2)
    ml = multigrid(space, lambda s: assemble.elasticity(s, LAM, MU), dirichlet=["clamped"],
                   smoother="block_jacobi", backend=backend, near_nullspace="rigid_body")
    b = ml.constrain(assemble.load(space, LOAD))
    t0 = time.perf_counter()
    x = ml.solve(b, rtol=rtol, accel="cg", maxiter=300)
    ml.backend.synchronize()
    t_mg = time.perf_counter() - t0
    u = to_host(ml.expand(x))
    return space, u, {"iterations": ml.last_iterations, "levels": len(ml.spaces), "t_mg": t_mg,
                      "compliance": float(assemble.load(space, LOAD) @ u), "backend": ml.backend}


def problem(n=2) -> AdaptiveProblem:
    def estimate(space, u, info):
        eta = elasticity_indicators(space, u, LAM, MU, f=LOAD, neumann_ids=["free"], backend=info.get("backend"))
        return eta, float(np.sqrt((eta ** 2).sum())), {"compliance": info["compliance"]}

    return AdaptiveProblem("elasticity_corner", coarse_mesh(n), solve, estimate)


def run(steps=10, backend="cpu", quiet=False, out=None, *, strategy="doerfler", theta=0.5, max_dofs=None):
    """Adaptive vector-Q1 solution; returns the dict of :func:`adaptmg.estimate.adaptive_loop`."""
    return adaptive_loop(problem(), steps=steps, strategy=strategy, theta=theta, backend=backend,
                         quiet=quiet, out=out, max_dofs=max_dofs)
