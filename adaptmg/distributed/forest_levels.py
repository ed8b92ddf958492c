r"""The distributed multigrid hierarchy set up from a :class:`~.forest.DistributedForest`:
no rank ever holds the whole fine mesh (Q1 scalar).

Levels.  The forest's global-coarsening sequence (seed 001 §2.2),

.. math::  F_L = \text{forest}, \quad F_{l-1} = F_l.\text{coarsen\_once}(),

is followed while a level has at least ``agglomerate_below`` global nodes (the finest level
always is distributed).  Coarse levels on fewer ranks (the replicated path's rule,
:func:`.partition.level_ranks`): with ``min_dofs_per_rank = m``, a coarser forest of ``N_l``
global nodes is re-cut onto

.. math::  P_l = \min\bigl(P_{l+1},\; \max(1, \lfloor N_l / m \rfloor)\bigr)

ranks ``0 .. P_l - 1`` (:meth:`~.forest.DistributedForest.repartition` with ``ranks=P_l``:
equal pieces of the curve); the ranks above own no leaf (an empty local mesh), so they own
no row of that level's ``K_l``, ``P_l`` or ``R_l`` and their smoother is
:class:`.hierarchy._NoRows`, but they join every collective (halo exchanges, inner products,
the transfers' ``Alltoallv``) with empty parts.  Such a level is only coarsened further on
its active ranks (a re-cut, when needed, onto those) or gathered.  ``ForestHierarchy.active_ranks``
(and ``describe()``'s ``ranks``) gives ``P_l`` per level (1 for the gathered one);
``min_dofs_per_rank`` None or 0 keeps every distributed level on all ranks.  When :meth:`~.forest.DistributedForest.coarsen_once` would leave a
rank without cells, the level is re-cut first (:meth:`~.forest.DistributedForest.repartition`:
the transfers find coarse cells by key, whatever the partitions); when that fails too, or
the coarse mesh is reached, the sequence stops.  Its last forest, the first one below the
threshold, is gathered on rank 0 (:func:`.forest_transfer.gather_level`: a serial
:class:`~adaptmg.mesh.Mesh` rebuilt from the leaf keys, its nodes mapped to the global ids),
where :func:`adaptmg.multigrid` builds the serial hierarchy of the small levels; its cycle
is the coarse solver (:class:`.hierarchy.RankZeroCycle`), as in
:class:`.hierarchy.DistributedHierarchy`.

Per distributed level ``l`` (each a forest of its own, owned node ids one contiguous range
per rank: :class:`.csr.RangeLayout`, O(P) memory):

* ``K_l``'s owned rows, :math:`Z H^T A H Z + s (I - Z)` in global ids
  (:func:`.forest_rows.owned_constrained_rows`), as a :class:`~.csr.DistCSR`;
* ``P_l``'s owned rows :math:`Z_f \chi H_c Z_c` (coarse cells asked for by key from the
  coarse level's owners) and ``R_l = P_l^T``'s (entries sent to the owners of their
  columns): :mod:`.forest_transfer`; into the gathered level the columns are renamed to
  rank 0's serial numbering;
* the smoother, built as the local set-up builds it
  (:func:`.hierarchy._distributed_smoother`: the owned diagonal block, ``omega = 4 / (3
  \lambda_{max})`` by a distributed power iteration -- all levels' together once they are
  built, :func:`.hierarchy._auto_omegas` --, Chebyshev's bound by Lanczos).

They are the levels of **one** :class:`~adaptmg.multilevel.MultilevelSolver` (its cycle),
preconditioning :mod:`adaptmg.linalg`'s Krylov methods in :func:`.solve.solve_forest`.
The right-hand side ``Z H^T (b - A H g) + s g`` (Dirichlet values ``g`` lifted as
:meth:`adaptmg.Constraints.rhs` lifts them) and the nodal values ``H x`` of the owned nodes
(hanging ones, also on the boundary, follow their parents) come from the finest forest alone
(:func:`.forest_rows.owned_constrained_load`, :meth:`ForestHierarchy.expand_local`).

The forests (keys, coarsening) are built on the host (NumPy/SciPy).  With
``backend="gpu"`` each level's local mesh is moved to the device once when the level is
reached (:meth:`~.forest.DistributedForest.local_space`, dropped once the next finer level's
transfer is built) and numbered there unless the coarsening counted its nodes on the host
first; its hanging nodes, ``H``, Dirichlet nodes and the expansion ``E``
(:func:`.forest_rows.prepare`), ``K_l``'s owned rows, the rows of ``P_l`` and ``R_l`` that the
rank answers itself, the load and the nodal values ``H x`` are formed there (the owned leaves
assembled on the device, :math:`Z E^T A E Z` by the congruence row kernels; only the cut's
requests and entries cross to the host); the DistCSR blocks, the smoothers and rank 0's
serial hierarchy live on the device.  Not here: Q2 and several components.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from ..assemble import stiffness
from ..backend import get_backend, to_host
from ..fe.space import Space
from ..multilevel.hierarchy import multigrid
from ..multilevel.level import Level
from ..multilevel.smoothers import smoother_setup_kwargs
from ..multilevel.solver import MultilevelSolver
from .comm import HaloTimer, resolve_transport
from .csr import DistCSR, RangeLayout
from .forest import DistributedForest, _check
from .forest_rows import _pull, owned_constrained_load, owned_constrained_rows, owned_dirichlet_values, prepare
from .forest_transfer import gather_level, prolongation_rows, restriction_rows
from .partition import level_ranks
from .hierarchy import RankZeroCycle, _DLevel, _NoRows, _auto_omegas, _distributed_smoother, level_from_rows

__all__ = ["ForestHierarchy", "coarsening_sequence"]


def _coarsen(F, ranks):
    """``F.coarsen_once()``, re-cutting ``F`` onto its ``ranks`` active ranks first when it would
    leave one of them without cells; None when that fails too (collective: the ValueError is
    agreed on by every rank)."""
    try:
        return F.coarsen_once()
    except ValueError:
        try:
            return F.repartition(ranks=ranks).coarsen_once()
        except ValueError:
            return None


def coarsening_sequence(forest, agglomerate_below, min_dofs_per_rank=None):
    """The forests of the hierarchy, fine -> coarse (module doc): every one but the last is a
    distributed level, the last is gathered on rank 0 (collective).  With ``min_dofs_per_rank``
    ``m``, a coarser forest with ``N_l`` nodes is re-cut onto ``P_l = min(P_{l+1}, max(1, N_l //
    m))`` ranks (:func:`.partition.level_ranks`; the others own no leaf).  Returns the forests
    and their numbers of active ranks."""
    level_ranks([1], 1, 0, min_dofs_per_rank)            # its argument check
    out, ranks = [forest], [forest.size]
    while len(out) == 1 or out[-1].num_global_nodes >= agglomerate_below:
        F = out[-1]
        Fc = _coarsen(F, ranks[-1])
        if Fc is None or Fc.global_num_cells == F.global_num_cells:
            break
        p = ranks[-1]
        if min_dofs_per_rank:
            p = min(p, max(1, Fc.num_global_nodes // int(min_dofs_per_rank)))
            if p < ranks[-1] and Fc.num_global_nodes >= agglomerate_below:
                Fc = Fc.repartition(ranks=p)
        out.append(Fc)
        ranks.append(p)
    if len(out) < 2:
        raise ValueError("distributed multigrid needs at least two levels (the finest one is distributed, "
                         "a coarser one lives on rank 0); the forest has no refinement to coarsen")
    return out, ranks


class ForestHierarchy:
    """The distributed levels of a forest's global-coarsening hierarchy and the one
    :class:`~adaptmg.multilevel.MultilevelSolver` over them (``self.solver``; module doc).

    Parameters
    ----------
    forest : the finest :class:`~.forest.DistributedForest` (its communicator is the job's).
    assemble : ``assemble(space)``, Q1 scalar matrix of a space (called on the rank's owned
        leaves, :class:`~.local.CellSubset`, and on rank 0's serial spaces).
    dirichlet : spec of boundary faces (None, "all", ids/names, ``where``, or a ``{boundary:
        value}`` dict whose values :meth:`load_local` lifts); the levels' matrices and the
        cycle are those of homogeneous data.
    agglomerate_below : levels with fewer global nodes go to rank 0 (the first such one).
    min_dofs_per_rank : a coarser distributed level of ``N_l`` nodes on ``P_l = min(P_{l+1},
        max(1, N_l // min_dofs_per_rank))`` ranks (module doc); None or 0: all ranks.
    backend, transport : "cpu" or "gpu"; the halo transport on the GPU (:mod:`.comm`).
    smoother, smoother_kwargs, presmooth, postsmooth, multigrid_kwargs : as for
        :func:`adaptmg.multigrid` (jacobi, chebyshev; rank 0's serial hierarchy gets them all).
    keep_assembled : keep the finest level's owned-leaf matrix ``A_p`` for lifting Dirichlet
        values in :meth:`load_local` (else it is assembled again there when needed).

    Attributes: ``solver``, ``A`` / ``layout`` (the finest level's DistCSR and
    :class:`~.csr.RangeLayout`), ``levels`` (coarse -> fine; ``levels[0]`` the gathered one,
    its ``A`` only), ``forests`` (coarse -> fine, the gathered one first), ``ml`` (rank 0's
    serial hierarchy; None elsewhere), ``active_ranks``, ``timer`` and ``setup_stats``
    (seconds per phase, this rank).
    """

    def __init__(self, forest, assemble=stiffness, *, dirichlet="all", agglomerate_below=1000,
                 backend="cpu", transport=None, smoother="jacobi", smoother_kwargs=None,
                 presmooth=2, postsmooth=2, keep_assembled=False, min_dofs_per_rank=None, **multigrid_kwargs):
        if not isinstance(forest, DistributedForest):
            raise TypeError(f"ForestHierarchy expects a DistributedForest, got {type(forest).__name__}")
        if not hasattr(forest.comm, "Alltoall"):
            raise ValueError("ForestHierarchy needs an mpi4py communicator (the forest was built without one)")
        self.comm = comm = forest.comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.backend = be = get_backend(backend)
        self.transport = resolve_transport(comm, transport, be)
        self.timer = HaloTimer()
        self.dirichlet = dirichlet
        self._assemble, self._fine_A = assemble, None
        st = self.setup_stats = {}

        def now():
            be.synchronize()
            return time.perf_counter()

        def phase(key, t):
            st[key] = st.get(key, 0.0) + now() - t
        t = now()
        seq, nranks = coarsening_sequence(forest, agglomerate_below, min_dofs_per_rank)
        seq, nranks = seq[::-1], nranks[::-1]                           # coarse -> fine
        self.forests = seq
        phase("coarsen_s", t)
        t = now()
        # each level's space, free mask and expansion (on the device with the GPU backend):
        # made when the level is reached, dropped once the next finer level's transfer is built
        preps = [prepare(seq[0], dirichlet, be)] + [None] * (len(seq) - 1)
        phase("prepare_s", t)
        t = now()
        mesh0, g2s = gather_level(seq[0])
        self._g2s = g2s
        phase("gather_s", t)
        t = now()
        ml = None
        if self.rank == 0:
            ml = multigrid(Space(mesh0, 1), assemble, dirichlet=dirichlet, backend=be, smoother=smoother,
                           smoother_kwargs=smoother_kwargs, presmooth=presmooth, postsmooth=postsmooth,
                           **multigrid_kwargs)
        self.ml = ml
        depth = len(ml.levels) - 1 if ml is not None else 0
        depth = comm.bcast(depth, root=0) if self.size > 1 else depth
        phase("rank0_hierarchy_s", t)
        kw = dict(backend=be, transport=self.transport)
        N0 = seq[0].num_global_nodes
        lay0 = RangeLayout(np.concatenate([[0], np.full(self.size, N0)]), comm)
        A0 = to_host(ml.levels[-1].A) if ml is not None else sp.csr_matrix((0, N0))
        d0 = _DLevel()
        d0.layout, d0.A, d0.P, d0.R, d0.smoother = lay0, DistCSR(A0, lay0, lay0, self.timer, local_rows=True, **kw), \
            None, None, None
        self.levels, self.layouts = [d0], [lay0]
        spec = SimpleNamespace(_smoother_spec=smoother, _smoother_kwargs=smoother_setup_kwargs(
            smoother, smoother_kwargs, block_size=1, auto_omega=True))
        pending = []                     # the levels' omega="auto": estimated together
        for i in range(1, len(seq)):
            F, Fc = seq[i], seq[i - 1]
            clay = self.layouts[-1]
            t = now()
            preps[i] = prepare(F, dirichlet, be)
            phase("prepare_s", t)
            t = now()
            fine = i == len(seq) - 1
            K_o, gids, free_o, scale, *A_p = owned_constrained_rows(F, assemble, dirichlet, prep=preps[i],
                                                                    return_assembled=fine and keep_assembled,
                                                                    backend=be)
            if fine:
                self._scale, self._fine_A = scale, (A_p[0] if A_p else None)
            lay = RangeLayout(preps[i][4].starts, comm)
            _check(comm, lay.n == gids.size and (gids.size == 0 or int(gids[0]) == lay.lo),
                   "ForestHierarchy: the owned node ids are not the rank's range")
            phase("matrix_s", t)
            t = now()
            P_o = prolongation_rows(F, Fc, free_o, preps[i - 1][4], g2s if i == 1 else None, backend=be)
            R_o = restriction_rows(P_o, gids, clay, F.num_global_nodes)
            F.release_device("owned_keys")   # the fine leaves' keys: read by this transfer only
            Fc.release_device()          # the coarser level's device copies (local mesh, expansion): done with
            preps[i - 1][4].drop_device()
            preps[i - 1] = None
            phase("transfer_s", t)
            t = now()
            d = level_from_rows(K_o, P_o, R_o, lay, clay, self.timer, kw)
            phase("distcsr_s", t)
            t = now()
            d.smoother = _distributed_smoother(spec, d.A, 1, pending)
            phase("smoother_s", t)
            self.levels.append(d)
            self.layouts.append(lay)
        t = now()
        _auto_omegas(comm, pending)
        phase("smoother_s", t)
        self._fine_prep = preps[-1]
        self.A, self.layout = self.levels[-1].A, self.layouts[-1]
        self.c = 1
        self.active_ranks = [1] + nranks[1:]
        t = now()
        levels = [Level(d0.A, meta={"dofs": N0, "ranks": 1})]
        for d, p in zip(self.levels[1:], self.active_ranks[1:]):
            levels.append(Level(d.A, d.P, d.R, smoother=d.smoother if d.layout.n else _NoRows(),
                                meta={"dofs": d.layout.N, "ranks": p}))
        self.solver = MultilevelSolver(levels, coarse=RankZeroCycle(ml, depth, self.rank), presmooth=presmooth,
                                       postsmooth=postsmooth, backend=be, dtype=np.float64)
        phase("solver_s", t)
        self.setup_exchanges = self.timer.exchanges

    @property
    def forest(self):
        """The finest forest."""
        return self.forests[-1]

    def load_local(self, f, g=None):
        """Owned entries of the constrained right-hand side ``Z H^T (b - A H g) + s g``, ``b`` the
        load vector of the source ``f`` (constant, callable of the points, or one value per
        owned leaf) on the finest forest, ``g`` the Dirichlet values (None: those of a
        ``{boundary: value}`` spec, else zero; a number or a callable of the points:
        :func:`.forest_rows.owned_dirichlet_values`) (:func:`.forest_rows.owned_constrained_load`;
        collective)."""
        g_o = owned_dirichlet_values(self.forest, g, self.dirichlet, self._fine_prep)
        return owned_constrained_load(self.forest, f, self.dirichlet, prep=self._fine_prep, g_o=g_o,
                                      A=self._fine_A, s=self._scale, assemble=self._assemble,
                                      backend=self.backend)[0]

    def expand_local(self, x_loc):
        """Nodal values ``u = H x`` of the finest level's owned nodes from the owned entries of
        the constrained solution ``x`` (host array): ``x`` at regular nodes, the parents'
        weighted values (pulled from their owners: one request and one reply) at hanging ones
        (collective)."""
        space, gids, first, _, ex = self._fine_prep
        F = self.forest
        be = space.backend                       # the device where the levels were prepared there
        xp = be.xp
        x = be.asarray(x_loc, dtype=float)
        own = F.owned_nodes_on(be)
        hang = xp.flatnonzero(space.mesh.is_hanging[own])
        Hh = space.H_nodes[own[hang]]
        cg = F._moved("node_gid", be)[Hh.indices]
        want = xp.unique(cg)
        vals = _pull(self.comm, ex.starts, want, first, x)
        u = x.copy()
        if hang.size:
            W = be.sparse.csr_matrix((Hh.data * vals[xp.searchsorted(want, cg)], Hh.indices, Hh.indptr),
                                     shape=Hh.shape)
            u[hang] = xp.asarray(W.sum(axis=1)).ravel()
        return to_host(u)

    def describe(self):
        """Per level (coarse -> fine): global DoFs, owned DoFs per rank and ghost columns per
        rank of ``A`` (collective)."""
        rows = []
        for l, d in enumerate(self.levels):
            g = self.comm.allgather(int(d.A.ghosts.size))
            rows.append({"level": l, "dofs": d.layout.N, "owned": d.layout.counts.tolist(), "ghosts": g,
                         "agglomerated": l == 0, "ranks": self.active_ranks[l]})
        return rows
