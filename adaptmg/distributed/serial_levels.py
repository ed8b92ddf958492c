r"""The serial levels below the locally built ones where every one of them is agglomerated on
rank 0 (the local set-up of :func:`.solve.solve`; ``top`` the finest level with fewer than
``agglomerate_below`` DoFs): rank 0 alone builds them (``multigrid(top)``), the other ranks
hold their summary (:class:`SerialLevelsOnRankZero`).

Who computes what before the local levels (:func:`hand_over`).  The mesh is replicated, so
every rank could find every level's free mask and the cut itself; instead one rank finds the
free masks of the local levels and of the top (:func:`free_masks`: their hanging nodes)
while rank 1 cuts the finest mesh and finds the local levels' owners (:func:`cut_and_own`),
and each sends its arrays to every other rank (:func:`~.comm.pass_arrays`: one NCCL group a
pair on the device, the host not waiting; the ranks as the narrowest integers that hold a
rank).  The receivers adopt the hanging nodes as their meshes' own (no search).

Rank 0 builds the serial levels (:class:`PendingSerialLevels`: what the local levels need of
them -- the top's space and free mask, the smoother and sweeps ``multigrid`` gives its
levels -- is known before they exist; :meth:`PendingSerialLevels.finish`, after the local
levels, broadcasts their summary, which must name the smoothing the local levels used)
either

* beside its finest level's device-bound assembly, where the hierarchy runs the finest
  level's ``after`` there (on the GPU, assembled levels:
  :meth:`~.hierarchy.DistributedHierarchy.serial_beside_finest`); rank 0 then finds the masks
  while rank 1 cuts and finds the top's and the second finest level's (:func:`mask_finders`) -- or
* first, while rank 1 finds the masks and cuts: elsewhere nothing would
  run beside them, and in the first local set-up of a process (:func:`first_setup`), whose
  serial levels pay their libraries' and kernels' first use (~0.45 s on an H200) while the
  process's NCCL communicator is made (~0.5 s, on a thread): first, that hides behind both.

Two H200, 21M DoFs a rank (42M-cell replicated mesh; old and new code alternated in one
call, warm set-ups): beside the finest level, 0.376 / 0.389 / 0.376 -> 0.363 / 0.362 / 0.361 s
on one host, 0.381 / 0.417 -> 0.371 / 0.374 s on another (the ranks reach the first local
level after ~49 ms instead of ~84 ms; the serial levels' ~52 ms of launch-bound host work
end with the finest assembly, ~2 ms after it).  Built there in a process's first set-up as
well, they made it 0.93 / 0.95 -> 1.02-1.07 s; built first there, 1.08 / 1.43 (old) against
0.99 / 1.09 s (the first set-up varies by tenths of a second between runs).
"""
from __future__ import annotations

import inspect
import time
from types import SimpleNamespace

import numpy as np

from ..backend import get_backend, to_host
from ..fe import Constraints
from ..mesh import Mesh
from ..multilevel.hierarchy import dirichlet_dofs, multigrid
from ..multilevel.smoothers import level_smoothers, smoother_setup_kwargs
from .comm import pass_arrays
from .partition import level_ownership, partition_cells

__all__ = ["SerialLevelsOnRankZero", "PendingSerialLevels", "multigrid_smoothing", "free_masks", "cut_and_own",
           "mask_finders", "hand_over", "first_setup", "setup_done"]

#: local set-ups this process has finished (:func:`setup_done`)
_SETUPS = [0]


def first_setup(comm) -> bool:
    """Whether this is the first local set-up of the process on some rank (collective: one
    ``allreduce`` of a count, so every rank answers the same)."""
    mine = int(_SETUPS[0] == 0)
    return bool(comm.allreduce(mine) if comm.Get_size() > 1 else mine)


def setup_done() -> None:
    """Count a finished local set-up (:func:`first_setup`)."""
    _SETUPS[0] += 1


