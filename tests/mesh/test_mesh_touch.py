"""touch_max's sparse path (few cells above the minimum: the 2:1 closure, global coarsening's
blocked families) equals the maximum over touch_graph, as its dense path does."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptmg import Mesh
from adaptmg.mesh import _touch


def _graph_max(m, vals):
    T = m.touch_graph.tocsr()
    return np.array([vals[T.indices[T.indptr[i]:T.indptr[i + 1]]].max() for i in range(m.num_cells)])


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6), nsrc=st.integers(0, 6))
def test_sparse_touch_max_matches_touch_graph(dim, seed, nsrc):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [3] * dim)
    for _ in range(2):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    assert m.num_hanging_nodes > 0
    nsrc = min(nsrc, m.num_cells // _touch.SPARSE)
    vals = np.full(m.num_cells, -1)
    src = rng.choice(m.num_cells, nsrc, replace=False)
    vals[src] = rng.integers(0, 9, nsrc)
    assert nsrc * _touch.SPARSE <= m.num_cells                     # the sparse path runs
    out = m.touch_max(vals)
    assert out.dtype == np.int64 and np.array_equal(out, _graph_max(m, vals))
    # the sources' neighbourhoods are raised, nothing else
    assert np.array_equal(out > -1, _graph_max(m, (vals > -1).astype(int)) > 0)


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6), wide=st.booleans())
def test_dense_touch_max_matches_touch_graph(dim, seed, wide):
    """touch_max with many sources (its dense path: values scattered value by value, or by
    np.maximum.at for a range beyond int16) equals the maximum over touch_graph, through the
    shared vertices and through the hanging-node links alike."""
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [3] * dim)
    for _ in range(2):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    vals = rng.integers(-3, 10 ** 6 if wide else 9, m.num_cells)
    vals[rng.random(m.num_cells) < 0.3] = vals.min()
    assert (vals > vals.min()).sum() * _touch.SPARSE > m.num_cells         # the dense path runs
    ref = _graph_max(m, vals)
    assert np.array_equal(m.touch_max(vals), ref)
    out = _touch.touch_max(m.cells, m.num_nodes, m._hanging[3], vals)
    assert out.dtype == np.int64 and np.array_equal(out, ref)


def _closure_by_graph(m, idx):
    """The 2:1 closure as its definition reads: add every cell that touches a marked cell of a
    higher level (touch_graph), until nothing changes."""
    T, lv = m.touch_graph.tocoo(), m.levels
    marked = np.zeros(m.num_cells, dtype=bool)
    marked[idx] = True
    while True:
        new = np.zeros_like(marked)
        hit = marked[T.col] & (lv[T.col] > lv[T.row])
        new[T.row[hit]] = True
        if not (new & ~marked).any():
            return np.flatnonzero(marked)
        marked |= new


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6), lowest=st.booleans())
def test_closure_equals_the_fixed_point_over_touch_graph(dim, seed, lowest):
    """Mesh._close (with its skip when only cells of the lowest level are marked) is the
    smallest 2:1 superset: the fixed point of the definition over touch_graph."""
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [3] * dim)
    for _ in range(2):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    lv = m.levels
    pool = np.flatnonzero(lv == lv.min()) if lowest else np.arange(m.num_cells)
    idx = np.unique(rng.choice(pool, max(1, pool.size // 5)))
    got = m._close(idx)
    assert np.array_equal(got, _closure_by_graph(m, idx))
    if not lowest:
        assert got.size >= idx.size


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("frac,sparse", [(0.15, False), (0.6, True)])
def test_level_jumps_sparse_and_dense_match_the_definition(dim, frac, sparse):
    """jump = (max - min of the levels at a node) > 0, on both paths (a dominant level: only
    the cells near the others are scanned, ``rows`` holds every cell with a jump vertex; no
    dominant level: all cells); the hanging nodes found from it are those of every node."""
    rng = np.random.default_rng(dim)
    m = Mesh.box([0] * dim, [1] * dim, [4] * dim).refine()
    m = m.refine(rng.random(m.num_cells) < frac)
    lv = m.levels.astype(np.int16)
    jump, rows = _touch.level_jumps(m.cells, m.num_nodes, lv)
    flat, rep = m.cells.ravel(), np.repeat(lv, m.cells.shape[1])
    hi = np.full(m.num_nodes, -1, np.int64)
    lo = np.full(m.num_nodes, 99, np.int64)
    np.maximum.at(hi, flat, rep)
    np.minimum.at(lo, flat, rep)
    assert jump.any() and np.array_equal(jump, hi > lo)
    assert (rows is not None) == sparse == ((m.num_cells - np.bincount(lv).max()) * _touch.SPARSE
                                            <= m.num_cells)
    if rows is not None:
        assert rows.size < m.num_cells and np.all(np.diff(rows) > 0)
        with_jump = np.flatnonzero(jump[m.cells].any(axis=1))
        assert np.isin(with_jump, rows).all()
    # every hanging node's parents are jump nodes, and the hanging nodes are found
    hp = m.hanging_parents
    assert m.num_hanging_nodes > 0 and jump[hp[hp >= 0]].all()


@pytest.mark.parametrize("dim", [2, 3])
def test_coarsening_and_closure_number_no_mesh(dim):
    """touch_max runs on the forest's node ids: global coarsening and the 2:1 closure number
    none of the meshes they pass through (multigrid() numbers the finest one on a worker
    meanwhile; a second numbering in the calling thread raced it)."""
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim).refine().refine()
    fresh = Mesh(m._forest, m._active)
    centre = m.points[m.cells].mean(axis=1)
    mask = np.linalg.norm(centre - 0.3, axis=1) < 0.25
    f = fresh.refine(mask)                                    # closure on an unnumbered mesh
    assert "_node_numbering" not in fresh.__dict__
    f2 = Mesh(f._forest, f._active)
    h = f2.hierarchy()
    assert len(h) >= 3
    assert all("_node_numbering" not in g.__dict__ for g in h)
    assert [g.num_cells for g in h] == sorted(g.num_cells for g in h)
