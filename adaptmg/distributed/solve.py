"""One-call distributed solves: partition, distributed hierarchy, multigrid-preconditioned CG.

:func:`solve` takes what :func:`adaptmg.multigrid` takes plus a right-hand side; on one
rank (or ``comm=None`` without mpi4py) it *is* the serial code path
(``multigrid(...).solve(..., accel="cg")``).  On several ranks the finest cells are cut
along the Morton curve (:mod:`.partition`); each rank builds the geometric levels with at
least ``agglomerate_below`` DoFs from its own cells plus a ghost layer (:mod:`.local`) and
the same small serial hierarchy below them (replicated mesh, see :mod:`.hierarchy`); a
coarser one of those levels with ``N_l`` DoFs works on ``P_l = min(P_{l+1}, max(1,
N_l // min_dofs_per_rank))`` ranks (the others own none of its DoFs; ``result.active_ranks``);
the Krylov solve is :func:`adaptmg.linalg.cg` (``accel``: or gmres / fgmres) on the owned
entries, preconditioned by one cycle of the one
:class:`~adaptmg.multilevel.MultilevelSolver` whose levels are the distributed ones
(``result.mg.solver``, :mod:`.hierarchy`), every inner product and norm completed by one
``Allreduce`` (:func:`adaptmg.linalg._vectorops.global_reductions` with
:func:`.comm.allreduce_sum`).  The result holds the global solution on every rank (one
``Allgatherv``) besides the local part.  ``result.ml`` is then the serial hierarchy of the
small levels only; ``result.mg.levels`` are all levels.  ``result.residuals``: the initial
and the final true residual norm (``||f||``, ``||f - K x||``).

GPU backend (``backend="gpu"``, or "auto" where a device is visible): every rank first
selects its device (:func:`.comm.select_device`: ``local_rank % device_count``); the small
serial hierarchy is built on it by every rank with :func:`adaptmg.multigrid`'s GPU path
(rank 0 runs its cycle), the distributed levels are set up on the device from the rank's
cells (:mod:`.hierarchy`: rows assembled and constrained there, :class:`~.csr.DistCSR` split
there, smoothers built on the device blocks);
a space on a mesh on the GPU (the mesh made after :func:`.comm.select_device`, on the
rank's device) keeps the whole set-up on the device (:mod:`.hierarchy`; ``b`` may then be
the CuPy load vector of :func:`adaptmg.assemble.load`);
the Krylov vectors and the cycle are CuPy arrays, halo exchanges go through host-staged MPI
(or NCCL when every rank has its own GPU; ``transport=``), reductions through one host
``Allreduce`` (host staging) or one ``ncclAllReduce`` on the device (NCCL: the inner
products stay on the device, the host waits once per CG iteration, for the stopping test).  ``result.u`` and ``result.x`` are host NumPy arrays (gathered) as on
the CPU; ``result.x_local`` (and the ``x`` given to ``callback``) is then a CuPy array.  Note
that :func:`adaptmg.multigrid`'s ``coarse_max_rows="auto"`` drops the levels below 2000 rows
on the GPU: pass ``coarse_max_rows=None`` for the CPU hierarchy.

:func:`solve_forest` is the same solve from a :class:`~.forest.DistributedForest`: every level
is set up from the forest's global-coarsening sequence (:mod:`.forest_levels`), so no rank
holds the whole fine mesh (Q1 scalar; Dirichlet values ``g`` lifted as the serial
:meth:`adaptmg.Constraints.rhs` lifts them; the result holds the owned parts, the global
vectors only with ``gather=True``).

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
from .. import linalg
from ..fe import Space
from ..linalg import ConvergenceWarning
from ..mesh import Mesh
from ..backend import get_backend, to_host
from ..multilevel.hierarchy import _value_dict, multigrid
from ..linalg._vectorops import global_norm, global_reductions
from .comm import agree, allreduce_sum, get_comm, guard, names_gpu, resolve_transport, select_device
from .nccl import start_nccl_communicator
from .hierarchy import DistributedHierarchy
from .serial_levels import (PendingSerialLevels, cut_and_own, first_setup, free_masks, hand_over, mask_finders,
                            setup_done)
from .partition import imbalance, level_ranks, partition_cells

__all__ = ["solve", "solve_forest", "solve_poisson", "resolve", "DistributedResult"]


@dataclass
class DistributedResult:
    """What :func:`solve` returns (the same on every rank except ``x_local``)."""
    u: np.ndarray                  # finite element nodal values H x (global, every rank)
    x: np.ndarray                  # constrained solution (global)
    x_local: Any                   # this rank's owned entries of x (a CuPy array on the GPU)
    iterations: int
    info: int                      # 0 converged, > 0 not converged (a ConvergenceWarning too)
    residuals: list                # one rank: the history; several: [||f||, ||f - K x||]
    size: int                      # number of ranks
    cell_ranks: Optional[np.ndarray] = None
    imbalance: float = 0.0         # max cells per rank / mean - 1
    timings: dict = field(default_factory=dict)   # setup (wall), setup_cpu, solve, halo seconds
    # (this rank); with the local set-up also the finest level's cells and phase seconds
    ml: Any = None                 # the serial hierarchy (replicated; with the local set-up only
    #                                the levels below the locally built ones, and where all of
    #                                them are agglomerated on rank 0 only there: the other ranks
    #                                hold a serial_levels.SerialLevelsOnRankZero summary)
    mg: Any = None                 # DistributedHierarchy (None on one rank); mg.solver the cycle
    active_ranks: list = field(default_factory=list)   # ranks per level (coarse -> fine): P_l
    u_local: Any = None            # solve_forest: nodal values H x of the owned nodes (host)
    #                                (partition.level_ranks), 1 on the levels agglomerated on rank 0


#: GPU defaults of ``agglomerate_below`` / ``min_dofs_per_rank``: a level's kernels cost about
#: the same below ~0.5M rows on one GPU (launch latency), while each distributed level adds
#: a halo exchange (tens of microseconds) to every smoothing step and residual; so levels
#: under 2^19 DoFs run on rank 0 and a distributed level keeps >= 2^18 DoFs per rank.
GPU_LEVEL_SIZES = (2 ** 19, 2 ** 18)
#: CPU defaults (ranks on cores: distributing pays down to small levels)
CPU_LEVEL_SIZES = (1000, 2000)


def level_sizes(agglomerate_below, min_dofs_per_rank, gpu):
    """``(agglomerate_below, min_dofs_per_rank)`` with "auto" resolved for the backend."""
    dflt = GPU_LEVEL_SIZES if gpu else CPU_LEVEL_SIZES
    return (dflt[0] if agglomerate_below == "auto" else agglomerate_below,
            dflt[1] if min_dofs_per_rank == "auto" else min_dofs_per_rank)


def _check_numbers(rtol, maxiter, accel, agglomerate_below, min_dofs_per_rank=None):
    m = min_dofs_per_rank
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0):
        return f"min_dofs_per_rank must be None, 'auto' or a non-negative integer, got {m!r}"
    a = agglomerate_below
    if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or a < 0:
        return f"agglomerate_below must be 'auto' or a non-negative integer, got {a!r}"
    if accel not in ("cg", "gmres", "fgmres"):
        return f"accel must be 'cg', 'gmres' or 'fgmres', got {accel!r}"
    if not (np.isscalar(rtol) and np.isfinite(rtol) and rtol > 0):
        return f"rtol must be a positive number, got {rtol!r}"
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 1:
        return f"maxiter must be a positive integer, got {maxiter!r}"
    return ""


def _check(space, b, rtol, maxiter, accel, min_dofs_per_rank=None, agglomerate_below=1000):
    msg = _check_numbers(rtol, maxiter, accel, agglomerate_below, min_dofs_per_rank)
    if msg:
        return msg
    if not isinstance(space, Space):
        return f"space must be an adaptmg Space, got {type(space).__name__}"
    xp = space.mesh.backend.xp                       # a device mesh: b may be a device vector
    b = xp.asarray(b) if xp is not np else np.asarray(b)
    if b.shape != (space.num_dofs,):
        return f"right-hand side must have shape ({space.num_dofs},), got {b.shape}"
    if not bool(xp.isfinite(b).all()):
        return "right-hand side contains NaN or Inf"
    return ""


def solve(space, assemble, b, *, comm=None, dirichlet="all", rtol=1e-10, maxiter=200,
          accel="cg", cycle="V", agglomerate_below="auto", min_dofs_per_rank="auto", weights=None,
          callback=None, local_setup=True, transport=None, on_device=False, matrix_free=False,
          **multigrid_kwargs) -> DistributedResult:
    """Solve the constrained system of ``assemble(space)`` with load vector ``b`` by CG
    preconditioned with geometric multigrid, distributed over ``comm``.

    Parameters
    ----------
    space, assemble, dirichlet, multigrid_kwargs : as for :func:`adaptmg.multigrid` (homogeneous
        Dirichlet values; ``backend`` "cpu" (the default here) or "gpu" (module doc); dtype
        float64; smoother "jacobi", "chebyshev" or "block_jacobi"; on several ranks
        ``threads`` defaults to 1, the ranks already share the cores).
    b : unconstrained load vector (num_dofs,), the same on every rank.
    comm : mpi4py communicator (default ``MPI.COMM_WORLD`` if mpi4py is installed).
    rtol, maxiter : stopping test ``||f - K x|| <= rtol ||f||``.
    accel : Krylov method: "cg", "gmres" or "fgmres" of :mod:`adaptmg.linalg`, their
        reductions through the hook (one Allreduce each).
    agglomerate_below : levels with fewer DoFs are gathered onto rank 0 ("auto": 1000 on the
        CPU, 2^19 on GPUs, :data:`GPU_LEVEL_SIZES`).
    min_dofs_per_rank : ("auto": 2000 on the CPU, 2^18 on GPUs) the finest level is on all ``P`` ranks; a coarser level with ``N_l >=
        agglomerate_below`` DoFs on ``P_l = min(P_{l+1}, max(1, N_l // min_dofs_per_rank))``
        ranks ``0 .. P_l - 1``, its cell partition folded onto them
        (:func:`~.partition.level_ranks`, :func:`~.partition.fold_cell_ranks`).  None or 0:
        every such level on all ranks.
    weights : per-cell partition weights (default 1 per cell).
    callback : ``callback(k, x_local)`` after each CG iteration (serial: ``callback(k, x)``).
    local_setup : on several ranks, build every geometric level with at least
        ``agglomerate_below`` DoFs from the rank's cells only (owned + ghost layer,
        :mod:`.local`; ``assemble`` is then called on cell-subset views of the level's
        space, :class:`~.local.CellSubset`) and the serial hierarchy below them; False:
        every rank builds the whole serial hierarchy (the first version).  Ignored with
        ``galerkin=True`` (the coarse operators need the whole finest matrix).
    transport : GPU backend only: the halo transport, "auto" (None: the environment variable
        ``ADAPTMG_HALO_TRANSPORT`` or "auto": NCCL when every rank has its own GPU, else host
        staging), "host" or "nccl" (:func:`.comm.resolve_transport`); ``result.mg.transport``
        tells which was used.
    on_device : GPU backend, several ranks: ``result.x`` and ``result.u`` stay on the device of
        the mesh (a mesh on the GPU; gathered there by ``ncclAllGather`` when the halo goes by
        NCCL) instead of host copies -- what a loop on a device mesh continues with (one rank:
        the serial path's arrays, on the device already).
    matrix_free : the operators of the locally built levels (the finest and every other one
        with at least ``agglomerate_below`` DoFs) applied without a matrix
        (:class:`~.matrix_free.DistMatrixFree`: ~100 bytes a DoF against ~330 for the
        assembled rows in 3-D, and no 2^31-entry limit on a rank's matrix); the small serial
        levels as usual.  Only for ``assemble=adaptmg.assemble.stiffness`` (coefficient 1) on
        a scalar Q1 space with the local set-up; on one rank too (it then takes the
        distributed code path on one rank instead of the serial one).  Meant for GPUs: the
        cell kernel costs about 1.4x the assembled SpMV there, while the host's NumPy cell
        sums are some 30-50x slower than SciPy's SpMV.
    """
    comm = get_comm(comm)
    size = 1 if comm is None else comm.Get_size()
    with guard(comm):
        gpu = _rank_backend(multigrid_kwargs.get("backend", "cpu"), comm).is_gpu
        agglomerate_below, min_dofs_per_rank = level_sizes(agglomerate_below, min_dofs_per_rank, gpu)
        msg = _check(space, b, rtol, maxiter, accel, min_dofs_per_rank, agglomerate_below)
        if not msg and transport not in (None, "auto", "host", "nccl"):
            msg = f"transport must be None, 'auto', 'host' or 'nccl', got {transport!r}"
        if not msg and not isinstance(matrix_free, (bool, np.bool_)):
            msg = f"matrix_free must be True or False, got {matrix_free!r}"
        if not msg and matrix_free:
            msg = _check_matrix_free(space, assemble, local_setup, multigrid_kwargs, comm)
        agree(comm, not msg, msg)
        t0, c0 = time.perf_counter(), time.process_time()
        multigrid_kwargs.setdefault("backend", "cpu")
        if gpu:
            dev = select_device(comm)  # local_rank % device_count, before any CuPy allocation
            on = getattr(getattr(space.mesh.points, "device", None), "id", None)
            agree(comm, on is None or on == dev,
                  f"the mesh lives on GPU {on}, but this rank works on GPU {dev}: make the mesh "
                  f"after adaptmg.distributed.comm.select_device(comm)")
        if size > 1:                   # ranks already share the node's cores: no set-up threads
            multigrid_kwargs.setdefault("threads", 1)
        local = (size > 1 or matrix_free) and local_setup and not multigrid_kwargs.get("galerkin", False)
        if local:
            return _solve_local(space, assemble, b, comm, dirichlet, rtol, maxiter, accel, cycle,
                                agglomerate_below, weights, callback, (t0, c0), multigrid_kwargs,
                                min_dofs_per_rank, transport, on_device, matrix_free=bool(matrix_free))
        ml = multigrid(space, assemble, dirichlet=dirichlet, **multigrid_kwargs)
        f = ml.constrain(_on_mesh(space, b))
        if size == 1:                                     # the serial code path
            ml.backend.synchronize()                      # the set-up's device work counted in it
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
                                                                     "halo": 0.0}, ml=ml,
                                     active_ranks=[1] * len(ml.levels))
        ranks = partition_cells(space.mesh, size, weights)
        mg = DistributedHierarchy(ml, ranks, comm, agglomerate_below,
                                  min_dofs_per_rank=min_dofs_per_rank, transport=transport)
        return _krylov_solve(comm, mg, mg.layout.scatter(to_host(f)), ranks, (t0, c0), accel, cycle, rtol,
                             maxiter, callback, lambda x: ml.expand(_on_mesh(space, x)), ml,
                             stacklevel=3, on_device=on_device)


def resolve(mg, f_loc, *, accel="cg", cycle="V", rtol=1e-8, maxiter=200, callback=None,
            true_residual=True):
    """Solve again on a set-up hierarchy ``mg`` (``result.mg``; collective): ``adaptmg.linalg.<accel>``
    on the owned entries ``f_loc`` (on ``mg``'s backend, e.g. ``mg.constrain_local(b)``) from
    zero, preconditioned by one ``cycle`` of ``mg.solver`` (its fixed buffers,
    :meth:`~adaptmg.multilevel.MultilevelSolver.buffered_cycle`), every reduction global.
    Returns ``(x_local, info, iterations, [||f||, ||f - A x||])`` (iterations: callback calls
    -- per iteration for cg, per inner iteration for (f)gmres; ``callback(k, arg)``).
    ``true_residual=False`` leaves out the reported final residual (one distributed product:
    the Krylov method has already checked the true residual against ``rtol`` when ``info ==
    0``); the list is then ``[||f||]``."""
    comm, xp = mg.comm, mg.backend.xp
    cyc = mg.solver.buffered_cycle(cycle)

    def M(r):                          # z = M r: a new array (the Krylov solver keeps it)
        xp.copyto(cyc.b, r)
        z = xp.empty_like(r)
        cyc.run_eager(z)
        return z

    its = [0]

    def cb(arg):
        its[0] += 1
        if callback is not None:
            callback(its[0], arg)

    kw = {"callback_type": "pr_norm"} if accel in ("gmres", "fgmres") else {}
    with global_reductions(allreduce_sum(comm, mg.transport)):     # NCCL: on the device
        x, info = getattr(linalg, accel)(mg.A, f_loc, rtol=rtol, atol=0.0, maxiter=maxiter, M=M,
                                         callback=cb, **kw)
        res = [global_norm(xp, f_loc)]
        if true_residual:
            r = f_loc.copy()
            mg.A(x, r, -1.0, 1.0)
            res.append(global_norm(xp, r))
    return x, info, its[0], res


def _timed_resolve(comm, mg, f_loc, start, accel, cycle, rtol, maxiter, callback, stacklevel):
    """:func:`resolve` once ``mg`` is set up (``start``: the set-up's wall and CPU clocks):
    ``(x_loc, info, iterations, residuals, timings)``, one agreed warning when it does not
    converge; ``f_loc`` (host) is moved to the hierarchy's backend."""
    t0, c0 = start
    f_loc = mg.backend.asarray(f_loc)
    mg.backend.synchronize()           # the set-up's device work counted in it
    t_setup, c_setup = time.perf_counter() - t0, time.process_time() - c0
    comm.Barrier()
    t1 = time.perf_counter()
    mg.timer.reset()
    x_loc, info, its, res = resolve(mg, f_loc, accel=accel, cycle=cycle, rtol=rtol, maxiter=maxiter,
                                    callback=callback)
    t2 = time.perf_counter()
    if info != 0:                      # the same reduced numbers on every rank: all warn
        warnings.warn(ConvergenceWarning(
            f"distributed multigrid-{accel} did not reach rtol={rtol:g} in {its} iterations "
            f"(info={info})"), stacklevel=stacklevel + 1)
    return x_loc, info, its, res, {"setup": t_setup, "setup_cpu": c_setup, "solve": t2 - t1,
                                   "halo": mg.timer.seconds}


def _krylov_solve(comm, mg, f_loc, ranks, start, accel, cycle, rtol, maxiter, callback, expand, ml,
                  extra_timings=None, stacklevel=3, on_device=False):
    """The distributed multigrid-Krylov solve once ``mg`` is set up (both set-up paths of
    :func:`solve`): set-up and solve timings, one agreed warning when it does not converge,
    the solution gathered on every rank (``expand``: nodal values of the constrained ``x``);
    ``f_loc`` (host) is moved to the hierarchy's backend, the gathered ``x`` and ``u`` are host
    arrays (``on_device``: where the gather and ``expand`` left them)."""
    x_loc, info, its, res, timings = _timed_resolve(comm, mg, f_loc, start, accel, cycle, rtol, maxiter,
                                                    callback, stacklevel)
    # a device layout's: on its device (NCCL: gathered there)
    x = mg.layout.allgather(x_loc, device=True, transport=getattr(mg, "transport", "mpi"))
    u = expand(x)
    if not on_device:
        u, x = to_host(u), to_host(x)
    size = comm.Get_size()
    return DistributedResult(u=u, x=x, x_local=x_loc, iterations=its, info=info,
                             residuals=res, size=size, cell_ranks=ranks, imbalance=float(imbalance(ranks, size)),
                             timings={**timings, **(extra_timings or {})},
                             ml=ml, mg=mg, active_ranks=list(mg.active_ranks))


def solve_forest(forest, assemble=_assemble.stiffness, f=1.0, *, g=None, comm=None, dirichlet="all", rtol=1e-10,
                 maxiter=200, accel="cg", cycle="V", agglomerate_below="auto", min_dofs_per_rank="auto",
                 callback=None, transport=None, gather=False, **multigrid_kwargs) -> DistributedResult:
    """Solve the constrained Q1 system of ``assemble`` on a distributed forest, load of the
    source ``f``, by ``accel`` preconditioned with the multigrid set up from the forest
    (:class:`.forest_levels.ForestHierarchy`: no rank holds the whole fine mesh).

    Parameters
    ----------
    forest : :class:`~.forest.DistributedForest` (collective: every rank of its communicator).
    assemble : ``assemble(space)`` -> Q1 scalar matrix (default the stiffness matrix).
    f : source of the load vector (constant, callable ``f(x)`` of the points, or one value
        per owned leaf in curve order).
    g, dirichlet : the Dirichlet values on the Dirichlet nodes of ``dirichlet`` (its boundary
        faces' nodes; None, "all", ids/names, ``where``): a number or a callable ``g(x)`` of
        the points (k, d) -> (k,), evaluated at the owned Dirichlet nodes of the forest's local
        mesh; None: zero, or the values of a ``{boundary: value}`` spec ``dirichlet`` (not
        both).  Lifted as :meth:`adaptmg.Constraints.rhs` lifts them, ``f = Z H^T (b - A H g)
        + s g`` (:func:`.forest_rows.owned_constrained_load`): ``x`` holds ``g`` at the
        Dirichlet nodes, ``u_local = H x`` also at the hanging boundary nodes, which follow
        their parents as in the serial code.
    comm : None or the forest's communicator.
    rtol, maxiter, accel, cycle, callback, transport : as for :func:`solve`.
    agglomerate_below : levels with fewer global nodes go to rank 0 ("auto": 1000 on the CPU,
        2^19 on GPUs).
    min_dofs_per_rank : as for :func:`solve` ("auto": 2000 on the CPU, 2^18 on GPUs; None or 0:
        every distributed level on all ranks): a coarser forest level with ``N_l`` nodes is
        re-cut onto ``P_l = min(P_{l+1}, max(1, N_l // min_dofs_per_rank))`` ranks
        (``result.active_ranks``).
    gather : also gather ``x`` and ``u`` (global, O(N) on every rank); default only the owned
        parts ``x_local`` / ``u_local`` (global ids ``result.mg.layout.rows``).
    multigrid_kwargs : for :func:`adaptmg.multigrid` (``backend`` "cpu" (default) or "gpu",
        ``smoother`` jacobi / chebyshev, ``presmooth``, ...; rank 0's serial hierarchy).

    ``result.timings``: set-up (wall, CPU), solve, halo seconds and the set-up phases
    (``ForestHierarchy.setup_stats``, ``rhs_s``) of this rank."""
    from .forest import DistributedForest
    from .forest_levels import ForestHierarchy
    if not isinstance(forest, DistributedForest):
        raise TypeError(f"solve_forest expects a DistributedForest, got {type(forest).__name__}")
    fcomm = forest.comm
    if comm is not None and comm is not fcomm:
        raise ValueError("solve_forest: comm must be the forest's communicator (or None)")
    comm = fcomm
    with guard(comm):
        gpu = _rank_backend(multigrid_kwargs.get("backend", "cpu"), comm).is_gpu
        agglomerate_below, min_dofs_per_rank = level_sizes(agglomerate_below, min_dofs_per_rank, gpu)
        msg = _check_numbers(rtol, maxiter, accel, agglomerate_below, min_dofs_per_rank)
        if not msg and transport not in (None, "auto", "host", "nccl"):
            msg = f"transport must be None, 'auto', 'host' or 'nccl', got {transport!r}"
        if not msg:
            msg = _check_values(g, dirichlet)
        agree(comm, not msg, msg)
        t0, c0 = time.perf_counter(), time.process_time()
        multigrid_kwargs.setdefault("backend", "cpu")
        if gpu:
            select_device(comm)
        if comm.Get_size() > 1:
            multigrid_kwargs.setdefault("threads", 1)
        mg = ForestHierarchy(forest, assemble, dirichlet=dirichlet, agglomerate_below=agglomerate_below,
                             min_dofs_per_rank=min_dofs_per_rank, transport=transport, keep_assembled=g is not None or _value_dict(dirichlet),
                             **multigrid_kwargs)
        t1 = time.perf_counter()
        f_loc = mg.load_local(f, g)
        rhs = time.perf_counter() - t1
        x_loc, info, its, res, timings = _timed_resolve(comm, mg, f_loc, (t0, c0), accel, cycle, rtol,
                                                        maxiter, callback, stacklevel=2)
        u_loc = mg.expand_local(x_loc)
        x = u = None
        if gather:
            x, u = mg.layout.allgather(to_host(x_loc)), mg.layout.allgather(u_loc)
        counts = np.asarray(comm.allgather(forest.num_owned), dtype=float)
        return DistributedResult(u=u, x=x, x_local=x_loc, u_local=u_loc, iterations=its, info=info,
                                 residuals=res, size=comm.Get_size(),
                                 imbalance=float(counts.max() / counts.mean() - 1.0),
                                 timings={**timings, **mg.setup_stats, "rhs_s": rhs}, ml=mg.ml, mg=mg,
                                 active_ranks=list(mg.active_ranks))


def _rank_backend(backend, comm):
    """``get_backend(backend)``, this rank's device selected first where ``backend`` names the
    GPU (:func:`.comm.names_gpu`): making the GPU backend must not open a context on device 0."""
    if names_gpu(backend):
        select_device(comm)
    return get_backend(backend)


def _check_values(g, dirichlet):
    """'' or what is wrong with the Dirichlet values ``g`` of :func:`solve_forest`."""
    if g is None:
        return ""
    if not (callable(g) or (np.ndim(g) == 0 and np.isreal(g) and not isinstance(g, (bool, str)))):
        return f"g must be None, a number or a callable g(x) of the points, got {type(g).__name__}"
    if not callable(g) and not np.isfinite(g):
        return f"g must be finite, got {g!r}"
    if _value_dict(dirichlet):
        return "give the Dirichlet values either as g or in a {boundary: value} dirichlet spec, not both"
    if dirichlet is None:
        return "g needs Dirichlet boundaries (dirichlet is None)"
    return ""


def _split_hierarchy(space, max_levels, agglomerate_below):
    """The spaces of the global-coarsening hierarchy of ``space`` (coarse -> fine), split into
    the top space of the serial part and the locally built spaces above it ('' or a message).

    The serial part ends at the finest level with fewer than ``agglomerate_below`` DoFs (those
    go to rank 0 anyway), at least the coarsest level; the finest level is always local."""
    if max_levels is not None and max_levels < 2:
        return None, None, f"distributed multigrid needs max_levels >= 2, got {max_levels!r}"
    meshes = space.mesh.hierarchy(max_levels=max_levels)
    if len(meshes) < 2:
        return None, None, ("distributed multigrid needs at least two levels (the finest one is "
                            "distributed, the coarsest one lives on rank 0); the mesh has no "
                            "refinement history to coarsen")
    # the serial top found from the finest level down: the coarser meshes are never numbered
    # here (a mesh of the hierarchy numbers its nodes on first use; rank 0's serial hierarchy
    # makes its own below the top): two H200, 21M DoFs a rank, 24 -> 19 ms on every rank
    spaces = []
    for m in meshes[-2::-1]:
        spaces.append(Space(m, space.degree, space.components))
        if spaces[-1].num_dofs < agglomerate_below:
            break
    return spaces[-1], spaces[-2::-1] + [space], ""


def _check_matrix_free(space, assemble, local_setup, kw, comm):
    """'' or why ``matrix_free=True`` cannot serve this solve."""
    if comm is None:
        return "matrix_free=True takes the distributed code path: it needs mpi4py, also on one rank"
    if assemble is not _assemble.stiffness:
        return ("matrix_free=True applies the Q1 Laplacian itself: assemble must be "
                f"adaptmg.assemble.stiffness, got {getattr(assemble, '__name__', assemble)!r}")
    if space.degree != 1 or space.components != 1:
        return (f"matrix_free=True needs a scalar Q1 space, got degree {space.degree} with "
                f"{space.components} components")
    if not local_setup or kw.get("galerkin", False):
        return "matrix_free=True needs the local set-up (local_setup=True, galerkin=False)"
    return ""


def _solve_local(space, assemble, b, comm, dirichlet, rtol, maxiter, accel, cycle, agglomerate_below,
                 weights, callback, start, kw, min_dofs_per_rank=None, transport=None, on_device=False,
                 matrix_free=False):
    """:func:`solve` on several ranks with the large geometric levels set up from the rank's
    cells only (``start``: wall and CPU clocks at the start of the set-up).

    Where every level of the serial hierarchy below them is agglomerated on rank 0 (its top
    has fewer than ``agglomerate_below`` DoFs) and there are several ranks, rank 0 finds the
    free masks of the local levels (but the second finest level's,
    :func:`.serial_levels.mask_finders`) while rank 1 finds that and the top's, cuts the mesh
    and finds the local levels' owners, each handing its arrays to the others
    (:func:`.serial_levels.hand_over`), and rank 0 alone builds the serial levels, later,
    beside its finest level's assembly (:class:`.serial_levels.PendingSerialLevels`; the
    others then hold their summary, :class:`.serial_levels.SerialLevelsOnRankZero`).  Before,
    rank 0 built them first while rank 1 found the masks and the cut (two H200 at 21M DoFs a
    rank, ~65 ms each, the masks and the cut about as long as the serial levels)."""
    t0, c0 = start
    max_levels = kw.get("max_levels")
    ok = max_levels is None or (isinstance(max_levels, (int, np.integer)) and not isinstance(max_levels, bool))
    agree(comm, ok, f"max_levels must be a positive integer or None, got {max_levels!r}")
    be = get_backend(kw.get("backend", "cpu"))
    transport = resolve_transport(comm, transport, be)
    if transport == "nccl":
        # made by every rank together, before ranks 0 and 1 use it; a process's first NCCL
        # communicator (~0.5 s) is made on a thread while the hierarchy below is set up
        start_nccl_communicator(comm)
    t_split = time.perf_counter()
    top, spaces, msg = _split_hierarchy(space, max_levels, agglomerate_below)
    agree(comm, not msg, msg)
    t_split = time.perf_counter() - t_split
    ckw = dict(kw)
    if max_levels is not None:
        ckw["max_levels"] = max_levels - len(spaces)
    size, rank = comm.Get_size(), comm.Get_rank()
    ownership = None
    if size > 1 and top.num_dofs < agglomerate_below:
        t1 = time.perf_counter()
        # the serial levels on rank 0 (.serial_levels): where the finest local level's
        # assembly leaves room beside it, built there, rank 0 finding the free masks (rank 1
        # the top's and the second finest level's) meanwhile; else -- and in a process's
        # first set-up -- now, rank 1 finding the masks; rank 1 cuts the mesh and finds the
        # owners; then each hands its arrays to the others
        ml = PendingSerialLevels(top, None, lambda: multigrid(top, assemble, dirichlet=dirichlet, **ckw),
                                 space.components, ckw, rank, be)
        beside = DistributedHierarchy.serial_beside_finest(be, matrix_free) and not first_setup(comm)
        levels = [top] + spaces
        finders = mask_finders(len(levels), beside)
        if not beside:
            ml.build("before the local levels")
        mine = [s for s, q in zip(levels, finders) if q == rank]
        masks = free_masks(mine, dirichlet) if mine else None
        t2 = time.perf_counter()
        nranks = level_ranks([s.num_dofs for s in spaces], size, 0, min_dofs_per_rank)
        cut = cut_and_own(space, spaces, size, weights, nranks) if rank == 1 else None
        t3 = time.perf_counter()
        ranks, ownership, masks = hand_over(comm, space, top, spaces, nranks, cut, masks, transport, finders)
        frees = masks[1:]
        ml.constraints[-1].free = masks[0]
        t4 = time.perf_counter()
        # coarse_hierarchy_s: the mesh hierarchy and its spaces (mesh_hierarchy_s; rank 0's
        # serial levels: the hierarchy's serial_build_s); frees_s: the free masks (or rank
        # 0's serial levels, built first); partition_s: the cut and the local levels' owners
        # (rank 1); handover_s: the two passed to the other ranks
        phases = {"coarse_hierarchy_s": t_split, "mesh_hierarchy_s": t_split,
                  "frees_s": t2 - t1, "partition_s": t3 - t2, "handover_s": t4 - t3}
    else:
        ml = multigrid(top, assemble, dirichlet=dirichlet, **ckw)       # the serial levels below
        t_coarse = time.perf_counter() - t0
        t1 = time.perf_counter()
        frees = free_masks(spaces, dirichlet)
        t2 = time.perf_counter()
        ranks = partition_cells(space.mesh, size, weights)
        t3 = time.perf_counter()
        # coarse_hierarchy_s: everything before the free masks (device selection, the mesh
        # hierarchy and its spaces -- mesh_hierarchy_s --, the serial levels below)
        phases = {"coarse_hierarchy_s": t_coarse, "mesh_hierarchy_s": t_split, "frees_s": t2 - t1,
                  "partition_s": t3 - t2}
    t4 = time.perf_counter()
    mg = DistributedHierarchy(ml, ranks, comm, agglomerate_below,
                              local=dict(spaces=spaces, assemble=assemble, frees=frees,
                                         matrix_free=matrix_free, ownership=ownership),
                              min_dofs_per_rank=min_dofs_per_rank, transport=transport)
    setup_done()
    t5 = time.perf_counter()
    f_loc = mg.constrain_local(b)
    phases["rhs_s"] = time.perf_counter() - t5
    return _krylov_solve(comm, mg, f_loc, ranks, (t0, c0), accel, cycle, rtol,
                         maxiter, callback, lambda x: space.H @ _on_mesh(space, x), mg.ml,
                         extra_timings={**phases, **mg.setup_stats},
                         stacklevel=4, on_device=on_device)


def _on_mesh(space, v):
    """``v`` as a float vector of the array module of ``space``'s mesh (moved to a device mesh's
    device; a host mesh takes a host copy)."""
    be = space.mesh.backend
    return be.asarray(v, dtype=float) if be.is_gpu else np.asarray(to_host(v), dtype=float)


def solve_poisson(mesh, f=1.0, *, degree=1, comm=None, **kwargs) -> DistributedResult:
    """``-Laplace u = f`` on ``mesh`` (Q``degree``), ``u = 0`` on the boundary: :func:`solve` with
    the stiffness matrix and the load of ``f`` (constant, per-cell array or callable f(x))."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"solve_poisson expects an adaptmg Mesh, got {type(mesh).__name__}")
    space = Space(mesh, degree)
    return solve(space, _assemble.stiffness, _assemble.load(space, f), comm=comm, **kwargs)
