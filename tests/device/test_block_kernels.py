"""The row-major block kernels (adaptmg.device.block_kernels) against SciPy/NumPy."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.device import block_kernels as BK

EPS = np.finfo(np.float64).eps


def test_threads_per_row():
    assert [BK.threads_per_row(k) for k in (1, 2, 3, 5, 16, 17, 32, 33, 100)] == \
        [1, 2, 4, 8, 16, 32, 32, 32, 32]


def _problem(n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random(n, n, density=7.0 / n, random_state=seed, format="csr", dtype=np.float64)
    A = (A + sp.diags(rng.uniform(1, 2, n))).tocsr().astype(dtype)
    X, B, Y = (rng.standard_normal((n, k)).astype(dtype) for _ in range(3))
    dinv = rng.uniform(0.5, 1.0, n).astype(dtype)
    return A, X, B, Y, dinv


def _check_row_kernels(A, X, B, Y, dinv, to_csr, put, get):
    """spmm / residual / jacobi of csr_block against float64 SciPy, in units of eps of the
    dtype times the sizes of the terms; ``put``/``get`` move arrays to/from the backend."""
    dtype = X.dtype
    Ad = to_csr(A)
    Xd, Bd, Yd, dd = (put(v) for v in (X, B, Y, dinv))
    assert BK.available(Ad, Xd)
    AX = A.astype(np.float64) @ X.astype(np.float64)
    scale = np.abs(A).astype(np.float64) @ np.abs(X).astype(np.float64) + np.abs(Y) + np.abs(B)
    tol = 64 * np.finfo(dtype).eps * scale
    want = {"spmm": 2.0 * AX - 0.5 * Y, "residual": B - AX,
            "jacobi": X + 0.7 * dinv[:, None] * (B - AX)}
    for mode, alpha, beta in (("spmm", 2.0, -0.5), ("residual", 1.0, 0.0), ("jacobi", 0.7, 0.0)):
        out = Yd.copy()
        BK.csr_block(mode, Ad, Xd, out, alpha, beta, B=Bd, dinv=dd)
        err = np.abs(get(out) - want[mode])
        assert (err <= tol * (1 + 2 * (mode == "jacobi"))).all(), (mode, float(err.max()))
    out = put(np.full(Y.shape, np.nan, dtype))     # beta = 0 must not read Y
    BK.csr_block("spmm", Ad, Xd, out, 1.0, 0.0)
    assert np.isfinite(get(out)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 3, 32, 45])
def test_row_kernels_match_scipy(dtype, k):
    import cupy as cp
    import cupyx.scipy.sparse as csp
    A, X, B, Y, dinv = _problem(1000, k, dtype)
    _check_row_kernels(A, X, B, Y, dinv, csp.csr_matrix, cp.asarray, cp.asnumpy)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, k", [(5, 2), (100000, 32), (3001, 40)])
def test_column_dots(dtype, n, k):
    import cupy as cp
    rng = np.random.default_rng(1)
    X, Y = (rng.standard_normal((n, k)).astype(dtype) for _ in range(2))
    Xd, Yd = cp.asarray(X), cp.asarray(Y)
    assert BK.column_dots_apply(Xd, Yd) and not BK.column_dots_apply(X, Y)
    got = cp.asnumpy(BK.column_dots(Xd, Yd))
    want = np.einsum("ij,ij->j", X.astype(np.float64), Y.astype(np.float64))
    scale = np.einsum("ij,ij->j", np.abs(X), np.abs(Y)).astype(np.float64)
    assert got.dtype == dtype
    assert (np.abs(got - want) <= 8 * np.finfo(dtype).eps * scale + 4 * np.sqrt(n) * EPS * scale).all()
    again = cp.asnumpy(BK.column_dots(Xd, Yd))
    assert np.array_equal(got, again)        # no atomics: the same bits every run


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [3, 32, 40])
def test_cg_update_and_scale_add(dtype, k):
    import cupy as cp
    rng = np.random.default_rng(2)
    n = 20001
    X, P, R, Q = (rng.standard_normal((n, k)).astype(dtype) for _ in range(4))
    alpha = rng.uniform(0.1, 2, k).astype(dtype)
    d = [cp.asarray(v) for v in (X, P, R, Q)]
    r2 = cp.asnumpy(BK.cg_update(cp.asarray(alpha), *d))
    eps = np.finfo(dtype).eps
    Xw, Rw = X + alpha * P, R - alpha * Q
    assert np.allclose(cp.asnumpy(d[0]), Xw, rtol=0, atol=4 * eps * (np.abs(X) + np.abs(alpha * P)).max())
    assert np.allclose(cp.asnumpy(d[2]), Rw, rtol=0, atol=4 * eps * (np.abs(R) + np.abs(alpha * Q)).max())
    want = (cp.asnumpy(d[2]).astype(np.float64) ** 2).sum(0)
    # positive terms: another summation order moves a sum of n of them by <~ sqrt(n) eps
    assert np.allclose(r2, want, rtol=16 * eps + 16 * np.sqrt(n) * EPS, atol=0)
    Pd, Zd = cp.asarray(P), cp.asarray(Q)
    BK.scale_add(Pd, cp.asarray(alpha), Zd)
    assert np.allclose(cp.asnumpy(Pd), Q + alpha * P, rtol=0, atol=4 * eps * (np.abs(Q) + np.abs(alpha * P)).max())


def test_scale_add_host():
    P, Z = np.ones((4, 2)), np.full((4, 2), 2.0)
    BK.scale_add(P, np.array([3.0, -1.0]), Z)
    assert np.array_equal(P, np.array([[5.0, 1.0]] * 4))


# ----------------------------------------------------------------- the kernels on host threads
@pytest.fixture
def host_bk(host_gpu, monkeypatch):
    """block_kernels launching its own CUDA source on host threads (tests/host_cuda.py)."""
    monkeypatch.setattr(BK, "get_backend", lambda name="auto": host_gpu)
    BK._module.cache_clear()
    yield BK
    BK._module.cache_clear()


@pytest.mark.parametrize("dtype, k", [(np.float64, 3), (np.float64, 40), (np.float32, 32)])
def test_row_kernels_on_host_threads(host_bk, dtype, k):
    A, X, B, Y, dinv = _problem(300, k, dtype)

    def int32_csr(M):
        M = M.copy()
        M.indptr, M.indices = M.indptr.astype(np.int32), M.indices.astype(np.int32)
        return M

    _check_row_kernels(A, X, B, Y, dinv, int32_csr, np.asarray, np.asarray)


@pytest.mark.parametrize("n, k", [(5, 2), (3001, 40)])
def test_column_kernels_on_host_threads(host_bk, n, k):
    rng = np.random.default_rng(3)
    X, P, R, Q = (rng.standard_normal((n, k)) for _ in range(4))
    scale = np.einsum("ij,ij->j", np.abs(X), np.abs(P))
    got = BK.column_dots(X, P)
    assert np.allclose(got, np.einsum("ij,ij->j", X, P), rtol=0, atol=8 * np.sqrt(n) * EPS * scale.max())
    alpha = rng.uniform(0.1, 2, k)
    X0, R0 = X.copy(), R.copy()
    r2 = BK.cg_update(alpha, X, P, R, Q)
    assert np.allclose(X, X0 + alpha * P, rtol=0, atol=4 * EPS * np.abs(X0 + alpha * P).max())
    assert np.allclose(R, R0 - alpha * Q, rtol=0, atol=4 * EPS * np.abs(R0 - alpha * Q).max())
    assert np.allclose(r2, (R ** 2).sum(0), rtol=16 * np.sqrt(n) * EPS, atol=0)


# ----------------------------------------------------------------- the block cycle's fused passes
def _check_fused_kernels(k, dtype, to_csr, put, get):
    """jacobi2_zero, restricted_residual and corrected_jacobi against their unfused float64
    SciPy definitions, in units of eps of the dtype times the sizes of the terms."""
    rng = np.random.default_rng(4)
    n, nc = 160, 45
    A, X, B, _, dinv = _problem(n, k, dtype)
    P = sp.random(n, nc, density=3.0 / nc, random_state=5, format="csr").astype(dtype)
    R = P.T.tocsr()
    RA, AP = (R @ A).tocsr(), (A @ P).tocsr()
    E = rng.standard_normal((nc, k)).astype(dtype)
    f64 = [M.astype(np.float64) for M in (A, P, R, RA, AP)]
    A8, P8, R8, RA8, AP8 = f64
    X8, B8, E8, d8 = (v.astype(np.float64) for v in (X, B, E, dinv))
    eps = 64 * np.finfo(dtype).eps
    w = 0.7
    d = put(dinv)
    # two sweeps from zero
    x1 = w * d8[:, None] * B8
    want = x1 + w * d8[:, None] * (B8 - A8 @ x1)
    out = put(np.full((n, k), np.nan, dtype))
    BK.jacobi2_zero(to_csr(A), put(B), d, w, out)
    scale = abs(A8) @ abs(x1) + abs(B8) + abs(x1)
    assert (np.abs(get(out) - want) <= 3 * eps * scale).all()
    # restricted residual
    want = R8 @ B8 - RA8 @ X8
    out = put(np.full((nc, k), np.nan, dtype))
    BK.restricted_residual(to_csr(R), to_csr(RA), put(B), put(X), out)
    scale = abs(R8) @ abs(B8) + abs(RA8) @ abs(X8)
    assert (np.abs(get(out) - want) <= eps * scale).all()
    # correction with one post-sweep
    xc = X8 + P8 @ E8
    want = xc + w * d8[:, None] * (B8 - A8 @ xc)
    out = put(np.full((n, k), np.nan, dtype))
    BK.corrected_jacobi(to_csr(A), to_csr(AP), to_csr(P), put(X), put(E), put(B), d, w, out)
    scale = abs(xc) + abs(B8) + abs(A8) @ abs(X8) + abs(AP8) @ abs(E8) + abs(P8) @ abs(E8)
    assert (np.abs(get(out) - want) <= 3 * eps * scale).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 5, 32, 40])
def test_fused_kernels_match_scipy(dtype, k):
    import cupy as cp
    import cupyx.scipy.sparse as csp
    _check_fused_kernels(k, dtype, csp.csr_matrix, cp.asarray, cp.asnumpy)


@pytest.mark.parametrize("dtype, k", [(np.float64, 3), (np.float64, 40), (np.float32, 32)])
def test_fused_kernels_on_host_threads(host_bk, dtype, k):
    def int32_csr(M):
        M = M.copy()
        M.indptr, M.indices = M.indptr.astype(np.int32), M.indices.astype(np.int32)
        return M
    _check_fused_kernels(k, dtype, int32_csr, np.asarray, np.asarray)


def test_two_columns_a_lane_only_on_aligned_even_blocks():
    X = np.zeros((10, 4))
    flat = np.zeros(41)
    shifted = flat[1:].reshape(10, 4)                 # C-ordered, 8 bytes off a 16-byte line
    assert BK._width(4, np.float64, (X, X)) == 2
    assert BK._width(3, np.float64, (X[:, :3].copy(),)) == 1
    assert BK._width(4, np.float64, (X, shifted)) == (2 if shifted.ctypes.data % 16 == 0 else 1)
    assert BK._width(4, np.float64, (X, None)) == 2


@pytest.mark.parametrize("offset", [0, 1])
def test_row_kernels_on_host_threads_any_alignment(host_bk, offset):
    """An even-k block 8 bytes off a 16-byte line takes the one-column path, same results."""
    A, X, B, Y, dinv = _problem(120, 6, np.float64)

    def int32_csr(M):
        M = M.copy()
        M.indptr, M.indices = M.indptr.astype(np.int32), M.indices.astype(np.int32)
        return M

    def put(v):
        if v.ndim != 2:
            return v
        flat = np.zeros(v.size + 2)
        base = (-flat.ctypes.data // 8) % 2            # 16-byte aligned start, then the offset
        out = flat[base + offset: base + offset + v.size].reshape(v.shape)
        out[...] = v
        return out

    _check_row_kernels(A, X, B, Y, dinv, int32_csr, put, np.asarray)


# ----------------------------------------------------------------- host blocks on the host threads
@pytest.mark.parametrize("threads", ["1", "3"])
def test_host_block_work_on_threads(monkeypatch, threads):
    """The host SpMM, sweep, row scaling, column dots and CG update split over row chunks
    give the one-thread results (bit for bit where both sides run the same operations in
    the same order: a row's sum in csr_matvecs, elementwise updates; to a few eps where
    the grouping differs: column sums over chunks, the sweep against (X + B) + A X)."""
    import adaptmg.threads as TH
    from adaptmg.device.spmm import make_spmm, scale_rows
    monkeypatch.setenv("ADAPTMG_THREADS", threads)
    n, k = 9001, 32                                       # 288,032 entries: above the split size
    assert n * k >= TH.ROW_SPLIT_ENTRIES
    A, X, B, Y, dinv = _problem(n, k, np.float64)
    plan = make_spmm(A)
    assert (plan._chunks is None) == (threads == "1")
    Y1 = Y.copy()
    plan(X, Y1, 1.0, 1.0)
    Y2 = Y.copy()
    make_spmm(A)._vecs(n, n, k, A.indptr, A.indices, A.data, X.ravel(), Y2.ravel())
    assert np.array_equal(Y1, Y2)
    W = np.empty_like(X)
    plan.sweep(X, B, W)
    # the row's terms are added onto X + B one by one: another grouping than (X + B) + A X
    assert np.abs(W - (X + B + A @ X)).max() <= 8 * EPS * np.abs(W).max()
    S = np.empty_like(B)
    scale_rows(B, dinv[:, None], S)
    assert np.array_equal(S, dinv[:, None] * B)
    got = BK.column_dots_host(X, B)
    assert np.allclose(got, np.einsum("ij,ij->j", X, B), rtol=0, atol=64 * EPS * np.einsum("ij,ij->j", abs(X), abs(B)).max())
    alpha = np.linspace(0.5, 1.5, k)
    X0, R0, P, Q = X.copy(), B.copy(), Y.copy(), X[::-1].copy()
    R = R0.copy()
    r2 = BK.cg_update_host(alpha, X, P, R, Q)
    assert np.array_equal(X, X0 + alpha * P) and np.array_equal(R, R0 - alpha * Q)
    assert np.allclose(r2, (R ** 2).sum(0), rtol=64 * EPS, atol=0)
    assert BK.host_blocks(X, P, R, Q) and not BK.host_blocks(X, P[:, :3].copy())
