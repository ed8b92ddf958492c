"""Fast host paths of the set-up: the paired (complex) element-entry sums of FieldSums,
congruence_map's merge of the unchanged entries, the row counts of mask_rows_cols, and the
identity block added inside expand_node_blocks -- each against the plain path it replaces."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import Constraints, assemble
from adaptmg.backend import CPU
from adaptmg.fe import Space
from adaptmg.fe.csr_ops import NodeBlockMatrix, _count_before, _merge_simple, congruence_map, expand_node_blocks
from adaptmg.fe.sparsity import FieldSums, Pattern
from adaptmg.mesh import Mesh


def _hanging_mesh(dim=2):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    c = m.points[m.cells].mean(axis=1)
    m = m.refine(np.linalg.norm(c, axis=1) < 0.4)
    return m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1) - 0.1, axis=1) < 0.2)


@pytest.mark.parametrize("dim,degree", [(2, 1), (2, 2), (3, 1)])
def test_field_sums_equal_add_at_bit_for_bit(dim, degree):
    """Paired fields (adjacent columns of one array, complex add.at), single columns and 1-D
    targets sum in entry order: the same values as np.add.at per field, bit for bit."""
    s = Space(_hanging_mesh(dim), degree)
    pat = Pattern(s.cell_dofs, s.cell_dofs, s.num_nodes, s.num_nodes)
    nc, nr, ncl = pat.cell_shape
    rng = np.random.default_rng(dim + degree)
    nf = 5
    K = rng.standard_normal((nf, nc, nr * ncl)) * 10.0 ** rng.integers(-8, 8, (nf, nc, 1))
    ref = np.zeros((pat.nnz, nf))
    for f in range(nf):
        for s0 in range(0, nc, 7):
            sl = slice(s0, min(s0 + 7, nc))
            np.add.at(ref[:, f], pat.cell_slice(sl), K[f, sl].reshape(-1))
    A = np.zeros((pat.nnz, 4))
    v = np.zeros(pat.nnz)
    targets = [(A, 0), (A, 1), (A, 3), v, (A, 2)]          # one pair, then singles
    sums = FieldSums(pat, targets, 7)
    for s0 in range(0, nc, 7):
        sl = slice(s0, min(s0 + 7, nc))
        sums.add(sl, K[:, sl])
    got = np.stack([A[:, 0], A[:, 1], A[:, 3], v, A[:, 2]], axis=1)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("frac", [0.0005, 0.3, 0.95])
def test_count_before_equals_searchsorted(frac):
    rng = np.random.default_rng(3)
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 9, 500))]).astype(np.int32)
    p = np.flatnonzero(rng.random(int(indptr[-1])) < frac)
    np.testing.assert_array_equal(_count_before(indptr, p), np.searchsorted(p, indptr))


@pytest.mark.parametrize("dim", [2, 3])
def test_congruence_map_merge_equals_the_full_pattern(dim, monkeypatch):
    """The merged pattern of the unchanged entries and the expanded pairs, and their positions,
    are those of one Pattern over all of them."""
    s = Space(_hanging_mesh(dim), 1)
    M = assemble.mass(s)
    n = s.num_nodes
    rng = np.random.default_rng(dim)
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(M.indptr))
    e_s = np.flatnonzero(rng.random(M.nnz) < 0.7)
    Pc = rng.integers(0, n, 300)
    Qc = rng.integers(0, n, 300)
    ip, ind, pos = _merge_simple(M.indptr, M.indices, e_s, Pc, Qc, n)
    full = Pattern(np.concatenate([row[e_s], Pc])[:, None], np.concatenate([M.indices[e_s], Qc])[:, None], n, n)
    np.testing.assert_array_equal(ip, full.indptr)
    np.testing.assert_array_equal(ind, full.indices)
    np.testing.assert_array_equal(pos, full.pos)
    # a non-canonical input pattern is refused (the caller builds the full Pattern)
    bad = M.indices.copy()
    bad[M.indptr[1] - 2:M.indptr[1]] = bad[M.indptr[1] - 2:M.indptr[1]][::-1]
    assert _merge_simple(M.indptr, bad, e_s, Pc, Qc, n) is None
    # and congruence_map's result does not depend on the path
    keep = rng.random(n) < 0.9
    fixed = np.flatnonzero(~keep)
    a = congruence_map(M.indptr, M.indices, s.H_nodes, keep, extra_diagonal=fixed)
    import adaptmg.fe.csr_ops as co
    monkeypatch.setattr(co, "_merge_simple", lambda *args: None)             # the full-Pattern path
    b = congruence_map(M.indptr, M.indices, s.H_nodes, keep, extra_diagonal=fixed)
    for x, y in zip(a[:2], b[:2]):
        np.testing.assert_array_equal(x, y)
        assert x.dtype == y.dtype
    for attr in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(a[2], attr), getattr(b[2], attr))


def _random_node_fields(m, c, F, seed):
    """The scalar space of mesh ``m``, its mass pattern, F random fields on it and F sparse
    random c x c coefficient blocks (the inputs of a NodeBlockMatrix), and the generator."""
    s1 = Space(m, 1)
    Ms = assemble.mass(s1)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((Ms.nnz, F))
    coef = rng.standard_normal((F, c, c)) * (rng.random((F, c, c)) < 0.5)
    return s1, Ms, data, coef, rng


@pytest.mark.parametrize("drop", [False, True])
def test_expand_node_blocks_diagonal_equals_an_identity_field(drop):
    c, F = 3, 4
    s1, Ms, data, coef, rng = _random_node_fields(_hanging_mesh(), c, F, 5)
    row = np.repeat(np.arange(s1.num_nodes), np.diff(Ms.indptr))
    diag = np.flatnonzero(Ms.indices == row)[::3]
    data[diag] = 0.0                                   # as for the fixed nodes of Constraints
    ident = np.zeros((Ms.nnz, 1))
    ident[diag] = 1.0
    D = 2.5 * np.eye(c)
    ref = expand_node_blocks(CPU, Ms.indptr, Ms.indices, np.hstack([data, ident]),
                             np.concatenate([coef, D[None]]), s1.num_nodes, drop_zeros=drop)
    got = expand_node_blocks(CPU, Ms.indptr, Ms.indices, data, coef, s1.num_nodes, drop_zeros=drop,
                             diagonal=(diag, D))
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.data, ref.data, rtol=4 * np.finfo(float).eps, atol=0)


class _HostAsDevice:
    """The host backend posing as a GPU one: runs Constraints' device branch with NumPy."""
    is_gpu = True
    name = "fake-gpu"
    xp = CPU.xp
    sparse = CPU.sparse

    def asarray(self, a):
        return CPU.asarray(a)


