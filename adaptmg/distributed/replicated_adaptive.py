r"""The adaptive loop solve -> estimate -> mark -> refine with the mesh replicated on every rank
(on the GPU: a device mesh on every rank's device) and the solve distributed over the ranks.

Step :math:`\ell` on the mesh :math:`\mathcal T_\ell` (every phase collective):

1. **Solve** :math:`-\Delta u = f`, :math:`u = 0` on the Dirichlet boundary, Q1, multigrid-CG
   by :func:`.solve.solve` with the local set-up: the cells are cut along the Morton curve of
   this step's mesh (the *repartition*, :func:`.partition.partition_cells`), each rank
   assembles, constrains and transfers the rows of its own cells only
   (:mod:`.local`), the levels below ``agglomerate_below`` live on rank 0; the solution is
   gathered on every rank (on the GPU on the devices: ``ncclAllGather`` when the halo goes by
   NCCL, ``solve(..., on_device=True)``).
2. **Estimate**: the residual indicators :func:`adaptmg.estimate.residual_indicators` of the
   rank's own cells of this step's cut (``cells=``: their cell residuals and the faces touching
   them, on the rank's copy of the mesh), summed over the ranks (each cell's indicator comes from
   one rank, the others add exact zeros: every rank holds the same array, bit for bit; on the
   devices ``ncclAllReduce`` when the halo goes by NCCL, else one host ``Allreduce``).
3. **Mark**: Doerfler's set (:func:`adaptmg.estimate.marking.mark`) of rank 0, broadcast (an
   allreduce of rank 0's marks and the others' zeros: on the devices by NCCL), so every rank
   refines the same cells whatever the round-off of its own indicators.
4. **Refine** with the 2:1 closure, on every rank (the refinement is deterministic: the
   ranks' meshes stay equal; their cell and node counts are compared every step and a
   difference is a ``RuntimeError``).

What scales with the ranks: the assembly, the constrained matrices, the transfers, the solve
(each rank its cells' rows) and the estimator's evaluation (each rank its cells and their
faces; the faces of the whole mesh are still matched on every rank).  What does not: the mesh
and the refinement, done whole on every rank -- memory per rank grows with the whole mesh (on an
H200 about 0.6 KB per DoF of 2-D mesh), which bounds this loop to what one device holds; the
distributed forest (:mod:`.forest`, :func:`.adaptive.adaptive_loop_forest`) holds only a
rank's cells and their ghost layer.

The history records per step the cells, DoFs, CG iterations, the estimate
:math:`(\sum_K\eta_K^2)^{1/2}`, the errors when ``exact`` / ``grad`` are given, and the wall
seconds (maximum over the ranks) of: ``mesh`` (the space and its load vector), ``setup`` (all
of the solve but CG: hierarchy, partition, owned rows), ``partition`` (its Morton cut, a part
of ``setup``),
``solve`` (CG), ``gather`` (the solution on every rank), ``estimate``, ``mark`` (with its
broadcast) and ``refine``.
"""
from __future__ import annotations

import time

import numpy as np

from .. import assemble as _assemble
from ..backend import backend_of, to_host
from ..estimate.marking import mark
from ..estimate.residual import residual_indicators
from ..fe import Space
from ..fe.norms import errors as _errors
from ..mesh import Mesh
from ..multilevel.release import release_hierarchies
from .adaptive import loop_arguments
from .comm import agree, get_comm
from .nccl import NcclSum
from .solve import solve

__all__ = ["adaptive_loop_replicated", "PHASES"]

#: the phases of a step, in order (``t_<phase>`` in the history)
PHASES = ("mesh", "setup", "partition", "solve", "gather", "estimate", "mark", "refine")


def _broadcast_marks(comm, eta, theta, tie_rtol, transport):
    """Rank 0's Doerfler marks of ``eta`` on every rank (the others do not mark): an allreduce
    of rank 0's marks and the others' zeros (NCCL on the devices when the halo goes that way;
    else one host ``Bcast``)."""
    be = backend_of(eta)
    root = comm.Get_rank() == 0
    marks = mark(eta, "doerfler", theta, tie_rtol) if root else None
    if transport == "nccl":
        mine = marks.astype(np.int32) if root else be.xp.zeros(eta.size, dtype=np.int32)
        return NcclSum(comm)(mine) > 0
    host = np.ascontiguousarray(to_host(marks), dtype=bool) if root else np.empty(eta.size, dtype=bool)
    comm.Bcast(host, root=0)
    return be.asarray(host) if be.is_gpu else host


def _sum_over_ranks(comm, a, transport):
    """The sum of every rank's ``a`` on every rank (NCCL on the devices when the halo goes that
    way; else one host ``Allreduce``)."""
    if comm.Get_size() == 1:
        return a
    be = backend_of(a)
    if transport == "nccl":
        return NcclSum(comm)(a)
    host = np.ascontiguousarray(to_host(a), dtype=float)
    out = np.empty_like(host)
    comm.Allreduce(host, out)
    return be.asarray(out) if be.is_gpu else out


