"""Node-block matrices (sum_f S_f (x) C_f), their congruence on the node pattern, and the
backend-generic (host / cuSPARSE) constrained matrix, against the plain CSR path."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import Constraints, assemble
from adaptmg.backend import CPU
from adaptmg.fe import Space
from adaptmg.fe.constraints import _device_matrix
from adaptmg.fe.csr_ops import NodeBlockMatrix, congruence_map
from adaptmg.mesh import Mesh

EPS = np.finfo(float).eps


def _hanging_mesh(dim=2):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    c = m.points[m.cells].mean(axis=1)
    m = m.refine(np.linalg.norm(c, axis=1) < 0.4)
    return m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1) - 0.1, axis=1) < 0.2)


def _block_matrix(space1, c, F, seed):
    """Random fields on the mass pattern of ``space1`` with random sparse c x c coefficients."""
    rng = np.random.default_rng(seed)
    Ms = assemble.mass(space1)
    data = rng.standard_normal((Ms.nnz, F))
    coef = rng.standard_normal((F, c, c)) * (rng.random((F, c, c)) < 0.5)
    coef[0] += np.eye(c)
    return NodeBlockMatrix(Ms.indptr, Ms.indices, data, coef, space1.num_nodes)


def _reference(B):
    return sum(sp.kron(B.field(f), B.coef[f]) for f in range(B.coef.shape[0])).tocsr()


@pytest.mark.parametrize("seed", range(3))
def test_node_block_matrix_expands_to_the_kronecker_sum(seed):
    m = _hanging_mesh()
    B = _block_matrix(Space(m, 1), 3, 4, seed)
    A, ref = B.tocsr(), _reference(B)
    assert A.shape == ref.shape == B.shape
    assert A.has_sorted_indices and np.all(np.diff(A.indices)[np.diff(np.repeat(
        np.arange(A.shape[0]), np.diff(A.indptr))) == 0] > 0)
    scale = abs(ref).max()
    assert abs(A - ref).max() <= 8 * EPS * scale
    x = np.random.default_rng(seed).standard_normal(A.shape[0])
    np.testing.assert_allclose(B @ x, ref @ x, rtol=0, atol=64 * EPS * scale * np.abs(x).sum() / 10)
    np.testing.assert_allclose(B.diagonal(), ref.diagonal(), rtol=0, atol=8 * EPS * scale)


def test_congruence_map_is_the_scalar_congruence():
    m = _hanging_mesh(3)
    s = Space(m, 1)
    assert s.hanging_nodes.size > 0
    S = assemble.stiffness(s) + assemble.mass(s)
    rng = np.random.default_rng(0)
    keep = rng.random(s.num_nodes) < 0.8
    ip, ind, T = congruence_map(S.indptr, S.indices, s.H_nodes, keep, extra_diagonal=np.flatnonzero(~keep))
    got = sp.csr_matrix((T @ S.data, ind, ip), shape=S.shape)
    Z = sp.diags(keep * 1.0)
    ref = (Z @ s.H_nodes.T @ S @ s.H_nodes @ Z).tocsr()
    assert abs(got - ref).max() <= 16 * EPS * abs(ref).max()
    # the pattern: canonical, and the fixed nodes hold their (zero) diagonal
    got.has_sorted_indices = False
    got.sort_indices()
    np.testing.assert_array_equal(got.indices, ind)
    assert np.all(got.diagonal()[~keep] == 0)
    dpos = NodeBlockMatrix(ip, ind, np.zeros(ind.size), np.ones((1, 1, 1)), s.num_nodes).diagonal_positions()
    assert np.all(dpos[~keep] >= 0) and np.all(dpos[keep & ~s.mesh.is_hanging] >= 0)
    with pytest.raises(ValueError, match="keep"):
        congruence_map(S.indptr, S.indices, s.H_nodes, keep[:-1])


@pytest.mark.parametrize("dim", [2, 3])
def test_constraints_of_a_block_matrix_equal_the_csr_path(dim):
    m = _hanging_mesh(dim)
    c = 2
    B = _block_matrix(Space(m, 1), c, 3, dim)
    space = Space(m, 1, components=c)
    assert space.hanging_nodes.size > 0
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(B.tocsr())
    s0 = cons._scale
    K1 = cons.matrix(B)
    assert cons._scale == pytest.approx(s0, rel=1e-13)
    assert K1.has_sorted_indices and K1.format == "csr"
    assert abs(K1 - K0).max() <= 64 * EPS * abs(K0).max()
    # the projection alone, and a right-hand side through the block matrix
    P0 = cons.project(B.tocsr())
    assert abs(cons.project(B).tocsr() - P0).max() <= 64 * EPS * abs(P0).max()
    # Dirichlet on one component only: not node-uniform, the general path
    cons2 = Constraints(space, space.boundary_dofs(components=[0]))
    K2 = cons2.matrix(B)
    K3 = cons2.matrix(B.tocsr())
    assert abs(K2 - K3).max() == 0
    with pytest.raises(ValueError, match="shape"):
        Constraints(Space(m, 1, components=3), None).matrix(B)


def test_node_block_matrix_rejects_bad_shapes():
    with pytest.raises(ValueError, match="coef"):
        NodeBlockMatrix([0, 1], [0], np.ones((1, 1)), np.ones((1, 2, 3)), 1)
    with pytest.raises(ValueError, match="data"):
        NodeBlockMatrix([0, 1], [0], np.ones((1, 2)), np.ones((1, 2, 2)), 1)
    with pytest.raises(ValueError, match="indptr"):
        NodeBlockMatrix([0, 1, 1], [0], np.ones((1, 1)), np.ones((1, 2, 2)), 1)


def _backend_generic_case():
    m = _hanging_mesh(2)
    space = Space(m, 1, components=2)
    A = assemble.stiffness(space) + assemble.mass(space)
    return space, A


def test_backend_generic_matrix_on_the_host_equals_the_host_path():
    """The path written against (xp, sparse) -- two SpGEMMs, masks, COO -> CSR -- run with
    NumPy/SciPy gives the host path's matrix."""
    space, A = _backend_generic_case()
    cons = Constraints(space, space.boundary_dofs(components=[1]))
    K0 = cons.matrix(A)
    s0 = cons._scale
    K1 = _device_matrix(cons, A, CPU)
    assert cons._scale == pytest.approx(s0, rel=1e-13)
    assert abs(K1 - K0).max() <= 16 * EPS * abs(K0).max()
    assert K1.has_canonical_format


