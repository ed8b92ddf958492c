"""Distributed meshes, matrices and multigrid over MPI (mpi4py), opt-in.

``mpiexec -n 4 python my_script.py`` with::

    from adaptmg.distributed import solve_poisson
    res = solve_poisson(mesh, f, degree=1)        # comm defaults to MPI.COMM_WORLD
    res.u, res.iterations, res.imbalance

Modules: :mod:`.partition` (Morton-curve cell partition, DoF owners), :mod:`.local`
(per-rank set-up of a level from the rank's cells plus a ghost layer), :mod:`.csr`
(MPIAIJ-style distributed CSR with halo exchange, distributed dots/norms),
:mod:`.matrix_free` (a level's constrained Q1 Laplacian applied without a matrix, with the
same halo exchange: ``solve(..., matrix_free=True)``), :mod:`.hierarchy` (the distributed levels -- every level distributed, coarser ones on
fewer ranks, the smallest agglomerated on rank 0 -- as the levels of one
:class:`adaptmg.multilevel.MultilevelSolver`: no cycle of its own), :mod:`.solve`
(one-call helpers: adaptmg.linalg's cg/gmres/fgmres unchanged, their reductions through
an allreduce hook; no Krylov method of its own), :mod:`.comm` (communicator, error
agreement, abort guard, the launcher's job size, the allreduce of the hook), :mod:`.forest`
(:class:`DistributedForest`: each rank holds its owned leaves -- a contiguous range of the
Morton curve -- and one ghost layer, never the whole mesh; refinement with the 2:1 closure
across ranks, global node numbering with hanging nodes, repartition migrating cells,
global coarsening) on :mod:`.cellkeys` (canonical int64 cell keys, a local
forest rebuilt from leaf keys), :mod:`.forest_rows` (owned rows of a Q1 matrix, of its
constrained form and of the constrained load, in global node ids, from the forest's local
meshes), :mod:`.forest_transfer` (owned rows of P and R between consecutive forest levels,
coarse cells asked for by key) and :mod:`.forest_levels` (the multigrid hierarchy set up
from a forest: :func:`solve_forest`, no rank ever holds the whole fine mesh; Q1 scalar;
coarse forest levels re-cut onto ``P_l`` ranks by the same rule as :func:`solve`'s below;
Dirichlet values ``g`` lifted as the serial constraints lift them), and
:mod:`.adaptive` (the adaptive loop on the forest: solve, residual indicators of the owned
leaves from the local mesh, Doerfler marking across ranks without a gather -- with a tie
rule for symmetric problems --, refine, repartition; :func:`adaptive_loop_forest`);
:mod:`.replicated_adaptive` (the adaptive loop with the mesh replicated on every rank --
every device --, :func:`solve`'s distributed set-up and solve each step, the Morton cut of
each step's mesh, rank 0's marks broadcast; :func:`adaptive_loop_replicated`)::

    df = DistributedForest.box([0, 0, 0], [1, 1, 1], [2, 2, 2]).refine().refine()
    res = solve_forest(df, assemble.stiffness, f=1.0, g=lambda x: x[:, 0], rtol=1e-8)  # u = g on the boundary
    out = adaptive_loop_forest(df, f=1.0, steps=6, theta=0.5)     # out["history"]: per step

``mpiexec -n 4 python -m adaptmg run poisson`` runs the Poisson demo distributed (the
problem asks :func:`launched_size`; rank 0 prints and writes the outputs).  The ``mpiexec``
must be that of the MPI library mpi4py is linked with (:func:`.comm.find_mpiexec` picks it
among the one next to Python -- the ``mpi`` extra's MPICH -- and those on the PATH, e.g. a
machine's Open MPI, then ``--allow-run-as-root`` as root); another library's launcher starts
singletons, which :func:`get_comm` refuses with a RuntimeError.  One rank per GPU under Open
MPI: add ``--bind-to none`` (``mpiexec_command(n, gpu=True)`` does): Open MPI binds each of
up to two ranks to one core, and the rank's NCCL proxy thread and CUDA driver threads then
share it with the rank (two H200, the first set-up in a fresh process at 4.8M DoFs: 1.35 ->
1.12 s, NCCL's first all-reduces connecting its channels on the rank's one core).

Stated plainly: :func:`solve` (not :func:`solve_forest`) still replicates the mesh on every rank (deal.II's ``parallel::shared``
model; so are the O(cells) mesh-level arrays derived from it: the coarsening hierarchy, the
partition, DoF owners, hanging-node matrices H).  Every geometric level with at least
``agglomerate_below`` DoFs is set up per rank from the cells touching its owned DoFs (owned
cells plus one ghost layer, widened to every cell of a hanging node with an owned parent;
:mod:`.local`): assembly, the owned rows of the constrained matrix, of P and of R, and the
smoother (its lambda_max estimate distributed).  The finest level is on all ``P`` ranks;
a coarser one with ``N_l`` DoFs on ``P_l = min(P_{l+1}, max(1, N_l // min_dofs_per_rank))``
ranks ``0 .. P_l - 1`` (its cell partition folded onto them, the other ranks own none of
its DoFs; ``min_dofs_per_rank`` default "auto": 2000 on the CPU, 2^18 on GPUs, None or 0:
all ranks; ``result.active_ranks`` lists ``P_l`` per level).  ``agglomerate_below`` defaults
to 1000 DoFs on the CPU and 2^19 on GPUs, where a level of fewer rows costs a kernel launch's
latency on one GPU and a halo exchange per smoothing step when distributed.  The small levels below ``agglomerate_below`` (agglomerated onto
rank 0, and algebraic ones) come from a serial hierarchy on the coarse mesh, which rank 0
alone builds: on the GPU with assembled levels beside its finest level's assembly, rank 0
finding the free masks and rank 1 cutting the mesh (the local levels' DoF owners) before;
elsewhere first, while rank 1 finds the masks and cuts.  Each hands its arrays to the others
(NCCL or MPI, the ranks as int8 where they fit) and rank 0 broadcasts what the others need of
its hierarchy (``result.ml`` there: a :class:`~.serial_levels.SerialLevelsOnRankZero`;
:mod:`.serial_levels`).  Where the
coarsest mesh level itself has ``agglomerate_below`` DoFs or more, every rank builds the
serial hierarchy and cuts the mesh, as before.  ``solve(..., local_setup=False)`` is the first version: every rank builds the
whole serial hierarchy and extracts its rows.  Matrices, vectors, smoothing, transfers and
the Krylov solve are distributed.  One rank (or no mpi4py) is the serial code path.

GPU backend (``solve(..., backend="gpu")``; float64; Jacobi, Chebyshev, block Jacobi).
What exists: each rank selects device ``local_rank % device_count`` first
(:func:`select_device`; the local rank from ``OMPI_COMM_WORLD_LOCAL_RANK`` /
``MPI_LOCALRANKID`` / ``PMI_LOCAL_RANK`` or a shared-memory split of the communicator;
call it yourself before any CuPy allocation when building :class:`DistributedHierarchy`
directly); the set-up runs on the host exactly as for the CPU and its results move to the
device: every distributed level's :class:`DistCSR` (owned and ghost blocks as cupyx CSR,
send indices, ghost/send buffers), the smoothers' owned-row data (``dinv``, Chebyshev's
direction, block Jacobi's ``S``), the cycle's vectors; the small levels agglomerated on
rank 0 run in the serial GPU hierarchy; the Krylov vectors are CuPy arrays, their
reductions one host ``Allreduce`` of the device partial sums.  Halo exchange: host staging
(device gather, D2H into pinned host buffers, MPI ``Isend``/``Irecv``, H2D into the ghost
buffer) or NCCL ``send``/``recv`` (``transport="nccl"``, chosen by ``"auto"`` only when
every rank has its own GPU; :func:`.comm.resolve_transport`).  ``result.u`` / ``result.x``
are host NumPy arrays, ``result.x_local`` a CuPy array.  What is tested: on a CPU-only
machine, the whole device code path under ``mpiexec -n 2`` with a NumPy stand-in for CuPy
(``tests/distributed/fake_cupy.py``; host staging, and NCCL's bookkeeping with a stand-in
NCCL carried by MPI); with ``-m gpu`` on one GPU shared by two ranks, the real CuPy path
with host staging.  Untested: the real NCCL transport (it needs one GPU per rank; NCCL
refuses two ranks on one device), CUDA-aware MPI (not used: MPI sees host buffers only),
more than one node, and performance (no overlap tuning: the exchange runs on CuPy's
current stream).
"""
from .adaptive import adaptive_loop_forest, doerfler_forest
from .comm import (agree, allreduce_sum, get_comm, guard, have_mpi, install_excepthook, launched_rank, launched_size,
                   local_rank, resolve_transport, select_device)
from .csr import DistCSR, Layout, dot, dots, norm
from .matrix_free import DistMatrixFree
from .forest import DistributedForest
from .hierarchy import DistributedHierarchy, RankZeroCycle
from .partition import (coarse_cell_ranks, curve_order, dof_owners, fold_cell_ranks, imbalance,
                        level_ranks, partition_cells)
from .replicated_adaptive import adaptive_loop_replicated
from .solve import DistributedResult, resolve, solve, solve_forest, solve_poisson

__all__ = ["adaptive_loop_forest", "adaptive_loop_replicated", "doerfler_forest", "agree", "allreduce_sum", "get_comm", "guard", "have_mpi", "install_excepthook", "launched_rank",
           "launched_size", "local_rank", "resolve_transport", "select_device", "DistCSR", "DistMatrixFree", "Layout",
           "dot", "dots", "norm", "DistributedForest", "DistributedHierarchy", "RankZeroCycle", "coarse_cell_ranks", "curve_order",
           "dof_owners", "fold_cell_ranks", "imbalance", "level_ranks", "partition_cells", "DistributedResult", "resolve", "solve",
           "solve_forest", "solve_poisson"]
