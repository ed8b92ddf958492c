r"""Poisson on a locally refined L-shaped mesh, solved with multigrid-preconditioned CG.

.. math::  -\Delta u = f \ \text{in}\ \Omega = (-1,1)^2 \setminus [0,1)\times(-1,0],
           \qquad u = 0 \ \text{on}\ \partial\Omega,

with the exact solution :math:`u = a(x)\,a(y)`, :math:`a(s) = s(1-s^2)`, which
vanishes on the whole boundary of the L (including the two edges at the
re-entrant corner), so :math:`f = -\Delta u = 6x\,a(y) + 6y\,a(x)`.

Mesh: the 3 coarse squares of the L, refined ``refine`` times uniformly and then
``local`` times in the cells touching the disc of radius ``radius`` around the
re-entrant corner (2:1 closure adds the transition cells, so the mesh has
hanging nodes).  Q1 (or Q2) elements; geometric multigrid on the global
coarsening hierarchy (Jacobi V(2,2), dense coarse solve) inside CG to
``rtol``.  The summary reports DoFs, levels, hanging nodes, CG iterations,
setup/solve times and the L2/H1 errors against the exact solution.

This is the problem-independent demo of ``adaptmg run poisson``.  Started by an MPI
launcher (``mpiexec -n 4 python -m adaptmg run poisson``) it solves with
:func:`adaptmg.distributed.solve` (Morton partition, distributed multigrid-CG; CPU), and
only rank 0 prints.
"""
from __future__ import annotations

import time

import numpy as np

import adaptmg
from adaptmg import Mesh, Space, assemble
from adaptmg.backend import get_backend, to_host
from adaptmg.distributed.comm import launched_rank, launched_size
from adaptmg.fe.norms import errors

__all__ = ["run", "make_mesh", "exact", "grad", "source"]


def _a(s):
    return s * (1.0 - s * s)


def _da(s):
    return 1.0 - 3.0 * s * s


def exact(x):
    return _a(x[..., 0]) * _a(x[..., 1])


def grad(x):
    return np.stack([_da(x[..., 0]) * _a(x[..., 1]), _a(x[..., 0]) * _da(x[..., 1])], axis=-1)


def source(x):
    return 6.0 * x[..., 0] * _a(x[..., 1]) + 6.0 * x[..., 1] * _a(x[..., 0])


def make_mesh(refine: int = 4, local: int = 3, radius: float = 0.25) -> Mesh:
    """L-shaped mesh: 3 unit squares, ``refine`` uniform and ``local`` corner refinements."""
    pts = np.array([[-1, -1], [0, -1], [-1, 0], [0, 0], [1, 0], [-1, 1], [0, 1], [1, 1]], float)
    cells = np.array([[0, 1, 2, 3], [2, 3, 5, 6], [3, 4, 6, 7]])
    mesh = Mesh.from_cells(pts, cells)
    for _ in range(refine):
        mesh = mesh.refine()
    for _ in range(local):
        X = mesh.points[mesh.cells]                           # (nc, 4, 2)
        near = (np.linalg.norm(X, axis=2) <= radius).any(axis=1)
        mesh = mesh.refine(near)
    return mesh


def _check_int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return int(v)


def run(refine: int = 6, local: int = 3, degree: int = 1, rtol: float = 1e-10,
        radius: float = 0.25, *, backend="auto", quiet: bool = False, out=None) -> dict:
    """Solve the L-shape Poisson problem; return a dict with fields, mesh, timings, error.

    Returns ``fields`` ({"u": FE solution, "u_exact": interpolant}, DoF vectors
    of ``space``), ``mesh``, ``space``, ``timings`` ({"mesh", "setup", "solve",
    "error", "sum"} in seconds), ``error`` ({"L2", "H1"}), ``iterations``,
    ``residuals`` (CG residual history), ``dofs``, ``levels``, ``hanging``,
    ``backend``.  ``out`` is accepted for the CLI convention and ignored (the
    CLI writes files).
    """
    refine = _check_int("refine", refine, 0, 12)
    local = _check_int("local", local, 0, 20)
    degree = _check_int("degree", degree, 1, 2)
    if not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise ValueError(f"rtol must be a number in (0, 1), got {rtol!r}")
    if not (isinstance(radius, (int, float)) and radius > 0):
        raise ValueError(f"radius must be a positive number, got {radius!r}")
    ranks = launched_size()
    if ranks > 1 and backend != "gpu":
        backend = "cpu"       # distributed runs use the CPU/MPI path unless the GPU is asked for
    # on several ranks the distributed solve picks each rank's device first (node-local rank)
    be = get_backend(backend) if ranks == 1 or backend != "gpu" else None
    t = {}
    t0 = time.perf_counter()
    mesh = make_mesh(refine, local, radius)
    space = Space(mesh, degree=degree)
    t["mesh"] = time.perf_counter() - t0

    if ranks > 1:          # started by mpiexec: the distributed solve (CPU/MPI, or GPU per rank)
        from adaptmg.distributed import solve as distributed_solve
        dr = distributed_solve(space, assemble.stiffness, assemble.load(space, source),
                               rtol=rtol, maxiter=200, backend=backend)
        be = get_backend(backend)
        ml, res, u, its = dr.ml, dr.residuals, dr.u, dr.iterations
        nlevels = len(dr.mg.levels)           # dr.ml holds only the small serial levels
        t["setup"], t["solve"] = dr.timings["setup"], dr.timings["solve"]
        t0 = time.perf_counter()
    else:
        t0 = time.perf_counter()
        ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be)
        b = ml.constrain(assemble.load(space, source))
        be.synchronize()
        t["setup"] = time.perf_counter() - t0

        res = []
        t0 = time.perf_counter()
        x = ml.solve(be.asarray(b), rtol=rtol, accel="cg", residuals=res, maxiter=200)
        be.synchronize()
        t["solve"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        u = np.asarray(to_host(ml.expand(x)))
        its = len(res) - 1
        nlevels = len(ml.levels)
    err = errors(space, u, exact, grad)
    t["error"] = time.perf_counter() - t0
    t["sum"] = sum(t.values())
    out_dict = dict(fields={"u": u, "u_exact": space.interpolate(exact)}, mesh=mesh, space=space,
                    timings=t, error={k: float(v) for k, v in err.items()},
                    iterations=its, residuals=[float(r) for r in res],
                    dofs=int(space.num_dofs), levels=nlevels,
                    hanging=int(mesh.num_hanging_nodes), backend=be.name, ranks=ranks)
    if not quiet and launched_rank() == 0:
        on = f", {ranks} MPI ranks" if ranks > 1 else ""
        print(f"poisson (L-shape, Q{degree}, backend={be.name}{on}): {space.num_dofs} DoFs, "
              f"{mesh.num_cells} cells, {mesh.num_hanging_nodes} hanging nodes, "
              f"{nlevels} levels")
        print(f"  CG + multigrid V(2,2): {its} iterations to rtol {rtol:g}")
        print("  " + "  ".join(f"{k} {v:.3f} s" for k, v in t.items()))
        print(f"  error vs exact: L2 {err['L2']:.3e}, H1 {err['H1']:.3e}")
    return out_dict
