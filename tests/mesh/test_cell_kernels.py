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
    np.testing.assert_array_equal(to_host(cell_kernels.cells_on_boundary(cp.asarray(ids))),
                                  cell_kernels.cells_on_boundary(ids))
    for sel in (None, np.array([1, 3])):
        for a, b in zip(_boundary.boundary_faces(cp.asarray(ids), sel), _boundary.boundary_faces(ids, sel)):
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
