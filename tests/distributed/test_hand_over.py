"""Who computes what before the local levels where rank 0 alone builds the serial levels
(adaptmg.distributed.serial_levels): the free masks (and hanging nodes) of the local levels
and the top, each found by one rank (one for all, or one per level: mask_finders), rank 1's
cut of the mesh and the local levels' owners, each handed to
every other rank -- the bytes that comm.pass_arrays moves by MPI, the cut narrowed to the
smallest integers that hold a rank and widened back, the receivers' meshes adopting the
hanging nodes (no search) -- and the serial levels built later (PendingSerialLevels): the
smoothing the local levels use before they exist is the one multigrid gives them, checked.
In-process ranks (thread_comm) and a shared message queue stand in for MPI (the MPI runs of
test_mpi.py, the NCCL path on two GPUs: -m gpu, check the whole solve)."""
import numpy as np
import pytest

from adaptmg import assemble, multigrid
from adaptmg.distributed.comm import pass_arrays
from adaptmg.distributed.partition import level_ownership, level_ranks
from adaptmg.distributed.serial_levels import (PendingSerialLevels, SerialLevelsOnRankZero, cut_and_own,
                                              free_masks, hand_over, mask_finders, multigrid_smoothing)
from adaptmg.distributed.solve import _split_hierarchy
from adaptmg.distributed.thread_comm import run_ranks
from adaptmg.fe import Space
from adaptmg.mesh import Mesh
from test_local_setup import RankOf, _mesh


class QueueRank(RankOf):
    """Rank ``rank`` of ``size`` whose Send / Recv go through the shared list ``queue``."""

    def __init__(self, rank, size, queue):
        super().__init__(rank, size)
        self.queue = queue

    def Send(self, buf, dest, tag):
        self.queue.append((self.rank, dest, tag, np.array(buf, copy=True)))

    def Recv(self, buf, source, tag):
        src, dst, t, data = self.queue.pop(0)
        assert (src, dst, t) == (source, self.rank, tag)
        assert data.dtype == buf.dtype and data.shape == buf.shape
        buf[...] = data


def test_pass_arrays_copies_the_senders_arrays_into_the_receivers():
    q = []
    rng = np.random.default_rng(0)
    sent = [rng.integers(-100, 100, 50).astype(np.int8), rng.integers(0, 9, (3, 4)).astype(np.int16),
            np.zeros(0, np.int32)]
    pass_arrays(QueueRank(1, 3, q), sent, 1, 0)
    assert len(q) == 3
    pass_arrays(QueueRank(2, 3, q), [np.ones(5)], 1, 0)          # neither sender nor receiver
    got = [np.full_like(a, 7) for a in sent]
    pass_arrays(QueueRank(0, 3, q), got, 1, 0)
    assert not q and all(np.array_equal(a, b) for a, b in zip(sent, got))
    pass_arrays(QueueRank(0, 1, q), got, 0, 0)                   # to itself: nothing moves
    assert not q
    with pytest.raises(ValueError, match="C-contiguous"):
        pass_arrays(QueueRank(1, 2, q), [np.zeros((4, 4))[:, 1]], 1, 0)


def _finders(mask_rank, levels, size):
    """``mask_rank`` as one finder per level: a rank, "beside" (:func:`mask_finders`: rank 0,
    rank 1 the top and the second finest) or "spread" (level l by rank (l + 2) % size: every rank finds some)."""
    if mask_rank == "beside":
        return mask_finders(levels, True)
    if mask_rank == "spread":
        return [(l + 2) % size for l in range(levels)]
    return [mask_rank] * levels


