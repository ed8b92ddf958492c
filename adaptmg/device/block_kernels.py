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
  the column sums of the updated :math:`R^2` in the same pass (block CG);
* the block cycle's fused passes (each one launch instead of two or three passes over the
  fine blocks): ``jacobi2z`` two Jacobi sweeps from zero, ``rres`` the restricted residual
  :math:`R B - (RA) X`, ``cjacobi`` the coarse-grid correction with the first post-sweep.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend
from ..threads import map_rows

__all__ = ["available", "cg_update", "scale_add", "csr_block", "column_dots", "column_dots_apply",
           "threads_per_row", "jacobi2_zero", "restricted_residual", "corrected_jacobi",
           "host_blocks", "column_dots_host", "cg_update_host"]

_EPILOGUE = {
    "spmm": "Y[o] = (beta == ({T})0) ? alpha * acc : alpha * acc + beta * Y[o];",
    "residual": "Y[o] = B[o] - acc;",
    "jacobi": "Y[o] = X[o] + alpha * dinv[row] * (B[o] - acc);",
}

_VECTOR_SRC = r"""
// {T}2 arithmetic for the two-column kernels (a lane moves 16 or 8 bytes per load)
__device__ __forceinline__ {T}2 operator+(const {T}2 a, const {T}2 b) { {T}2 r; r.x = a.x + b.x; r.y = a.y + b.y; return r; }
__device__ __forceinline__ {T}2 operator-(const {T}2 a, const {T}2 b) { {T}2 r; r.x = a.x - b.x; r.y = a.y - b.y; return r; }
__device__ __forceinline__ {T}2 operator*(const {T} s, const {T}2 a) { {T}2 r; r.x = s * a.x; r.y = s * a.y; return r; }
__device__ __forceinline__ void operator+=({T}2& a, const {T}2 b) { a.x += b.x; a.y += b.y; }
__device__ __forceinline__ {T}2 adaptmg_vzero(const {T}2*) { {T}2 r; r.x = 0; r.y = 0; return r; }
__device__ __forceinline__ {T} adaptmg_vzero(const {T}*) { return 0; }
"""

_ROWDOT_SRC = r"""
// sum_p data[p] * s(col_p) * X[col_p, c] over the CSR row [s, e) (s(col) = 1, or
// scale * dinv[col] when dinv is given: the first Jacobi iterate from zero on the fly);
// X has k entries of type {V} a row (one or two columns each); four gathers in flight
__device__ __forceinline__ {V} adaptmg_block_rowdot_{V}(
    const int s, const int e, const int k, const int c, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {V}* __restrict__ X, const {T}* __restrict__ dinv,
    const {T} scale)
{
    {V} acc = adaptmg_vzero((const {V}*)0);
    int p = s;
    if (dinv == 0) {
        for (; p + 4 <= e; p += 4) {
            const {V} x0 = X[(long long)indices[p] * k + c];
            const {V} x1 = X[(long long)indices[p + 1] * k + c];
            const {V} x2 = X[(long long)indices[p + 2] * k + c];
            const {V} x3 = X[(long long)indices[p + 3] * k + c];
            acc += data[p] * x0;
            acc += data[p + 1] * x1;
            acc += data[p + 2] * x2;
            acc += data[p + 3] * x3;
        }
        for (; p < e; ++p) acc += data[p] * X[(long long)indices[p] * k + c];
    } else {
        for (; p + 4 <= e; p += 4) {
            const int j0 = indices[p], j1 = indices[p + 1], j2 = indices[p + 2], j3 = indices[p + 3];
            const {V} x0 = (scale * dinv[j0]) * X[(long long)j0 * k + c];
            const {V} x1 = (scale * dinv[j1]) * X[(long long)j1 * k + c];
            const {V} x2 = (scale * dinv[j2]) * X[(long long)j2 * k + c];
            const {V} x3 = (scale * dinv[j3]) * X[(long long)j3 * k + c];
            acc += data[p] * x0;
            acc += data[p + 1] * x1;
            acc += data[p + 2] * x2;
            acc += data[p + 3] * x3;
        }
        for (; p < e; ++p) {
            const int j = indices[p];
            acc += data[p] * ((scale * dinv[j]) * X[(long long)j * k + c]);
        }
    }
    return acc;
}
"""

