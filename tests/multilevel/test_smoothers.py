"""Smoothers x <- x + omega S (b - A x): formulas, symmetry, block structure, bad input."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.backend import to_host
from adaptmg.multilevel.smoothers import (SMOOTHERS, BlockJacobi, Chebyshev, GaussSeidel, Jacobi,
                                          PrePostSmoother, Richardson, estimate_lambda_max,
                                          make_smoother, normalize_smoother_name)


def lap1d(n):
    return sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tocsr()


def lap2d(m):
    K = lap1d(m)
    I = sp.identity(m)
    return (sp.kron(K, I) + sp.kron(I, K)).tocsr()


def _anorm(A, e):
    return float(np.sqrt(e @ (A @ e)))


def test_jacobi_sweep_formula(backend):
    A = lap2d(12)
    n = A.shape[0]
    rng = np.random.default_rng(0)
    x0, b = rng.standard_normal(n), rng.standard_normal(n)
    sm = Jacobi(A, omega=0.6, backend=backend)
    x = backend.asarray(x0.copy())
    sm.smooth(x, backend.asarray(b), sweeps=2)
    ref = x0.copy()
    for _ in range(2):
        ref = ref + 0.6 * (b - A @ ref) / A.diagonal()
    np.testing.assert_allclose(to_host(x), ref, rtol=1e-13, atol=1e-13)
    # zero_initial: same as starting from zeros, whatever x holds
    x = backend.asarray(rng.standard_normal(n))
    sm.smooth(x, backend.asarray(b), sweeps=3, zero_initial=True)
    z = backend.xp.zeros(n)
    sm.smooth(z, backend.asarray(b), sweeps=3)
    np.testing.assert_allclose(to_host(x), to_host(z), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kind", ["jacobi", "block_jacobi", "richardson", "chebyshev",
                                  "gauss_seidel", "block_gauss_seidel", "sor", "l1_gauss_seidel"])
def test_smoother_is_A_selfadjoint(backend, kind):
    """E = error propagation of a sweep; <A E x, y> == <A x, E y> (symmetric smoothing; the
    Gauss-Seidel names default to the symmetric sweep)."""
    A = lap2d(10)
    n = A.shape[0]
    kw = {"block_jacobi": {"block_size": 2}, "block_gauss_seidel": {"block_size": 2},
          "sor": {"omega": 1.4}, "l1_gauss_seidel": {"partition_rows": 30}}.get(kind, {})
    sm = make_smoother(kind, A, backend=backend, **kw)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(n), rng.standard_normal(n)

    def E(v):
        vd = backend.asarray(v.copy())
        sm.smooth(vd, backend.xp.zeros(n), sweeps=2)
        return to_host(vd)

    lhs = (A @ E(x)) @ y
    rhs = (A @ x) @ E(y)
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_block_jacobi_equals_jacobi_for_diagonal_blocks(backend):
    As = lap2d(8)
    B = sp.diags([2.0, 3.0])                      # diagonal 2x2 coupling
    A = sp.kron(As, B).tocsr()                    # DoF = node*2 + comp
    n = A.shape[0]
    rng = np.random.default_rng(2)
    b = backend.asarray(rng.standard_normal(n))
    x1 = backend.asarray(np.ones(n))
    x2 = backend.asarray(np.ones(n))
    Jacobi(A, omega=0.7, backend=backend).smooth(x1, b, 3)
    BlockJacobi(A, block_size=2, omega=0.7, backend=backend).smooth(x2, b, 3)
    np.testing.assert_allclose(to_host(x1), to_host(x2), rtol=1e-13, atol=1e-14)


def test_block_jacobi_inverts_node_blocks(backend):
    As = lap2d(6)
    B = np.array([[2.0, 1.0], [1.0, 3.0]])        # SPD coupling of 2 components
    A = sp.kron(As, sp.csr_matrix(B)).tocsr()
    sm = BlockJacobi(A, block_size=2, omega=1.0, backend=backend)
    S = sm._S_host.toarray()
    d = As.diagonal()
    expected = np.kron(np.diag(1.0 / d), np.linalg.inv(B))
    np.testing.assert_allclose(S, expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(S, S.T)         # symmetrised
    # smoothing reduces the A-norm of the error (zero rhs)
    rng = np.random.default_rng(3)
    e0 = rng.standard_normal(A.shape[0])
    e = backend.asarray(e0.copy())
    BlockJacobi(A, block_size=2, omega=0.6, backend=backend).smooth(e, backend.xp.zeros(A.shape[0]), 4)
    assert _anorm(A, to_host(e)) < 0.8 * _anorm(A, e0)


def test_block_jacobi_singular_block_names_node():
    A = sp.kron(lap1d(5), np.array([[1.0, 1.0], [1.0, 1.0]])).tolil()
    A = A.tocsr()
    with pytest.raises(ValueError, match="node 0"):
        BlockJacobi(A, block_size=2)
    A2 = sp.kron(lap1d(5), np.eye(2)).tolil()
    A2[6, 6] = 0.0
    A2[7, 7] = 0.0
    with pytest.raises(ValueError, match="node 3"):
        BlockJacobi(A2.tocsr(), block_size=2)
    with pytest.raises(ValueError, match="multiple of block_size"):
        BlockJacobi(lap1d(5), block_size=2)


def test_lambda_max_estimate():
    A = lap2d(20)
    lam = estimate_lambda_max(A)
    true = float(np.max(np.linalg.eigvalsh((A / A.diagonal()[:, None]).toarray())))
    assert 0.97 * true <= lam <= true * (1 + 1e-12)
    assert Chebyshev(A).lmax >= true


def test_chebyshev_reduces_error(backend):
    A = lap2d(24)
    n = A.shape[0]
    rng = np.random.default_rng(4)
    e0 = rng.standard_normal(n)
    zero = backend.xp.zeros(n)
    for deg in (1, 2, 3, 4):
        e = backend.asarray(e0.copy())
        Chebyshev(A, degree=deg, backend=backend).smooth(e, zero, 1)
        ratio = _anorm(A, to_host(e)) / _anorm(A, e0)
        assert ratio < 0.6, (deg, ratio)
    # the error bound 1/T_k(sigma) on [lmax/30, lmax] holds for the top of the spectrum
    w, V = np.linalg.eigh(A.toarray())           # lap2d has constant diagonal
    top = V[:, -1] / np.sqrt(w[-1])              # unit A-norm, highest eigenvector of A
    e = backend.asarray(top.copy())
    sm = Chebyshev(A, degree=3, backend=backend)
    sm.smooth(e, zero, 1)
    s = (1 + sm.lower) / (1 - sm.lower)
    bound = 1.0 / (4 * s ** 3 - 3 * s)
    assert _anorm(A, to_host(e)) <= bound * (1 + 1e-10)


def test_to_backend_and_dtype():
    A = lap2d(5)
    sm = Jacobi(A)
    assert sm.to("cpu") is sm
    s32 = sm.to("cpu", np.float32)
    assert s32.dinv.dtype == np.float32 and sm.dinv.dtype == np.float64
    x = np.zeros(25, np.float32)
    s32.smooth(x, np.ones(25, np.float32), 2)
    assert x.dtype == np.float32 and np.all(np.isfinite(x))
    c32 = Chebyshev(A).to("cpu", np.float32)
    assert c32._d.dtype == np.float32


def test_bad_input():
    A = lap2d(4)
    with pytest.raises(ValueError, match="square"):
        Jacobi(sp.random(4, 5, density=0.5, format="csr"))
    with pytest.raises(ValueError, match="omega"):
        Jacobi(A, omega=-1)
    with pytest.raises(ValueError, match="diagonal"):
        Jacobi(sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 2.0]])))
    with pytest.raises(ValueError, match="unknown smoother 'gauss_jordan'"):
        make_smoother("gauss_jordan", A)
    with pytest.raises(ValueError, match="scaling"):
        Chebyshev(A, scaling="diag")
    with pytest.raises(ValueError, match="lmax"):
        Chebyshev(A, lmax=-1.0)
    with pytest.raises(TypeError, match="adaptmg smoother"):
        PrePostSmoother(Jacobi(A), object())
    with pytest.raises(TypeError, match="smoother"):
        make_smoother(42, A)
    with pytest.raises(ValueError, match="degree"):
        Chebyshev(A, degree=0)
    sm = Jacobi(A)
    with pytest.raises(ValueError, match="sweeps"):
        sm.smooth(np.zeros(16), np.zeros(16), sweeps=-1)
    with pytest.raises(ValueError, match="shape"):
        sm.smooth(np.zeros(15), np.zeros(16))
    with pytest.raises(TypeError, match="float64"):
        sm.smooth(np.zeros(16, np.float32), np.zeros(16, np.float32))


@pytest.mark.parametrize("zero", [False, True])
def test_fused_jacobi_equals_two_launch_jacobi(backend, zero):
    A = lap2d(9)
    n = A.shape[0]
    rng = np.random.default_rng(8)
    x0, b = rng.standard_normal(n), backend.asarray(rng.standard_normal(n))
    plain = Jacobi(A, omega=0.7, backend=backend)
    fused = Jacobi(A, omega=0.7, backend=backend, fused=True)
    assert fused.can_fuse
    for sweeps in range(5):
        x1, x2 = backend.asarray(x0.copy()), backend.asarray(x0.copy())
        plain.smooth(x1, b, sweeps, zero_initial=zero)
        fused.smooth(x2, b, sweeps, zero_initial=zero)
        np.testing.assert_allclose(to_host(x2), to_host(x1), rtol=1e-13, atol=1e-14)


def test_richardson_and_unscaled_chebyshev(backend):
    """Richardson: x + omega (b - A x); Chebyshev(scaling='none'): the polynomial in A itself."""
    A = lap2d(9) * 3.0                               # diagonal 12: scaling matters
    n = A.shape[0]
    rng = np.random.default_rng(9)
    x0, b = rng.standard_normal(n), rng.standard_normal(n)
    x = backend.asarray(x0.copy())
    Richardson(A, omega=0.05, backend=backend).smooth(x, backend.asarray(b), 2)
    ref = x0.copy()
    for _ in range(2):
        ref = ref + 0.05 * (b - A @ ref)
    np.testing.assert_allclose(to_host(x), ref, rtol=1e-13, atol=1e-13)
    lam = float(np.linalg.eigvalsh(A.toarray())[-1])
    assert 4 / (3 * 1.05 * lam) * 0.95 <= Richardson(A).omega <= 4 / (3 * lam) * 1.05
    # degree 2, interval [a, b]: error polynomial (1 - t/r1)(1 - t/r2), r = Chebyshev nodes
    lo, hi = 0.1 * lam, 1.1 * lam
    sm = Chebyshev(A, degree=2, lower=lo / hi, lmax=hi, scaling="none", backend=backend)
    r1, r2 = 0.5 * (hi + lo) + 0.5 * (hi - lo) * np.cos(np.pi * np.array([0.25, 0.75]))
    e = backend.asarray(x0.copy())
    sm.smooth(e, backend.xp.zeros(n), 1)
    I = sp.identity(n)
    ref = (I - A / r1) @ ((I - A / r2) @ x0)
    np.testing.assert_allclose(to_host(e), ref, rtol=1e-11, atol=1e-11)
    assert "scaling='none'" in repr(sm)


def test_pre_post_smoother(backend):
    """smooth runs pre (x pre_sweeps), smooth_adjoint runs post (x post_sweeps); .to moves both."""
    A = lap2d(8)
    n = A.shape[0]
    b = backend.asarray(np.random.default_rng(10).standard_normal(n))
    pre, post = Jacobi(A, omega=0.6, backend=backend), GaussSeidel(A, sweep="forward", backend=backend)
    pp = PrePostSmoother(pre, post, pre_sweeps=2, post_sweeps=3)
    x, y = backend.xp.zeros(n), backend.xp.zeros(n)
    pp.smooth(x, b, 2)
    pre.smooth(y, b, 4)
    np.testing.assert_allclose(to_host(x), to_host(y), rtol=1e-14)
    x, y = backend.xp.zeros(n), backend.xp.zeros(n)
    pp.smooth_adjoint(x, b, 1)
    post.smooth(y, b, 3)
    np.testing.assert_allclose(to_host(x), to_host(y), rtol=1e-14)
    p32 = pp.to(backend, np.float32)
    assert p32.dtype == np.float32 and p32.pre.dtype == np.float32 and p32.post.dtype == np.float32
    assert pp.to(backend) is pp
    assert "pre=Jacobi(omega=0.6) x2" in repr(pp) and "post=GaussSeidel(sweep='forward'" in repr(pp)


def test_every_registry_name_normalises_to_itself():
    for name in SMOOTHERS:
        assert normalize_smoother_name(name) == name
        assert normalize_smoother_name(name.upper().replace("_", "-")) == name
