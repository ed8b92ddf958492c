r"""The distributed levels of one :class:`~adaptmg.multilevel.MultilevelSolver`: set-up only.

Given the serial :class:`~adaptmg.multilevel.hierarchy.GeometricMultigrid` ``ml`` (levels
``0..L``, coarse -> fine) and the cell partition of the finest mesh,
:class:`DistributedHierarchy` builds

* the cell partition of every coarser geometric level (a coarse cell lives where most
  of its children live, :func:`~.partition.coarse_cell_ranks`) and from it the DoF
  owners of each level (:func:`~.partition.dof_owners`);
* per level a :class:`~.csr.DistCSR` for ``A_l``, ``P_l`` (rows: level ``l``, columns:
  level ``l-1``) and ``R_l`` (stored explicitly, as in the serial solver);
* the level's smoother, with the *serial* smoother's parameters (``omega`` from the
  serial ``lambda_max`` estimate, Chebyshev coefficients, block-Jacobi inverses -- a
  node's components share its owner, so blocks never straddle ranks) restricted to the
  owned rows:
  the very same object type and kernels (:mod:`adaptmg.device.kernels`), whose SpMV plan is
  the distributed product.  Point smoothers (Jacobi, Chebyshev) need the neighbours'
  values only through ``A x``, so the distributed iterates equal the serial ones up to
  the summation order inside the row products (block Jacobi alike);
* and from them **one** :class:`~adaptmg.multilevel.MultilevelSolver` (``self.solver``):
  every distributed level ``l >= c`` is an ordinary :class:`~adaptmg.multilevel.Level`
  whose ``A``, ``P``, ``R`` are DistCSR (the halo exchange inside their SpMV, see
  :mod:`.csr`) and whose vectors are the owned parts; its ``levels[0]`` is level ``c - 1``
  (on rank 0, below) and its coarse solver is :class:`RankZeroCycle`.  The cycle (V, W or
  F; seed 001, Algorithm 1) is the serial solver's own, nothing here runs one.

Agglomeration, in two stages.  (1) Fewer ranks: the finest level lives on all ``P`` ranks
(the user's partition); a coarser level with ``N_l >= agglomerate_below`` DoFs on

.. math::  P_l = \min\bigl(P_{l+1},\; \max(1, \lfloor N_l / m \rfloor)\bigr),
           \qquad m = \texttt{min\_dofs\_per\_rank}

ranks ``0 .. P_l - 1`` (:func:`~.partition.level_ranks`: each active rank gets about ``m``
DoFs or more, ``P_l`` never grows towards the coarse levels; ``m`` None or 0: ``P_l = P``).
Its voted cell partition is folded onto them (:func:`~.partition.fold_cell_ranks`: sorted
by (rank, curve position), cut into ``P_l`` equal contiguous pieces; for ``P_l | P`` and a
balanced voted partition the fold ``r -> floor(r P_l / P)``) and the DoF owners follow
(:func:`~.partition.dof_owners`).
Such a level is an ordinary distributed level in which ranks ``>= P_l`` own no row: their
parts are empty arrays, they send and receive nothing in its halo exchanges, join its
set-up's reductions with zeros, and their smoother there does nothing (:class:`_NoRows`).
``active_ranks`` (and :meth:`DistributedHierarchy.describe`) report ``P_l``.
(2) Rank 0: levels with fewer than ``agglomerate_below`` DoFs (always the coarsest
one, and all algebraic levels; never the finest) live entirely on rank 0: their DoF
"partition" gives rank 0 every DoF, so the restriction into the finest of them (level
``c - 1``) is an ordinary ``DistCSR`` product that gathers onto rank 0, and the
prolongation out of it scatters.  The coarse solver of the one cycle,
:class:`RankZeroCycle`, runs the *serial* solver's cycle from level ``c - 1`` down on
rank 0 (``ml._run(..., level=c - 1)``: the same smoothers, fused kernels and dense coarse
inverse); it tells the cycle schedule that ``c - 1`` levels lie below it, so W- and
F-cycles visit it as the serial cycle visits level ``c - 1``.  Other ranks own no entry of
level ``c - 1`` and wait in the next halo exchange.

Local set-up (``local=``, what :func:`.solve.solve` uses by default).  ``ml`` is then the
serial hierarchy of the *small* levels only (those agglomerated onto rank 0, plus the
algebraic ones), and the geometric levels above it are built per rank from its cells
(:mod:`.local`): the owned rows of ``K_l``, ``P_l`` and ``R_l`` straight from the cells
touching the owned DoFs, and the smoother constructed on the owned diagonal block with the
hierarchy's smoother name and keyword arguments, ``omega="auto"`` (power iteration, 12
steps) and Chebyshev's ``lmax`` (Lanczos, 20 steps) estimated with the distributed product
from the serial start vector (its owned entries only), so they equal the serial
estimates up to the summation order (:mod:`.estimates`).  On the GPU with NCCL and assembled
levels the local levels are built fine to coarse, the host-bound set-up beside the finest
level's device-bound work on a high-priority stream (:mod:`adaptmg.device.priority`): while
the finest level's assembly runs (its det J check read afterwards,
:mod:`adaptmg.device.deferred`), its transfer rows, their DistCSRs, the levels below the
second finest and, where rank 0 alone builds the serial levels
(:class:`~.serial_levels.PendingSerialLevels`), those on rank 0; while its power iteration
runs (queued: the host does not wait for it), the second finest level.  Otherwise coarse to
fine (on the GPU the finest level's transfer, and rank 0's serial levels, beside its
assembly all the same).

GPU backend (``ml`` on the GPU).  The local set-up runs where the levels will live, by the
same code as on the CPU written against the backend's ``xp`` (:mod:`.local`): each rank's
rows of ``K_l`` are assembled on the device (the form called with ``device=,
keep_on_device=True`` as :func:`adaptmg.multigrid` does there) and constrained there (the
congruence of the hanging entries, owned rows and free columns selected after it); ``P_l``'s and ``R_l``'s owned
rows are built on the host (as the serial hierarchy builds its prolongations) and moved up;
:class:`~.csr.DistCSR` splits device rows into its owned and ghost blocks on the device (only
the distinct ghost columns come to the host, for the communication pattern; ``transport``:
host staging or NCCL, :func:`.comm.resolve_transport`, decided once for the hierarchy); the
smoother is constructed on the device owned block and its ``lambda_max`` estimate runs the
device product.  Levels taken from a serial hierarchy (the replicated set-up) keep the
serial smoother's parameters, their owned-row data moved (:func:`_smoother_on`).  The
solver's level vectors are allocated on the device by the solver.  The agglomerated levels
run in the serial GPU hierarchy on rank 0, as on the CPU.  The smoothers' kernels are the
same (:mod:`adaptmg.device.kernels` dispatch on the array type).  On the GPU a distributed
level's Jacobi sweeps and residuals are one-pass CSR kernels over the owned block, launched
while the halo exchange is in flight, plus one launch over the (row-compressed) ghost rows
after it (:meth:`.csr.DistCSR.jacobi_sweep`, :meth:`~.csr.DistCSR.residual`; the solver
fuses a Jacobi smoother through them, ``DistCSR.fused_kernels``); transfer fusion and CUDA
graphs stay off on distributed levels (their matrices are DistCSR, not CSR:
:meth:`~adaptmg.multilevel.MultilevelSolver.set_fuse_below` and ``_capturable`` see that).

A mesh on the GPU (``Mesh.box(..., backend="gpu")``, ``mesh.to("gpu")``; every rank selects
its device before making it): the cell ranks, the coarse votes, the folds and the DoF
owners are computed on the device (:mod:`.partition`), each level's :class:`~.csr.Layout`
keeps its rows and local positions there (the host sees the owners of ghost and send
entries only), and the local levels' rows are built from the mesh's device arrays
(:mod:`.local`): the set-up runs on CuPy arrays end to end, the host doing O(levels)
Python plus the O(halo) communication pattern.

Limits (stated plainly): the mesh is **replicated** on every rank (like deal.II's
``parallel::shared::Triangulation``) together with its O(cells) derived arrays; without
``local`` (``solve(..., local_setup=False)``) the whole serial hierarchy is replicated and
each level's owned rows are extracted from it.  Smoothers: Jacobi, Chebyshev and block
Jacobi; others (Gauss-Seidel: sequential across rows) raise ValueError.
"""
from __future__ import annotations

