"""Seed 003: node classes, hierarchical transform, prehandled matrix, condition numbers (Table 1),
and method M1 against a sparse direct solve in fp64 / fp32 / fp16."""
import numpy as np
import pytest
import scipy.sparse.linalg as sla

from adaptmg.backend import to_host
from adaptmg.prehandle import (RefinedMacroMesh, SchurSolver, condition_number, global_transform,
                               macro_square, macro_square_with_hole, prehandled_matrix)


@pytest.fixture(scope="module")
def square():
    return RefinedMacroMesh(*macro_square(4), 3)            # h0 = 1/4, h = 1/32


@pytest.fixture(scope="module")
def ring():
    return RefinedMacroMesh(*macro_square_with_hole(), 3)   # 16 distorted cells, 4 shapes


def test_node_classes_follow_eqs_6_to_8():
    for k, J in [(4, 2), (2, 3), (8, 2)]:
        rm = RefinedMacroMesh(*macro_square(k), J)
        h0, h = 1.0 / k, 1.0 / (k << J)
        assert rm.n_C == round((1 / h0 - 1) ** 2)
        assert rm.n_E == round(2 * (1 / h0 - 1) * (1 / h - 1 / h0))
        assert rm.n_I == round((1 / h - 1 / h0) ** 2)
        assert rm.num_groups == 1
        # the unknowns are the interior points, the Dirichlet ones come last
        on_bnd = np.isclose(rm.points, 0).any(axis=1) | np.isclose(rm.points, 1).any(axis=1)
        assert not on_bnd[:rm.N].any() and on_bnd[rm.N:].all()


def test_ring_mesh_has_several_shapes_and_coarse_nodes(ring):
    assert ring.num_groups == 4 and ring.n_C == 8
    assert sorted(len(c) for c in ring.group_cells) == [4, 4, 4, 4]


def test_transform_reproduces_coarse_linear_functions(ring):
    """S maps the coarse nodal values (hierarchical coefficients 0 on finer levels) of a linear
    function to its values at every fine node, also on distorted cells."""
    f = lambda p: 1.0 + 2.0 * p[:, 0] - 3.0 * p[:, 1]
    S = global_transform(ring)
    xt = np.zeros(len(ring.points))
    verts = ring.local_to_global[:, [0, ring.n, (ring.n + 1) * ring.n, (ring.n + 1) ** 2 - 1]].ravel()
    xt[verts] = f(ring.points[verts])
    assert np.abs(S @ xt - f(ring.points)).max() < 1e-13


def test_prehandled_structure_on_the_unit_square(square):
    """A_CC = I, A_CI = 0 (orthogonal macro cells) and unit diagonal (seed 003 §4.1)."""
    A_h, At, A, L = prehandled_matrix(square)
    c, e = square.n_C, square.n_C + square.n_E
    assert np.abs(A[:c, :c].toarray() - np.eye(c)).max() < 1e-13
    assert A[:c, e:].nnz == 0
    assert np.abs(A.diagonal() - 1).max() < 1e-13


def test_condition_numbers_of_table_1_blocks():
    """kappa(C_i) depends on h0/h only: Table 1 gives 6.6, 11.1, 16.9 for h0/h = 8, 16, 32."""
    for J, ref in [(3, 6.6), (4, 11.1), (5, 16.9)]:
        s = SchurSolver(RefinedMacroMesh(*macro_square(2), J), backend="cpu", keep_factors=True)
        kc = condition_number(s.C_blocks[0], inverse=s.C_inv[0], dense_max=1000)
        assert abs(kc - ref) <= 0.02 * ref, (J, kc, ref)


def test_prehandling_condition_number_grows_like_log_squared():
    """kappa(A_h) = 4 / lambda_min of the Q1 stencil grows like h^-2; kappa(A) only like (log 1/h)^2."""
    kh, ka, kt = [], [], []
    for J in (2, 3):
        rm = RefinedMacroMesh(*macro_square(4), J)
        A_h, At, A, _ = prehandled_matrix(rm)
        kh.append(condition_number(A_h))
        kt.append(condition_number(At))
        ka.append(condition_number(A))
        th = np.pi / (4 << J)
        c = np.cos(th)
        lmin = 8 / 3 - 4 / 3 * c - 4 / 3 * c * c
        cmax = np.cos(th * ((4 << J) - 1))
        lmax = 8 / 3 - 2 / 3 * (cmax + c) - 4 / 3 * cmax * c
        assert abs(kh[-1] - lmax / lmin) < 1e-8 * kh[-1]
        assert ka[-1] < kt[-1] < kh[-1]
    assert 3.5 < kh[1] / kh[0] < 4.1
    assert ka[1] / ka[0] < 2.0 and kh[1] > 5 * kt[1]      # (1 + log2(h0/h))^2: 9 -> 16