_ROW_SRC = r"""
extern "C" __global__ void adaptmg_block_{MODE}_{V}(
    const int n, const int k, const int G,
    const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {V}* __restrict__ X, const {V}* __restrict__ B,
    const {T}* __restrict__ dinv, {V}* __restrict__ Y, const {T} alpha, const {T} beta)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / G;
    const int lane = (int)(t - row * G);
    if (row >= n) return;
    const int s = indptr[row], e = indptr[row + 1];
    for (int c = lane; c < k; c += G) {
        const {V} acc = adaptmg_block_rowdot_{V}(s, e, k, c, indices, data, X, 0, ({T})0);
        const long long o = row * k + c;
        {EPILOGUE}
    }
}
"""

_FUSED_SRC = r"""
// two damped Jacobi sweeps from zero in one pass: x1 = w D^-1 B (on the fly),
// Y = x1 + w D^-1 (B - A x1)
extern "C" __global__ void adaptmg_block_jacobi2z_{V}(
    const int n, const int k, const int G,
    const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {V}* __restrict__ B,
    const {T}* __restrict__ dinv, {V}* __restrict__ Y, const {T} omega)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / G;
    const int lane = (int)(t - row * G);
    if (row >= n) return;
    const int s = indptr[row], e = indptr[row + 1];
    const {T} d = dinv[row];
    for (int c = lane; c < k; c += G) {
        const {V} acc = adaptmg_block_rowdot_{V}(s, e, k, c, indices, data, B, dinv, omega);
        const long long o = row * k + c;
        const {V} x1 = (omega * d) * B[o];
        Y[o] = x1 + (omega * d) * (B[o] - acc);
    }
}

// the restricted residual: Y = R B - (R A) X over the coarse rows (R and RA share rows)
extern "C" __global__ void adaptmg_block_rres_{V}(
    const int n, const int k, const int G,
    const int* __restrict__ rp, const int* __restrict__ ri, const {T}* __restrict__ rd,
    const int* __restrict__ ap, const int* __restrict__ ai, const {T}* __restrict__ ad,
    const {V}* __restrict__ B, const {V}* __restrict__ X, {V}* __restrict__ Y)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / G;
    const int lane = (int)(t - row * G);
    if (row >= n) return;
    const int rs = rp[row], re = rp[row + 1], as = ap[row], ae = ap[row + 1];
    for (int c = lane; c < k; c += G) {
        const {V} rb = adaptmg_block_rowdot_{V}(rs, re, k, c, ri, rd, B, 0, ({T})0);
        const {V} rax = adaptmg_block_rowdot_{V}(as, ae, k, c, ai, ad, X, 0, ({T})0);
        Y[row * k + c] = rb - rax;
    }
}

// the coarse-grid correction and one damped Jacobi sweep: x' = X + P E,
// Y = x' + w D^-1 (B - A X - (A P) E)   (Y distinct from X)
extern "C" __global__ void adaptmg_block_cjacobi_{V}(
    const int n, const int k, const int G,
    const int* __restrict__ app, const int* __restrict__ api, const {T}* __restrict__ apd,
    const int* __restrict__ pp, const int* __restrict__ pi, const {T}* __restrict__ pd,
    const int* __restrict__ aap, const int* __restrict__ aai, const {T}* __restrict__ aad,
    const {V}* __restrict__ X, const {V}* __restrict__ E, const {V}* __restrict__ B,
    const {T}* __restrict__ dinv, {V}* __restrict__ Y, const {T} omega)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = t / G;
    const int lane = (int)(t - row * G);
    if (row >= n) return;
    const int s = aap[row], e = aap[row + 1];
    const int ps = pp[row], pe = pp[row + 1], qs = app[row], qe = app[row + 1];
    const {T} d = dinv[row];
    for (int c = lane; c < k; c += G) {
        const {V} ax = adaptmg_block_rowdot_{V}(s, e, k, c, aai, aad, X, 0, ({T})0);
        const {V} ape = adaptmg_block_rowdot_{V}(qs, qe, k, c, api, apd, E, 0, ({T})0);
        const {V} pe_ = adaptmg_block_rowdot_{V}(ps, pe, k, c, pi, pd, E, 0, ({T})0);
        const long long o = row * k + c;
        const {V} xc = X[o] + pe_;
        Y[o] = xc + (omega * d) * (B[o] - (ax + ape));
    }
}
"""


