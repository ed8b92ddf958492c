"""touch_max's sparse path (few cells above the minimum: the 2:1 closure, global coarsening's
blocked families) equals the maximum over touch_graph, as its dense path does."""
import numpy as np
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
