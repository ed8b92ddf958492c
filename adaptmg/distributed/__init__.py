"""Distributed meshes, matrices and multigrid over MPI (mpi4py), opt-in.

``mpiexec -n 4 python my_script.py`` with::

    from adaptmg.distributed import solve_poisson
    res = solve_poisson(mesh, f, degree=1)        # comm defaults to MPI.COMM_WORLD
    res.u, res.iterations, res.imbalance

Modules: :mod:`.partition` (Morton-curve cell partition, DoF owners), :mod:`.local`
(per-rank set-up of a level from the rank's cells plus a ghost layer), :mod:`.csr`
(MPIAIJ-style distributed CSR with halo exchange, distributed dots/norms),
:mod:`.multigrid` (every level distributed, coarser ones on fewer ranks, the smallest
agglomerated on rank 0),
:mod:`.krylov` (adaptmg.linalg's cg/gmres/fgmres unchanged, their reductions through an
allreduce hook), :mod:`.solve` (one-call helpers), :mod:`.comm` (communicator, error
agreement, abort guard, the launcher's job size).

``mpiexec -n 4 python -m adaptmg run poisson`` runs the Poisson demo distributed (the
problem asks :func:`launched_size`; rank 0 prints and writes the outputs).

Stated plainly: the mesh is replicated on every rank (deal.II's ``parallel::shared``
model; so are the O(cells) mesh-level arrays derived from it: the coarsening hierarchy, the
partition, DoF owners, hanging-node matrices H).  Every geometric level with at least
``agglomerate_below`` DoFs is set up per rank from the cells touching its owned DoFs (owned
cells plus one ghost layer, widened to every cell of a hanging node with an owned parent;
:mod:`.local`): assembly, the owned rows of the constrained matrix, of P and of R, and the
smoother (its lambda_max estimate distributed).  The finest level is on all ``P`` ranks;
a coarser one with ``N_l`` DoFs on ``P_l = min(P_{l+1}, max(1, N_l // min_dofs_per_rank))``
ranks ``0 .. P_l - 1`` (its cell partition folded onto them, the other ranks own none of
its DoFs; ``min_dofs_per_rank`` default 2000, None or 0: all ranks; ``result.active_ranks``
lists ``P_l`` per level).  The small levels below ``agglomerate_below`` (agglomerated onto
rank 0, and algebraic ones) come from a serial hierarchy that every rank builds on the
coarse mesh.  ``solve(..., local_setup=False)`` is the first version: every rank builds the
whole serial hierarchy and extracts its rows.  Matrices, vectors, smoothing, transfers and
the Krylov solve are distributed.  One rank (or no mpi4py) is the serial code path.
CPU/MPI only; the device path over NCCL is a TODO.
"""
from .comm import agree, get_comm, guard, have_mpi, install_excepthook, launched_rank, launched_size
from .csr import DistCSR, Layout, dot, dots, norm
from .krylov import cg, krylov, linalg_is_distributed
from .multigrid import DistributedMultigrid
from .partition import (coarse_cell_ranks, curve_order, dof_owners, fold_cell_ranks, imbalance,
                        level_ranks, partition_cells)
from .solve import DistributedResult, solve, solve_poisson

__all__ = ["agree", "get_comm", "guard", "have_mpi", "install_excepthook", "launched_rank",
           "launched_size", "DistCSR", "Layout",
           "dot", "dots", "norm", "cg", "krylov", "linalg_is_distributed", "DistributedMultigrid", "coarse_cell_ranks", "curve_order",
           "dof_owners", "fold_cell_ranks", "imbalance", "level_ranks", "partition_cells", "DistributedResult", "solve",
           "solve_poisson"]