class SerialLevelsOnRankZero:
    """What a rank other than 0 holds of the serial hierarchy below the locally built levels,
    which the local set-up builds on rank 0 only (:func:`.solve.solve`; every one of its
    levels is agglomerated there): the levels' sizes ``levels[l].n`` (coarse -> fine),
    ``num_algebraic``, the cells of its geometric levels ``cells``, its top space
    (``spaces[-1]``, this rank's own copy) with its free-DoF mask ``free``
    (``constraints[-1].free``: handed over before the local levels, :func:`hand_over`), the
    smoother specification and the sweeps -- what the distributed levels above it and
    :class:`~.rank_zero.RankZeroCycle` ask of it.  Made from :meth:`summary` of rank 0's
    hierarchy (broadcast)."""

    def __init__(self, summary, top, backend, free):
        self.levels = [SimpleNamespace(n=int(n)) for n in summary["dofs"]]
        self.num_algebraic = summary["num_algebraic"]
        self.cells = list(summary["cells"])
        self.spaces = [top]
        self.constraints = [SimpleNamespace(free=top.backend.xp.asarray(free))]
        self._smoother_spec, self._smoother_kwargs = summary["smoother"]
        self.presmooth, self.postsmooth = summary["sweeps"]
        self.backend, self.dtype = backend, np.dtype(np.float64)

    @staticmethod
    def summary(ml):
        """The picklable description of rank 0's hierarchy ``ml`` that the other ranks build
        this from (a smoother given as a factory travels as its name: the distributed levels
        reject it by that name)."""
        spec = ml._smoother_spec
        return dict(dofs=[int(lev.n) for lev in ml.levels], num_algebraic=int(ml.num_algebraic),
                    cells=[int(s.mesh.num_cells) for s in ml.spaces],
                    smoother=(_spec_name(spec), dict(ml._smoother_kwargs)),
                    sweeps=(ml.presmooth, ml.postsmooth))

    def __repr__(self):
        return (f"SerialLevelsOnRankZero({len(self.levels)} levels on rank 0, "
                f"{self.levels[-1].n} DoFs at the top)")


def _spec_name(spec):
    return spec if isinstance(spec, str) else getattr(spec, "__name__", repr(spec))


def multigrid_smoothing(components, kwargs):
    """``(spec, smoother_kwargs, presmooth, postsmooth)`` of the finest level of
    ``multigrid(space, **kwargs)`` for a space of ``components`` (multigrid's defaults where
    ``kwargs`` has none): what its solver's ``_smoother_spec`` and ``_smoother_kwargs`` will be."""
    params = inspect.signature(multigrid).parameters

    def get(key):
        return kwargs.get(key, params[key].default)
    smoother = get("smoother")
    skw = smoother_setup_kwargs(smoother, get("smoother_kwargs"), block_size=components, auto_omega=True)
    spec, kw = level_smoothers(smoother, skw)[0]
    return spec, kw, get("presmooth"), get("postsmooth")