def _share(comm, make_mesh, below, sent=None, mask_rank=0):
    """One rank's side of the hand-over on its own copy of the mesh: what it ends with."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if sent is not None:                                         # the dtypes this rank sends
        send = comm.Send
        comm.Send = lambda buf, dest, tag=0: (sent.append(np.asarray(buf).dtype), send(buf, dest, tag))
    space = Space(make_mesh(), 1)
    top, spaces, msg = _split_hierarchy(space, None, below)
    assert not msg
    nranks = level_ranks([s.num_dofs for s in spaces], size, 0, 100)
    cut = cut_and_own(space, spaces, size, None, nranks) if rank == 1 else None
    finders = _finders(mask_rank, len(spaces) + 1, size)
    mine = [s for s, q in zip([top] + spaces, finders) if q == rank]
    masks = free_masks(mine, "all") if mine else None
    arg = mask_rank if isinstance(mask_rank, int) else finders
    ranks, (owners, cells, nr), got = hand_over(comm, space, top, spaces, nranks, cut, masks, "mpi", arg)
    searched = ["_hanging_forest" in s._carrier.__dict__ for s in [top, *spaces]]
    return dict(ranks=ranks, owners=owners, cells=cells, nranks=nr, masks=got, searched=searched,
                hanging=[s._carrier._hanging_arrays() for s in [top, *spaces]],
                H=[s.H.toarray() for s in [top, *spaces]], spaces=(top, spaces), want_nranks=nranks,
                own_masks=free_masks([top] + spaces, "all"), finders=finders)


@pytest.mark.parametrize("size, mask_rank", [(2, 0), (3, 0), (2, 1), (3, 1), (2, "beside"), (3, "beside"),
                                             (3, "spread")])
def test_every_rank_gets_rank_ones_cut_and_the_masks(size, mask_rank):
    sent = {r: [] for r in range(size)}
    got = run_ranks(size, lambda comm: _share(comm, lambda: _mesh(2, 3), 50, sent[comm.Get_rank()], mask_rank),
                    timeout=120)
    top, spaces = got[1]["spaces"]
    finders = got[0]["finders"]
    assert top.num_dofs < 50 and len(spaces) >= 2
    assert got[0]["want_nranks"][0] < size                       # a folded level among them
    if 1 not in finders:                                         # the cut: an eighth of int64's bytes
        assert sent[1] and all(d == np.int8 for d in sent[1])
    else:                                                        # (the cut first, then the masks)
        ncut = 1 + 2 * len(spaces)
        assert all(d == np.int8 for d in sent[1][:ncut * (size - 1)])
    if mask_rank == "beside":
        assert finders == [1] + [0] * (len(spaces) - 2) + [1, 0]
    ref = got[1]                                                 # the cut rank's own arrays
    again = level_ownership(spaces, ref["ranks"], ref["want_nranks"], size)
    assert all(np.array_equal(a, b) for a, b in zip(again[0] + again[1], ref["owners"] + ref["cells"]))
    for r, g in enumerate(got):
        assert g["nranks"] == ref["want_nranks"]
        for a, b in zip([g["ranks"], *g["owners"], *g["cells"]], [ref["ranks"], *ref["owners"], *ref["cells"]]):
            assert a.dtype == np.int64 and np.array_equal(a, b), r          # integers: exact
        assert len(g["masks"]) == len(spaces) + 1
        for l, (m, own) in enumerate(zip(g["masks"], g["own_masks"])):
            m0 = got[finders[l]]["masks"][l]
            assert m.dtype == bool and np.array_equal(m, m0) and np.array_equal(m, own), (r, l)
        # the receivers keep the finder's hanging nodes as their meshes' own: never searched,
        # and what the search finds; the same integer operations give the same H (weights 1/2, 1/4)
        assert g["searched"] == [r == q for q in finders], r
        for l, h in enumerate(g["hanging"]):
            h0 = got[finders[l]]["hanging"][l]
            assert all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) for a, b in zip(h, h0))
            assert np.array_equal(g["H"][l], got[finders[l]]["H"][l])
    assert sum(s.hanging_nodes.size for s in spaces) > 0


def test_hand_over_needs_one_finder_per_level():
    def one(comm):
        space = Space(_uniform(), 1)
        top, spaces, _ = _split_hierarchy(space, None, 20)
        with pytest.raises(ValueError, match="one rank per level"):
            hand_over(comm, space, top, spaces, [2] * len(spaces), None, None, "mpi", [0])
        with pytest.raises(ValueError, match="one rank per level"):
            hand_over(comm, space, top, spaces, [2] * len(spaces), None, None, "mpi", 2)
    run_ranks(2, one, timeout=60)


def _uniform():
    return Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine().refine()


def test_hand_over_keeps_empty_hanging_arrays_shaped():
    """Levels without hanging nodes: the receivers' arrays keep their 2-D shape (0, k)."""
    got = run_ranks(2, lambda comm: _share(comm, _uniform, 20), timeout=120)
    shapes = [[a.shape for a in h] for h in got[0]["hanging"]]
    assert all(sh[0] == (0,) and len(sh[1]) == 2 for sh in shapes)
    assert [[a.shape for a in h] for h in got[1]["hanging"]] == shapes