@pytest.mark.gpu
def test_constrained_matrix_on_the_device_equals_the_host():
    from adaptmg.backend import get_backend, to_host
    be = get_backend("gpu")
    space, A = _backend_generic_case()
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(A)
    Kd = cons.matrix(be.asmatrix(A))                 # cuSPARSE SpGEMM, stays on the device
    assert type(Kd).__module__.startswith("cupyx")
    K1 = to_host(Kd)
    assert abs(K1 - K0).max() <= 16 * EPS * abs(K0).max()
    P1 = to_host(cons.project(be.asmatrix(A)))
    P0 = cons.project(A)
    assert abs(P1 - P0).max() <= 16 * EPS * abs(P0).max()


@pytest.mark.parametrize("drop", [False, True])
def test_backend_expansion_equals_the_host_expansion(drop):
    """expand_node_blocks (the scatter written against xp, used on the device) run with NumPy
    gives tocsr()'s matrix: same pattern, same values (dropping only exact zeros)."""
    from adaptmg.fe.csr_ops import expand_node_blocks
    B = _block_matrix(Space(_hanging_mesh(), 1), 3, 4, 7)
    B.data[::5] = 0.0                                 # some exact zeros to drop
    ref = B.tocsr()
    got = expand_node_blocks(CPU, B.indptr, B.indices, B.data, B.coef, B.num_nodes, drop_zeros=drop)
    if drop:
        ref = ref.copy()
        ref.eliminate_zeros()
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.data, ref.data)


@pytest.mark.gpu
def test_block_constraints_on_the_device_equal_the_host():
    from adaptmg.backend import get_backend, to_host
    be = get_backend("gpu")
    m = _hanging_mesh(3)
    B = _block_matrix(Space(m, 1), 2, 3, 11)
    space = Space(m, 1, components=2)
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(B)
    Bd = NodeBlockMatrix(B.indptr, B.indices, B.data, B.coef, B.num_nodes, backend=be)
    Kd = cons.matrix(Bd)
    assert type(Kd).__module__.startswith("cupyx")
    K1 = to_host(Kd)
    np.testing.assert_array_equal(K1.indptr, K0.indptr)
    np.testing.assert_array_equal(K1.indices, K0.indices)
    assert np.abs(K1.data - K0.data).max() <= 16 * EPS * np.abs(K0.data).max()


