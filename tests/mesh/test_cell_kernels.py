"""The cell kernels (adaptmg.device.cell_kernels): whether a cell has a vertex in a node mask,
and every cell's value into its vertices' minimum / maximum -- the twins against the
formulas, the kernels (GPU) against the twins."""
import numpy as np
import pytest

from adaptmg.device import cell_kernels


def _cells_case(seed=11, nc=300, nv=8, nn=500):
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, nn, (nc, nv))
    return rng, cells


def test_cells_vertex_hit_and_scatter_cells_twins_are_the_formulas():
    """``cells_vertex_hit``: a cell is hit iff one of its vertices is in the mask;
    ``scatter_cells``: every node's bounds are the min / max of the values of the cells that
    have it as a vertex (and the initial value), each bound alone or both."""
    rng, cells = _cells_case()
    mask = rng.random(500) < 0.01
    hit = cell_kernels.cells_vertex_hit(cells, mask)
    assert hit.dtype == bool and np.array_equal(hit, [mask[c].any() for c in cells]) and 0 < hit.sum() < 300
    vals = rng.integers(-50, 50, 300).astype(np.int32)
    lo0, hi0 = np.full(500, 7, np.int32), np.full(500, -7, np.int32)
    lo, hi = cell_kernels.scatter_cells(cells, vals, lo0.copy(), hi0.copy())
    for i in range(500):
        at = vals[(cells == i).any(axis=1)]
        assert lo[i] == min([7, *at]) and hi[i] == max([-7, *at])
    only_lo, none_hi = cell_kernels.scatter_cells(cells, vals, lo=lo0.copy())
    assert none_hi is None and np.array_equal(only_lo, lo)
    none_lo, only_hi = cell_kernels.scatter_cells(cells, vals, hi=hi0.copy())
    assert none_lo is None and np.array_equal(only_hi, hi)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("nv", [4, 8, 27])
def test_cells_vertex_hit_and_scatter_cells_kernels_equal_twins(dtype, nv):
    """The kernels (one thread a cell; atomics a slot) equal the twins: integers, exact."""
    from adaptmg.backend import get_backend, to_host
    cp = get_backend("gpu").xp
    rng, cells = _cells_case(nv=nv)
    cells = cells.astype(dtype)
    mask = rng.random(500) < 0.02
    want = cell_kernels.cells_vertex_hit(cells, mask)
    np.testing.assert_array_equal(to_host(cell_kernels.cells_vertex_hit(cp.asarray(cells), cp.asarray(mask))), want)
    vals = rng.integers(-50, 50, 300).astype(dtype)
    for ops in ("lo", "hi", "both"):
        lo0 = np.full(500, 7, dtype) if ops != "hi" else None
        hi0 = np.full(500, -7, dtype) if ops != "lo" else None
        w = cell_kernels.scatter_cells(cells, vals, None if lo0 is None else lo0.copy(),
                                        None if hi0 is None else hi0.copy())
        g = cell_kernels.scatter_cells(cp.asarray(cells), cp.asarray(vals),
                                        None if lo0 is None else cp.asarray(lo0), None if hi0 is None else cp.asarray(hi0))
        for a, b in zip(g, w):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(to_host(a), b)
    with pytest.raises(TypeError, match="int32 / int64"):
        cell_kernels.scatter_cells(cp.asarray(cells), cp.asarray(vals).astype(np.float64), lo=cp.zeros(500))