def test_level_ownership_needs_one_rank_count_per_level():
    space = Space(_mesh(2, 2), 1)
    _, spaces, _ = _split_hierarchy(space, None, 50)
    ranks = np.zeros(space.mesh.num_cells, dtype=np.int64)
    with pytest.raises(ValueError, match="rank counts"):
        level_ownership(spaces, ranks, [1], 2)
    with pytest.raises(ValueError, match="one rank per cell"):
        level_ownership(spaces, ranks[:-1], [2] * len(spaces), 2)


@pytest.mark.parametrize("below", [1, 40, 100, 500, 5000, 10 ** 9])
def test_serial_top_is_the_finest_level_below_the_threshold(below, monkeypatch):
    """_split_hierarchy's top: the finest level below the finest with fewer than ``below`` DoFs
    (the coarsest where none has), the levels above it returned as they are; the spaces of the
    levels below the top are never made (their meshes are not numbered: rank 0's serial
    hierarchy makes its own)."""
    import importlib
    solve_mod = importlib.import_module("adaptmg.distributed.solve")      # (the package's solve is a function)
    space = Space(_mesh(2, 3), 1)
    every = [Space(m, 1) for m in space.mesh.hierarchy()[:-1]] + [space]
    small = [i for i, s in enumerate(every[:-1]) if s.num_dofs < below]
    g = max(small) if small else 0
    made = []
    monkeypatch.setattr(solve_mod, "Space", lambda *a: made.append(a[0]) or Space(*a))
    top, spaces, msg = _split_hierarchy(space, None, below)
    assert not msg and spaces[-1] is space
    assert [top.num_dofs] + [s.num_dofs for s in spaces] == [s.num_dofs for s in every[g:]]
    assert len(made) == len(every) - 1 - g                       # only the top and the levels above it


def test_free_masks_leave_the_hanging_matrices_unbuilt():
    """free_masks: each level's mask is its Constraints' free mask, and no level's H is built
    (on rank 1 of a hand-over H waits for the rows phase, off the path both ranks wait on)."""
    space = Space(_mesh(2, 3), 1)
    _, spaces, _ = _split_hierarchy(space, None, 50)
    frees = free_masks(spaces, "all")
    assert all(s.hanging_nodes.size for s in spaces[-2:])        # levels with hanging nodes
    assert not any("H_nodes" in s.__dict__ for s in spaces)       # cached_property: not built
    from adaptmg.fe.constraints import Constraints
    from adaptmg.multilevel.hierarchy import dirichlet_dofs
    assert all(np.array_equal(f, Constraints(s, dirichlet_dofs(s, "all")).free) for f, s in zip(frees, spaces))
    assert all("H_nodes" in s.__dict__ for s in spaces if s.hanging_nodes.size)   # the check can see it