import contextlib
import copy
import time
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from ..backend import CPU, backend_of, get_backend, is_device_sparse, to_host
from ..device import kernels as K
from ..device.priority import PriorityStream
from ..multilevel.smoothers import BlockJacobi, Chebyshev, Jacobi
from ..multilevel.level import Level
from ..multilevel.solver import MultilevelSolver
from .comm import HaloTimer, resolve_transport
from .csr import DistCSR, Layout, _device_block, _device_plan
from .estimates import (auto_omegas as _auto_omegas, device_norms, lanczos_lambda as _lanczos_lambda,
                        start_auto_omegas)
from .matrix_free import DistMatrixFree
from .partition import level_ownership, level_ranks
from .rank_zero import RankZeroCycle
from .serial_levels import PendingSerialLevels, SerialLevelsOnRankZero

__all__ = ["DistributedHierarchy", "RankZeroCycle", "SerialLevelsOnRankZero", "level_owners"]


def level_owners(ml, fine_cell_ranks, size, agglomerate_below=1000, min_dofs_per_rank=2000):
    """DoF owners of every level of ``ml`` (coarse -> fine), the index ``c`` of the coarsest
    distributed level (levels below ``c`` are on rank 0), the cell ranks per geometric level
    (folded onto the level's ranks: zeros on the levels agglomerated on rank 0) and the
    number of ranks ``P_l`` of every level (:func:`~.partition.level_ranks`; 1 for the
    agglomerated levels)."""
    L = len(ml.levels)
    nalg = ml.num_algebraic
    spaces = ml.spaces
    c = 1
    for l in range(L):
        if l < nalg or ml.levels[l].n < agglomerate_below:
            c = max(c, l + 1)
    if L < 2:
        raise ValueError("distributed multigrid needs at least two levels (the finest one is "
                         "distributed, the coarsest one lives on rank 0); the mesh has no refinement "
                         "history to coarsen")
    c = min(c, L - 1)                        # the finest level is always distributed
    nranks = level_ranks([lev.n for lev in ml.levels], size, c, min_dofs_per_rank)
    owners, cell = level_ownership(spaces[c - nalg:], fine_cell_ranks, nranks[c:], size)
    return with_agglomerated([lev.n for lev in ml.levels[:c]],
                             [s.mesh.num_cells for s in spaces[:c - nalg]], owners, cell, nranks[c:])


