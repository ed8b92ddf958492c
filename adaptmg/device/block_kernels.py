r"""Device kernels for row-major ``(n, k)`` blocks of vectors (block multigrid, block Krylov).

A block ``X`` is C-ordered: the ``k`` values of one row are contiguous.  With ``G`` threads
per row (``G = min(32, 2^ceil(log2 k))``), lane ``j`` of a row handles the columns
``j, j + G, ...``; the row's CSR indices and values are read once per warp (a broadcast)
and ``X[col, j..j+G)`` is one coalesced load, so a product reads the matrix once for all
``k`` columns (cuSPARSE's SpMM takes column-major blocks only, and on the 9-entry rows of
2-D Q1 at 1.05M rows and ``k = 32`` it took 1.18 ms on an H200 against 0.44 ms here).

Kernels (one template, ``{T}`` = ``double`` or ``float``, int32 CSR indices):

* ``spmm``:     :math:`Y \leftarrow \alpha A X + \beta Y` (``Y`` not read when ``beta = 0``);
* ``residual``: :math:`R \leftarrow B - A X`;
* ``jacobi``:   :math:`Y \leftarrow X + \omega\, \mathrm{diag}(d) (B - A X)` (``Y`` distinct
  from ``X``: a damped Jacobi sweep out of place);
* ``coldot``:   per block of rows, :math:`s_j = \sum_i X_{ij} Y_{ij}` accumulated in double;
  the partial sums of the blocks are added by one small reduction (deterministic: no atomics),
  so :func:`column_dots` gives the same bits on every run;
* ``cg_update``: :math:`X \mathrel{+}= \alpha_j P,\ R \mathrel{-}= \alpha_j Q` per column and
  the column sums of the updated :math:`R^2` in the same pass (block CG).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend

__all__ = ["available", "cg_update", "scale_add", "csr_block", "column_dots", "column_dots_apply",
           "threads_per_row"]

_EPILOGUE = {
    "spmm": "Y[o] = (beta == ({T})0) ? alpha * acc : alpha * acc + beta * Y[o];",
    "residual": "Y[o] = B[o] - acc;",
    "jacobi": "Y[o] = X[o] + alpha * dinv[row] * (B[o] - acc);",
}

_ROW_SRC = r"""
extern "C" __global__ void adaptmg_block_{MODE}_{T}(
    const int n, const int k, const int G,
    const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ X, const {T}* __restrict__ B,
    const {T}* __restrict__ dinv, {T}* __restrict__ Y, const {T} alpha, const {T} beta)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / G;
    const int lane = (int)(t - row * G);
    if (row >= n) return;
    const int s = indptr[row], e = indptr[row + 1];
    for (int c = lane; c < k; c += G) {
        {T} acc = 0;
        int p = s;
        for (; p + 4 <= e; p += 4) {      // four independent gathers in flight per lane
            const {T} x0 = X[(long long)indices[p] * k + c];
            const {T} x1 = X[(long long)indices[p + 1] * k + c];
            const {T} x2 = X[(long long)indices[p + 2] * k + c];
            const {T} x3 = X[(long long)indices[p + 3] * k + c];
            acc += data[p] * x0;
            acc += data[p + 1] * x1;
            acc += data[p + 2] * x2;
            acc += data[p + 3] * x3;
        }
        for (; p < e; ++p) acc += data[p] * X[(long long)indices[p] * k + c];
        const long long o = row * k + c;
        {EPILOGUE}
    }
}
"""

_PARTIAL_SRC = r"""
// the column kernels' block partials (blockDim (32, 8)): the 8 row lanes' sums acc of
// column col (= blockIdx.y * 32 + threadIdx.x) into part[blockIdx.x, col]
__device__ __forceinline__ void adaptmg_block_partial(
    const double acc, const int col, const int k, double* __restrict__ part)
{
    __shared__ double s[8][33];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < k) {
        double v = 0.0;
        for (int i = 0; i < 8; ++i) v += s[i][threadIdx.x];
        part[(long long)blockIdx.x * k + col] = v;
    }
}
"""

_COLDOT_SRC = r"""
// blockDim (32, 8): threadIdx.x a column of the chunk blockIdx.y, threadIdx.y a row lane;
// part[blockIdx.x, col] = sum over this block's rows of X[row, col] * Y[row, col]
extern "C" __global__ void adaptmg_block_coldot_{T}(
    const long long n, const int k, const {T}* __restrict__ X, const {T}* __restrict__ Y,
    double* __restrict__ part)
{
    const int col = blockIdx.y * 32 + threadIdx.x;
    double acc = 0.0;
    if (col < k) {
        for (long long r = (long long)blockIdx.x * 8 + threadIdx.y; r < n;
             r += (long long)gridDim.x * 8) {
            const long long o = r * k + col;
            acc += (double)X[o] * (double)Y[o];
        }
    }
    adaptmg_block_partial(acc, col, k, part);
}
"""

_CG_SRC = r"""
// X += alpha_j P; R -= alpha_j Q (per column j) and, like coldot, the partial sums of R_j^2
// of the updated R per block of rows (blockDim (32, 8))
extern "C" __global__ void adaptmg_block_cg_update_{T}(
    const long long n, const int k, const {T}* __restrict__ alpha, {T}* __restrict__ X,
    const {T}* __restrict__ P, {T}* __restrict__ R, const {T}* __restrict__ Q,
    double* __restrict__ part)
{
    const int col = blockIdx.y * 32 + threadIdx.x;
    double acc = 0.0;
    if (col < k) {
        const {T} a = alpha[col];
        for (long long r = (long long)blockIdx.x * 8 + threadIdx.y; r < n;
             r += (long long)gridDim.x * 8) {
            const long long o = r * k + col;
            X[o] += a * P[o];
            const {T} v = R[o] - a * Q[o];
            R[o] = v;
            acc += (double)v * (double)v;
        }
    }
    adaptmg_block_partial(acc, col, k, part);
}
"""

_CTYPE = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}
_COLDOT_BLOCKS = 1024


def threads_per_row(k):
    """``G``: the threads that share one row of a ``k``-column block (a power of two <= 32)."""
    return int(min(32, 1 << max(0, int(k) - 1).bit_length()))


@functools.lru_cache(maxsize=None)
def _module(xp, ctype):
    code = "".join(_ROW_SRC.replace("{MODE}", m).replace("{EPILOGUE}", e)
                   for m, e in _EPILOGUE.items()) + _PARTIAL_SRC + _COLDOT_SRC + _CG_SRC
    return xp.RawModule(code=code.replace("{T}", ctype))


def available(A, X):
    """Whether the kernels take CSR ``A`` (device, float32/64, int32 indices) and the
    C-contiguous block ``X`` of ``A``'s dtype."""
    dt = np.dtype(A.dtype)
    return (dt in _CTYPE and X.ndim == 2 and X.dtype == dt and X.flags.c_contiguous
            and A.indices.dtype == np.int32 and A.indptr.dtype == np.int32)


