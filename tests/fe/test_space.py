"""Spaces and constraints on adaptive meshes: H weights, lumped mass, rigid-body modes, errors."""
import numpy as np
import pytest

from adaptmg import assemble
from adaptmg.fe import Constraints, Space
from adaptmg.mesh import Mesh


def adaptive(dim, seed=3, steps=2):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim)
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < 0.4)
    assert m.num_hanging_nodes > 0
    return m


def test_q2_hanging_weights_are_quadratic():
    m = Mesh.box([0, 0], [1, 1], [2, 1]).refine([0])
    s = Space(m, 2)
    H = s.H.tocsr()
    vals = sorted(np.round(H[s.hanging_nodes].data, 12))
    # two quarter points on the refined edge: weights 3/8, 3/4, -1/8 each
    assert vals == sorted([-0.125, 0.375, 0.75] * 2)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("k", [1, 2])
def test_lumped_mass_sums_to_volume(dim, k):
    s = Space(adaptive(dim), k)
    ml = assemble.lumped_mass(s)
    # folded onto regular DoFs the total is unchanged (rows of H sum to one)
    assert np.isclose(ml.sum(), 1.0, rtol=1e-12)
    assert np.isclose((s.H.T @ ml).sum(), 1.0, rtol=1e-12)


@pytest.mark.parametrize("dim", [2, 3])
def test_elasticity_rigid_modes_in_kernel_with_hanging_nodes(dim):
    s = Space(adaptive(dim), 1, dim)
    K = s.H.T @ assemble.elasticity(s, 8e4, 2e4) @ s.H
    x = s.points
    modes = [np.eye(dim)[a][None, :].repeat(len(x), 0) for a in range(dim)]
    pairs = [(0, 1)] if dim == 2 else [(0, 1), (1, 2), (0, 2)]
    for a, b in pairs:
        r = np.zeros_like(x)
        r[:, a], r[:, b] = -x[:, b], x[:, a]
        modes.append(r)
    scale = abs(K).max()
    for r in modes:
        assert np.linalg.norm(K @ r.ravel()) <= 1e-10 * scale * np.linalg.norm(r)
    # and a non-rigid field is not in the kernel
    stretch = np.zeros_like(x)
    stretch[:, 0] = x[:, 0]
    assert np.linalg.norm(K @ stretch.ravel()) > 1e-3 * scale


def test_boundary_dofs_components_and_predicate():
    s = Space(Mesh.box([0, 0], [1, 1], [2, 2]), 1, 2)
    left = s.boundary_dofs(ids=0)
    assert left.size == 2 * 3 and np.allclose(s.points[left // 2, 0], 0)
    only_y = s.boundary_dofs(ids=0, components=1)
    assert (only_y % 2 == 1).all() and only_y.size == 3
    top_half = s.boundary_nodes(where=lambda p: p[:, 1] > 0.5)
    assert np.all(s.points[top_half, 1] > 0.5) and top_half.size == 3   # y = 1 row only
    with pytest.raises(ValueError, match="components"):
        s.boundary_dofs(components=2)


def test_constraints_bad_input():
    s = Space(Mesh.box([0, 0], [1, 1], [2, 2]), 1)
    with pytest.raises(TypeError, match="Space"):
        Constraints("space")
    with pytest.raises(ValueError, match=r"\[0, 9\)"):
        Constraints(s, [0, 12])
    with pytest.raises(ValueError, match="integer"):
        Constraints(s, np.array([0.5]))
    c = Constraints(s, s.boundary_dofs(), 1.0)
    with pytest.raises(ValueError, match="shape"):
        c.matrix(np.eye(4))
    with pytest.raises(ValueError, match=r"right-hand side has shape"):
        c.rhs(np.ones(3), assemble.stiffness(s))
    with pytest.raises(ValueError, match="NaN"):
        Constraints(s, s.boundary_dofs(), lambda x: np.full(len(x), np.nan))


def test_space_bad_input():
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="degree"):
        Space(m, 3)
    with pytest.raises(ValueError, match="components"):
        Space(m, 1, 0)
    with pytest.raises(TypeError, match="Mesh"):
        Space(np.zeros((3, 2)), 1)


def _coo_constraint_matrix(n, hanging, cols, W):
    """The COO -> CSR construction of H with chain substitution (the reference)."""
    import scipy.sparse as sps
    regular = np.ones(n, dtype=bool)
    regular[hanging] = False
    r = np.flatnonzero(regular)
    nz = W != 0
    H = sps.csr_matrix((np.concatenate([np.ones(r.size), W[nz]]),
                        (np.concatenate([r, np.repeat(hanging, nz.sum(1))]),
                         np.concatenate([r, cols[nz]]))), shape=(n, n))
    for _ in range(8):
        if not H[:, hanging].count_nonzero():
            break
        H = (H @ H).tocsr()
    H.eliminate_zeros()
    H.sort_indices()
    return H


@pytest.mark.parametrize("dim,degree", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_direct_constraint_csr_equals_the_coo_construction(dim, degree):
    """H written straight as canonical CSR (no chains) is the COO construction's matrix,
    entry for entry, on random 2:1 meshes; a chain (a weight on a hanging column) still
    goes through the substitution."""
    from adaptmg.fe.space import constraint_matrix
    rng = np.random.default_rng(5 + dim + degree)
    m = Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim)
    for _ in range(3 if dim == 3 else 4):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    s = Space(m, degree)
    hn, cols, W = s._hanging_rows
    assert hn.size
    A, B = constraint_matrix(s.num_nodes, hn, cols, W), _coo_constraint_matrix(s.num_nodes, hn, cols, W)
    assert A.has_canonical_format
    assert np.array_equal(A.indptr, B.indptr) and np.array_equal(A.indices, B.indices)
    assert np.array_equal(A.data, B.data)
    # hanging rows given out of order, one of them with no nonzero weight (an empty row),
    # one at the last index: the same matrix as the COO construction
    perm = rng.permutation(hn.size)
    W2 = W.copy()
    W2[perm[0]] = 0.0
    for h, c, w in ((hn[perm], cols[perm], W2[perm]), (np.append(hn, s.num_nodes), None, None)):
        if c is None:                              # one more node, hanging on node 0 alone
            n2 = s.num_nodes + 1
            c = np.vstack([cols, np.zeros((1, cols.shape[1]), dtype=cols.dtype)])
            w = np.vstack([W, np.eye(1, W.shape[1])])
        else:
            n2 = s.num_nodes
        A, B = constraint_matrix(n2, h, c, w), _coo_constraint_matrix(n2, h, c, w)
        assert np.array_equal(A.indptr, B.indptr) and np.array_equal(A.indices, B.indices)
        assert np.array_equal(A.data, B.data)
    # a chain: node 0 hangs on node 1, which hangs on nodes 2 and 3
    C = constraint_matrix(4, np.array([0, 1]), np.array([[1, 2], [2, 3]]), np.array([[1.0, 0.0], [0.5, 0.5]]))
    assert np.allclose(C.toarray(), [[0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5], [0, 0, 1, 0], [0, 0, 0, 1]])