def with_agglomerated(dofs, cells, owners, cell_ranks, nranks):
    """:func:`level_owners`'s ``(owners, c, cell_ranks, nranks)`` from those of the distributed
    levels (:func:`~.partition.level_ownership`) and the sizes of the ``c = len(dofs)``
    levels below them, which rank 0 owns whole: ``dofs[l]`` DoFs, the geometric ones among
    them ``cells[g]`` cells (coarse -> fine)."""
    xp = backend_of(cell_ranks[-1]).xp
    return ([np.zeros(n, dtype=np.int64) for n in dofs] + list(owners), len(dofs),
            [xp.zeros(n, dtype=np.int64) for n in cells] + list(cell_ranks), [1] * len(dofs) + list(nranks))


def _local_smoother(sm, A: DistCSR, rows: np.ndarray, be=CPU):
    """A copy of the serial smoother ``sm`` acting on the owned rows, its SpMV the distributed one
    (its data on ``be``: the serial hierarchy's backend, the same as ``A``'s)."""
    if type(sm) not in (Jacobi, Chebyshev, BlockJacobi):
        raise ValueError(f"distributed multigrid supports the smoothers Jacobi, Chebyshev and "
                         f"BlockJacobi, got {type(sm).__name__}")
    if sm.backend.name != be.name:
        raise ValueError(f"distributed multigrid: a {sm.backend.name} smoother in a "
                         f"{be.name} hierarchy")
    loc = copy.copy(sm)
    loc.n = rows.size
    loc.A_host = None
    if isinstance(sm, BlockJacobi):
        # S = blockdiag(B_k)^{-1} couples the components of one node, and all components
        # of a node have one owner: the owned rows of S only reach owned columns
        S = to_host(sm.S)[rows]
        loc.S = S[:, rows].tocsr()
        if loc.S.nnz != S.nnz:
            raise RuntimeError("BlockJacobi: a block couples DoFs of different ranks")
        loc._Splan = K.make_spmv(loc.S)
        return _smoother_on(loc, be, A)
    loc.dinv = np.ascontiguousarray(to_host(sm.dinv)[rows])
    if isinstance(sm, Chebyshev):
        loc._d = np.zeros(rows.size, sm.dtype)
    return _smoother_on(loc, be, A)


def _smoother_on(loc, be, A):
    """The owned-rows smoother ``loc`` (host data) with its SpMV the distributed ``A`` (not
    fused, fresh scratch) and its data on ``be`` (``A``'s backend): on the CPU nothing more; on
    the GPU ``dinv`` (Jacobi, Chebyshev), Chebyshev's direction ``_d`` and BlockJacobi's ``S``
    (cupyx CSR, its SpMV plan) become device data."""
    _smoother_with(loc, A)
    if not be.is_gpu:
        return loc
    loc.backend = be
    if isinstance(loc, BlockJacobi):
        S = sp.csr_matrix(loc.S)
        loc.S = _device_block(be, S)              # None for a rank without rows (never smooths)
        loc._Splan = _device_plan(loc.S)
        return loc
    loc.dinv = be.asarray(np.ascontiguousarray(loc.dinv, dtype=loc.dtype))
    if isinstance(loc, Chebyshev):
        loc._d = be.xp.zeros(loc.n, loc.dtype)
    return loc


def _smoother_with(loc, A):
    """The smoother ``loc`` with its SpMV the distributed ``A`` (not fused, fresh scratch, no
    host matrix kept)."""
    loc.A = A
    loc.A_host = None
    loc._Aplan = A
    loc.fused = False
    loc._work = None
    return loc


