"""mesh/_join.cells_holding equals the sparse product it replaced in Mesh._hanging:
the entries of P @ N^T (P: sets of nodes, N: cell incidence) equal to the required count."""
import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from adaptmg import Mesh
from adaptmg.mesh._join import cells_holding


def _product(cells, rows, nodes, need, nrows, num_nodes):
    nc, nv = cells.shape
    N = sp.csr_matrix((np.ones(nc * nv, dtype=np.int32), cells.ravel(), np.arange(0, nc * nv + 1, nv)),
                      shape=(nc, num_nodes))
    P = sp.csr_matrix((np.ones(rows.size, dtype=np.int32), (rows, nodes)), shape=(nrows, num_nodes))
    C = (P @ N.T).tocoo()
    hit = C.data == need[C.row]
    r, c = C.row[hit], C.col[hit]
    o = np.lexsort((c, r))
    return r[o], c[o]


@settings(max_examples=15, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6))
def test_cells_holding_matches_the_sparse_product(dim, seed):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [3] * dim).refine(rng.random(3 ** dim) < 0.4)
    cells, n = m.cells, m.num_nodes
    # sets of 1..4 distinct nodes: half of them the vertices of a face / edge of a cell
    nrows = 60
    sizes = rng.integers(1, 5, nrows)
    sets = [rng.choice(n, k, replace=False) if i % 2 else cells[rng.integers(m.num_cells)][:k]
            for i, k in enumerate(sizes)]
    rows = np.repeat(np.arange(nrows), sizes)
    nodes = np.concatenate(sets)
    need = np.where(rng.random(nrows) < 0.8, sizes, sizes - 1)
    r, c = cells_holding(cells, rows, nodes, need, n)
    r0, c0 = _product(cells, rows, nodes, need, nrows, n)
    assert r.size > 0 and np.array_equal(r, r0) and np.array_equal(c, c0) and c.dtype == c0.dtype


def test_cells_holding_without_sets():
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    r, c = cells_holding(m.cells, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), m.num_nodes)
    assert r.size == c.size == 0 and c.dtype == np.int32