@pytest.mark.parametrize("mesh", ["square", "ring"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5), (np.float16, 1e-2)])
def test_m1_matches_sparse_direct_solve(mesh, dtype, tol, request):
    rm = request.getfixturevalue(mesh)
    A_h = prehandled_matrix(rm, cholesky=False)[0]
    rng = np.random.default_rng(1)
    B = rng.standard_normal((rm.N, 5))
    ref = sla.spsolve(A_h.tocsc(), B)
    for pre in (True, False):
        s = SchurSolver(rm, dtype=dtype, prehandle=pre, backend="cpu")
        X = s.solve(B)
        err = np.abs(X - ref).max(axis=0) / np.abs(ref).max(axis=0)
        assert err.max() < tol, (pre, err)
        x1 = s.solve(B[:, 2])                                    # one rhs = that column of many
        assert x1.shape == (rm.N,)
        assert np.abs(x1 - X[:, 2]).max() <= 64 * np.finfo(dtype).eps * np.abs(X[:, 2]).max()


def test_m1_prehandled_system(ring):
    """solve_prehandled solves the assembled prehandled matrix A = L^-1 S^T A_h S L^-T."""
    A = prehandled_matrix(ring)[2]
    b = np.random.default_rng(2).standard_normal(ring.N)
    x = SchurSolver(ring, backend="cpu").solve_prehandled(b)
    assert np.abs(A @ x - b).max() < 1e-12 * np.abs(b).max()


def test_fp32_error_bound(square):
    """Single precision: error of the prehandled solve <= a small multiple of kappa eps32."""
    A = prehandled_matrix(square)[2]
    b = np.random.default_rng(3).standard_normal((square.N, 4))
    x = SchurSolver(square, backend="cpu").solve_prehandled(b)
    x32 = SchurSolver(square, dtype=np.float32, backend="cpu").solve_prehandled(b.astype(np.float32))
    kappa = condition_number(A)
    rel = np.abs(x32 - x).max(axis=0) / np.abs(x).max(axis=0)
    assert rel.max() < kappa * np.finfo(np.float32).eps


def test_bad_input(square):
    s = SchurSolver(square, dtype=np.float32, backend="cpu")
    N = square.N
    with pytest.raises(ValueError, match=r"shape \(%d,\) or \(%d, k\)" % (N, N)):
        s.solve(np.ones(N + 1))
    with pytest.raises(ValueError, match="got \\(%d, 2, 2\\)" % N):
        s.solve(np.ones((N, 2, 2)))
    with pytest.raises(TypeError, match="real floating-point"):
        s.solve(np.ones(N, dtype=np.int64))
    with pytest.raises(TypeError, match="real floating-point"):
        s.solve(np.ones(N, dtype=complex))
    with pytest.raises(TypeError, match="solver's dtype float32"):
        s.solve_prehandled(np.ones(N))
    with pytest.raises(TypeError, match="numpy array"):
        s.solve([1.0] * N)
    with pytest.raises(TypeError, match="float64, float32 or float16"):
        SchurSolver(square, dtype=np.int32, backend="cpu")
    with pytest.raises(TypeError, match="RefinedMacroMesh"):
        SchurSolver(None, backend="cpu")
    pts, cells = macro_square(2)
    with pytest.raises(ValueError, match="lexicographic"):
        RefinedMacroMesh(pts, cells[:, [1, 0, 3, 2]], 2)
    with pytest.raises(ValueError, match="levels"):
        RefinedMacroMesh(pts, cells, 0)
    with pytest.raises(ValueError, match="shape \\(m, 4\\)"):
        RefinedMacroMesh(pts, cells[:, :3], 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5), (np.float16, 1e-2)])
def test_m1_on_the_gpu_matches_the_cpu(ring, dtype, tol):
    import cupy
    B = np.random.default_rng(4).standard_normal((ring.N, 3))
    ref = SchurSolver(ring, backend="cpu").solve(B)
    X = to_host(SchurSolver(ring, dtype=dtype, backend="gpu").solve(cupy.asarray(B)))
    assert np.abs(X - ref).max() < tol * np.abs(ref).max()
