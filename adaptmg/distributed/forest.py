r"""The distributed forest: every rank holds its own leaves and one ghost layer, never the
whole mesh (p4est's model; :mod:`adaptmg.distributed` otherwise replicates the mesh).

Data on each rank.  The coarse mesh (the roots) is replicated: it is small.  The leaves
are cut along the Morton curve (:mod:`.cellkeys`: a cell is known across ranks only by its
int64 key (root position, level, child digits)); rank ``p`` *owns* one contiguous range of
the curve order.  Its *ghosts* are exactly the leaves owned elsewhere that share a vertex
with an owned leaf (this includes the coarse neighbour whose edge/face holds a hanging
vertex of an owned leaf: it has a corner of that edge/face in common with the fine leaf).
:attr:`DistributedForest.mesh` is a serial :class:`~adaptmg.mesh.Mesh` whose active cells
are the owned leaves and the ghosts, over a local forest built from the roots the rank
needs (:func:`.cellkeys.build_local`); per-rank memory is O(owned + ghosts) (plus the
ancestors and their siblings, a geometric series), also for a mesh refined from few roots:
the cut falls inside trees.  ``owner[i]`` is the rank of local cell ``i``.

Cell halo (:class:`CellHalo`).  An owned leaf ``K`` is a ghost on rank ``q`` iff ``K`` shares a
vertex with a leaf owned by ``q`` -- iff a ghost of ``q`` here shares a vertex with ``K``: each
rank finds the (owned cell, rank) pairs locally (one sparse product, incidence x ghost
ranks per node), sends the keys once (one ``Alltoallv``) and matches them to its ghosts;
afterwards :meth:`CellHalo.exchange` moves any per-cell values owner -> ghost holders.

Refinement (:meth:`DistributedForest.refine`) with the 2:1 closure across ranks: the
serial rule ``refine K if a touching flagged cell has a higher level`` is applied to the
owned leaves (all their neighbours are local), the ghosts' flags come from their owners;
repeat (one exchange and one ``allreduce`` a round) until no rank flags a new cell: the
smallest closed superset, as :meth:`Mesh.refine`'s ``_close``, whatever the cut.  Then
every rank splits its flagged local leaves (owned and ghosts: their flags are final) and
keeps the owned children plus the leaves touching them: children inherit their parent's
owner, the cut moves with the cells (:meth:`repartition` re-cuts).

Global node numbering (:attr:`DistributedForest.node_gid`).  A node (any vertex of an owned
leaf, hanging or not) belongs to the lowest rank among the leaves having it as a vertex
(the rule of :func:`.partition.dof_owners`; all those leaves are local).  Owned nodes are
numbered contiguously per rank (an exclusive scan of the counts), in the local mesh's node
order.  Two exchanges of every owned leaf's vertex ids to its ghost holders: after the
first, every vertex of an owned leaf has its id (its owner owns a leaf touching ours, a
ghost here); after the second, every vertex of a ghost too
(its owner knows all of them) -- so the parents of hanging nodes, vertices of the coarse
ghost, have ids on every rank that needs them.

Repartition (:meth:`DistributedForest.repartition`).  The owned ranges are re-cut into
equal pieces of the curve (or of given weights): ``new = floor(P * before / total)``.  Each
old owner sends its leaves' keys to their new owners, and for the ghost layers: at every
vertex ``v`` of an owned leaf where leaves of different new owners meet (all of them local),
to each new owner ``q`` there the keys (and new owners) of the leaves at ``v`` that ``q`` will
not own.  A leaf ghost to ``q`` after the cut shares some vertex with a leaf ``q`` will own, and
that vertex belongs to a leaf's old owner, who sends it: the receivers get exactly their
new ghost layers and rebuild their local forests from the keys.  ``repartition(ranks=p)`` cuts
the curve onto ranks ``0 .. p - 1`` only: the others are left with no leaf and an empty
local mesh (a coarse level folded onto fewer ranks, :mod:`.forest_levels`); such a forest
still coarsens (an idle rank stays idle) and re-cuts.

Global coarsening (:meth:`DistributedForest.coarsen_once`, seed 001 §2.2): the serial rule
of :meth:`Mesh.coarsen_once` with the families decided by their children's owners (a leaf's
siblings share its parent's centre, so they are local to it), blocked families agreed
through the halo, each parent given to the owner of its child 0, and the new ghost layers
migrated as in a repartition; repeated, it is the global-coarsening hierarchy per rank.

Exists: box / coarse-mesh construction, refine (uniform or marked, callable of the cell
centres), 2:1 closure across ranks, the ghost layer, cell halo exchange, global node
numbering with hanging nodes and their parents, repartition with optional weights, global
coarsening; all host NumPy, vectorised (no loop over cells, nodes or ranks' items; one
collective per round), tested against the serial :class:`Mesh` at P = 1, 2, 3.  Wired into the
solver: the owned rows of a Q1 matrix and of its constrained form in global ids
(:mod:`.forest_rows`), the transfers between the levels of the global-coarsening sequence
(:mod:`.forest_transfer`: a fine leaf's coarse cell asked for by key from its owner) and the
distributed multigrid hierarchy over them with the small levels gathered on rank 0
(:mod:`.forest_levels`, :func:`.solve.solve_forest`; every level equal to the serial
hierarchy's at P = 1, 2, 3), and the adaptive loop solve -> estimate -> mark -> refine ->
repartition (:mod:`.adaptive`: the owned leaves' residual indicators from the local mesh, Doerfler
marking across ranks; the serial loop's marks at P = 1, 2, 3); coarse levels re-cut onto fewer
ranks (:meth:`repartition` with ``ranks=``, the others idle).  Not yet: DoF numbering of Q2
(edge/face/cell DoFs: the same two-round exchange over more entities); the forest itself on
the device -- its keys, closure, coarsening and repartition are host NumPy; with
``backend="gpu"`` each level's local mesh moves up once (or stays there after
``refine(..., backend="gpu")``, which splits the local forest on the device and copies it
back) and is numbered there (:attr:`node_gid` from the device mesh where it exists), and its
hanging nodes, expansion, rows, transfers and load are formed there (:mod:`.forest_levels`),
so the host's part of a set-up is the coarsening (with the numbering of the levels it
counts).  Node coordinates came out as the serial forest's bit for
bit in every test (boxes and two imported unstructured meshes); where coarse cells are
oriented differently a face centre made by another cell's split could differ in the last
bit (its parents summed in another order) -- the ids, not coordinates, identify nodes
across ranks.
"""
from __future__ import annotations