@pytest.mark.parametrize("components, kw", [
    (1, {}), (1, dict(smoother="chebyshev", presmooth=1, postsmooth=3)),
    (1, dict(smoother="jacobi", smoother_kwargs={"omega": 0.6})), (2, dict(smoother="block_jacobi")),
    (1, dict(smoother=("chebyshev", "jacobi"))), (1, dict(backend="cpu", threads=1, coarse_max_rows=None))])
def test_smoothing_of_the_serial_levels_is_known_before_they_exist(components, kw):
    """multigrid_smoothing: the finest level's smoother, its arguments and the sweeps that
    multigrid(space, **kw) gives its solver -- what the local levels use while rank 0 has not
    built the serial levels yet."""
    space = Space(Mesh.box([0, 0], [1, 1], [4, 4]).refine(), 1, components)
    form = (lambda sp: assemble.elasticity(sp, 1.0, 1.0)) if components == 2 else assemble.stiffness
    ml = multigrid(space, form, **kw)
    spec, skw, pre, post = multigrid_smoothing(components, kw)
    assert (spec, skw, pre, post) == (ml._smoother_spec, ml._smoother_kwargs, ml.presmooth, ml.postsmooth)


def _pending(comm, make_kw, below=50):
    rank = comm.Get_rank()
    space = Space(_mesh(2, 3), 1)
    top, _, _ = _split_hierarchy(space, None, below)
    free = free_masks([top], "all")[0]
    made = []

    def make():
        made.append(rank)
        return multigrid(top, assemble.stiffness, dirichlet="all", **make_kw)
    pend = PendingSerialLevels(top, free, make, 1, {}, rank, "cpu")
    pend.build("in the test")                     # rank 0 only
    ml, summary = pend.finish(comm, None)
    return made, ml, summary, top, free


def test_pending_serial_levels_are_built_on_rank_zero_and_summarised_elsewhere():
    got = run_ranks(2, lambda comm: _pending(comm, {}), timeout=120)
    (made0, ml0, s0, top0, _), (made1, ml1, s1, top1, free1) = got
    assert made0 == [0] and made1 == []                            # built once, on rank 0
    assert type(ml0).__name__ == "GeometricMultigrid" and isinstance(ml1, SerialLevelsOnRankZero)
    assert s1 == s0 and s0["dofs"] == [lev.n for lev in ml0.levels] and s0["dofs"][-1] == top1.num_dofs
    assert "free" not in s0 and "hanging" not in s0               # the others have the top's already
    assert ml1.constraints[-1].free is free1 and ml1.spaces[-1] is top1
    assert (ml1._smoother_spec, ml1._smoother_kwargs) == (ml0._smoother_spec, ml0._smoother_kwargs)
    assert [lev.n for lev in ml1.levels] == s0["dofs"] and ml1.cells == s0["cells"]


@pytest.mark.parametrize("make_kw", [dict(smoother="chebyshev"), dict(presmooth=1)])
def test_pending_serial_levels_refuse_other_smoothing(make_kw):
    """Serial levels built with another smoothing than the local levels used: every rank
    raises (the check runs on the broadcast summary)."""
    with pytest.raises(RuntimeError, match="not those the local levels were built for"):
        run_ranks(2, lambda comm: _pending(comm, make_kw), timeout=120)


def test_first_setup_is_agreed_by_every_rank(monkeypatch):
    """first_setup: true on every rank while some rank has finished no local set-up."""
    import adaptmg.distributed.serial_levels as SL
    monkeypatch.setattr(SL, "_SETUPS", [0])
    assert run_ranks(2, lambda comm: SL.first_setup(comm), timeout=60) == [True, True]
    SL.setup_done()
    assert run_ranks(2, lambda comm: SL.first_setup(comm), timeout=60) == [False, False]

    class OtherFresh:                                # a rank whose peer has set up nothing yet
        def Get_size(self):
            return 2

        def allreduce(self, x):
            return x + 1
    assert SL.first_setup(OtherFresh()) is True      # this rank is not fresh, its peer is: both say first
