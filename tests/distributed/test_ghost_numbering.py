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


def _split_rows_case(comm, owner):
    """A rank's DistCSR from its rows and from the same rows split beforehand (SplitRows)."""
    import scipy.sparse as sp
    from adaptmg.device.index_kernels import owned_ghost_rows
    from adaptmg.distributed.csr import DistCSR, SplitRows, split_rows
    lay = Layout(owner, comm)
    M = sp.csr_matrix(sp.random(owner.size, owner.size, density=0.03, random_state=np.random.default_rng(7))
                      + sp.eye(owner.size))
    rows = M[lay.rows]
    parts = owned_ghost_rows(rows.indptr, rows.indices, rows.data, lay.local.astype(np.int32))
    plain = DistCSR(rows, lay, lay, local_rows=True)
    split = DistCSR(SplitRows(parts, rows.shape), lay, lay, local_rows=True)
    chosen = DistCSR(split_rows(M, lay, np.asarray(lay.rows, dtype=np.int64)), lay, lay, local_rows=True)
    wrong = None
    try:                                 # split for another layout: ghosts this rank owns
        other = np.where(owner == comm.Get_rank(), (comm.Get_rank() + 1) % comm.Get_size(), owner)
        DistCSR(SplitRows(owned_ghost_rows(rows.indptr, rows.indices, rows.data,
                                           Layout(other, comm).local.astype(np.int32)), rows.shape),
                lay, lay, local_rows=True)
    except ValueError as e:
        wrong = str(e)
    x = np.random.default_rng(comm.Get_rank()).random(lay.n)
    return plain, split, chosen, wrong, plain @ x, split @ x


def test_split_rows_make_the_same_distributed_matrix():
    """DistCSR of SplitRows (a kernel's split, here owned_ghost_rows', of the rows or of the
    whole matrix's chosen rows: split_rows) has the blocks, ghosts and product of the
    DistCSR of the rows themselves (the same entries moved: exact); rows split
    for another column layout are refused, and SplitRows need local_rows=True."""
    from adaptmg.distributed.csr import DistCSR, SplitRows
    from adaptmg.distributed.thread_comm import run_ranks
    owner = np.random.default_rng(2).integers(0, 3, 500)
    for plain, split, chosen, wrong, y1, y2 in run_ranks(3, _split_rows_case, owner, timeout=60):
        for s in (split, chosen):         # chosen: split_rows of the whole matrix's rank rows
            assert np.array_equal(s.ghosts, plain.ghosts) and s.nnz_local == plain.nnz_local
            for a, b in ((s.Aoo, plain.Aoo), (s.Aog, plain.Aog)):
                assert a.shape == b.shape and (a != b).nnz == 0
        assert np.array_equal(y1, y2)
        assert wrong is not None and "another column layout" in wrong
    with pytest.raises(ValueError, match="local_rows=True"):
        DistCSR(SplitRows((), (1, 1)), None, None)