class _FineView:
    """``ml`` (the serial hierarchy below the locally built levels) seen with the local
    levels' ``spaces`` (coarse -> fine) on top, for :func:`level_owners` (levels' sizes,
    spaces, number of algebraic levels)."""

    def __init__(self, ml, spaces):
        self.levels = list(ml.levels) + [SimpleNamespace(n=s.num_dofs) for s in spaces]
        self.spaces = list(ml.spaces) + list(spaces)
        self.num_algebraic = ml.num_algebraic


def _distributed_smoother(ml, A: DistCSR, components, pending=None):
    """The finest level's smoother (the hierarchy's smoother spec and keyword arguments)
    built on ``A``'s owned block on ``A``'s backend (its diagonal and node blocks are the
    owned ones; on the GPU the device block, nothing comes back but the diagonal),
    ``omega="auto"`` / Chebyshev's ``lmax`` estimated with distributed products, its SpMV
    the distributed ``A``.  A rank without rows builds it on the host (empty data, moved by
    :func:`_smoother_on`) and only joins the estimates' reductions.  ``pending`` (a list): an
    ``omega="auto"`` is estimated later, with other levels' (:func:`_auto_omegas`), and
    ``(A, smoother)`` appended to it."""
    spec = ml._smoother_spec
    key = spec if isinstance(spec, str) else None
    if key is not None:
        from ..multilevel.smoothers import normalize_smoother_name
        key = normalize_smoother_name(spec)
    cls = {"jacobi": Jacobi, "chebyshev": Chebyshev, "block_jacobi": BlockJacobi}.get(key)
    if cls is None:
        raise ValueError(f"distributed multigrid supports the smoothers jacobi, chebyshev and "
                         f"block_jacobi, one for every level, got {spec!r}")
    kw = dict(ml._smoother_kwargs)
    comm, N, be = A.comm, A.global_shape[0], A.backend
    blk = A.owned_block()
    on = be if (A.rows.n and is_device_sparse(blk)) or not be.is_gpu else CPU
    auto = kw.get("omega") == "auto"
    if cls is Chebyshev:
        est = kw.get("lmax") is None
        if est:
            kw["lmax"] = 1.0
        sm = cls(blk, backend=on, dtype=np.float64, **kw)
        if est:
            sm.lmax = 1.1 * _lanczos_lambda(comm, A, sm._dinv_host, N)
            sm._setup_host()
    else:
        if auto:
            kw["omega"] = 1.0
        sm = cls(blk, backend=on, dtype=np.float64, **kw)
    loc = copy.copy(sm)
    loc = _smoother_on(loc, be, A) if on is not be else _smoother_with(loc, A)
    if auto and cls is not Chebyshev:
        if pending is None:
            _auto_omegas(comm, [(A, loc)])
        else:
            pending.append((A, loc))
    return loc


class _DLevel:
    __slots__ = ("A", "P", "R", "smoother", "layout")


def level_from_rows(K_o, P_o, R_o, lay, clay, timer, kw, A=None):
    """A distributed level from this rank's rows of ``K``, ``P`` (fine x coarse) and ``R``
    (coarse x fine), global columns, on the layouts ``lay`` (fine) and ``clay`` (coarse):
    three :class:`~.csr.DistCSR` (``kw``: backend, transport; ``P_o`` / ``R_o`` may be
    theirs already); the smoother comes later.
    ``A``: the level's operator made already (``K_o`` None; e.g. a :class:`.DistMatrixFree`)."""
    d = _DLevel()
    d.layout, d.smoother = lay, None
    d.A = A if A is not None else DistCSR(K_o, lay, lay, timer, local_rows=True, **kw)
    d.P = P_o if isinstance(P_o, DistCSR) else DistCSR(P_o, lay, clay, timer, local_rows=True, **kw)
    d.R = R_o if isinstance(R_o, DistCSR) else DistCSR(R_o, clay, lay, timer, local_rows=True, **kw)
    return d


class _NoRows:
    """The smoother of a level on a rank that owns none of its rows (a folded level): there
    is nothing to smooth (its vectors are empty), so no kernel is launched."""

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        return x

    def __repr__(self):
        return "_NoRows()"