class PendingSerialLevels:
    """The serial levels below the local ones before rank 0 has built them (module doc): the
    top space ``spaces[-1]`` with its free mask ``constraints[-1].free`` (``free``; the caller
    may set it later, once the masks are handed over), ``levels`` and
    ``cells`` of the top alone, and the smoothing of :func:`multigrid_smoothing` -- what the
    local levels ask of them, and their ``backend`` and ``dtype`` (``kwargs``' or multigrid's
    defaults).  ``make()`` builds them (called on rank 0 only: :meth:`build`); ``seconds``:
    how long that took."""

    def __init__(self, top, free, make, components, kwargs, rank, backend):
        self.spaces = [top]
        self.constraints = [SimpleNamespace(free=free)]
        self.levels = [SimpleNamespace(n=int(top.num_dofs))]
        self.cells = [int(top.mesh.num_cells)]
        self.num_algebraic = 0
        self._smoother_spec, self._smoother_kwargs, self.presmooth, self.postsmooth = \
            multigrid_smoothing(components, kwargs)
        self.backend = get_backend(backend)
        self.dtype = np.dtype(kwargs.get("dtype", inspect.signature(multigrid).parameters["dtype"].default))
        self._make, self.rank = make, rank
        self.built, self.seconds, self.where = None, 0.0, None

    def build(self, where):
        """Rank 0: build the serial levels (once; ``where``: a word on when, kept in
        ``where``); other ranks: nothing."""
        if self.rank == 0 and self.built is None:
            t = time.perf_counter()
            self.built = self._make()
            self.seconds = time.perf_counter() - t
            self.where = where

    def finish(self, comm, backend):
        """Collective, after the local levels: ``(ml, summary)`` -- rank 0's hierarchy there
        (built now if it was not yet), its :class:`SerialLevelsOnRankZero` elsewhere, and the
        broadcast :meth:`SerialLevelsOnRankZero.summary` -- after checking on every rank that
        its top is this top and its smoothing the one the local levels used."""
        self.build("after the local levels")
        summary = None
        if self.rank == 0:
            summary = SerialLevelsOnRankZero.summary(self.built)
            # compared on the host (the top's masks are small; a device comparison of two bool
            # arrays would be a kernel of its own for a first run to compile)
            summary["same_free"] = bool(np.array_equal(to_host(self.built.constraints[-1].free),
                                                       to_host(self.constraints[-1].free)))
        if comm.Get_size() > 1:
            summary = comm.bcast(summary, root=0)
        used = ((_spec_name(self._smoother_spec), dict(self._smoother_kwargs)), (self.presmooth, self.postsmooth))
        got = (tuple(summary["smoother"]), tuple(summary["sweeps"]))
        if got != used or summary["dofs"][-1] != self.levels[-1].n or not summary["same_free"]:
            raise RuntimeError(f"the serial levels on rank 0 ({got}, {summary['dofs'][-1]} DoFs at the top) are "
                               f"not those the local levels were built for ({used}, {self.levels[-1].n} DoFs), "
                               f"or their top's free mask differs: {summary['same_free']}")
        if self.rank == 0:
            return self.built, summary
        return SerialLevelsOnRankZero(summary, self.spaces[-1], backend, self.constraints[-1].free), summary

    def __repr__(self):
        return f"PendingSerialLevels({self.levels[-1].n} DoFs at the top, built: {self.built is not None})"


def free_masks(spaces, dirichlet):
    """The free-DoF masks (neither hanging nor Dirichlet) of ``spaces``.  Their hanging-node
    matrices ``H`` are not built here: a mask needs only which nodes hang, and ``H`` is built
    on first use by the level's rows (the other ranks of a hand-over get the hanging nodes,
    :func:`hand_over`, and build it there, off the path the ranks wait on)."""
    return [Constraints(s, dirichlet_dofs(s, dirichlet), build_H=False).free for s in spaces]


def cut_and_own(space, spaces, size, weights, nranks):
    """The finest cells' ranks (:func:`~.partition.partition_cells`) and the locally built
    levels' ``(owners, cell_ranks, nranks)`` (:func:`~.partition.level_ownership`; ``nranks``
    their numbers of ranks, :func:`~.partition.level_ranks`)."""
    ranks = partition_cells(space.mesh, size, weights)
    owners, cells = level_ownership(spaces, ranks, nranks, size)
    return ranks, (owners, cells, nranks)


def mask_finders(levels: int, beside: bool) -> list:
    """The rank that finds each of the ``levels`` free masks of ``[top] + spaces`` (coarse ->
    fine; :func:`hand_over`'s ``mask_rank``).  ``beside`` (rank 0 builds the serial levels
    later, beside its finest assembly): rank 0 finds them, except the top's and the second
    finest level's, which rank 1 finds beside its cut (one H200, the 42M-cell mesh of two
    ranks at 21M DoFs each, sync-timed sides: rank 0's masks 26.4 ms against 19.8 ms for
    rank 1's cut and second finest mask; with the top's moved, 21.2 / 24.6 ms -- the top's
    mask, ~5 ms, is bound by the host's launches and syncs); else rank 1 finds every one
    while rank 0 builds the serial levels."""
    if not beside:
        return [1] * levels
    out = [0] * levels
    if levels >= 2:
        out[0] = out[-2] = 1
    return out