def test_cells_on_boundary_and_majority_ranks_twins_are_the_formulas():
    """``cells_on_boundary``: a cell is on the boundary iff one of its face ids is >= 0;
    ``majority_ranks``: every coarse cell's most frequent rank among its fine cells (ties and
    cells without fine cells: the lowest rank); a rank outside 0 .. size - 1 or a size below
    one is a ValueError."""
    rng = np.random.default_rng(5)
    ids = np.where(rng.random((400, 6)) < 0.05, rng.integers(0, 4, (400, 6)), -1).astype(np.int32)
    hit = cell_kernels.cells_on_boundary(ids)
    assert hit.dtype == bool and np.array_equal(hit, [any(v >= 0 for v in row) for row in ids])
    assert 0 < hit.sum() < 400
    rows = rng.permutation(400)[:250]
    assert np.array_equal(cell_kernels.cells_on_boundary(ids, rows), hit[rows])
    from adaptmg.mesh import _boundary
    c, f, bid = _boundary.boundary_faces(ids, None, rows)
    want = np.nonzero(ids[rows] >= 0)
    assert np.array_equal(c, want[0]) and np.array_equal(f, want[1]) and np.array_equal(bid, ids[rows][want])
    for size in (1, 2, 3):
        parent = rng.integers(0, 50, 300)
        ranks = rng.integers(0, size, 300)
        got = cell_kernels.majority_ranks(parent, ranks, 60, size)
        for K in range(60):
            counts = [int(((parent == K) & (ranks == r)).sum()) for r in range(size)]
            assert got[K] == counts.index(max(counts)), (K, counts)
    assert np.array_equal(cell_kernels.majority_ranks(np.array([0, 0, 1, 1]), np.array([1, 0, 1, 1]), 3, 2),
                          [0, 1, 0])
    with pytest.raises(ValueError, match=r"0 \.\. 1"):
        cell_kernels.majority_ranks(np.array([0, 1]), np.array([0, 2]), 2, 2)
    with pytest.raises(ValueError, match="positive integer"):
        cell_kernels.majority_ranks(np.array([0, 1]), np.array([0, 0]), 2, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_cells_on_boundary_and_majority_ranks_kernels_equal_twins(dtype):
    """The kernels equal the twins (integers, exact), also with the boundary faces searched in
    the boundary cells only; a bad rank raises from the device flag."""
    from adaptmg.backend import get_backend, to_host
    from adaptmg.mesh import _boundary
    cp = get_backend("gpu").xp
    rng = np.random.default_rng(8)
    ids = np.where(rng.random((5000, 6)) < 0.03, rng.integers(0, 4, (5000, 6)), -1).astype(dtype)
    rows = rng.permutation(5000)[:3000]
    for r in (None, rows):
        np.testing.assert_array_equal(
            to_host(cell_kernels.cells_on_boundary(cp.asarray(ids), None if r is None else cp.asarray(r))),
            cell_kernels.cells_on_boundary(ids, r))
        for sel in (None, np.array([1, 3])):
            got = _boundary.boundary_faces(cp.asarray(ids), sel, None if r is None else cp.asarray(r))
            for a, b in zip(got, _boundary.boundary_faces(ids, sel, r)):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(to_host(a), b)
    for size in (1, 2, 5):
        parent = rng.integers(0, 700, 6000).astype(dtype)
        ranks = rng.integers(0, size, 6000).astype(dtype)
        want = cell_kernels.majority_ranks(parent, ranks, 800, size)
        got = cell_kernels.majority_ranks(cp.asarray(parent), cp.asarray(ranks), 800, size)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(to_host(got), want)
    with pytest.raises(ValueError, match=r"0 \.\. 1"):
        cell_kernels.majority_ranks(cp.asarray([0, 1]), cp.asarray([0, -1]), 2, 2)


def _forest_case(rng):
    """A small forest: 20 roots, some refined into 8 children (ids consecutive), some of
    those again; a coarse mesh (the roots and the first generation where refined once more)
    and a fine mesh one level below it in places."""
    parent, child0 = list(np.full(20, -1)), list(np.full(20, -1))

    def split(c):
        child0[c] = len(parent)
        parent.extend([c] * 8)
        child0.extend([-1] * 8)
    for c in rng.choice(20, 8, replace=False):
        split(int(c))
    gen1 = [c for c in range(20, len(parent))]
    for c in rng.choice(gen1, 10, replace=False):
        split(int(c))
    parent, child0 = np.array(parent), np.array(child0)
    refined = child0 >= 0
    # coarse: roots unrefined or refined once (their children), no grandchildren
    coarse = np.array([c for c in range(len(parent)) if (parent[c] < 0 and not refined[c])
                       or (parent[c] >= 0 and parent[parent[c]] < 0)])
    fine = np.array([c for c in range(len(parent)) if not refined[c]])
    return parent, child0, coarse, fine


def test_parent_positions_twin_is_the_formula():
    """Each fine cell's coarse position is its own where it is a coarse cell (child -1), else
    its parent's with the child index ``a - child0[parent]``; a cell two levels below is not
    found (``ok`` False)."""
    rng = np.random.default_rng(3)
    parent, child0, coarse, fine = _forest_case(rng)
    loc = np.full(parent.size, -1, np.int32)
    loc[coarse] = np.arange(coarse.size)
    pos, child, pos_c, child_c, ok = cell_kernels.parent_positions(fine, loc, parent, child0)
    assert ok and pos.dtype == child.dtype == np.int64 and pos_c.dtype == np.int32 and child_c.dtype == np.int8
    for a, p, ch in zip(fine, pos, child):
        if a in coarse:
            assert coarse[p] == a and ch == -1
        else:
            assert coarse[p] == parent[a] and ch == a - child0[parent[a]] and 0 <= ch < 8
    assert np.array_equal(pos_c, pos) and np.array_equal(child_c, child)
    roots_only = np.full(parent.size, -1, np.int32)
    roots_only[:20] = np.arange(20)
    assert not cell_kernels.parent_positions(fine, roots_only, parent, child0)[4]


@pytest.mark.gpu
@pytest.mark.parametrize("compact", [np.int32, np.int64])
def test_parent_positions_kernel_equals_twin(compact):
    """The kernel equals the twin (integers, exact), found or not."""
    from adaptmg.backend import get_backend, to_host
    cp = get_backend("gpu").xp
    rng = np.random.default_rng(4)
    parent, child0, coarse, fine = _forest_case(rng)
    loc = np.full(parent.size, -1, np.int32)
    loc[coarse] = np.arange(coarse.size)
    roots_only = np.full(parent.size, -1, np.int32)
    roots_only[:20] = np.arange(20)
    for table in (loc, roots_only):
        want = cell_kernels.parent_positions(fine, table, parent, child0, compact)
        got = cell_kernels.parent_positions(cp.asarray(fine), cp.asarray(table), cp.asarray(parent),
                                            cp.asarray(child0), compact)
        assert got[4] == want[4]
        if want[4]:
            for a, b in zip(got[:4], want[:4]):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(to_host(a), b)