def _row_source(V):
    """The row kernels for blocks of ``{V}`` entries (``{T}``: one column a lane,
    ``{T}2``: two)."""
    code = _ROWDOT_SRC + "".join(_ROW_SRC.replace("{MODE}", m).replace("{EPILOGUE}", e)
                                 for m, e in _EPILOGUE.items()) + _FUSED_SRC
    return code.replace("{V}", V)


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
    code = (_VECTOR_SRC + _row_source("{T}") + _row_source("{T}2")
            + _PARTIAL_SRC + _COLDOT_SRC + _CG_SRC)
    return xp.RawModule(code=code.replace("{T}", ctype))


def available(A, X):
    """Whether the kernels take CSR ``A`` (device, float32/64, int32 indices) and the
    C-contiguous block ``X`` of ``A``'s dtype."""
    dt = np.dtype(A.dtype)
    return (dt in _CTYPE and X.ndim == 2 and X.dtype == dt and X.flags.c_contiguous
            and A.indices.dtype == np.int32 and A.indptr.dtype == np.int32)


def _address(a):
    """Device (or host) address of an array's first entry."""
    data = getattr(a, "data", None)
    return data.ptr if hasattr(data, "ptr") else a.ctypes.data


def _width(k, dt, blocks):
    """Columns per lane: 2 (``{T}2`` loads) when ``k`` is even and every block starts on
    a ``2 * itemsize`` boundary, else 1.  Measured on an H200, 2-D Q1 at 1.05M rows,
    ``k = 32``: SpMM 0.23 ms with two columns a lane against 0.37-0.42 ms with one."""
    step = 2 * np.dtype(dt).itemsize
    return 2 if k % 2 == 0 and all(_address(B) % step == 0 for B in blocks if B is not None) else 1