import numpy as np

from ..backend import CPU, get_backend, scatter_min, to_host
from ..fe.space import Space
from ..mesh import Mesh
from ..mesh._tree import _mean_of
from .cellkeys import KeyCodec, build_local, root_positions
from .comm import alltoallv, collective_property, get_comm
from .forest_cells import (CellHalo, _StayingLevels, _agree, _allsum, _check, _exscan, _layer_pairs,
                           _owned_and_layer, _touching)

__all__ = ["DistributedForest", "CellHalo"]


class _SerialComm:
    """Stand-in for a one-rank communicator where mpi4py is missing."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


def _as_comm(comm):
    c = get_comm(comm)
    return _SerialComm() if c is None else c


class DistributedForest:
    """Owned leaves (a contiguous range of the Morton curve) plus one ghost layer per rank
    (module docstring).  Build it with :meth:`box` or :meth:`from_coarse` (collective); it is
    immutable: :meth:`refine` and :meth:`repartition` return new forests.

    Attributes: ``mesh`` (local :class:`Mesh`: owned leaves and ghosts), ``keys`` and
    ``owner`` (per local cell), ``owned_cells`` / ``ghost_cells`` (local cell indices in key
    order), ``num_owned``, ``first`` (curve position of the first owned leaf) and
    ``global_num_cells``.  Properties computed on first use are collective (every rank must
    ask): :attr:`halo`, :attr:`node_gid` and what derives from it.
    """

    def __init__(self, comm, coarse, codec: KeyCodec, root_pos: np.ndarray, mesh: Mesh,
                 fkey: np.ndarray, owner: np.ndarray):
        self.comm, self.coarse, self.codec, self.root_pos = comm, coarse, codec, root_pos
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.mesh, self._fkey = mesh, fkey
        self.owner = np.asarray(owner, dtype=np.int64)
        self.keys = fkey[mesh.cell_ids]
        self.num_owned = int(np.count_nonzero(self.owner == self.rank))
        self.first = int(_exscan(comm, self.num_owned))
        self.global_num_cells = int(_allsum(comm, self.num_owned))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_coarse(cls, coarse: Mesh, comm=None) -> "DistributedForest":
        """The unrefined mesh ``coarse`` (replicated on every rank) cut into contiguous curve
        ranges of its cells (each rank needs at least one)."""
        comm = _as_comm(comm)
        if not isinstance(coarse, Mesh):
            raise TypeError(f"from_coarse expects an adaptmg Mesh, got {type(coarse).__name__}")
        F0 = coarse._forest
        if F0.num_cells != coarse.num_cells or (F0.cell_level != 0).any():
            raise ValueError("from_coarse needs an unrefined mesh (its cells are the roots); refine "
                             "the DistributedForest instead")
        n, P = F0.num_cells, comm.Get_size()
        if n < P:
            raise ValueError(f"from_coarse: {n} coarse cells cannot be cut over {P} ranks (every rank "
                             "owns at least one; use a finer coarse mesh)")
        root_pos = root_positions(F0)
        codec = KeyCodec(coarse.dim, n)
        owner = root_pos * P // n
        local = _touching(F0.cell_nodes, F0.num_nodes, np.flatnonzero(owner == comm.Get_rank()))
        return cls._from_keys(comm, F0, codec, root_pos, codec.roots(root_pos[local]), owner[local])

    @classmethod
    def box(cls, lower, upper, cells, comm=None, map=None) -> "DistributedForest":
        """:meth:`Mesh.box` (its cells the roots, replicated) cut over the ranks of ``comm``."""
        return cls.from_coarse(Mesh.box(lower, upper, cells, map=map), comm)

    @classmethod
    def _from_keys(cls, comm, coarse, codec, root_pos, keys, owners) -> "DistributedForest":
        """The rank's forest with local leaves ``keys`` (distinct) owned by ``owners``."""
        o = np.argsort(keys, kind="stable")       # distinct keys: the one order; sorted runs (owned
        #                                           leaves, ghosts) merged by timsort in O(n)
        keys, owners = keys[o], np.asarray(owners)[o]
        mesh, fkey = build_local(coarse, codec, root_pos, keys)
        own = owners[np.searchsorted(keys, fkey[mesh.cell_ids])]
        return cls(comm, coarse, codec, root_pos, mesh, fkey, own)

    # ------------------------------------------------------------------ cells
    def _in_key_order(self, mask: np.ndarray) -> np.ndarray:
        c = np.flatnonzero(mask)
        k = self.keys.take(c)
        if k.size > 1 and not bool((k[1:] > k[:-1]).all()):   # e.g. a uniform refinement's order
            c = c[np.argsort(k, kind="stable")]   # distinct keys; the cells of a level are a sorted run
        return c

    @collective_property
    def owned_cells(self) -> np.ndarray:
        """Local indices of the owned leaves, in curve (key) order."""
        return self._in_key_order(self.owner == self.rank)

    @collective_property
    def ghost_cells(self) -> np.ndarray:
        """Local indices of the ghosts, in key order."""
        return self._in_key_order(self.owner != self.rank)

    def local_space(self, backend):
        """The local mesh's Q1 space on ``backend`` (a :class:`~adaptmg.backend.Backend`): on the
        GPU the local mesh moved there once (:meth:`adaptmg.Mesh.to`: one copy of its forest's
        tables, kept with this forest) -- its numbering, cells and nodes are the host mesh's --
        where the set-up's matrices, loads and indicators are computed."""
        cache = self.__dict__.setdefault("_spaces", {})
        if backend.name not in cache:
            cache[backend.name] = Space(self.mesh.to(backend), 1)
        return cache[backend.name]

    def release_device(self, *names):
        """Drop the device copies of :meth:`local_space` and of the moved arrays
        (:meth:`owned_cells_on`, ...; a coarse level's, once its rows are built: their memory
        goes back to the pool); with ``names`` only those moved arrays (e.g. ``"owned_keys"``)."""
        if names:
            cache = self.__dict__.get("_owned_on", {})
            for key in [k for k in cache if k[0] in names]:
                del cache[key]
            return
        self.__dict__.pop("_spaces", None)
        self.__dict__.pop("_owned_on", None)

    def _moved(self, name, backend):
        """The host array attribute ``name`` as an array of ``backend`` (moved once, kept until
        :meth:`release_device`)."""
        cache = self.__dict__.setdefault("_owned_on", {})
        if (name, backend.name) not in cache:
            cache[name, backend.name] = backend.asarray(getattr(self, name))
        return cache[name, backend.name]

    def owned_cells_on(self, backend):
        """:attr:`owned_cells` as an array of ``backend`` (moved once, kept)."""
        return self._moved("owned_cells", backend)

    def owned_nodes_on(self, backend):
        """:attr:`owned_nodes` as an array of ``backend`` (moved once, kept)."""
        return self._moved("owned_nodes", backend)

    @property
    def dim(self) -> int:
        return self.mesh.dim

    @property
    def num_ghosts(self) -> int:
        return self.mesh.num_cells - self.num_owned

    @property
    def owned_keys(self) -> np.ndarray:
        """Keys of the owned leaves, in curve order."""
        return self.keys[self.owned_cells]

    def centres(self, cells=None) -> np.ndarray:
        """(n, d) centroids (vertex means) of local cells (default: the owned ones, curve order)."""
        cells = self.owned_cells if cells is None else np.asarray(cells)
        F = self.mesh._forest
        cn = F.cell_nodes.take(self.mesh.cell_ids.take(cells), axis=0)
        return _mean_of(F.X, [cn[:, j] for j in range(cn.shape[1])])     # = X[cn].mean(1), same rounding

    def local_nbytes(self) -> int:
        """Bytes of this rank's local forest and mesh arrays (the per-rank memory that scales)."""
        F = self.mesh._forest
        arrays = [F.X, F.node_kind, F.node_par, F.cell_nodes, F.cell_parent, F.cell_child0, F.cell_level,
                  F.cell_bface, F.edge_keys, F.edge_nodes, F.face_keys, F.face_nodes, self._fkey,
                  self.mesh.cell_ids, self.keys, self.owner]
        return int(sum(a.nbytes for a in arrays))

    @collective_property
    def halo(self) -> CellHalo:
        """The owner -> ghost-holder exchange of per-cell values (collective on first use)."""
        M = self.mesh
        # without ghosts (one rank) nothing is sent or received: no vertex table needed
        cells = M._active_cell_nodes() if self.num_ghosts else np.zeros((0, 2 ** self.dim), dtype=np.int64)
        return CellHalo(self.comm, cells, M._forest.num_nodes, self.owner, self.keys)

    # ------------------------------------------------------------------ refinement
    def refine(self, marker=None, backend=None) -> "DistributedForest":
        """Refine the marked owned leaves, closed across ranks by the 2:1 rule (collective).

        ``marker``: None (every leaf), a boolean mask over the owned leaves in curve order
        (:attr:`owned_cells`), or a callable ``f(centres) -> bool mask`` of their centroids
        (n, d).  Children stay with their parent's owner; :meth:`repartition` re-cuts.
        ``backend`` (a :class:`~adaptmg.backend.Backend` or name; default: the host): with
        the GPU the local forest is split on the device -- the copy of :meth:`local_space`,
        made there if this forest has none -- and copied back (the same tables: the split's
        arithmetic is the same on both), and the new forest keeps the device copy as its own
        :meth:`local_space` (its set-up moves nothing up)."""
        n = self.num_owned
        if marker is None:
            mask = np.ones(n, dtype=bool)
        else:
            mask = marker(self.centres()) if callable(marker) else marker
            mask = np.asarray(mask)
        ok = mask.dtype == bool and mask.shape == (n,)
        _agree(self.comm, ok, f"refine: the marker must be a boolean mask over the {n} owned leaves "
                              f"(or a callable returning one), got {mask.dtype} {mask.shape}")
        M = self.mesh
        lv = M.levels
        mine = self.owner == self.rank
        if marker is None:
            flag = mine.copy()
        else:
            flag = np.zeros(M.num_cells, dtype=bool)
            flag[self.owned_cells[mask]] = True
        while True:                       # one exchange and one allreduce a round
            flag = self.halo.exchange(flag)
            new = np.zeros(0, dtype=bool)
            if not flag.all():
                need = M.touch_max(np.where(flag, lv, -1)) > lv
                new = need & ~flag & mine
                flag |= new
            if _allsum(self.comm, int(new.any())) == 0:
                break
        deepest = int(lv[flag].max()) + 1 if flag.any() else 0
        _agree(self.comm, deepest <= self.codec.lmax,
               f"refine: level {deepest} exceeds the {self.codec.lmax} levels cell keys hold here")
        idx = np.flatnonzero(flag)
        if _allsum(self.comm, idx.size) == 0:
            return self
        F = M._forest
        be = None if backend is None else get_backend(backend)
        dev = None
        if not idx.size:
            M2 = M
        elif be is not None and be.is_gpu:                 # the split on the device, copied back
            dev = self.local_space(be).mesh._refine_exact(be.asarray(idx))
            M2 = dev.to(CPU)
        else:
            M2 = M._refine_exact(idx)
        F2, nc = M2._forest, F.num_cells
        new_cells = np.arange(nc, F2.num_cells, dtype=np.int64)
        par = F2.cell_parent[new_cells]
        fkey = np.concatenate([self._fkey, self.codec.child(self._fkey[par], new_cells - F2.cell_child0[par])])
        cown = np.full(F2.num_cells, -1, dtype=np.int64)
        cown[M.cell_ids] = self.owner
        cown[nc:] = cown[par]
        owner = cown[M2.cell_ids]
        if not self.num_ghosts:                    # no ghosts (one rank): every leaf stays
            keep = np.arange(owner.size)
        else:
            keep = _owned_and_layer(M2._active_cell_nodes(), F2.num_nodes, owner, self.rank)
        active = M2.cell_ids[keep]
        # leaves dropped from the ghost layer stay in the forest (it only grows): past a
        # quarter of the active cells, rebuild it from the keys (memory ~ owned + ghosts)
        if int((F2.cell_child0 < 0).sum()) - active.size > active.size // 4:
            return DistributedForest._from_keys(self.comm, self.coarse, self.codec, self.root_pos,
                                                fkey[active], owner[keep])
        out = DistributedForest(self.comm, self.coarse, self.codec, self.root_pos, Mesh(F2, active), fkey,
                                owner[keep])
        if dev is not None:                     # its local space: the device copy it came from
            out.__dict__["_spaces"] = {be.name: Space(dev if keep.size == M2.num_cells
                                                      else Mesh(dev._forest, be.asarray(active)), 1)}
        return out

    # ------------------------------------------------------------------ repartition
    def repartition(self, weights=None, ranks=None) -> "DistributedForest":
        """Re-cut the curve into ``P`` contiguous pieces of equal count (or equal sum of
        ``weights``: non-negative, one per owned leaf in curve order) and migrate the leaves
        (collective; module docstring).  ``ranks``: cut into that many pieces instead, on
        ranks ``0 .. ranks - 1`` (a folded level: the others own no leaf)."""
        n = self.num_owned
        P = self.size if ranks is None else int(ranks)
        if not 1 <= P <= self.size:
            raise ValueError(f"repartition: ranks must be in 1..{self.size}, got {ranks!r}")
        if weights is None:
            new = (self.first + np.arange(n, dtype=np.int64)) * P // self.global_num_cells
        else:
            w = np.asarray(weights, dtype=float)
            ok = w.shape == (n,) and bool(np.isfinite(w).all()) and not (w < 0).any()
            _agree(self.comm, ok, f"repartition: weights must be {n} finite non-negative numbers "
                                  f"(one per owned leaf), got shape {w.shape}")
            total = _allsum(self.comm, float(w.sum()))
            _agree(self.comm, total > 0, "repartition: the weights sum to zero")
            before = _exscan(self.comm, float(w.sum())) + np.cumsum(w) - w
            new = np.minimum((before * P / total).astype(np.int64), P - 1)
        counts = np.bincount(new, minlength=P)
        counts = counts if self.size == 1 else self.comm.allreduce(counts)
        _agree(self.comm, bool((counts > 0).all()),
               f"repartition: the cut leaves ranks {np.flatnonzero(counts == 0).tolist()} without cells")
        if _allsum(self.comm, int((new != self.rank).any())) == 0:
            return self                              # the cut is where it was: nothing moves
        newown = np.full(self.mesh.num_cells, -1, dtype=np.int64)
        newown[self.owned_cells] = new
        newown = self.halo.exchange(newown)
        (okeys,) = alltoallv(self.comm, new, self.keys[self.owned_cells])
        M = self.mesh

        def old_owned(rows, sub):
            mask = np.zeros(M._forest.num_nodes, dtype=bool)
            mask[sub[self.owner[rows] == self.rank]] = True
            return mask
        dest, other = _layer_pairs(M._active_cell_nodes(), M._forest.num_nodes, newown, P, old_owned)
        return self._settle(okeys, dest, self.keys[other], newown[other])

    def _settle(self, owned_keys, dest, keys, owners) -> "DistributedForest":
        """The forest of ``owned_keys`` here and the ghosts (``keys`` with their ``owners``)
        that the ranks send to ``dest``, deduplicated (collective)."""
        gkeys, gown = alltoallv(self.comm, dest, keys, owners)
        gkeys, at = np.unique(gkeys, return_index=True)
        return DistributedForest._from_keys(
            self.comm, self.coarse, self.codec, self.root_pos, np.concatenate([owned_keys, gkeys]),
            np.concatenate([np.full(owned_keys.size, self.rank, dtype=np.int64), gown[at]]))

    # ------------------------------------------------------------------ global coarsening
    def coarsen_once(self) -> "DistributedForest":
        """:meth:`Mesh.coarsen_once` across ranks (collective): take back every refinement whose
        2^d children are all leaves, except where that would break the 2:1 rule.

        A leaf's siblings share its parent's centre, so an owned leaf's whole family is local:
        its owner decides whether the family is complete and, from the levels around its owned
        children, whether it is blocked; a family on several ranks is blocked if any child is
        (the children's flags through the halo; repeated, one round per blocking wave, as the
        serial loop).  The parent goes to the owner of child 0 (it takes that child's place on
        the curve: the ranges stay contiguous), and the new ghost layers come as in
        :meth:`repartition` from the ranks that had every old leaf at a vertex.  A rank left
        without cells (all its leaves in families of a lower rank) is a ValueError, unless it
        had none before (idle on a folded level)."""
        M, F = self.mesh, self.mesh._forest
        nv, lv = 2 ** self.dim, M.levels
        mine = self.owner == self.rank
        par = M.parents
        has = par >= 0
        p0 = np.where(has, par, 0)
        in_fam = has & (np.bincount(par[has], minlength=F.num_cells)[p0] == nv)
        in_fam = self.halo.exchange(in_fam)       # a ghost's family may not be whole here
        acn_local = M._active_cell_nodes()
        stays = _StayingLevels(acn_local, F.num_nodes, lv, in_fam & mine)
        left = ~in_fam                            # the cells that stay: first all, then the new ones
        while True:                               # one blocking wave a round
            bad = np.zeros(M.num_cells, dtype=bool)
            bad[stays.add(left, in_fam & mine)] = True
            bad = self.halo.exchange(bad)
            blocked = np.zeros(F.num_cells, dtype=bool)
            blocked[par[bad]] = True
            newly = in_fam & blocked[p0]
            # a ghost's flag is its owner's, which only falls: the cells that left stay
            was = in_fam
            in_fam = self.halo.exchange(in_fam & ~newly)
            left = was & ~in_fam
            if _allsum(self.comm, int((newly & mine).any())) == 0:
                break
        if _allsum(self.comm, int(in_fam.any())) == 0:
            return self
        at = np.full(F.num_cells, -1, dtype=np.int64)  # forest id -> local cell
        at[M.cell_ids] = np.arange(M.num_cells)
        c0 = at[F.cell_child0[p0]]
        newown = self.owner.copy()
        fam_mine = in_fam & mine
        newown[fam_mine] = self.owner[c0[fam_mine]]  # child 0 is a sibling: local
        newown = self.halo.exchange(newown)
        pown = np.full(F.num_cells, -1, dtype=np.int64)
        pown[par[in_fam]] = newown[in_fam]           # the same for every child
        parents = np.flatnonzero(pown >= 0)
        active = np.concatenate([M.cell_ids[~in_fam], parents])
        own = np.concatenate([newown[~in_fam], pown[parents]])
        o = np.argsort(active, kind="stable")     # distinct ids, two sorted runs: merged in O(n)
        active, own = active[o], own[o]
        keys = self._fkey[active]
        n_own = int((own == self.rank).sum())
        _agree(self.comm, n_own > 0 or self.num_owned == 0, f"coarsen_once: rank {self.rank} would own no cell (its leaves all "
                                     "belong to families of a lower rank); repartition or use fewer ranks")
        # the vertices of this rank's old leaves (read at the new leaves' vertices only): every
        # node where no ghost was here (one rank), else the owned rows gathered by index
        if not self.num_ghosts:
            old_nodes = np.ones(F.num_nodes, dtype=bool)
        else:
            old_nodes = np.zeros(F.num_nodes, dtype=bool)
            old_nodes[np.take(acn_local, np.flatnonzero(mine), axis=0)] = True
        acn = F.cell_nodes[active]
        dest, other = _layer_pairs(acn, F.num_nodes, own, self.size, lambda rows, sub: old_nodes)
        return self._settle(keys[own == self.rank], dest, keys[other], own[other])

    # ------------------------------------------------------------------ global node numbering
    @collective_property
    def _numbering(self):
        # on the device where this forest's local mesh is there already (the GPU set-up moves it
        # first, a GPU refinement leaves it there): the same node numbers as the host mesh's,
        # without numbering the host mesh; the results copied down once
        dev = next((sp_ for sp_ in self.__dict__.get("_spaces", {}).values() if sp_.backend.is_gpu), None)
        be = CPU if dev is None else dev.backend
        xp = be.xp
        M = self.mesh if dev is None else dev.mesh
        cells, nn, nv = M.cells, M.num_nodes, 2 ** M.dim
        g = self.ghost_cells
        flat = xp.take(cells, self.owned_cells_on(be), axis=0).reshape(-1)
        on_owned = xp.zeros(nn, dtype=bool)
        on_owned[flat] = True
        # owner: the lowest rank of the leaves with the node as a vertex -- this rank unless a
        # ghost (a lower rank) has it too: a scatter over the ghosts' vertices only
        low = xp.full(nn, self.size, dtype=np.int64)
        if g.size:
            scatter_min(low, xp.take(cells, be.asarray(g), axis=0).reshape(-1),
                        xp.repeat(be.asarray(self.owner[g]), nv))
        node_owner = xp.where(on_owned, xp.minimum(low, self.rank), -1)
        # owned nodes in the local mesh's node order (first occurrence along the local forest's
        # cells: the children of a cell consecutive, a space-filling order inside each tree)
        mine = xp.flatnonzero(node_owner == self.rank)
        off = int(_exscan(self.comm, int(mine.size)))
        total = int(_allsum(self.comm, int(mine.size)))
        gid = xp.full(nn, -1, dtype=np.int64)
        gid[mine] = off + xp.arange(mine.size, dtype=np.int64)
        if self.size > 1:
            halo = self.halo
            tgt = xp.take(cells, be.asarray(halo.recv_cells), axis=0)
            sent = xp.take(cells, be.asarray(halo.send_cells), axis=0)
            for _ in range(2):                       # owned leaves' vertices, then the ghosts'
                got = be.asarray(halo.send(to_host(xp.take(gid, sent))))
                known = got >= 0
                gid[tgt[known]] = got[known]
        missing = int((gid < 0).sum())
        _check(self.comm, missing == 0,
               f"global node numbering: rank {self.rank} has {missing} nodes without an id")
        if be.is_gpu:                                # kept on the device for the set-up
            moved = self.__dict__.setdefault("_owned_on", {})
            moved["node_gid", be.name], moved["owned_nodes", be.name] = gid, mine
        return to_host(gid), to_host(node_owner), to_host(mine), total, to_host(on_owned)

    @property
    def num_local_nodes(self) -> int:
        """Number of nodes of the local mesh (vertices of owned leaves and ghosts)."""
        return int(self.node_gid.size)

    @property
    def node_gid(self) -> np.ndarray:
        """Global id of every node of the local mesh (owned leaves' and ghosts' vertices)."""
        return self._numbering[0]

    @property
    def node_owner(self) -> np.ndarray:
        """Owner rank of every local node that is a vertex of an owned leaf (-1 for the others)."""
        return self._numbering[1]

    @property
    def owned_nodes(self) -> np.ndarray:
        """Local indices of the nodes this rank owns, in global id order."""
        return self._numbering[2]

    @property
    def num_global_nodes(self) -> int:
        return self._numbering[3]

    @property
    def nodes_of_owned(self) -> np.ndarray:
        """Mask over local nodes: vertex of an owned leaf."""
        return self._numbering[4]

    @property
    def hanging(self):
        """(global ids of the hanging vertices of owned leaves, (n, 4) global ids of their
        parents, -1 padded: 2 on edges, 4 on faces)."""
        M, gid = self.mesh, self.node_gid
        h, p = M.hanging_nodes, M.hanging_parents
        keep = self.nodes_of_owned[h]
        p = p[keep]
        return gid[h[keep]], np.where(p >= 0, gid[np.maximum(p, 0)], -1)

    def __repr__(self) -> str:
        return (f"DistributedForest(rank {self.rank}/{self.size}, {self.dim}-D, owned {self.num_owned} of "
                f"{self.global_num_cells}, ghosts {self.num_ghosts}, local forest cells "
                f"{self.mesh._forest.num_cells})")