class DistributedHierarchy:
    """The distributed levels of a serial ``GeometricMultigrid`` and the one
    :class:`~adaptmg.multilevel.MultilevelSolver` over them (``self.solver``; module doc).

    Parameters
    ----------
    ml : GeometricMultigrid, built identically on every rank (CPU or GPU backend, float64):
        the whole hierarchy, or with ``local`` the levels below the locally built ones.  Its
        backend is the distributed levels' (GPU: select each rank's device first,
        :func:`.comm.select_device`).
    fine_cell_ranks : rank of every finest cell (:func:`~.partition.partition_cells`).
    comm : mpi4py communicator.
    agglomerate_below : levels with fewer DoFs go to rank 0 (the coarsest always does).
    min_dofs_per_rank : a coarser distributed level with ``N_l`` DoFs works on
        ``P_l = min(P_{l+1}, max(1, N_l // min_dofs_per_rank))`` ranks, ``0 .. P_l - 1``
        (:func:`~.partition.level_ranks`; the finest level on all of them); None or 0: every
        distributed level on all ranks.
    local : dict(spaces=[...], frees=[...], assemble=f), optional: the spaces of the
        geometric levels above ``ml`` (coarse -> fine, the finest last), their free-DoF masks
        and the assembly callable, called on :class:`~.local.CellSubset` views.  Their
        levels must all be distributed (at least ``agglomerate_below`` DoFs).  With
        ``matrix_free=True`` in it these levels' operators are
        :class:`~.matrix_free.DistMatrixFree` (the Q1 Laplacian; ``assemble`` not called).
        ``ownership=(owners, cell_ranks, nranks)`` in it: those of the local levels, computed
        by the caller (:func:`~.partition.level_ownership`; every level of ``ml`` is then
        agglomerated on rank 0, and ``ml`` may be a :class:`SerialLevelsOnRankZero` or a
        :class:`~.serial_levels.PendingSerialLevels`: rank 0 builds them beside the finest
        level's assembly -- the finest level's ``after`` --, and the levels below their top
        join ``levels``, ``layouts`` and the other lists at the end; ``self.ml`` is then rank
        0's hierarchy there and a :class:`SerialLevelsOnRankZero` elsewhere).

    transport : GPU only: the halo transport, "auto" / "host" / "nccl" (None: the
        environment variable ``ADAPTMG_HALO_TRANSPORT`` or "auto"); ``self.transport`` the one
        used ("mpi" on the CPU).

    ``solver``: the MultilevelSolver whose levels are the distributed ones (coarse -> fine,
    its ``levels[0]`` level ``c - 1`` on rank 0, coarse solver :class:`RankZeroCycle`);
    precondition a Krylov method of :mod:`adaptmg.linalg` with its cycle, the reductions made
    global by :func:`adaptmg.linalg._vectorops.global_reductions` (:func:`.solve.solve`
    does).  ``A``: the finest level's DistCSR.

    ``setup_stats`` (local set-up): per local level the cells assembled by this rank and the
    level's cells, the cells used for P/R, and the seconds of each phase.  ``active_ranks``:
    per level (coarse -> fine) the number of ranks it works on (1 for the agglomerated ones);
    ``owning_ranks``: how many of them own at least one DoF of it.
    """

    def __init__(self, ml, fine_cell_ranks, comm, agglomerate_below=1000, local=None,
                 min_dofs_per_rank=2000, transport=None):
        if ml.backend.name not in ("cpu", "gpu") or np.dtype(ml.dtype) != np.float64:
            raise ValueError(f"DistributedHierarchy: CPU or GPU float64 hierarchies only, got "
                             f"backend {ml.backend.name} and dtype {ml.dtype}")
        self.ml, self.comm = ml, comm
        self.backend = be = ml.backend
        self.transport = resolve_transport(comm, transport, be)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timer = HaloTimer()
        self.setup_stats = {}
        st = self.setup_stats
        t0 = time.perf_counter()
        self.HT_o = self.free_o = None
        self.aside_estimates = 0          # 1: the finest local level's estimate overlapped the second finest
        self.priority_switches = 0        # blocks of the set-up run on the priority stream
        self.build_order = []             # the locally built levels' indices, in the order finished
        self.serial_built = None          # pending serial levels: when rank 0 built them (None elsewhere)
        self.matrix_free = bool(local is not None and local.get("matrix_free"))
        pending_serial = isinstance(ml, PendingSerialLevels)      # (then only their top is known)
        if local is not None and local.get("ownership") is not None:     # computed by the caller
            cells = (ml.cells if isinstance(ml, (SerialLevelsOnRankZero, PendingSerialLevels))
                     else [s.mesh.num_cells for s in ml.spaces])
            owners, c, cell_ranks, nranks = with_agglomerated([lev.n for lev in ml.levels], cells,
                                                              *local["ownership"])
        else:
            view = ml if local is None else _FineView(ml, local["spaces"])
            owners, c, cell_ranks, nranks = level_owners(view, fine_cell_ranks, self.size,
                                                         agglomerate_below, min_dofs_per_rank)
        self.owners, self.c, self.cell_ranks = owners, c, cell_ranks
        self.active_ranks = nranks
        self.layouts = [Layout(o, comm) for o in owners]
        self.owning_ranks = [int((lay.counts > 0).sum()) for lay in self.layouts]
        be.synchronize()
        t1 = time.perf_counter()
        st["owners_s"] = t1 - t0            # transport, level owners and layouts
        self.levels = []
        kw = dict(backend=be, transport=self.transport)
        for l, lev in enumerate(ml.levels):
            d = _DLevel()
            d.layout = lay = self.layouts[l]
            d.A = d.P = d.R = d.smoother = None
            if l == c - 1 and not pending_serial:     # the top of the levels on rank 0: the coarse level
                d.A = self._rank_zero_top(lev, lay, kw)
            if l >= c:
                d.A = DistCSR(to_host(lev.A), lay, lay, self.timer, **kw)
                d.P = DistCSR(lev.P, lay, self.layouts[l - 1], self.timer, **kw)
                d.R = DistCSR(lev.R, self.layouts[l - 1], lay, self.timer, **kw)
                d.smoother = _local_smoother(ml._dev[l].smoother, d.A, lay.rows, be)
            self.levels.append(d)
        be.synchronize()
        st["serial_levels_s"] = time.perf_counter() - t1     # the levels from ml (c - 1 and up)
        if local is not None:
            if c > len(ml.levels):
                raise RuntimeError("DistributedHierarchy: a locally built level would be agglomerated")
            spaces = [ml.spaces[-1]] + list(local["spaces"])
            frees = [ml.constraints[-1].free] + list(local["frees"])
            st.update(cells_assembled=[], cells=[], cells_transfer=[])
            # on the GPU with NCCL, fine to coarse, the host-bound set-up of the coarser levels
            # beside the finest level's device-bound work, on the high-priority stream
            # (adaptmg.device.priority): the finest assembly is queued (its det J check
            # deferred) and, while its kernels run, its transfer rows, their DistCSRs, the
            # levels below the second finest and rank 0's pending serial levels (~45 ms of
            # launch-bound host work, no collective) are set up; then the finest level's omega="auto"
            # estimate (twelve products of the largest matrix, norms on the device) is queued and
            # the second finest level is set up meanwhile; the other estimates (bound by
            # launches and latency) run together afterwards.  Two H200, 21M DoFs a rank: the
            # finest assembly ~130 ms and its estimate ~37 ms of device work; the coarser
            # levels ~26 ms (the third finest) and ~41 ms (the second finest) of host work.
            # Not for matrix-free levels, which put memory first (their set-up is device-bound;
            # the estimate's vectors would be live beside the coarser levels' set-up: at 1e8 DoFs
            # a rank the pool's high-water 1,329 -> 1,374 B per DoF, no time gained).  Otherwise
            # coarse to fine, every estimate at the end.
            pending, top, base = [], len(spaces) - 1, len(self.levels)
            hi = PriorityStream(be.xp) if be.is_gpu else None
            fine_first = hi is not None and top > 1 and not self.matrix_free and self.transport == "nccl"
            built, order = {}, []

            def level(j, got=pending, after=None):
                built[j] = self._local_level(spaces[j - 1], spaces[j], frees[j - 1], frees[j], local["assemble"],
                                             fine=j == top, pending=got, level=base + j - 1,
                                             aside=hi if j == top else None, after=after)
                order.append(j)

            serial_build = (lambda: ml.build("beside the finest level")) if pending_serial else None

            def below_second():                      # beside the finest assembly
                for j in range(top - 2, 0, -1):
                    level(j)
                if serial_build is not None:         # rank 0's serial levels (no collective)
                    serial_build()
            fine_est = None
            if fine_first:
                fine_pairs = []
                level(top, fine_pairs, after=below_second if top > 2 or pending_serial else None)
                if device_norms(fine_pairs):
                    mark = hi.mark()                                    # the finest level's work
                    fine_est = start_auto_omegas(self.comm, fine_pairs)
                else:
                    pending.extend(fine_pairs)
                with hi.after(mark) if fine_est is not None else contextlib.nullcontext():
                    level(top - 1)
            else:
                for j in range(1, top + 1):
                    level(j, after=serial_build if j == top else None)
            for key in ("cells_assembled", "cells", "cells_transfer"):          # coarse -> fine
                st[key] = [v for _, v in sorted(zip(order, st[key]))]
            self.aside_estimates = int(fine_est is not None)
            self.priority_switches = hi.switches if hi is not None else 0
            self.build_order = [base + j - 1 for j in order]        # the local levels, as finished
            self.levels.extend(built[j] for j in range(1, top + 1))
            t_est = time.perf_counter()
            _auto_omegas(self.comm, pending)
            if fine_est is not None:
                fine_est.finish()
            be.synchronize()
            st["smoother_s"] = st.get("smoother_s", 0.0) + time.perf_counter() - t_est
            if pending_serial:
                self._serial_below(ml, local["ownership"], kw)
        self.A = self.levels[-1].A
        self.layout = self.layouts[-1]
        t2 = time.perf_counter()
        self.solver = self._solver()
        be.synchronize()
        st["solver_s"] = time.perf_counter() - t2
        #: halo exchanges of the set-up itself (the smoothers' lambda_max estimates run the
        #: distributed product on the hierarchy's backend)
        self.setup_exchanges = self.timer.exchanges
        self.setup_idle = self.timer.idle          # ... of them skipped (NCCL, nothing to move)

    @staticmethod
    def serial_beside_finest(backend, matrix_free):
        """Whether the finest local level's ``after`` -- where a
        :class:`~.serial_levels.PendingSerialLevels` is built -- runs beside its device-bound
        assembly (the GPU, assembled levels: the priority stream of :meth:`_local_level`) rather
        than after it."""
        return get_backend(backend).is_gpu and not matrix_free

    def _rank_zero_top(self, lev, lay, kw):
        """Level ``c - 1``'s DistCSR, the top of the levels on rank 0 (the coarse level of the
        one cycle): rank 0 owns every row, in order, so its rows are the serial matrix
        ``lev.A`` as it is (on the device there: no host round trip); the other ranks own none."""
        A = lev.A if lay.n == lay.N else sp.csr_matrix((lay.n, lay.N))
        return DistCSR(A, lay, lay, self.timer, local_rows=True, **kw)

    def _serial_below(self, pending, ownership, kw):
        """After the local levels, from :class:`~.serial_levels.PendingSerialLevels` (collective):
        rank 0's serial levels (built beside the finest assembly; now if not), their summary on
        the other ranks, the levels below their top put below the ones built (their layouts:
        rank 0 owns them), the top's DistCSR, and every level index shifted by their count."""
        t = time.perf_counter()
        self.ml, summary = pending.finish(self.comm, self.backend)
        self.serial_built = pending.where
        self.setup_stats["serial_build_s"] = pending.seconds
        owners, c, cell_ranks, nranks = with_agglomerated(summary["dofs"], summary["cells"], *ownership)
        below = c - 1                                    # the levels under the top
        self.owners, self.c, self.cell_ranks, self.active_ranks = owners, c, cell_ranks, nranks
        self.layouts = [Layout(o, self.comm) for o in owners[:below]] + self.layouts
        self.owning_ranks = [int((lay.counts > 0).sum()) for lay in self.layouts]
        empty = []
        for lay in self.layouts[:below]:
            d = _DLevel()
            d.layout, d.A, d.P, d.R, d.smoother = lay, None, None, None, None
            empty.append(d)
        self.levels = empty + self.levels
        lev = self.ml.levels[-1] if self.rank == 0 else None
        self.levels[c - 1].A = self._rank_zero_top(lev, self.layouts[c - 1], kw)
        self.build_order = [l + below for l in self.build_order]
        self.backend.synchronize()
        self.setup_stats["serial_levels_s"] += time.perf_counter() - t

    def _solver(self):
        """The one MultilevelSolver: levels ``c - 1 .. L`` (DistCSR operators, the owned-rows
        smoothers; :class:`_NoRows` where this rank owns no row), :class:`RankZeroCycle` below."""
        c, ml = self.c, self.ml
        levels = [Level(self.levels[c - 1].A, meta={"dofs": self.layouts[c - 1].N, "ranks": 1})]
        for l in range(c, len(self.levels)):
            d = self.levels[l]
            sm = d.smoother if d.layout.n else _NoRows()
            levels.append(Level(d.A, d.P, d.R, smoother=sm,
                                meta={"dofs": d.layout.N, "ranks": self.active_ranks[l]}))
        return MultilevelSolver(levels, coarse=RankZeroCycle(ml, c - 1, self.rank),
                                presmooth=ml.presmooth, postsmooth=ml.postsmooth,
                                backend=self.backend, dtype=np.float64)

    def _local_level(self, cspace, space, cfree, free, assemble, fine, pending=None, level=None, aside=None,
                     after=None):
        """The next level from the rank's cells only (:mod:`.local`): owned rows of K, P, R and
        the smoother (``fine``: also keep (Z H^T)'s owned rows for the right-hand side), all
        built on the hierarchy's backend (on the GPU: K's rows assembled and constrained
        there, P's and R's rows built on the host and moved up, split into the DistCSR blocks
        there, the smoother from the device block; an ``omega="auto"`` appended to ``pending``,
        estimated with the other local levels').  ``level``: its index (default: the next one).
        ``aside``: a :class:`~adaptmg.device.priority.PriorityStream` for the constraint
        blocks, the transfer's rows and their two DistCSRs, built there while the assembly's
        kernels run (:func:`.local.local_constrained_rows`' ``beside``; its det J check read
        after them); then ``after()`` there too (the coarser levels), else ``after()`` after
        the transfer.  Its phase times are the coarser levels' own, not this level's.
        Phase times are taken after a synchronisation of the current stream, not the device's:
        while the coarser levels are set up on the priority stream, the finest level's
        estimate runs on the other one."""
        from .local import local_constrained_rows, local_transfer_rows
        l = len(self.levels) if level is None else level
        lay, clay = self.layouts[l], self.layouts[l - 1]
        be, kw = self.backend, dict(backend=self.backend, transport=self.transport)

        def now():
            if be.is_gpu:
                be.xp.cuda.get_current_stream().synchronize()
            return time.perf_counter()
        t0 = now()
        xp = space.mesh.backend.xp                   # a device mesh: its owners on the device
        mf = None
        tr = {}
        # with ``aside`` the transfer and its DistCSRs (and ``after``) are built on the priority
        # stream while the assembly's kernels run (two H200, 21M DoFs a rank: ~40 ms of host
        # work that waited for the device otherwise)
        beside = aside is not None and not self.matrix_free

        def transfer():
            # matrix-free levels put memory first: P's rows this rank needs only (the whole P
            # of a 2e8-DoF level on each of two H200 raised the pool's high-water by 55 B per DoF)
            t = time.perf_counter()
            # split for the DistCSRs as they are taken out of P and its transpose
            P_o, R_o, tr["cells"] = local_transfer_rows(cspace, space, cfree, free, clay.owner_on(xp),
                                                        lay.owner_on(xp), self.rank,
                                                        whole=False if self.matrix_free else None,
                                                        split=(clay, lay))
            tr["P"], tr["R"] = ((DistCSR(P_o, lay, clay, self.timer, local_rows=True, **kw),
                                 DistCSR(R_o, clay, lay, self.timer, local_rows=True, **kw)) if beside
                                else (P_o, R_o))
            tr["s"] = time.perf_counter() - t
            if after is not None:                    # the coarser levels (their own phase times)
                t = time.perf_counter()
                after()
                tr["after"] = time.perf_counter() - t
        if self.matrix_free:                         # the operator without a matrix
            mf = DistMatrixFree(space, free, lay, self.timer, **kw)
            K_o, HT_o, cells = None, None, mf.num_cells
        else:
            # on a device mesh the row kernels write K's rows split for the DistCSR already
            K_o, HT_o, cells = local_constrained_rows(space, assemble, free, lay.owner_on(xp), self.comm,
                                                      backend=be, rhs_rows=fine,
                                                      local=lay.local_on(xp) if xp is not np else None,
                                                      aside=aside, beside=transfer if beside else None)
            cells = int(cells.size)
        t1 = now()
        if "P" not in tr:
            transfer()
        t2 = now()
        d = level_from_rows(K_o, tr["P"], tr["R"], lay, clay, self.timer, kw, A=mf)
        t3 = now()
        ncells_t = tr["cells"]
        d.smoother = _distributed_smoother(self.ml, d.A, space.components, pending)
        st = self.setup_stats
        st["cells_assembled"].append(cells)
        st["cells"].append(space.mesh.num_cells)
        st["cells_transfer"].append(ncells_t)
        # the transfer's host time (beside the assembly: with its DistCSRs) counts in transfer_s,
        # the coarser levels' (``after``) in their own phases: neither in the interval holding them
        ta = tr.get("after", 0.0)
        inside = tr["s"] + ta if beside else 0.0
        for key, v in (("matrix_s", t1 - t0 - inside), ("transfer_s", t2 - t1 + (tr["s"] if beside else -ta)),
                       ("distcsr_s", t3 - t2), ("smoother_s", now() - t3)):
            st[key] = st.get(key, 0.0) + v
        if fine:
            self.HT_o = HT_o
            self.free_o = free[lay.rows_on(xp)]
            st.update(fine_cells=space.mesh.num_cells, fine_cells_assembled=cells,
                      fine_cells_transfer=ncells_t)
        return d

    def constrain_local(self, b):
        """Owned entries of the constrained right-hand side ``f = Z H^T b`` (homogeneous
        Dirichlet values) on the finest level, from the global load vector ``b``."""
        if isinstance(self.A, DistMatrixFree):       # its own owned rows of Z H^T
            return self.A.constrain_load(b)
        if self.HT_o is None:                        # replicated set-up: the serial hierarchy's
            return self.layout.scatter(self.ml.constrain(np.asarray(b, dtype=float)))
        # a device mesh: HT_o, the free mask and f on the device (b moved there)
        xp = backend_of(self.HT_o).xp
        f = self.HT_o @ (xp.asarray(b, dtype=float) if xp is not np else np.asarray(b, dtype=float))
        f[~self.free_o] = 0.0
        return f

    def describe(self):
        """Per level: global DoFs, DoFs per rank, ghost entries per rank, the number of ranks
        it works on (``ranks``: P_l) and of those owning DoFs (collective)."""
        rows = []
        for l, d in enumerate(self.levels):
            ghosts = d.A.ghosts.size if d.A is not None else 0
            g = self.comm.allgather(ghosts)
            rows.append({"level": l, "dofs": d.layout.N, "owned": d.layout.counts.tolist(),
                         "ghosts": g, "agglomerated": l < self.c, "ranks": self.active_ranks[l],
                         "owning": self.owning_ranks[l]})
        return rows
