r"""Stationary transport-diffusion with a circular interior layer (manufactured solution).

.. math::  -\varepsilon\Delta u + b\cdot\nabla u = f \ \text{in}\ \Omega=(0,1)^2, \qquad u = u_{ex}\ \text{on}\ \partial\Omega,

with :math:`u_{ex} = \arctan(\alpha (r - r_0))`, r the distance to ``CENTER`` = (-0.05, -0.05),
:math:`r_0 = 0.7` (the "wave front" benchmark with a steep internal layer of width
:math:`\sim 1/\alpha`), constant :math:`b = (1, 1/2)` and :math:`\varepsilon = 0.01`;
f is computed from :math:`u_{ex}`:

.. math::  \Delta u = u'' + u'/r,\quad u' = \frac{\alpha}{1+s^2},\ u'' = -\frac{2\alpha^2 s}{(1+s^2)^2},\ s = \alpha(r-r_0).

The Galerkin Q1 discretisation is used (no stabilisation): on coarse meshes the cell
Peclet number is large and u_h oscillates, which the residual estimator sees; the
adaptive loop resolves the layer.  The non-symmetric systems are solved by GMRES
preconditioned with the geometric multigrid V-cycle (rediscretised on every level).
"""
from __future__ import annotations

import time

import numpy as np

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import to_host
from adaptmg.estimate import AdaptiveProblem, adaptive_loop, residual_indicators
from adaptmg.fe.norms import errors

EPS = 0.01
B = np.array([1.0, 0.5])
ALPHA = 50.0
R0 = 0.7
CENTER = np.array([-0.05, -0.05])


def exact(x):
    r = np.linalg.norm(x - CENTER, axis=-1)
    return np.arctan(ALPHA * (r - R0))


def grad(x):
    dx = x - CENTER
    r = np.linalg.norm(dx, axis=-1)
    s = ALPHA * (r - R0)
    return (ALPHA / (1 + s ** 2) / r)[..., None] * dx


def rhs(x):
    dx = x - CENTER
    r = np.linalg.norm(dx, axis=-1)
    s = ALPHA * (r - R0)
    u1 = ALPHA / (1 + s ** 2)
    u2 = -2 * ALPHA ** 2 * s / (1 + s ** 2) ** 2
    lap = u2 + u1 / r
    return -EPS * lap + (grad(x) * B).sum(-1)


def coarse_mesh(n=16) -> Mesh:
    return Mesh.box([0, 0], [1, 1], [n, n])


def operator(space):
    return assemble.stiffness(space, EPS) + assemble.convection(space, B)


def solve(mesh, backend="cpu", rtol=1e-9):
    space = Space(mesh, 1)
    ml = multigrid(space, operator, dirichlet="all", backend=backend)
    con = ml.constraints[-1].with_values(exact)    # the hierarchy's constraints (and row scale)
    A = ml.assembled
    b = con.rhs(assemble.load(space, rhs, quad_points=4), A)
    t0 = time.perf_counter()
    x = ml.solve(b, rtol=rtol, accel="gmres", maxiter=300)
    ml.backend.synchronize()
    t_mg = time.perf_counter() - t0
    return space, con.expand(to_host(x)), {"iterations": ml.last_iterations, "levels": len(ml.spaces),
                                           "t_mg": t_mg, "backend": ml.backend}


def problem(n=16) -> AdaptiveProblem:
    def estimate(space, u, info):
        eta = residual_indicators(space, u, f=rhs, k=EPS, b=B, backend=info.get("backend"))
        return eta, float(np.sqrt((eta ** 2).sum())), {}

    def error(space, u, info):
        e = errors(space, u, exact, grad, backend=info.get("backend"))
        return {"energy": np.sqrt(EPS) * e["H1"], "H1": e["H1"], "L2": e["L2"]}

    return AdaptiveProblem("interior_layer", coarse_mesh(n), solve, estimate, error,
                           lambda s, u, i: {"exact": s.interpolate(exact)})


def run(steps=10, backend="cpu", quiet=False, out=None, *, strategy="doerfler", theta=0.5, max_dofs=None):
    """Adaptive Q1 solution; returns the dict of :func:`adaptmg.estimate.adaptive_loop`."""
    return adaptive_loop(problem(), steps=steps, strategy=strategy, theta=theta, backend=backend,
                         quiet=quiet, out=out, max_dofs=max_dofs)
