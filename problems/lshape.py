r"""Poisson problem on the L-shaped domain with the corner singularity r^(2/3).

.. math::  -\Delta u = 0 \ \text{in}\ \Omega = (-1,1)^2 \setminus [0,1)\times(-1,0], \qquad
           u = g \ \text{on}\ \partial\Omega,

with the exact solution :math:`u = r^{2/3}\sin(2\theta/3)`, :math:`\theta \in [0, 3\pi/2]`
measured from the positive x axis (u vanishes on both edges of the re-entrant corner).
u is in :math:`H^{1+2/3-\epsilon}` only, so uniform Q1 refinement converges like
:math:`|u-u_h|_1 \sim h^{2/3} = N^{-1/3}`, while adaptive refinement recovers the optimal
:math:`N^{-1/2}`.

The coarse mesh has 12 squares of side 1/2 (:meth:`Mesh.from_cells`).  Goal functional
for the DWR estimator: a mollified point value :math:`J(u) = \int w u` with a smooth bump
w of unit mass centred at ``GOAL_CENTER`` (radius ``GOAL_RADIUS``); its exact value is
computed by composite Gauss quadrature of the exact solution (:func:`goal_exact`).
"""
from __future__ import annotations

import functools

import time

import numpy as np

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import get_backend, to_host
from adaptmg.estimate import AdaptiveProblem, adaptive_loop, dwr_indicators, residual_indicators
from adaptmg.fe.norms import errors

GOAL_CENTER = np.array([0.25, 0.25])
GOAL_RADIUS = 0.2


