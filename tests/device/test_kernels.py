"""Fused kernels and SpMV plans: NumPy twins vs plain NumPy math (CPU), CuPy kernels vs twins (GPU)."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.device import kernels as K
from adaptmg.backend import get_backend, to_host


def _vecs(n, dtype, seed=0, k=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for _ in range(k)]


# reference math for every kernel: (args builder, expected outputs)
def _cases(dtype):
    n = 257
    x, d, dinv, b, Ax = _vecs(n, dtype)
    w, c1, c2 = 0.7, 0.3, 1.9
    idx = np.random.default_rng(1).permutation(n)[:100]       # some rows, no repeats, any order
    xi = x.copy()
    xi[idx] += w * dinv[:100] * (b[idx] - Ax[:100])
    cases = {
        "axpby": ((1.5, b, -0.5, x.copy()), [1.5 * b - 0.5 * x]),
        "jacobi_update": ((dinv, b, w, x.copy()), [x + w * dinv * b]),
        "jacobi_residual_update": ((dinv, b, Ax, w, x.copy()), [x + w * dinv * (b - Ax)]),
        "jacobi_zero": ((dinv, b, w, x.copy()), [w * dinv * b]),
        "chebyshev_start": ((dinv, b, Ax, c2, x.copy(), d.copy()),
                            [x + c2 * dinv * (b - Ax), c2 * dinv * (b - Ax)]),
        "chebyshev_start_zero": ((dinv, b, c2, x.copy(), d.copy()),
                                 [c2 * dinv * b, c2 * dinv * b]),
        "chebyshev_update": ((dinv, b, Ax, c1, c2, x.copy(), d.copy()),
                             [x + c1 * d + c2 * dinv * (b - Ax), c1 * d + c2 * dinv * (b - Ax)]),
        "add_cast": ((b.astype(np.float32), x.copy()), [x + b.astype(np.float32).astype(dtype)]),
        "indexed_jacobi_update": ((idx, dinv[:100], b, Ax[:100], w, x.copy()), [xi]),
        "geo_flux3": ((x, d, dinv, b, Ax, x, d, dinv, b, x.copy(), x.copy(), x.copy()),
                      [b * x + d * d + dinv * dinv, d * x + Ax * d + b * dinv,
                       dinv * x + b * d + x * dinv]),
        "geo_flux2": ((x, d, dinv, b, Ax, x.copy(), x.copy()),
                      [dinv * x + Ax * d, Ax * x + b * d]),
    }
    assert set(cases) == set(K.KERNEL_NAMES)
    return cases


def _outputs(name, args):
    nout = {"chebyshev_start": 2, "chebyshev_start_zero": 2, "chebyshev_update": 2,
            "geo_flux3": 3, "geo_flux2": 2}.get(name, 1)
    return list(args[-nout:])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", K.KERNEL_NAMES)
def test_numpy_twin_matches_plain_math(name, dtype):
    args, expected = _cases(dtype)[name]
    K.get_kernel(name, "cpu")(*args)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for got, exp in zip(_outputs(name, args), expected):
        np.testing.assert_allclose(got, exp, rtol=rtol, atol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", K.KERNEL_NAMES)
def test_cupy_kernel_matches_twin(name, dtype):
    be = get_backend("gpu")
    args, _ = _cases(dtype)[name]
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    K.get_kernel(name, "cpu")(*ref)
    dev = [be.asarray(a) if isinstance(a, np.ndarray) else np.dtype(dtype).type(a) for a in args]
    K.get_kernel(name, "gpu")(*dev)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for got, exp in zip(_outputs(name, dev), _outputs(name, ref)):
        np.testing.assert_allclose(to_host(got), exp, rtol=rtol, atol=rtol)
    assert K.get_kernel(name, "gpu").name == f"adaptmg_{name}"


def test_public_functions_dispatch(backend):
    xp = backend.xp
    x, dinv, b, Ax, d = (backend.asarray(v) for v in _vecs(100, np.float64, seed=3))
    x0 = to_host(x).copy()
    K.jacobi_residual_update(x, dinv, b, Ax, 0.5)
    exp = x0 + 0.5 * to_host(dinv) * (to_host(b) - to_host(Ax))
    np.testing.assert_allclose(to_host(x), exp, rtol=1e-13)
    y = xp.full(100, np.nan)                 # b == 0: y is not read (NaN does not propagate)
    K.axpby(2.0, b, 0.0, y)
    np.testing.assert_allclose(to_host(y), 2 * to_host(b))
    d0 = to_host(d).copy()
    K.chebyshev_update(x, d, dinv, b, Ax, 0.25, 2.0)
    dd = 0.25 * d0 + 2.0 * to_host(dinv) * (to_host(b) - to_host(Ax))
    np.testing.assert_allclose(to_host(d), dd, rtol=1e-13)


def test_get_kernel_unknown_name():
    with pytest.raises(ValueError, match="unknown kernel"):
        K.get_kernel("nope", "cpu")


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-1.0, 1.0), (2.5, -0.5), (0.0, 3.0), (0.5, 0.5)])
def test_spmv_plan(backend, alpha, beta):
    rng = np.random.default_rng(1)
    A = sp.random(60, 45, density=0.1, random_state=2, format="csr")
    x = rng.standard_normal(45)
    y = rng.standard_normal(60)
    exp = alpha * (A @ x) + beta * y
    Ad = backend.asmatrix(A)
    plan = K.make_spmv(Ad)
    yd = backend.asarray(y.copy())
    out = plan(backend.asarray(x), yd, alpha, beta)
    assert out is yd
    np.testing.assert_allclose(to_host(yd), exp, rtol=1e-12, atol=1e-12)
    # repeated calls reuse the cached descriptors and stay correct
    yd2 = backend.xp.zeros(60)
    plan(backend.asarray(x), yd2, 1.0, 0.0)
    np.testing.assert_allclose(to_host(yd2), A @ x, rtol=1e-12, atol=1e-12)


def test_generic_plan_for_operators():
    from scipy.sparse.linalg import aslinearoperator
    A = sp.random(30, 30, density=0.2, random_state=0, format="csr")
    op = aslinearoperator(A)
    plan = K.make_spmv(op)
    x = np.arange(30.0)
    y = np.ones(30)
    plan(x, y, -1.0, 1.0)
    np.testing.assert_allclose(y, 1.0 - A @ x, rtol=1e-13)


def test_dense_matvec(backend):
    rng = np.random.default_rng(0)
    M = rng.standard_normal((20, 20))
    b = rng.standard_normal(20)
    out = backend.xp.zeros(20)
    K.dense_matvec(backend.asarray(M), backend.asarray(b), out)
    np.testing.assert_allclose(to_host(out), M @ b, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", [(1089, 1089), (3, 2000), (40, 7)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dense_matvec_under_capture(n, m, dtype):
    """The captured GEMV (one block per row, four partial sums per thread, block reduction):
    every row, short and long rows, both dtypes, against float64 NumPy within the sum's
    rounding bound m eps sum_j |M_ij b_j|."""
    from adaptmg.backend import get_backend
    cp = get_backend("gpu").xp
    rng = np.random.default_rng(n + m)
    M, b = rng.standard_normal((n, m)).astype(dtype), rng.standard_normal(m).astype(dtype)
    Md, bd, out = cp.asarray(M), cp.asarray(b), cp.full(n, np.nan, dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        K.dense_matvec(Md, bd, out)
        graph = stream.end_capture()
    graph.launch()
    stream.synchronize()
    M64, b64 = M.astype(np.float64), b.astype(np.float64)
    bound = m * np.finfo(dtype).eps * (np.abs(M64) @ np.abs(b64))
    assert np.all(np.abs(cp.asnumpy(out) - M64 @ b64) <= bound)


@pytest.mark.parametrize("tpr", [None, 4, 32])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_csr_kernels(backend, dtype, tpr, monkeypatch):
    monkeypatch.setattr(K, "CSR_THREADS_PER_ROW", tpr)
    rng = np.random.default_rng(7)
    A = (sp.random(300, 300, density=0.03, random_state=3, format="csr")
         + sp.identity(300)).tocsr().astype(dtype)
    x, b, dinv = (rng.standard_normal(300).astype(dtype) for _ in range(3))
    Ad = backend.asmatrix(A)
    out = backend.xp.zeros(300, dtype)
    K.csr_jacobi_sweep(Ad, backend.asarray(x), backend.asarray(b), backend.asarray(dinv), 0.6, out)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(to_host(out), x + 0.6 * dinv * (b - A @ x), rtol=rtol, atol=rtol)
    K.csr_residual(Ad, backend.asarray(x), backend.asarray(b), out)
    np.testing.assert_allclose(to_host(out), b - A @ x, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("tpr", [None, 1, 4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_jacobi_zero_sweeps_kernel(backend, dtype, tpr, monkeypatch):
    """The first two Jacobi sweeps from zero in one launch against their formula
    (GPU kernel with 1 or several threads per row, and the NumPy twin)."""
    monkeypatch.setattr(K, "CSR_THREADS_PER_ROW", tpr)
    rng = np.random.default_rng(11)
    n = 300
    A = (sp.random(n, n, density=0.03, random_state=3, format="csr") + sp.identity(n)).tocsr().astype(dtype)
    A.indices, A.indptr = A.indices.astype(np.int32), A.indptr.astype(np.int32)
    b, dinv = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    Ad = backend.asmatrix(A)
    assert K.is_int32_csr(Ad) and not K.is_int32_csr(A.tocoo())
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    out = backend.xp.zeros(n, dtype)
    K.csr_jacobi_zero_sweeps(Ad, backend.asarray(b), backend.asarray(dinv), 0.6, out)
    x1 = 0.6 * dinv * b
    np.testing.assert_allclose(to_host(out), x1 + 0.6 * dinv * (b - A @ x1), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("tpr", [None, 1, 8])
@pytest.mark.parametrize("sweeps", [1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_smooth_restrict_kernel(backend, dtype, sweeps, tpr, monkeypatch):
    """Pre-smoothing from zero and S b in one launch, S = R (I - A G): y against the sweeps'
    formulas and S b against R (b - A y) (GPU kernel with 1 or several threads per row and
    fine/coarse blocks of one grid, and the NumPy twin); sweeps other than 1, 2 refused."""
    monkeypatch.setattr(K, "CSR_THREADS_PER_ROW", tpr)
    rng = np.random.default_rng(13)
    n, m = 300, 70
    A = (sp.random(n, n, density=0.03, random_state=4, format="csr") + sp.identity(n)).tocsr()
    R = sp.random(m, n, density=0.05, random_state=5, format="csr")
    b = rng.standard_normal(n)
    dinv = 1.0 / (1.0 + rng.random(n))
    S = K.smooth_restrict_matrix(A, R, dinv, 0.6, sweeps)
    y_ref = 0.6 * dinv * b
    if sweeps == 2:
        y_ref = y_ref + 0.6 * dinv * (b - A @ y_ref)
    np.testing.assert_allclose(S @ b, R @ (b - A @ y_ref), rtol=1e-12, atol=1e-12)
    Ad, Sd = backend.asmatrix(A.astype(dtype)), backend.asmatrix(S.astype(dtype))
    y, c = backend.xp.zeros(n, dtype), backend.xp.zeros(m, dtype)
    K.csr_smooth_restrict(Ad, backend.asarray(dinv.astype(dtype)), 0.6, sweeps, Sd,
                          backend.asarray(b.astype(dtype)), y, c)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(to_host(y), y_ref, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(to_host(c), S @ b, rtol=rtol, atol=10 * rtol)
    with pytest.raises(ValueError, match="sweeps"):
        K.smooth_restrict_matrix(A, R, dinv, 0.6, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("sweeps", [1, 2])
def test_smooth_restrict_matrix_on_device(sweeps):
    """S = R (I - A G) from device matrices (cuSPARSE SpGEMMs, no download) equals the host
    SciPy product to round-off (other summation order); matrices on two backends refused."""
    rng = np.random.default_rng(21)
    n, m = 400, 90
    A = (sp.random(n, n, density=0.03, random_state=6, format="csr") + sp.identity(n)).tocsr()
    R = sp.random(m, n, density=0.05, random_state=7, format="csr")
    dinv = 1.0 / (1.0 + rng.random(n))
    S = K.smooth_restrict_matrix(A, R, dinv, 0.6, sweeps)
    be = get_backend("gpu")
    Sd = K.smooth_restrict_matrix(be.asmatrix(A), be.asmatrix(R), be.asarray(dinv), 0.6, sweeps)
    assert type(Sd).__module__.startswith("cupyx")
    D = to_host(Sd).toarray() - S.toarray()
    assert np.abs(D).max() <= 64 * np.finfo(float).eps * max(np.abs(S.toarray()).max(), 1.0)
    with pytest.raises(TypeError, match="one backend"):
        K.smooth_restrict_matrix(be.asmatrix(A), R, dinv, 0.6, sweeps)


@pytest.mark.parametrize("tpr", [None, 1, 8])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_transfer_kernels(backend, dtype, tpr, monkeypatch):
    """R b - (R A) x over the coarse rows and x + P e + omega dinv (b - A x - (A P) e) over
    the fine rows, against the unfused formulas R (b - A x) and x' + omega dinv (b - A x'),
    x' = x + P e (GPU kernel with 1 or several threads per row, and the NumPy twin)."""
    monkeypatch.setattr(K, "CSR_THREADS_PER_ROW", tpr)
    rng = np.random.default_rng(12)
    n, nc = 300, 80
    A = (sp.random(n, n, density=0.03, random_state=5, format="csr") + 4 * sp.identity(n)).tocsr()
    P = sp.random(n, nc, density=0.05, random_state=6, format="csr")
    R = sp.random(nc, n, density=0.05, random_state=7, format="csr")
    mats = [M.astype(dtype).tocsr() for M in (A, P, R, R @ A, A @ P)]
    for M in mats:
        M.indices, M.indptr = M.indices.astype(np.int32), M.indptr.astype(np.int32)
    A, P, R, RA, AP = mats
    Ad, Pd, Rd, RAd, APd = (backend.asmatrix(M) for M in mats)
    x, b, dinv = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    e = rng.standard_normal(nc).astype(dtype)
    xd, bd, dd, ed = (backend.asarray(v) for v in (x, b, dinv, e))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    out_c = backend.xp.zeros(nc, dtype)
    K.csr_restricted_residual(Rd, RAd, bd, xd, out_c)
    ref = R @ (b - A @ x)
    np.testing.assert_allclose(to_host(out_c), ref, rtol=tol, atol=tol * np.abs(ref).max())
    out = backend.xp.zeros(n, dtype)
    K.csr_correct_jacobi(Ad, APd, Pd, xd, ed, bd, dd, 0.6, out)
    x1 = x + P @ e
    ref = x1 + 0.6 * dinv * (b - A @ x1)
    np.testing.assert_allclose(to_host(out), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_csr_chebyshev_step_twin_is_the_formula():
    """d <- c1 d + c2 dinv (b - A x); out <- x + d (NumPy twin; each entry one rounding chain)."""
    import scipy.sparse as sp
    rng = np.random.default_rng(3)
    A = (sp.random(60, 60, 0.2, format="csr", random_state=4) + 4 * sp.eye(60)).tocsr()
    x, b, d = rng.standard_normal((3, 60))
    dinv = 1.0 / A.diagonal()
    t = 0.3 * d + 0.7 * dinv * (b - A @ x)
    out = np.empty(60)
    K.csr_chebyshev_step(A, x, b, dinv, d, 0.3, 0.7, out)
    # the twin forms the same products in another grouping: a few eps of the terms' size
    scale = np.abs(0.3 * d).max() + np.abs(0.7 * dinv * (np.abs(b) + abs(A) @ np.abs(x))).max()
    assert np.abs(d - t).max() <= 8 * np.finfo(float).eps * scale
    assert np.abs(out - (x + t)).max() <= 8 * np.finfo(float).eps * (scale + np.abs(x).max())


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_csr_rows_add(backend, dtype, scaled):
    """out[rows] += alpha scale[rows] (C x) for a row-compressed block C (a distributed
    matrix's ghost rows) equals the dense formula; the other entries of out are untouched
    (GPU kernel and NumPy twin)."""
    rng = np.random.default_rng(4)
    n, ng = 500, 60
    G = sp.random(n, ng, density=0.02, random_state=9, format="csr").astype(dtype)
    rows = np.flatnonzero(np.diff(G.indptr)).astype(np.int32)
    gptr = np.concatenate([G.indptr[rows], G.indptr[-1:]]).astype(np.int32)
    xg = rng.standard_normal(ng).astype(dtype)
    out = rng.standard_normal(n).astype(dtype)
    scale = (1.0 + rng.random(n)).astype(dtype) if scaled else None
    want = out + (-0.7) * (scale if scaled else 1.0) * (G @ xg)
    be = backend
    dev = [be.asarray(a) for a in (gptr, G.indices.astype(np.int32), G.data, rows, xg, out)]
    K.csr_rows_add(*dev, -0.7, be.asarray(scale) if scaled else None)
    got = to_host(dev[-1])
    eps = np.finfo(dtype).eps
    assert 0 < rows.size < n
    assert np.abs(got - want).max() <= 32 * eps * np.abs(want).max()
    untouched = np.setdiff1d(np.arange(n), rows)
    assert np.array_equal(got[untouched], out[untouched])
