r"""Multigrid with every level distributed: the serial hierarchy's operators on owned rows.

Given the serial :class:`~adaptmg.multilevel.hierarchy.GeometricMultigrid` ``ml`` (levels
``0..L``, coarse -> fine) and the cell partition of the finest mesh,
:class:`DistributedMultigrid` builds

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
  the summation order inside the row products (block Jacobi alike).

Agglomeration.  Levels with fewer than ``agglomerate_below`` DoFs (always the coarsest
one, and all algebraic levels; never the finest) live entirely on rank 0: their DoF "partition" gives
rank 0 every DoF, so the restriction into the finest of them is an ordinary
``DistCSR`` product that gathers onto rank 0, and the prolongation out of it scatters.
Rank 0 then runs the *serial* solver's cycle on those levels (``ml._run(..., level=)``:
the same smoothers and dense coarse inverse), other ranks wait in the next halo exchange.

The cycle (V, W or F) is the serial one of :class:`~adaptmg.multilevel.MultilevelSolver`
(seed 001, Algorithm 1), level by level on local vectors.

First-version limits (stated plainly): the mesh and the serial hierarchy are
**replicated** on every rank (like deal.II's ``parallel::shared::Triangulation``), and
each level's matrices are **assembled serially and their owned rows extracted**
(assembling only owned + one ghost layer of cells is the next step); memory is
therefore not distributed yet, the solve is.  Smoothers: Jacobi, Chebyshev and block
Jacobi; others (Gauss-Seidel: sequential across rows) raise ValueError.
"""
from __future__ import annotations

import copy

import numpy as np

from ..device import kernels as K
from ..multilevel.smoothers import BlockJacobi, Chebyshev, Jacobi
from .comm import HaloTimer
from .csr import DistCSR, Layout
from .partition import coarse_cell_ranks, dof_owners

__all__ = ["DistributedMultigrid", "level_owners"]


def level_owners(ml, fine_cell_ranks, size, agglomerate_below=1000):
    """DoF owners of every level of ``ml`` (coarse -> fine) and the index ``c`` of the coarsest
    distributed level (levels below ``c`` are on rank 0); also the cell ranks per geometric level."""
    L = len(ml.levels)
    nalg = ml.num_algebraic
    spaces = ml.spaces
    cell_ranks = [None] * len(spaces)
    cell_ranks[-1] = np.asarray(fine_cell_ranks, dtype=np.int64)
    if cell_ranks[-1].shape != (spaces[-1].mesh.num_cells,):
        raise ValueError(f"fine_cell_ranks must have one rank per cell ({spaces[-1].mesh.num_cells}), "
                         f"got shape {cell_ranks[-1].shape}")
    for i in range(len(spaces) - 2, -1, -1):
        cell_ranks[i] = coarse_cell_ranks(spaces[i + 1].mesh, spaces[i].mesh, cell_ranks[i + 1], size)
    c = 1
    for l in range(L):
        if l < nalg or ml.levels[l].n < agglomerate_below:
            c = max(c, l + 1)
    if L < 2:
        raise ValueError("distributed multigrid needs at least two levels (the finest one is "
                         "distributed, the coarsest one lives on rank 0); the mesh has no refinement "
                         "history to coarsen")
    c = min(c, L - 1)                        # the finest level is always distributed
    owners = []
    for l in range(L):
        if l < c:
            owners.append(np.zeros(ml.levels[l].n, dtype=np.int64))
        else:
            owners.append(dof_owners(spaces[l - nalg], cell_ranks[l - nalg]))
    return owners, c, cell_ranks


def _local_smoother(sm, A: DistCSR, rows: np.ndarray):
    """A copy of the serial smoother ``sm`` acting on the owned rows, its SpMV the distributed one."""
    if type(sm) not in (Jacobi, Chebyshev, BlockJacobi):
        raise ValueError(f"distributed multigrid supports the smoothers Jacobi, Chebyshev and "
                         f"BlockJacobi, got {type(sm).__name__}")
    if sm.backend.name != "cpu":
        raise ValueError("distributed multigrid: the CPU backend only in this version "
                         "(the NCCL device path is a TODO)")
    loc = copy.copy(sm)
    loc.n = rows.size
    loc.A = A
    loc.A_host = None
    loc._Aplan = A
    loc.fused = False
    loc._work = None
    if isinstance(sm, BlockJacobi):
        # S = blockdiag(B_k)^{-1} couples the components of one node, and all components
        # of a node have one owner: the owned rows of S only reach owned columns
        S = sm.S[rows]
        loc.S = S[:, rows].tocsr()
        if loc.S.nnz != S.nnz:
            raise RuntimeError("BlockJacobi: a block couples DoFs of different ranks")
        loc._Splan = K.make_spmv(loc.S)
        return loc
    loc.dinv = np.ascontiguousarray(sm.dinv[rows])
    if isinstance(sm, Chebyshev):
        loc._d = np.zeros(rows.size, sm.dtype)
    return loc