def hand_over(comm, space, top, spaces, nranks, cut, masks, transport, mask_rank=0):
    """Rank 1's :func:`cut_and_own` of ``space`` (``cut``, None elsewhere) and the
    :func:`free_masks` of ``[top] + spaces`` with those meshes' hanging nodes on every rank
    (module doc): ``mask_rank`` the rank that found them, or one such rank per level
    (:func:`mask_finders`); ``masks`` this rank's masks of the levels it found, in level order
    (None: it found none).  The cut goes as the narrowest integers that hold a rank, widened
    to int64 by the receivers -- an eighth of int64's bytes below 128 ranks; the hanging
    arrays' shapes by one MPI ``allgather``.  Collective (``size >= 2``).  Returns ``(ranks,
    (owners, cell_ranks, nranks), masks)`` (every level's mask); a receiver's meshes hold the
    finder's hanging nodes as their own."""
    rank, size = comm.Get_rank(), comm.Get_size()
    narrow = np.int8 if size < 2 ** 7 else np.int16 if size < 2 ** 15 else np.int32
    xp = space.mesh.backend.xp
    L = len(spaces)
    levels = [top, *spaces]
    finders = [mask_rank] * (L + 1) if np.ndim(mask_rank) == 0 else [int(q) for q in mask_rank]
    if len(finders) != L + 1 or any(not 0 <= q < size for q in finders):
        raise ValueError(f"hand_over: mask_rank must be a rank or one rank per level ({L + 1}) in "
                         f"[0, {size}), got {mask_rank!r}")
    carriers = [s._carrier for s in levels]
    if rank == 1:
        ranks, (owners, cells, _) = cut
        cbufs = [xp.ascontiguousarray(a.astype(narrow)) for a in [ranks, *owners, *cells]]
    else:
        n = [space.mesh.num_cells] + [s.num_dofs for s in spaces] + [s.mesh.num_cells for s in spaces]
        cbufs = [xp.empty(k, dtype=narrow) for k in n]
    own = [l for l in range(L + 1) if finders[l] == rank]
    found = dict(zip(own, masks if own else []))
    hang = {l: [xp.ascontiguousarray(a) for a in carriers[l]._hanging_arrays()] for l in own}
    metas = comm.allgather([(a.shape, a.dtype.str) for l in own for a in hang[l]])
    for dst in range(size):                      # (to itself: nothing moves)
        pass_arrays(comm, cbufs, 1, dst, transport)
    k = Mesh.HANGING_ARRAYS
    out = [None] * (L + 1)
    for q in sorted(set(finders)):               # each finder's masks and hanging arrays
        lv = [l for l in range(L + 1) if finders[l] == q]
        if q == rank:
            mbufs = [found[l].view(np.int8) for l in lv] + [a for l in lv for a in hang[l]]
        else:
            mbufs = ([xp.empty(levels[l].num_dofs, dtype=np.int8) for l in lv]
                     + [xp.empty(shape, dtype=np.dtype(dt)) for shape, dt in metas[q]])
        for dst in range(size):
            pass_arrays(comm, mbufs, q, dst, transport)
        for i, l in enumerate(lv):
            out[l] = mbufs[i].view(bool)
            if q != rank:
                carriers[l]._adopt_hanging(mbufs[len(lv) + k * i:len(lv) + k * (i + 1)])
    masks = out
    if rank == 1:
        return ranks, cut[1], masks
    wide = [a.astype(np.int64) for a in cbufs]
    return wide[0], (wide[1:1 + L], wide[1 + L:], nranks), masks