def test_congruence_map_on_the_backend_equals_the_host_map():
    """congruence_map_on (the device's map: parents expanded, one sort) run with NumPy: the
    host map's pattern and the same T (values of every field to rounding)."""
    from adaptmg.fe.congruence import congruence_map_on
    m = _hanging_mesh(3)
    s = Space(m, 1)
    S = assemble.stiffness(s) + assemble.mass(s)
    rng = np.random.default_rng(3)
    keep = (rng.random(s.num_nodes) < 0.8) & ~m.is_hanging
    fixed = np.flatnonzero(~keep)
    ip0, ind0, T0 = congruence_map(S.indptr, S.indices, s.H_nodes, keep, extra_diagonal=fixed)
    ip1, ind1, T1 = congruence_map_on(CPU, S.indptr, S.indices, s.H_nodes, keep, extra_diagonal=fixed)
    np.testing.assert_array_equal(ip1, ip0)
    np.testing.assert_array_equal(ind1, ind0)
    assert T1.shape == T0.shape and abs(T1 - T0).max() <= EPS
    data = rng.standard_normal((S.nnz, 4))
    D0, D1 = T0 @ data, T1 @ data
    assert np.abs(D1 - D0).max() <= 8 * EPS * np.abs(D0).max()
    # no hanging nodes: only the fixed ones expand (to nothing), or nothing at all
    u = Space(Mesh.box([0.0] * 2, [1.0] * 2, [4, 3]), 1)
    U = assemble.mass(u)
    for kp in (np.arange(u.num_nodes) % 3 > 0, np.ones(u.num_nodes, dtype=bool)):
        xd = np.flatnonzero(~kp)
        a, b = congruence_map(U.indptr, U.indices, u.H_nodes, kp, xd), congruence_map_on(CPU, U.indptr, U.indices, u.H_nodes, kp, xd)
        np.testing.assert_array_equal(b[0], a[0])
        np.testing.assert_array_equal(b[1], a[1])
        assert abs(b[2] - a[2]).max() == 0
    with pytest.raises(ValueError, match="keep"):
        congruence_map_on(CPU, S.indptr, S.indices, s.H_nodes, keep[:-1])
    with pytest.raises(ValueError, match="Hn has shape"):
        congruence_map_on(CPU, S.indptr, S.indices, s.H_nodes[:-1], keep)


@pytest.mark.parametrize("dim", [2, 3])
def test_block_constraints_on_the_backend_equal_the_host_path(dim):
    """Constraints._matrix_blocks_on (what a GPU node-block matrix takes: map, T @ data, scale,
    expansion, all against xp) run with NumPy gives the host path's K and scale."""
    m = _hanging_mesh(dim)
    B = _block_matrix(Space(m, 1), 3, 4, 20 + dim)
    space = Space(m, 1, components=3)
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(B)
    s0 = cons.scale
    fn = cons.free.reshape(-1, 3)[:, 0]
    K1 = cons._matrix_blocks_on(CPU, B, fn, np.flatnonzero(~fn))
    assert cons.scale == pytest.approx(s0, rel=16 * EPS)
    np.testing.assert_array_equal(K1.indptr, K0.indptr)
    np.testing.assert_array_equal(K1.indices, K0.indices)
    assert np.abs(K1.data - K0.data).max() <= 16 * EPS * np.abs(K0.data).max()


@pytest.mark.gpu
def test_node_block_matrix_of_device_arrays():
    """A node-block matrix whose fields live on the device (elasticity(keep_on_device=True))
    stays there: constrained on the device, equal to the host matrix; its host views
    (tocsr, diagonal, @) are the host matrix's."""
    from adaptmg.backend import get_backend, to_host
    be = get_backend("gpu")
    m = _hanging_mesh(3)
    B = _block_matrix(Space(m, 1), 2, 3, 13)
    Bd = NodeBlockMatrix(be.asarray(B.indptr), be.asarray(B.indices), be.asarray(B.data), B.coef, B.num_nodes)
    assert Bd.on_device and Bd.backend.is_gpu
    space = Space(m, 1, components=2)
    cons = Constraints(space, space.boundary_dofs())
    K0 = cons.matrix(B)
    from adaptmg.backend import host_copies
    before = host_copies()
    Kd = cons.matrix(Bd)
    assert host_copies() == before                     # constrained without a copy to the host
    K1 = to_host(Kd)
    np.testing.assert_array_equal(K1.indices, K0.indices)
    assert np.abs(K1.data - K0.data).max() <= 16 * EPS * np.abs(K0.data).max()
    assert abs(Bd.tocsr() - B.tocsr()).max() == 0
    np.testing.assert_array_equal(Bd.diagonal(), B.diagonal())
    np.testing.assert_array_equal(to_host(Bd.diagonal_positions()), B.diagonal_positions())
