"""One-call distributed solves: partition, distributed hierarchy, multigrid-preconditioned CG.

:func:`solve` takes what :func:`adaptmg.multigrid` takes plus a right-hand side; on one
rank (or ``comm=None`` without mpi4py) it *is* the serial code path
(``multigrid(...).solve(..., accel="cg")``).  On several ranks every rank builds the
same serial hierarchy (replicated mesh, see :mod:`.multigrid`), the finest cells are cut
along the Morton curve (:mod:`.partition`), and CG with the distributed multigrid cycle
runs on the owned entries (:mod:`.krylov`).  The result holds the global solution on
every rank (one ``Allgatherv``) besides the local part.

Failures: argument errors are agreed on by all ranks (:func:`.comm.agree`, the same
``ValueError`` everywhere); any other exception on one rank -- including one raised by
``callback`` or ``assemble`` -- aborts all ranks through :class:`.comm.guard`.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .. import assemble as _assemble
from ..fe import Space
from ..linalg import ConvergenceWarning
from ..mesh import Mesh
from ..multilevel.hierarchy import multigrid
from .comm import agree, get_comm, guard
from .krylov import krylov
from .multigrid import DistributedMultigrid
from .partition import imbalance, partition_cells

__all__ = ["solve", "solve_poisson", "DistributedResult"]


@dataclass
class DistributedResult:
    """What :func:`solve` returns (the same on every rank except ``x_local``)."""
    u: np.ndarray                  # finite element nodal values H x (global, every rank)
    x: np.ndarray                  # constrained solution (global)
    x_local: np.ndarray            # this rank's owned entries of x
    iterations: int
    info: int                      # 0 converged, > 0 not converged (a ConvergenceWarning too)
    residuals: list
    size: int                      # number of ranks
    cell_ranks: Optional[np.ndarray] = None
    imbalance: float = 0.0         # max cells per rank / mean - 1
    timings: dict = field(default_factory=dict)   # setup, solve, halo seconds (this rank)
    ml: Any = None                 # the serial hierarchy (replicated)
    mg: Any = None                 # DistributedMultigrid (None on one rank)


def _check(space, b, rtol, maxiter, accel):
    if accel not in ("cg", "gmres", "fgmres"):
        return f"accel must be 'cg', 'gmres' or 'fgmres', got {accel!r}"
    if not isinstance(space, Space):
        return f"space must be an adaptmg Space, got {type(space).__name__}"
    b = np.asarray(b)
    if b.shape != (space.num_dofs,):
        return f"right-hand side must have shape ({space.num_dofs},), got {b.shape}"
    if not np.isfinite(b).all():
        return "right-hand side contains NaN or Inf"
    if not (np.isscalar(rtol) and np.isfinite(rtol) and rtol > 0):
        return f"rtol must be a positive number, got {rtol!r}"
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 1:
        return f"maxiter must be a positive integer, got {maxiter!r}"
    return ""


def solve(space, assemble, b, *, comm=None, dirichlet="all", rtol=1e-10, maxiter=200,
          accel="cg", cycle="V", agglomerate_below=1000, weights=None, callback=None,
          **multigrid_kwargs) -> DistributedResult:
    """Solve the constrained system of ``assemble(space)`` with load vector ``b`` by CG
    preconditioned with geometric multigrid, distributed over ``comm``.

    Parameters
    ----------
    space, assemble, dirichlet, multigrid_kwargs : as for :func:`adaptmg.multigrid` (homogeneous
        Dirichlet values; CPU backend; smoother "jacobi" or "chebyshev"; on several ranks
        ``threads`` defaults to 1, the ranks already share the cores).
    b : unconstrained load vector (num_dofs,), the same on every rank.
    comm : mpi4py communicator (default ``MPI.COMM_WORLD`` if mpi4py is installed).
    rtol, maxiter : stopping test ``||f - K x|| <= rtol ||f||``.
    accel : Krylov method (:func:`.krylov.krylov`): "cg" always; "gmres", "fgmres" once
        adaptmg.linalg routes its norms through the reduction hook.
    agglomerate_below : levels with fewer DoFs are gathered onto rank 0.
    weights : per-cell partition weights (default 1 per cell).
    callback : ``callback(k, x_local)`` after each CG iteration (serial: ``callback(k, x)``).
    """
    comm = get_comm(comm)
    size = 1 if comm is None else comm.Get_size()
    with guard(comm):
        msg = _check(space, b, rtol, maxiter, accel)
        agree(comm, not msg, msg)
        t0 = time.perf_counter()
        multigrid_kwargs.setdefault("backend", "cpu")
        if size > 1:                   # ranks already share the node's cores: no set-up threads
            multigrid_kwargs.setdefault("threads", 1)
        ml = multigrid(space, assemble, dirichlet=dirichlet, **multigrid_kwargs)
        f = ml.constrain(np.asarray(b, dtype=float))
        if size == 1:                                     # the serial code path
            t1 = time.perf_counter()
            its = [0]

            def count(xk):
                its[0] += 1
                if callback is not None:
                    callback(its[0], xk)

            res = []
            x = ml.solve(f, rtol=rtol, maxiter=maxiter, accel=accel, cycle=cycle,
                         callback=count, residuals=res)
            t2 = time.perf_counter()
            info = 0 if res[-1] <= rtol * float(np.linalg.norm(f)) * (1 + 1e-8) else maxiter
            return DistributedResult(u=ml.expand(x), x=x, x_local=x, iterations=its[0], info=info,
                                     residuals=res, size=1, timings={"setup": t1 - t0, "solve": t2 - t1,
                                                                     "halo": 0.0}, ml=ml)
        ranks = partition_cells(space.mesh, size, weights)
        mg = DistributedMultigrid(ml, ranks, comm, agglomerate_below)
        f_loc = mg.layout.scatter(f)
        comm.Barrier()
        t1 = time.perf_counter()
        mg.timer.reset()
        x_loc, info, its, res = krylov(comm, accel, mg.A, f_loc, M=lambda r: mg.precondition(r, cycle),
                                       rtol=rtol, maxiter=maxiter, callback=callback)
        t2 = time.perf_counter()
        if info != 0:                  # the same reduced numbers on every rank: all warn
            warnings.warn(ConvergenceWarning(
                f"distributed multigrid-{accel} did not reach rtol={rtol:g} in {its} iterations "
                f"(info={info})"), stacklevel=2)
        x = mg.layout.allgather(x_loc)
        return DistributedResult(u=ml.expand(x), x=x, x_local=x_loc, iterations=its, info=info,
                                 residuals=res, size=size, cell_ranks=ranks,
                                 imbalance=imbalance(ranks, size),
                                 timings={"setup": t1 - t0, "solve": t2 - t1, "halo": mg.timer.seconds},
                                 ml=ml, mg=mg)


def solve_poisson(mesh, f=1.0, *, degree=1, comm=None, **kwargs) -> DistributedResult:
    """``-Laplace u = f`` on ``mesh`` (Q``degree``), ``u = 0`` on the boundary: :func:`solve` with
    the stiffness matrix and the load of ``f`` (constant, per-cell array or callable f(x))."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"solve_poisson expects an adaptmg Mesh, got {type(mesh).__name__}")
    space = Space(mesh, degree)
    return solve(space, _assemble.stiffness, _assemble.load(space, f), comm=comm, **kwargs)