class _DLevel:
    __slots__ = ("A", "P", "R", "smoother", "x", "b", "r", "layout")


class DistributedMultigrid:
    """Distributed counterpart of a serial ``GeometricMultigrid`` (see the module doc).

    Parameters
    ----------
    ml : GeometricMultigrid, built identically on every rank (CPU backend, float64).
    fine_cell_ranks : rank of every finest cell (:func:`~.partition.partition_cells`).
    comm : mpi4py communicator.
    agglomerate_below : levels with fewer DoFs go to rank 0 (the coarsest always does).
    """

    def __init__(self, ml, fine_cell_ranks, comm, agglomerate_below=1000):
        if ml.backend.name != "cpu" or np.dtype(ml.dtype) != np.float64:
            raise ValueError(f"DistributedMultigrid: CPU float64 hierarchies only, got backend "
                             f"{ml.backend.name} and dtype {ml.dtype}")
        self.ml, self.comm = ml, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timer = HaloTimer()
        owners, c, cell_ranks = level_owners(ml, fine_cell_ranks, self.size, agglomerate_below)
        self.owners, self.c, self.cell_ranks = owners, c, cell_ranks
        self.layouts = [Layout(o, comm) for o in owners]
        self.presmooth, self.postsmooth = ml.presmooth, ml.postsmooth
        self.levels = []
        for l, lev in enumerate(ml.levels):
            d = _DLevel()
            d.layout = lay = self.layouts[l]
            d.A = d.P = d.R = d.smoother = None
            if l >= c:
                d.A = DistCSR(lev.A, lay, lay, self.timer)
                d.P = DistCSR(lev.P, lay, self.layouts[l - 1], self.timer)
                d.R = DistCSR(lev.R, self.layouts[l - 1], lay, self.timer)
                d.smoother = _local_smoother(ml._dev[l].smoother, d.A, lay.rows)
            d.x, d.b = np.zeros(lay.n), np.zeros(lay.n)
            d.r = np.zeros(lay.n)
            self.levels.append(d)
        self.A = self.levels[-1].A
        self.layout = self.layouts[-1]

    # ------------------------------------------------------------------ the cycle
    def _smooth(self, d, sweeps, zero, post):
        sm = d.smoother
        f = sm.smooth_adjoint if post and hasattr(sm, "smooth_adjoint") else sm.smooth
        f(d.x, d.b, sweeps, work=d.r, zero_initial=zero)

    def _level_cycle(self, l, kind, zero):
        if l < self.c:                 # agglomerated: rank 0 runs the serial cycle
            if self.rank == 0:         # on this level's vectors, swapped into the serial solver
                d = self.levels[l]
                self.ml._run(d.b, d.x, kind, zero, level=l)
            return
        d, cl = self.levels[l], self.levels[l - 1]
        self._smooth(d, self.presmooth, zero, post=False)
        d.r[...] = d.b
        d.A(d.x, d.r, -1.0, 1.0)
        d.R(d.r, cl.b, 1.0, 0.0)
        if kind == "V":
            self._level_cycle(l - 1, "V", True)
        elif kind == "W":
            self._level_cycle(l - 1, "W", True)
            if l - 1 > 0:
                self._level_cycle(l - 1, "W", False)
        else:
            self._level_cycle(l - 1, "F", True)
            if l - 1 > 0:
                self._level_cycle(l - 1, "V", False)
        d.P(cl.x, d.x, 1.0, 1.0)
        self._smooth(d, self.postsmooth, False, post=True)

    def precondition(self, r, cycle="V"):
        """One cycle from zero on ``A z = r`` (local vectors); returns a new ``z``."""
        d = self.levels[-1]
        d.b[...] = r
        self._level_cycle(len(self.levels) - 1, cycle, True)
        return d.x.copy()

    def describe(self):
        """Per level: global DoFs, DoFs per rank, ghost entries per rank (collective)."""
        rows = []
        for l, d in enumerate(self.levels):
            ghosts = d.A.ghosts.size if d.A is not None else 0
            g = self.comm.allgather(ghosts)
            rows.append({"level": l, "dofs": d.layout.N, "owned": d.layout.counts.tolist(),
                         "ghosts": g, "agglomerated": l < self.c})
        return rows