def _launch_rows(name, n, k, dt, args, blocks):
    """One launch of the row kernel ``name`` over ``n`` rows of ``k``-column ``blocks``
    (the block arguments among ``args``), two columns a lane where :func:`_width` allows."""
    xp = get_backend("gpu").xp
    if n == 0 or k == 0:
        return
    ct = _CTYPE[np.dtype(dt)]
    w = _width(k, dt, blocks)
    kv = k // w
    G = threads_per_row(kv)
    ker = _module(xp, ct).get_function(f"adaptmg_block_{name}_{ct}{'2' if w == 2 else ''}")
    ker(((n * G + 255) // 256,), (256,), (np.int32(n), np.int32(kv), np.int32(G)) + tuple(args))


def csr_block(mode, A, X, Y, alpha=1.0, beta=0.0, B=None, dinv=None):
    """One launch of the ``mode`` kernel (``"spmm"``, ``"residual"``, ``"jacobi"``; see the
    module docstring) on device CSR ``A`` and C-ordered blocks; returns ``Y``.  The caller
    checks :func:`available` for ``X``; ``B``, ``Y`` are C-ordered of the same dtype,
    ``dinv`` of length ``n``."""
    dt = np.dtype(A.dtype)
    null = np.uintp(0)
    _launch_rows(mode, int(A.shape[0]), int(X.shape[1]), dt,
                 (A.indptr, A.indices, A.data, X, B if B is not None else null,
                  dinv if dinv is not None else null, Y, dt.type(alpha), dt.type(beta)),
                 (X, B, Y))
    return Y


def jacobi2_zero(A, B, dinv, omega, Y):
    r"""Two damped Jacobi sweeps from zero in one pass over the rows:
    :math:`Y = x_1 + \omega D^{-1}(B - A x_1)`, :math:`x_1 = \omega D^{-1} B` formed on the
    fly from the gathered ``B`` and ``dinv`` (what ``jacobi_zero`` and one ``jacobi`` sweep
    write, without the pass that stores :math:`x_1`).  ``Y`` distinct from ``B``."""
    dt = np.dtype(A.dtype)
    _launch_rows("jacobi2z", int(A.shape[0]), int(B.shape[1]), dt,
                 (A.indptr, A.indices, A.data, B, dinv, Y, dt.type(omega)), (B, Y))
    return Y


def restricted_residual(R, RA, B, X, Y):
    r""":math:`Y = R B - (R A) X` over the coarse rows (``RA`` the product ``R A``): the
    restriction of the residual without the fine residual block (one pass over ``B`` and
    ``X`` instead of three plus the restriction's)."""
    _launch_rows("rres", int(R.shape[0]), int(B.shape[1]), R.dtype,
                 (R.indptr, R.indices, R.data, RA.indptr, RA.indices, RA.data, B, X, Y), (B, X, Y))
    return Y


def corrected_jacobi(A, AP, P, X, E, B, dinv, omega, Y):
    r"""The coarse-grid correction and one damped Jacobi sweep in one pass:
    :math:`Y = X + P E + \omega D^{-1}(B - A X - (A P) E)` (``AP`` the product ``A P``;
    ``Y`` distinct from ``X``)."""
    dt = np.dtype(A.dtype)
    _launch_rows("cjacobi", int(A.shape[0]), int(X.shape[1]), dt,
                 (AP.indptr, AP.indices, AP.data, P.indptr, P.indices, P.data,
                  A.indptr, A.indices, A.data, X, E, B, dinv, Y, dt.type(omega)), (X, E, B, Y))
    return Y


def column_dots_apply(X, Y):
    """Whether :func:`column_dots` takes ``X``, ``Y``: device blocks (not NumPy), both
    C-contiguous of one float32/float64 dtype and shape (:func:`host_blocks` for NumPy)."""
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


def host_blocks(*blocks):
    """Whether the host versions :func:`column_dots_host` / :func:`cg_update_host` take
    these blocks: NumPy, C-contiguous, of one float dtype and shape."""
    b0 = blocks[0]
    return all(isinstance(B, np.ndarray) and B.ndim == 2 and B.flags.c_contiguous
               and B.dtype == b0.dtype and B.shape == b0.shape for B in blocks) \
        and np.dtype(b0.dtype) in _CTYPE


def column_dots_host(X, Y):
    """:func:`column_dots` of NumPy blocks: the row chunks' ``einsum`` on the host threads
    (:func:`adaptmg.threads.map_rows`), summed."""
    parts = map_rows(lambda a, b: np.einsum("ij,ij->j", X[a:b], Y[a:b]), X.shape[0], X.size)
    return parts[0] if len(parts) == 1 else np.sum(parts, axis=0)


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


def cg_update_host(alpha, X, P, R, Q):
    """:func:`cg_update` of NumPy blocks, row chunk by row chunk on the host threads."""

    def run(a, b):
        t = alpha * P[a:b]
        X[a:b] += t
        np.multiply(Q[a:b], alpha, out=t)
        R[a:b] -= t
        return np.einsum("ij,ij->j", R[a:b], R[a:b])
    parts = map_rows(run, X.shape[0], X.size)
    return parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
