r"""The adaptive loop solve -> estimate -> mark -> refine -> repartition on a
:class:`~.forest.DistributedForest` (issue 37): no rank holds the whole mesh at any step.

Step :math:`\ell` on the forest :math:`\mathcal T_\ell` (every phase collective):

1. **Solve** :math:`-\nabla\cdot\nabla u = f`, :math:`u = g` on the Dirichlet boundary
   (:func:`.solve.solve_forest`: ``g`` lifted as the serial constraints lift it, zero by
   default), Q1, multigrid-preconditioned CG; its ``u_local`` holds :math:`u_h = H x` at the
   owned nodes (hanging ones included, also on the boundary).
2. **Estimate** (:func:`owned_indicators`): the residual indicators of
   :func:`adaptmg.estimate.residual_indicators`,

   .. math::  \eta_K^2 = h_K^2\|f + \Delta u_h\|_K^2
              + \tfrac12\sum_{F\subset\partial K\setminus\partial\Omega} h_F\|[\![\partial_n u_h]\!]\|_F^2,

   evaluated by the serial estimator on the rank's local mesh (owned leaves + ghost layer).
   Every face of an owned leaf has its neighbours there (a neighbour across a face shares
   a vertex with it: the ghost layer holds it, also the coarse leaf of a hanging face and
   the fine leaves on a coarse owned face), and the serial estimator adds each face's
   :math:`\frac12 h_F\|[\![\partial_n u_h]\!]\|^2` to both cells -- the same split whichever
   rank evaluates it; so the owned leaves' indicators *equal* those of the serial mesh (up
   to round-off: the face may be integrated from the other side).  The nodal values at the
   vertices of the local leaves owned elsewhere come from their owners by global id
   (:func:`local_nodal_values`: one request and one reply); faces of ghosts at the outer
   edge of the layer look like boundary faces here, but only the owned leaves' values are kept.
3. **Mark** (:func:`doerfler_forest`): the serial Doerfler set -- the smallest set, largest
   indicators first, with :math:`\sum_M\eta_K^2\ge\theta\sum\eta_K^2` -- across ranks
   without gathering the indicators: the threshold :math:`t^* = \max\{t:
   S(t)\ge\theta\,S(0)\}`, :math:`S(t) = \sum_{\eta_K^2\ge t}\eta_K^2`, is found by a
   256-ary search over the bit patterns of the non-negative doubles (monotone in the value):
   each round one ``allreduce`` of the 255 local sums :math:`S_p(t_j)`, at most 8 rounds;
   the cells above :math:`t^*` are marked, and of those equal to it the first ones in curve
   (key) order that reach the bulk.  Difference from :func:`adaptmg.estimate.doerfler`:
   exactly tied indicators are taken in curve order, the serial one in its mesh's cell
   order (stable argsort) -- the sets agree unless the threshold splits exactly tied cells.
   A symmetric problem (the L-shape with its exact data is symmetric about :math:`y = -x`,
   Fichera's cube under permutations of the axes) has twin cells whose indicators differ by
   round-off only, and a threshold that splits twins makes the marks (of the serial loop
   too) depend on round-off: ``tie_rtol`` marks every cell with
   :math:`\eta_K^2 \ge (1-\delta)t^*` (twins together, in both loops).
4. **Refine** the marked owned leaves with the 2:1 closure across ranks
   (:meth:`~.forest.DistributedForest.refine`) and **repartition** along the Morton curve
   (:meth:`~.forest.DistributedForest.repartition`: the owned counts then differ by at most 1).

The history records per step the cells, DoFs (global nodes, hanging ones included, as the
serial ``space.num_dofs``), CG iterations, the estimate :math:`(\sum\eta_K^2)^{1/2}`, the
errors :math:`\|u-u_h\|_{L^2}`, :math:`|u-u_h|_{H^1}` when the exact solution is given (owned
leaves per rank, squares summed by ``allreduce``), a goal :math:`\int_\Omega w\,u_h` when a
weight ``goal`` is given (e.g. ``goal=1`` with ``f = 1``, ``g = 0``: :math:`J(u_h) =
\|\nabla u_h\|^2`, from which Fichera's energy error follows), and the wall seconds of each phase (set-up:
the multigrid hierarchy from the forest, the load and ``H x``, all of :func:`.solve.solve_forest`
but the Krylov solve; solve; estimate; error; mark; refine; repartition; the maximum over the
ranks).  GPU: ``backend`` goes
to :func:`.solve.solve_forest`, whose levels' matrices and load are formed on the device, and
the indicators are computed there on the finest forest's local mesh (a callable ``f`` gets
device points), as are the errors and the goal (the finest level's local space of the set-up);
the refinement splits that local mesh there (:meth:`~.forest.DistributedForest.refine` with
``backend``: the new local forest copied back, its device copy kept for the next set-up); the
marking and the forest's other work (closure, keys, repartition, coarsening) stay on the host.
"""
from __future__ import annotations