def adaptive_loop_replicated(mesh, f=1.0, *, comm=None, steps=10, max_dofs=None, theta=0.5, tie_rtol=None,
                             exact=None, grad=None, goal=None, rtol=1e-8, dirichlet="all", quiet=True,
                             printer=print, **solve_kwargs) -> dict:
    r"""Run solve -> estimate -> mark -> refine on ``mesh`` (module docstring; collective: every
    rank passes the same mesh) until ``steps`` refinements are done or the space has
    ``max_dofs`` DoFs (``steps + 1`` solves at most).

    Parameters
    ----------
    mesh : the initial :class:`adaptmg.Mesh`, the same on every rank, refined at least once (the
        multigrid coarsens its refinement history); on the GPU make it there after
        :func:`.comm.select_device` (``Mesh.box(..., backend="gpu")`` or ``mesh.to("gpu")``).
    f : source, a number or a callable ``f(x)`` of the points (device points for a device mesh).
    comm : mpi4py communicator (default ``MPI.COMM_WORLD``).
    theta, tie_rtol : Doerfler's bulk parameter and tie rule (:func:`adaptmg.estimate.doerfler`).
    exact, grad : the exact solution and its gradient, for the errors (L2, H1).
    goal : None, or a weight ``w`` (number or callable of the points): the history gets ``goal``
        = :math:`\int w u_h` (e.g. ``goal=1`` with ``f = 1``: :math:`J(u_h) = \|\nabla u_h\|^2`).
    rtol, dirichlet, solve_kwargs : for :func:`.solve.solve` (``backend="gpu"``,
        ``agglomerate_below``, ``smoother``, ...): homogeneous Dirichlet data.
    quiet, printer : rank 0 prints one line per step unless ``quiet``.

    Returns ``{"history": [one dict per step], "mesh": the last mesh, "u": its solution (every
    rank; on the mesh's device), "eta": its indicators}``; a history row holds step, cells,
    dofs, iterations, info, estimate, err_L2 / err_H1, goal and ``t_<phase>`` (:data:`PHASES`, seconds,
    the maximum over the ranks)."""
    comm = get_comm(comm)
    msg = (f"adaptive_loop_replicated expects an adaptmg Mesh, got {type(mesh).__name__}"
           if not isinstance(mesh, Mesh) else loop_arguments(f, exact, grad, steps, max_dofs, theta, tie_rtol, goal))
    agree(comm, not msg, msg)
    if solve_kwargs.get("local_setup") is False or solve_kwargs.get("on_device") is False:
        agree(comm, False, "adaptive_loop_replicated runs the local set-up with the solution on the mesh's device")
    solve_kwargs.pop("local_setup", None)
    solve_kwargs.pop("on_device", None)
    root = comm.Get_rank() == 0
    be = mesh.backend
    hist = []
    if root and not quiet:
        printer(f"{'step':>4} {'cells':>10} {'dofs':>10} {'it':>3} {'estimate':>10} {'err_H1':>10} "
                + " ".join(f"{'t_' + p[:6]:>8}" for p in PHASES))

    def now():
        be.synchronize()
        return time.perf_counter()
    for step in range(steps + 1):
        t = dict.fromkeys(PHASES, 0.0)
        t0 = now()
        space = Space(mesh, 1)
        b = _assemble.load(space, f)
        t1 = now()
        res = solve(space, _assemble.stiffness, b, comm=comm, dirichlet=dirichlet, rtol=rtol,
                    local_setup=True, on_device=True, **solve_kwargs)
        t2 = now()
        tm, its, info, transport = res.timings, res.iterations, res.info, getattr(res.mg, "transport", "mpi")
        u = be.asarray(res.u) if be.is_gpu else np.asarray(res.u)
        own = None if comm.Get_size() == 1 else res.cell_ranks == comm.Get_rank()
        del res                               # its hierarchy: not alive during the next one
        release_hierarchies(space.num_dofs)   # (its reference cycles freed now, not at some later collection)
        t3 = now()
        t.update(mesh=t1 - t0, setup=tm["setup"], partition=tm.get("partition_s", 0.0), solve=tm["solve"],
                 gather=t2 - t1 - tm["setup"] - tm["solve"] + (t3 - t2))
        eta = _sum_over_ranks(comm, residual_indicators(space, u, f=f, cells=own), transport)
        est = float(np.sqrt(float((eta * eta).sum())))
        t4 = now()
        t["estimate"] = t4 - t3
        row = {"step": step, "cells": mesh.num_cells, "dofs": int(space.num_dofs), "iterations": its,
               "info": info, "estimate": est}
        if exact is not None or grad is not None:
            e = _errors(space, u, exact, grad)
            row.update({f"err_{k}": float(v) for k, v in e.items()})
        if goal is not None:
            row["goal"] = float(_assemble.load(space, goal) @ u)
        last = step == steps or (max_dofs is not None and space.num_dofs >= max_dofs)
        if not last:
            t5 = now()
            marks = _broadcast_marks(comm, eta, theta, tie_rtol, transport)
            t6 = now()
            mesh = mesh.refine(marks)
            t7 = now()
            t.update(mark=t6 - t5, refine=t7 - t6)
            sizes = comm.allgather((mesh.num_cells, mesh.num_nodes))
            if len(set(sizes)) != 1:
                raise RuntimeError(f"adaptive_loop_replicated: the ranks' refined meshes differ (cells, nodes "
                                   f"per rank: {sizes}); the refinement must be deterministic")
        got = comm.allgather([t[p] for p in PHASES])
        row.update({f"t_{p}": max(g[i] for g in got) for i, p in enumerate(PHASES)})
        hist.append(row)
        if root and not quiet:
            printer(f"{step:4d} {row['cells']:10d} {row['dofs']:10d} {row['iterations']:3d} {row['estimate']:10.4e} "
                    f"{row.get('err_H1', float('nan')):10.4e} " + " ".join(f"{row['t_' + p]:8.3f}" for p in PHASES))
        if last:
            break
    return {"history": hist, "mesh": mesh, "u": u, "eta": eta}
