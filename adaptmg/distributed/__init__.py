"""Distributed meshes, matrices and multigrid over MPI (mpi4py), opt-in.

``mpiexec -n 4 python my_script.py`` with::

    from adaptmg.distributed import solve_poisson
    res = solve_poisson(mesh, f, degree=1)        # comm defaults to MPI.COMM_WORLD
    res.u, res.iterations, res.imbalance

Modules: :mod:`.partition` (Morton-curve cell partition, DoF owners), :mod:`.csr`
(MPIAIJ-style distributed CSR with halo exchange, distributed dots/norms),
:mod:`.multigrid` (every level distributed, coarse levels agglomerated on rank 0),
:mod:`.krylov` (adaptmg.linalg's cg/gmres/fgmres unchanged, their reductions through an
allreduce hook), :mod:`.solve` (one-call helpers), :mod:`.comm` (communicator, error
agreement, abort guard, the launcher's job size).

``mpiexec -n 4 python -m adaptmg run poisson`` runs the Poisson demo distributed (the
problem asks :func:`launched_size`; rank 0 prints and writes the outputs).

First version, stated plainly: the mesh and the serial hierarchy are replicated on
every rank (deal.II's ``parallel::shared`` model) and level matrices are assembled
serially with their owned rows extracted; matrices, vectors, smoothing, transfers and
the Krylov solve are distributed.  One rank (or no mpi4py) is the serial code path.
CPU/MPI only; the device path over NCCL is a TODO.
"""
from .comm import agree, get_comm, guard, have_mpi, install_excepthook, launched_rank, launched_size
from .csr import DistCSR, Layout, dot, dots, norm
from .krylov import cg, krylov, linalg_is_distributed
from .multigrid import DistributedMultigrid
from .partition import coarse_cell_ranks, curve_order, dof_owners, imbalance, partition_cells
from .solve import DistributedResult, solve, solve_poisson

__all__ = ["agree", "get_comm", "guard", "have_mpi", "install_excepthook", "launched_rank",
           "launched_size", "DistCSR", "Layout",
           "dot", "dots", "norm", "cg", "krylov", "linalg_is_distributed", "DistributedMultigrid", "coarse_cell_ranks", "curve_order",
           "dof_owners", "imbalance", "partition_cells", "DistributedResult", "solve",
           "solve_poisson"]