import time

import numpy as np

from .. import assemble as _assemble
from ..estimate.marking import check_tie_rtol
from ..estimate.residual import residual_indicators
from ..fe import Space
from ..backend import to_host
from ..fe.norms import errors as _errors
from ..multilevel.release import release_hierarchies
from .forest import DistributedForest, _agree, _allsum, _exscan
from .forest_rows import _owner_ranges, _pull
from .local import CellSubset
from .solve import solve_forest

__all__ = ["local_nodal_values", "owned_indicators", "doerfler_forest", "adaptive_loop_forest"]

#: pivots per round of the distributed Doerfler search (256-ary: <= 8 rounds over 2^63 patterns)
SEARCH_WAYS = 256
_INF_BITS = int(np.float64(np.inf).view(np.int64))


def local_nodal_values(forest, u_owned, starts=None) -> np.ndarray:
    """Nodal values at every node of the forest's local mesh (owned leaves' and ghosts'
    vertices) from ``u_owned``, the values of this rank's owned nodes in global id order
    (``solve_forest(...).u_local``): the others are pulled from their owners by global id
    (one request and one reply ``Alltoallv``; collective).  ``starts``: the ranks' blocks of
    owned node ids (default: one ``allgather`` of the counts)."""
    gid, own = forest.node_gid, forest.owned_nodes
    u_owned = np.asarray(u_owned, dtype=float)
    _agree(forest.comm, u_owned.shape == (own.size,),
           f"local_nodal_values: u_owned must hold the {own.size} owned nodes' values, got shape {u_owned.shape}")
    if starts is None:
        starts = _owner_ranges(forest.comm, int(own.size))
    first = int(starts[forest.rank])
    u = np.empty(gid.size)
    u[own] = u_owned
    other = np.flatnonzero((gid < first) | (gid >= first + own.size))
    want, inv = np.unique(gid[other], return_inverse=True)
    u[other] = _pull(forest.comm, np.asarray(starts), want, first, u_owned)[inv.reshape(-1)]
    return u


def owned_indicators(forest, u_nodes, *, f=0.0, space=None, **estimator_kwargs) -> np.ndarray:
    """Residual indicators of the owned leaves (curve order) from the nodal values ``u_nodes``
    of every local node (:func:`local_nodal_values`): the serial
    :func:`~adaptmg.estimate.residual_indicators` on the local mesh (module docstring: equal
    to the serial mesh's).  ``f``: a constant or a callable of the points; ``space``: the local
    mesh's Q1 space if already built -- on the GPU (:meth:`~.forest.DistributedForest.local_space`)
    the indicators are computed there (``u_nodes`` moved up, a callable ``f`` gets device
    points) and the owned ones come back as a host array for the marking."""
    if not (callable(f) or np.isscalar(f)):
        raise TypeError(f"owned_indicators: f must be a number or a callable of the points, got {type(f).__name__}")
    space = Space(forest.mesh, 1) if space is None else space
    be = space.backend
    if be.is_gpu:                     # the local mesh's space on the device: u moved up, eta back
        eta = residual_indicators(space, be.asarray(u_nodes, dtype=float), f=f, partial=True, **estimator_kwargs)
        return to_host(eta[forest.owned_cells_on(be)])
    eta = residual_indicators(space, u_nodes, f=f, partial=True, **estimator_kwargs)
    return eta[forest.owned_cells]