def test_block_constraints_device_branch_equals_the_host_branch():
    m = _hanging_mesh(3)
    c, F = 2, 3
    s1, Ms, data, coef, rng = _random_node_fields(m, c, F, 11)
    coef[0] += np.eye(c)
    space = Space(m, 1, components=c)
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(NodeBlockMatrix(Ms.indptr, Ms.indices, data, coef, s1.num_nodes))
    K1 = cons.matrix(NodeBlockMatrix(Ms.indptr, Ms.indices, data, coef, s1.num_nodes, backend=_HostAsDevice()))
    K1 = sp.csr_matrix(K1)
    np.testing.assert_array_equal(K1.indptr, K0.indptr)
    np.testing.assert_array_equal(K1.indices, K0.indices)
    np.testing.assert_allclose(K1.data, K0.data, rtol=4 * np.finfo(float).eps, atol=0)


def test_row_grouping_by_counting_sort_is_the_stable_argsort():
    """When the slot table cannot be used (a node at one local index of two cells), the
    rows are grouped by a counting sort: the permutation of the stable argsort."""
    from adaptmg.fe.sparsity import _row_grouped
    rng = np.random.default_rng(5)
    for nrows, shape in ((50, (400, 4)), (7, (30, 9)), (1000, (64, 8))):
        rc = rng.integers(0, nrows, shape)
        ids, by_slot = _row_grouped(rc, nrows)
        assert not by_slot
        np.testing.assert_array_equal(ids, np.argsort(rc.reshape(-1), kind="stable"))


def test_block_constraints_device_branch_with_per_component_dirichlet():
    """Dirichlet on one component only (the free mask differs inside a node): the device
    branch expands the fields on its backend (no host CSR of a device matrix) and gives
    the host branch's matrix."""
    m = _hanging_mesh(3)
    c, F = 2, 3
    s1, Ms, data, coef, rng = _random_node_fields(m, c, F, 12)
    coef[0] += np.eye(c)
    space = Space(m, 1, components=c)
    cons = Constraints(space, space.boundary_dofs(components=[0]))
    assert not np.array_equal(cons.free[0::c], cons.free[1::c])
    K0 = cons.matrix(NodeBlockMatrix(Ms.indptr, Ms.indices, data, coef, s1.num_nodes))
    K1 = cons.matrix(NodeBlockMatrix(Ms.indptr, Ms.indices, data, coef, s1.num_nodes, backend=_HostAsDevice()))
    np.testing.assert_array_equal(K1.indptr, K0.indptr)
    np.testing.assert_array_equal(K1.indices, K0.indices)
    np.testing.assert_allclose(K1.data, K0.data, rtol=4 * np.finfo(float).eps, atol=0)