def coarse_mesh(n: int = 2, backend="cpu") -> Mesh:
    """L-shaped mesh of 3 n^2 squares of side 1/n (default 12 cells), on ``backend`` ("cpu" or
    "gpu": then the mesh, its refinements and everything built from them live on the device)."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    g = np.linspace(-1, 1, 2 * n + 1)
    X, Y = np.meshgrid(g, g, indexing="ij")
    pts = np.stack([X.ravel(order="F"), Y.ravel(order="F")], axis=1)
    i, j = np.meshgrid(np.arange(2 * n), np.arange(2 * n), indexing="ij")
    i, j = i.ravel(), j.ravel()
    keep = ~((i >= n) & (j < n))                    # drop the quadrant x > 0, y < 0
    i, j = i[keep], j[keep]
    s = 2 * n + 1
    base = i + s * j
    cells = np.stack([base, base + 1, base + s, base + s + 1], axis=1)
    mesh = Mesh.from_cells(pts, cells)
    return mesh if get_backend(backend).name == "cpu" else mesh.to(backend)


def mesh_backend_for(backend, mesh_backend=None) -> str:
    """Where the loop's mesh lives: ``mesh_backend`` ("cpu" or "gpu"), by default the solver's
    backend ("gpu" when ``backend`` resolves to the GPU)."""
    if mesh_backend is None:
        return get_backend(backend).name
    if mesh_backend not in ("cpu", "gpu"):
        raise ValueError(f"mesh_backend must be 'cpu', 'gpu' or None, got {mesh_backend!r}")
    if mesh_backend == "gpu" and not get_backend(backend).is_gpu:
        raise ValueError(f"a mesh on the GPU needs backend 'gpu', got {backend!r}")
    return mesh_backend


def exact(x):
    r = np.hypot(x[..., 0], x[..., 1])
    th = np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)
    return r ** (2.0 / 3.0) * np.sin(2.0 * th / 3.0)


def grad(x):
    r = np.hypot(x[..., 0], x[..., 1])
    th = np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)
    rs = np.where(r > 0, r, 1.0) ** (-1.0 / 3.0) * (2.0 / 3.0)
    ur, ut = rs * np.sin(2 * th / 3), rs * np.cos(2 * th / 3)
    c, s = np.cos(th), np.sin(th)
    return np.stack([ur * c - ut * s, ur * s + ut * c], axis=-1)


# -- the variant with homogeneous Dirichlet data (for solvers that take u = 0 on the boundary,
#    e.g. adaptmg.distributed.solve_forest): u0 = s w, s = r^(2/3) sin(2 theta / 3) the corner
#    singularity, w = (1 - x^2)(1 - y^2) exp(a x + b y) a weight vanishing on the outer edges
#    (s vanishes on the re-entrant ones); a != -b breaks the symmetry about y = -x, so no two
#    cells have equal indicators (Doerfler marking has no ties to break).  s is harmonic, so
#    f0 = -Laplace u0 = -(s Laplace w + 2 grad s . grad w) (bounded but for r^(-1/3) at 0).
WEIGHT_A, WEIGHT_B = 0.5, 0.25


def _weight(x):
    """w, grad w (..., 2), Laplace w."""
    X, Y, a, b = x[..., 0], x[..., 1], WEIGHT_A, WEIGHT_B
    e = np.exp(a * X + b * Y)
    qx, qy = 1 - X * X, 1 - Y * Y
    q = qx * qy
    wx = e * (-2 * X * qy + a * q)
    wy = e * (-2 * Y * qx + b * q)
    lap = e * (-2 * qy - 4 * a * X * qy + a * a * q - 2 * qx - 4 * b * Y * qx + b * b * q)
    return e * q, np.stack([wx, wy], axis=-1), lap


def exact_zero_bc(x):
    """u0 = r^(2/3) sin(2 theta / 3) (1 - x^2)(1 - y^2) exp(x / 2 + y / 4): 0 on the boundary."""
    return exact(x) * _weight(x)[0]


def grad_zero_bc(x):
    w, gw, _ = _weight(x)
    return grad(x) * w[..., None] + exact(x)[..., None] * gw


def source_zero_bc(x):
    """f0 = -Laplace u0 = -(s Laplace w + 2 grad s . grad w)."""
    _, gw, lap = _weight(x)
    return -(exact(x) * lap + 2 * (grad(x) * gw).sum(-1))


def _bump_raw(x):
    q = ((x - GOAL_CENTER) ** 2).sum(-1) / GOAL_RADIUS ** 2
    inside = q < 1
    return np.where(inside, np.exp(-1.0 / np.where(inside, 1.0 - q, 1.0)), 0.0)


@functools.lru_cache(maxsize=None)
def _goal_quadrature(n_sub=32, n_pts=8):
    from adaptmg.fe.quadrature import gauss_legendre
    t, w = gauss_legendre(n_pts)
    a = GOAL_CENTER - GOAL_RADIUS
    hs = 2 * GOAL_RADIUS / n_sub
    xs = (np.arange(n_sub)[:, None] + t[None, :]).ravel() * hs
    ws = np.tile(w, n_sub) * hs
    X = np.stack(np.meshgrid(a[0] + xs, a[1] + xs, indexing="ij"), -1).reshape(-1, 2)
    W = np.outer(ws, ws).ravel()
    return X, W


@functools.lru_cache(maxsize=None)
def _bump_mass():
    X, W = _goal_quadrature()
    return float(W @ _bump_raw(X))


def goal_weight(x):
    """Mollifier w >= 0 with unit mass supported in the disc of radius GOAL_RADIUS."""
    return _bump_raw(np.asarray(x, dtype=float)) / _bump_mass()


def goal_exact() -> float:
    """J(u) = int w u for the exact solution (composite 32x32 sub-squares x 8x8 Gauss points)."""
    X, W = _goal_quadrature()
    return float(W @ (goal_weight(X) * exact(X)))


def solve(mesh, backend="cpu", rtol=1e-9, accel="cg"):
    """Q1 solution with exact Dirichlet data by geometric multigrid (V(2,2) Jacobi) + CG.
    On a mesh on the GPU the Dirichlet values (``exact`` at device points), the right-hand
    side and ``u`` stay on the device; otherwise ``u`` is a NumPy array."""
    space = Space(mesh, 1)
    ml = multigrid(space, assemble.stiffness, dirichlet="all", backend=backend)
    con = ml.constraints[-1].with_values(exact)    # the hierarchy's constraints (and row scale)
    A = ml.assembled
    on_device = mesh.backend.is_gpu
    rhs = con.rhs(mesh.backend.xp.zeros(space.num_dofs), A)
    t0 = time.perf_counter()
    x = ml.solve(rhs, rtol=rtol, accel=accel)
    ml.backend.synchronize()
    t_mg = time.perf_counter() - t0
    u = con.expand(mesh.backend.asarray(x) if on_device else to_host(x))
    return space, u, {"iterations": ml.last_iterations, "levels": len(ml.spaces), "t_mg": t_mg, "ml": ml}


def problem(estimator="residual", n=2, backend_dual=None, mesh_backend="cpu") -> AdaptiveProblem:
    """The L-shape as an :class:`AdaptiveProblem` (estimator "residual" or "dwr"; the coarse
    mesh on ``mesh_backend``: on "gpu" the whole loop runs on the device, residual estimator
    only -- the DWR estimator's Q2 dual space needs a host mesh)."""
    if estimator not in ("residual", "dwr"):
        raise ValueError(f"estimator must be 'residual' or 'dwr', got {estimator!r}")
    if estimator == "dwr" and mesh_backend != "cpu":
        raise ValueError("the DWR estimator (a Q2 dual space) needs mesh_backend='cpu'")
    Jex = goal_exact()

    def estimate(space, u, info):
        if estimator == "residual":
            eta = residual_indicators(space, u, f=0.0, backend=info["ml"].backend)
            return eta, float(np.sqrt((eta ** 2).sum())), {}
        eta, est, di = dwr_indicators(space, u, goal_weight, f=0.0, g=exact,
                                      backend=backend_dual or info["ml"].backend.name)
        Jh = float(assemble.load(space, goal_weight, quad_points=8) @ u)
        return eta, est, {"goal_error": Jex - Jh, "dual_iterations": di["dual_iterations"]}

    def error(space, u, info):           # on the solver's backend (the device on the GPU)
        e = errors(space, u, exact, grad, backend=info["ml"].backend)
        return {"H1": e["H1"], "L2": e["L2"]}

    def fields(space, u, info):          # the exact solution interpolated once per written step
        ex = space.interpolate(exact)
        return {"exact": ex, "error": ex - u}

    return AdaptiveProblem("lshape", coarse_mesh(n, mesh_backend), solve, estimate, error, fields)


def run(steps=12, backend="cpu", quiet=False, out=None, *, estimator="residual", strategy="doerfler",
        theta=0.5, max_dofs=None, mesh_backend=None, tie_rtol=None):
    """Adaptive (or ``strategy="uniform"``) Q1 solution; returns the dict of
    :func:`adaptmg.estimate.adaptive_loop` (history, mesh, space, u, eta).  ``mesh_backend``:
    where the mesh lives (:func:`mesh_backend_for`: by default on the GPU when ``backend``
    is the GPU, with the residual estimator; "cpu" keeps the host mesh)."""
    if mesh_backend is None and estimator == "dwr":
        mesh_backend = "cpu"
    mb = mesh_backend_for(backend, mesh_backend)
    return adaptive_loop(problem(estimator, mesh_backend=mb), steps=steps, strategy=strategy, theta=theta,
                         backend=backend, quiet=quiet, out=out, max_dofs=max_dofs, tie_rtol=tie_rtol)