def doerfler_forest(forest, eta, theta=0.5, tie_rtol=None) -> np.ndarray:
    """Doerfler marking across the forest's ranks (module docstring, step 3): a boolean mask
    over the owned leaves in curve order, the serial :func:`adaptmg.estimate.doerfler` set
    of all ranks' indicators (``eta``: the owned leaves', curve order; ``tie_rtol`` as
    there: a number marks every leaf with ``eta^2 >= (1 - tie_rtol) t*``, no curve order
    involved).  O(log) collectives, no gather."""
    comm = forest.comm
    eta = np.asarray(eta, dtype=float)
    ok = eta.shape == (forest.num_owned,) and bool(np.isfinite(eta).all()) and not (eta < 0).any()
    _agree(comm, ok, f"doerfler_forest: eta must be {forest.num_owned} finite non-negative indicators (one per "
                     f"owned leaf), got shape {eta.shape}")
    _agree(comm, bool(np.isscalar(theta) and 0 < theta <= 1), f"theta must lie in (0, 1], got {theta!r}")
    _agree(comm, not check_tie_rtol(tie_rtol), check_tie_rtol(tie_rtol))
    e2 = eta * eta
    bits = e2.view(np.int64)                    # non-negative doubles: the bit order is the value order
    o = np.argsort(bits, kind="stable")
    sb = bits[o]
    suf = np.append(np.cumsum(e2[o][::-1])[::-1], 0.0)     # suf[i] = sum of the i-th smallest on

    def S(piv):                                 # sum of e2 >= piv, per pivot (this rank)
        return suf[np.searchsorted(sb, piv, side="left")]

    total = _allsum(comm, float(suf[0]))
    mask = np.zeros(eta.size, dtype=bool)
    if total <= 0:
        return mask
    target = theta * total * (1 - 1e-12)        # the serial doerfler's slack
    lo, hi = 0, _INF_BITS                       # S(lo) >= target > S(hi)
    while hi - lo > 1:
        step = max(1, (hi - lo) // SEARCH_WAYS)
        piv = lo + step * np.arange(1, SEARCH_WAYS, dtype=np.int64)
        piv = piv[piv < hi]
        good = _allsum(comm, S(piv)) >= target  # non-increasing in the pivot: a prefix
        k = int(good.sum())
        lo, hi = (int(piv[k - 1]) if k else lo), (int(piv[k]) if k < piv.size else hi)
    t = float(np.int64(lo).view(np.float64))
    if tie_rtol is not None:
        return e2 >= t * (1 - tie_rtol)
    gt, tied = bits > lo, bits == lo
    s_gt, n_tied = _allsum(comm, np.array([e2[gt].sum(), float(tied.sum())]))
    m = min(int(n_tied), max(1, int(np.ceil((target - s_gt) / t)))) if t > 0 else 0
    before = int(_exscan(comm, int(tied.sum())))            # tied leaves of the lower ranks
    ti = np.flatnonzero(tied)                                # curve order within the rank
    mask[gt] = True
    mask[ti[before + np.arange(ti.size) < m]] = True
    return mask


def _check_args(forest, f, exact, grad, steps, max_dofs, theta, tie_rtol=None, goal=None):
    if not isinstance(forest, DistributedForest):
        raise TypeError(f"adaptive_loop_forest expects a DistributedForest, got {type(forest).__name__}")
    return loop_arguments(f, exact, grad, steps, max_dofs, theta, tie_rtol, goal)


def _number(x):
    return np.isscalar(x) and not isinstance(x, (bool, str, bytes))


def loop_arguments(f, exact, grad, steps, max_dofs, theta, tie_rtol=None, goal=None) -> str:
    """What is wrong with an adaptive loop's arguments ('' if nothing): the source, the exact
    solution and gradient, steps, max_dofs, Doerfler's theta and tie rule, the goal weight
    (:func:`adaptive_loop_forest`, :func:`.replicated_adaptive.adaptive_loop_replicated`)."""
    if not (callable(f) or _number(f)):
        return f"f must be a number or a callable of the points, got {type(f).__name__}"
    for name, fn in (("exact", exact), ("grad", grad)):
        if fn is not None and not callable(fn):
            return f"{name} must be None or a callable of the points, got {type(fn).__name__}"
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        return f"steps must be a non-negative integer, got {steps!r}"
    if max_dofs is not None and (isinstance(max_dofs, bool) or not isinstance(max_dofs, (int, np.integer))
                                 or max_dofs < 1):
        return f"max_dofs must be None or a positive integer, got {max_dofs!r}"
    if not (np.isscalar(theta) and 0 < theta <= 1):
        return f"theta must lie in (0, 1], got {theta!r}"
    if goal is not None and not (callable(goal) or _number(goal)):
        return f"goal must be None, a number or a callable of the points, got {type(goal).__name__}"
    return check_tie_rtol(tie_rtol) or ""

PHASES = ("setup", "solve", "estimate", "error", "mark", "refine", "repartition")


def adaptive_loop_forest(forest, f=1.0, *, g=None, assemble=_assemble.stiffness, exact=None, grad=None, steps=10,
                         max_dofs=None, theta=0.5, tie_rtol=None, goal=None, repartition=True, rtol=1e-8, comm=None,
                         quiet=True, printer=print, callback=None, **solve_kwargs) -> dict:
    """Run solve -> estimate -> mark -> refine -> repartition on ``forest`` (module
    docstring; collective) until ``steps`` refinements are done or the forest has
    ``max_dofs`` global nodes (``steps + 1`` solves at most).

    Parameters
    ----------
    forest : the initial :class:`~.forest.DistributedForest` (refined at least once: the
        multigrid needs two levels).
    f : source, a constant or a callable ``f(x)`` of the points (..., d) -> (...).
    g : Dirichlet values on ``dirichlet`` (a ``solve_kwargs`` entry, default every boundary
        face): None (zero), a number or a callable ``g(x)`` of the points (k, d) -> (k,)
        (:func:`.solve.solve_forest`).
    assemble : Q1 scalar matrix of a space (default the stiffness matrix; the estimator is
        that of :math:`-\\Delta u = f`).
    exact, grad : the exact solution and its gradient (callables of the points) for the errors.
    theta, tie_rtol : Doerfler's bulk parameter and tie rule (:func:`doerfler_forest`).
    goal : None, or a weight ``w`` (number or callable of the points): the history gets
        ``goal`` = :math:`\\int w u_h` (owned leaves' loads, summed over the ranks).
    repartition : re-cut after each refinement.
    rtol, solve_kwargs : for :func:`.solve.solve_forest` (``backend="gpu"``, ``agglomerate_below``,
        ``smoother``, ...).  comm : None or the forest's communicator.
    quiet, printer : rank 0 prints one line per step unless ``quiet``.
    callback : ``callback(step, forest, eta, marks, result)`` on every rank after each step's
        marking (``marks`` None at the last step; ``result`` the step's solve).

    Returns ``{"history": [one dict per step], "forest": the last forest, "eta": its owned
    indicators, "u_local": its owned nodal values, "result": its solve's result}``; a history
    row holds step, cells, dofs, iterations, info, estimate, err_L2 / err_H1, goal, owned_min /
    owned_max (the ranks' owned leaves at the solve) and ``t_<phase>`` (:data:`PHASES`,
    seconds, max over the ranks)."""
    msg = _check_args(forest, f, exact, grad, steps, max_dofs, theta, tie_rtol, goal)
    fcomm = forest.comm
    if not msg and comm is not None and comm is not fcomm:
        msg = "adaptive_loop_forest: comm must be the forest's communicator (or None)"
    _agree(fcomm, not msg, msg)
    comm, root = fcomm, fcomm.Get_rank() == 0
    if root and not quiet:
        printer(f"{'step':>4} {'cells':>10} {'dofs':>10} {'it':>3} {'estimate':>10} {'err_H1':>10} "
                + " ".join(f"{'t_' + p[:6]:>8}" for p in PHASES))
    F, hist = forest, []
    for step in range(steps + 1):
        t = dict.fromkeys(PHASES, 0.0)
        t0 = time.perf_counter()
        if step:                                              # the last step's hierarchy freed first
            res = None
            release_hierarchies(hist[-1]["dofs"])
        res = solve_forest(F, assemble, f, g=g, rtol=rtol, **solve_kwargs)
        t["solve"] = res.timings["solve"]
        t["setup"] = time.perf_counter() - t0 - t["solve"]      # hierarchy, load, H x: all but CG
        t0 = time.perf_counter()
        space = res.mg._fine_prep[0]            # the finest forest's local Q1 space (on the GPU: there)
        u = local_nodal_values(F, res.u_local, res.mg.layout.starts)
        be = space.backend
        cells = F.owned_cells_on(be)
        eta = owned_indicators(F, u, f=f, space=space)
        t["estimate"] = time.perf_counter() - t0
        sums = [float((eta * eta).sum())]
        if exact is not None or grad is not None:
            t0 = time.perf_counter()
            e = _errors(space, be.asarray(u), exact, grad, cells=cells)
            sums += [e.get("L2", 0.0) ** 2, e.get("H1", 0.0) ** 2]
            t["error"] = time.perf_counter() - t0
        if goal is not None:
            t0 = time.perf_counter()
            sums.append(float(be.xp.asarray(_assemble.load(CellSubset(space, cells), goal)) @ be.asarray(u)))
            t["error"] += time.perf_counter() - t0
        sums = _allsum(comm, np.array(sums))
        row = {"step": step, "cells": F.global_num_cells, "dofs": F.num_global_nodes,
               "iterations": res.iterations, "info": res.info, "estimate": float(np.sqrt(sums[0]))}
        if goal is not None:
            row["goal"] = float(sums[-1])
        if exact is not None or grad is not None:
            if exact is not None:
                row["err_L2"] = float(np.sqrt(sums[1]))
            if grad is not None:
                row["err_H1"] = float(np.sqrt(sums[2]))
        last = step == steps or (max_dofs is not None and F.num_global_nodes >= max_dofs)
        n_owned, marks = F.num_owned, None
        if not last:
            t0 = time.perf_counter()
            marks = doerfler_forest(F, eta, theta, tie_rtol)
            t1 = time.perf_counter()
            t_mark = t1 - t0
            if callback is not None:
                callback(step, F, eta, marks, res)
                t1 = time.perf_counter()
            F2 = F.refine(marks, backend=be)             # on the GPU: split on the device
            t2 = time.perf_counter()
            F2 = F2.repartition() if repartition else F2
            t3 = time.perf_counter()
            t.update(mark=t_mark, refine=t2 - t1, repartition=t3 - t2)
        got = comm.allgather((n_owned, [t[p] for p in PHASES])) if comm.Get_size() > 1 else [(n_owned, [t[p] for p in PHASES])]
        counts = [g[0] for g in got]
        row.update(owned_min=min(counts), owned_max=max(counts),
                   **{f"t_{p}": max(g[1][i] for g in got) for i, p in enumerate(PHASES)})
        hist.append(row)
        if root and not quiet:
            printer(f"{step:4d} {row['cells']:10d} {row['dofs']:10d} {row['iterations']:3d} {row['estimate']:10.4e} "
                    f"{row.get('err_H1', float('nan')):10.4e} "
                    + " ".join(f"{row['t_' + p]:8.3f}" for p in PHASES))
        if last:
            if callback is not None:
                callback(step, F, eta, None, res)
            break
        F = F2
    return {"history": hist, "forest": F, "eta": eta, "u_local": res.u_local, "result": res}
