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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 3, 32, 45])
def test_row_kernels_match_scipy(dtype, k):
    import cupy as cp
    import cupyx.scipy.sparse as csp
    A, X, B, Y, dinv = _problem(1000, k, dtype)
    Ad = csp.csr_matrix(A)
    Xd, Bd, Yd, dd = (cp.asarray(v) for v in (X, B, Y, dinv))
    assert BK.available(Ad, Xd)
    AX = (A.astype(np.float64) @ X.astype(np.float64))
    scale = np.abs(A).astype(np.float64) @ np.abs(X).astype(np.float64) + np.abs(Y) + np.abs(B)
    tol = 64 * np.finfo(dtype).eps * scale
    want = {"spmm": 2.0 * AX - 0.5 * Y, "residual": B - AX,
            "jacobi": X + 0.7 * dinv[:, None] * (B - AX)}
    for mode, alpha, beta in (("spmm", 2.0, -0.5), ("residual", 1.0, 0.0), ("jacobi", 0.7, 0.0)):
        out = Yd.copy()
        BK.csr_block(mode, Ad, Xd, out, alpha, beta, B=Bd, dinv=dd)
        err = np.abs(cp.asnumpy(out) - want[mode])
        assert (err <= tol * (1 + 2 * (mode == "jacobi"))).all(), (mode, float(err.max()))
    out = cp.full_like(Yd, np.nan)            # beta = 0 must not read Y
    BK.csr_block("spmm", Ad, Xd, out, 1.0, 0.0)
    assert np.isfinite(cp.asnumpy(out)).all()


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
