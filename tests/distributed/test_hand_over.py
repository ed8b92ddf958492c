"""Rank 1's cut of the mesh, the local levels' owners, free masks and hanging nodes handed to
rank 0 (the local set-up of adaptmg.distributed.solve, where rank 0 alone builds the serial
levels): the bytes that comm.pass_arrays moves by MPI, and solve._hand_over's narrowing to
the smallest integers that hold a rank and widening back -- rank 0 ends with exactly rank 1's
arrays, as int64, and with the masks and hanging nodes its own mesh would give.
Two stand-in ranks in one process share a message queue (the MPI runs of test_mpi.py, the
NCCL path on two GPUs: -m gpu, check the whole solve)."""
import numpy as np
import pytest

from adaptmg.distributed.comm import pass_arrays
from adaptmg.distributed.partition import level_ownership, level_ranks
from adaptmg.distributed.solve import _cut_and_own, _free_masks, _hand_over, _split_hierarchy
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


@pytest.mark.parametrize("size", [2, 3])
def test_rank_zero_receives_rank_ones_cut_and_owners_as_int64(size):
    space = Space(_mesh(2, 3), 1)
    top, spaces, msg = _split_hierarchy(space, None, 50)
    assert not msg and top.num_dofs < 50 and len(spaces) >= 2
    nranks = level_ranks([s.num_dofs for s in spaces], size, 0, 100)
    ranks, own = _cut_and_own(space, spaces, size, None, nranks)
    assert nranks[0] < size                                      # a folded level among them
    frees = _free_masks(spaces, "all")
    q = []
    assert _hand_over(QueueRank(1, size, q), space, spaces, nranks, ranks, own, frees, "mpi") == (ranks, own, frees)
    narrowed = q[1:2 + 2 * len(spaces)]                          # (after the hanging arrays' shapes)
    assert all(data.dtype == np.int8 for *_, data in narrowed)   # an eighth of int64's bytes
    space0 = Space(_mesh(2, 3), 1)                               # rank 0's own (identical) mesh
    _, spaces0, _ = _split_hierarchy(space0, None, 50)
    r0, (owners, cells, nr), frees0 = _hand_over(QueueRank(0, size, q), space0, spaces0, nranks, None, None,
                                                 None, "mpi")
    assert not q and nr == nranks
    for a, b in zip([r0, *owners, *cells], [ranks, *own[0], *own[1]]):
        assert a.dtype == np.int64 and np.array_equal(a, b)
    again = level_ownership(spaces, r0, nranks, size)            # what rank 0 would have computed
    assert all(np.array_equal(a, b) for a, b in zip(again[0] + again[1], owners + cells))
    assert all(f0.dtype == bool and np.array_equal(f0, f) for f0, f in zip(frees0, frees))   # masks: exact
    # rank 0 keeps rank 1's hanging nodes as its meshes' own: it never searched them, and
    # they are what the search finds
    assert sum(s.hanging_nodes.size for s in spaces0) > 0
    for s0, s in zip(spaces0, spaces):
        assert "_hanging_forest" not in s0.mesh.__dict__
        for a0, a in zip(s0.mesh._hanging_arrays(), s.mesh._hanging_arrays()):
            assert a0.dtype == a.dtype and a0.shape == a.shape and np.array_equal(a0, a)
        # the same operations on the same integers on both sides (the weights 1/2, 1/4): exact
        assert np.array_equal(s0.H.toarray(), s.H.toarray())
    assert all(np.array_equal(f0, f) for f0, f in zip(frees0, _free_masks(spaces0, "all")))
    assert all("_hanging_forest" not in s0.mesh.__dict__ for s0 in spaces0)


def test_serial_summary_hands_the_tops_hanging_nodes_to_the_other_ranks():
    """Rank 0's summary of its serial levels carries the hanging nodes of their top; another
    rank's copy of the top adopts them (no search) and gets the same constraint matrix."""
    from adaptmg import assemble, multigrid
    from adaptmg.backend import CPU
    from adaptmg.distributed.hierarchy import SerialLevelsOnRankZero
    space = Space(_mesh(2, 3), 1)
    top, _, _ = _split_hierarchy(space, None, 200)
    ml = multigrid(top, assemble.stiffness, dirichlet="all")
    assert top.hanging_nodes.size > 0
    summary = SerialLevelsOnRankZero.summary(ml)
    top1, _, _ = _split_hierarchy(Space(_mesh(2, 3), 1), None, 200)     # rank 1's own copy
    SerialLevelsOnRankZero(summary, top1, CPU)
    assert "_hanging_forest" not in top1.mesh.__dict__
    for a1, a in zip(top1.mesh._hanging_arrays(), top.mesh._hanging_arrays()):
        assert a1.dtype == a.dtype and a1.shape == a.shape and np.array_equal(a1, a)
    assert np.array_equal(top1.H.toarray(), top.H.toarray())        # the same integer operations
    assert "_hanging_forest" not in top1.mesh.__dict__


def _uniform():
    return Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine().refine()


def test_hand_over_keeps_empty_hanging_arrays_shaped():
    """Levels without hanging nodes: rank 0's arrays keep their 2-D shape (0, k)."""
    space = Space(_uniform(), 1)
    top, spaces, _ = _split_hierarchy(space, None, 20)
    nranks = level_ranks([s.num_dofs for s in spaces], 2, 0, 10)
    ranks, own = _cut_and_own(space, spaces, 2, None, nranks)
    q = []
    _hand_over(QueueRank(1, 2, q), space, spaces, nranks, ranks, own, _free_masks(spaces, "all"), "mpi")
    space0 = Space(_uniform(), 1)
    _, spaces0, _ = _split_hierarchy(space0, None, 20)
    _hand_over(QueueRank(0, 2, q), space0, spaces0, nranks, None, None, None, "mpi")
    shapes = [[a.shape for a in s.mesh._hanging_arrays()] for s in spaces]
    assert all(sh[0] == (0,) and len(sh[1]) == 2 for sh in shapes)
    assert [[a.shape for a in s.mesh._hanging_arrays()] for s in spaces0] == shapes


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
    """_free_masks: each level's mask is its Constraints' free mask, and no level's H is built
    (on rank 1 of a hand-over H waits for the rows phase, off the path both ranks wait on)."""
    space = Space(_mesh(2, 3), 1)
    _, spaces, _ = _split_hierarchy(space, None, 50)
    frees = _free_masks(spaces, "all")
    assert all(s.hanging_nodes.size for s in spaces[-2:])        # levels with hanging nodes
    assert not any("H_nodes" in s.__dict__ for s in spaces)       # cached_property: not built
    from adaptmg.fe.constraints import Constraints
    from adaptmg.multilevel.hierarchy import dirichlet_dofs
    assert all(np.array_equal(f, Constraints(s, dirichlet_dofs(s, "all")).free) for f, s in zip(frees, spaces))
    assert all("H_nodes" in s.__dict__ for s in spaces if s.hanging_nodes.size)   # the check can see it