def csr_block(mode, A, X, Y, alpha=1.0, beta=0.0, B=None, dinv=None):
    """One launch of the ``mode`` kernel (``"spmm"``, ``"residual"``, ``"jacobi"``; see the
    module docstring) on device CSR ``A`` and C-ordered blocks; returns ``Y``.  The caller
    checks :func:`available` for ``X``; ``B``, ``Y`` are C-ordered of the same dtype,
    ``dinv`` of length ``n``."""
    xp = get_backend("gpu").xp
    dt = np.dtype(A.dtype)
    ct = _CTYPE[dt]
    n, k = int(A.shape[0]), int(X.shape[1])
    if n == 0 or k == 0:
        return Y
    G = threads_per_row(k)
    threads = 256
    blocks = (n * G + threads - 1) // threads
    ker = _module(xp, ct).get_function(f"adaptmg_block_{mode}_{ct}")
    null = np.uintp(0)
    ker((blocks,), (threads,),
        (np.int32(n), np.int32(k), np.int32(G), A.indptr, A.indices, A.data, X,
         B if B is not None else null, dinv if dinv is not None else null, Y,
         dt.type(alpha), dt.type(beta)))
    return Y


def column_dots_apply(X, Y):
    """Whether :func:`column_dots` takes ``X``, ``Y``: device blocks (not NumPy), both
    C-contiguous of one float32/float64 dtype and shape."""
    return (not isinstance(X, np.ndarray) and getattr(X, "ndim", 0) == 2
            and np.dtype(X.dtype) in _CTYPE and X.dtype == Y.dtype and X.shape == Y.shape
            and X.flags.c_contiguous and Y.flags.c_contiguous)


def _column_pass(name, X, *args):
    """Launch the column-partial kernel ``name`` over the rows of ``X``; the column sums."""
    xp = get_backend("gpu").xp
    dt = np.dtype(X.dtype)
    n, k = int(X.shape[0]), int(X.shape[1])
    if n == 0:
        return xp.zeros(k, dt)
    gx = int(min(_COLDOT_BLOCKS, (n + 7) // 8))
    part = xp.empty((gx, k), np.float64)
    ct = _CTYPE[dt]
    ker = _module(xp, ct).get_function(f"adaptmg_block_{name}_{ct}")
    ker((gx, (k + 31) // 32), (32, 8), (np.int64(n), np.int32(k)) + args + (part,))
    return part.sum(axis=0).astype(dt, copy=False)


def column_dots(X, Y):
    """``s_j = sum_i X_ij Y_ij`` of two C-ordered device blocks of one float dtype (float64
    accumulation, the result in that dtype): one pass over both blocks."""
    return _column_pass("coldot", X, X, Y)


def scale_add(P, beta, Z):
    """``P <- Z + beta_j P`` per column (``beta`` of length ``k``), in place: one pass on the
    device (the ``axpby`` elementwise kernel broadcasting ``beta`` over the rows)."""
    if isinstance(P, np.ndarray):
        P *= beta
        P += Z
        return P
    from .elementwise import get_kernel
    one = np.ones((), P.dtype)[()]
    get_kernel("axpby", "gpu")(one, Z, beta.astype(P.dtype, copy=False), P)
    return P


def cg_update(alpha, X, P, R, Q):
    """The CG update of every column in one pass: ``X += alpha_j P``, ``R -= alpha_j Q``;
    returns ``||R_j||^2`` of the updated ``R`` (float64 accumulation).  C-ordered device
    blocks of one float dtype (:func:`column_dots_apply` for each pair), ``alpha`` of
    length ``k`` in that dtype."""
    return _column_pass("cg_update", X, alpha, X, P, R, Q)
