"""The ghost columns of a rank's rows (adaptmg.distributed.csr.ghost_numbering): distinct,
ordered by (owner, global index), each entry's position among them, and the count per owner
-- for a replicated owner array and for ranges, on the host and (GPU) with the owners on
the device."""
import numpy as np
import pytest

from adaptmg.distributed.csr import ghost_numbering
from adaptmg.distributed.layout import Layout, RangeLayout
from test_local_setup import RankOf


def _layouts(xp=np, N=997, size=4, rank=1, seed=3):
    rng = np.random.default_rng(seed)
    comm = RankOf(rank, size)
    owner = rng.integers(0, size, N)
    starts = np.concatenate([[0], np.sort(rng.integers(0, N, size - 1)), [N]])
    rng_owner = np.searchsorted(starts, np.arange(N), side="right") - 1
    return [(Layout(xp.asarray(owner) if xp is not np else owner, comm), owner),
            (RangeLayout(starts, comm), rng_owner)]


def _check(ghosts, gpos, counts, gi, owner, size):
    gi = np.asarray(gi)
    want = np.unique(gi)
    key = owner[want] * owner.size + want
    want = want[np.argsort(key)]                     # by owner, then global index
    assert np.array_equal(ghosts, want)
    assert np.array_equal(ghosts[gpos], gi)          # each entry finds its column
    assert np.array_equal(counts, np.bincount(owner[want], minlength=size))
    assert counts.dtype == np.int64 and ghosts.dtype == np.int64


@pytest.mark.parametrize("n", [0, 1, 300])
def test_ghosts_ordered_by_owner_then_index_with_counts(n):
    rng = np.random.default_rng(n)
    for lay, owner in _layouts():
        gi = rng.choice(np.flatnonzero(owner != lay.rank), n)        # repeats allowed
        ghosts, gpos, counts = ghost_numbering(np, gi, lay)
        _check(ghosts, np.asarray(gpos), counts, gi, owner, 4)
        assert counts[lay.rank] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 300])
def test_device_keys_equal_the_host_numbering(n):
    """Owners on the device (a device layout, a range layout): the keys sorted there give the
    host's ghosts, positions and counts; a host layout with device entries: the host lookup."""
    import cupy
    rng = np.random.default_rng(n)
    for (dlay, owner), (hlay, _) in zip(_layouts(cupy), _layouts()):
        gi = rng.choice(np.flatnonzero(owner != dlay.rank), n)
        want = ghost_numbering(np, gi, hlay)
        for lay in (dlay, hlay):
            ghosts, gpos, counts = ghost_numbering(cupy, cupy.asarray(gi), lay)
            assert isinstance(gpos, cupy.ndarray)
            assert np.array_equal(ghosts, want[0]) and np.array_equal(counts, want[2])
            assert np.array_equal(cupy.asnumpy(gpos), np.asarray(want[1]))


def _canonical(A):
    """Columns strictly increasing inside every row."""
    inside = np.ones(max(A.nnz - 1, 0), dtype=bool)
    b = A.indptr[1:-1] - 1
    inside[b[(b >= 0) & (b < inside.size)]] = False
    return bool(np.all(np.diff(A.indices)[inside] > 0))


@pytest.mark.parametrize("which", [0, 1])
def test_split_blocks_keep_sorted_rows_whether_or_not_the_ghost_order_does(which):
    """csr._split: the ghost block's rows are sorted both where the (owner, index) order of the
    ghosts is their global order (ranges: no sort) and where it is not (interleaved owners:
    sorted); the blocks are the rows' owned and ghost columns."""
    import scipy.sparse as sp
    from adaptmg.backend import CPU
    from adaptmg.distributed.csr import _split
    lay, owner = _layouts()[which]
    M = sp.csr_matrix(sp.random(owner.size, owner.size, density=0.03, random_state=np.random.default_rng(5))
                      + sp.eye(owner.size))
    rows = M[lay.rows]
    Aoo, Aog, ghosts, counts = _split(CPU, rows, lay, lay.rank)
    assert bool(np.all(np.diff(ghosts) > 0)) == (which == 1)     # the ranges keep the order
    assert _canonical(Aoo) and _canonical(Aog) and Aog.has_sorted_indices
    dense = rows.toarray()
    # the blocks' values are the rows' own entries moved, not computed: exact
    assert np.array_equal(Aoo.toarray(), dense[:, lay.rows])
    assert np.array_equal(Aog.toarray(), dense[:, ghosts])
