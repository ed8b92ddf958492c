r"""Colour-by-colour Gauss-Seidel updates: one CUDA kernel per colour, and their NumPy twin.

For a colouring of the node graph of ``A`` (:mod:`adaptmg.multilevel.coloring`)
the update of colour ``k`` is

.. math::  x_C \leftarrow x_C + \omega\, D_{CC}^{-1} (b_C - A_{C,:}\, x),

``C`` the rows of the nodes of colour ``k`` and ``D_CC`` the diagonal
(``block_size = 1``) or the block diagonal of the ``c x c`` node blocks
(``block_size = c``; rows ``c p .. c p + c - 1`` belong to node ``p``).  Nodes of
one colour are not coupled, so every row of ``C`` reads only unknowns of other
colours (and its own node's): all of ``C`` may be updated at once, and the
result is exactly sequential Gauss-Seidel over ``C``.

:func:`make_colored_sweep` builds, once per matrix and backend, a *plan* whose
``color(k, x, b, omega)`` runs that update in place:

* GPU: one launch of the RawKernel ``adaptmg_gs_point_<type>`` (point) or
  ``adaptmg_gs_block<c>_<type>`` (blocks, ``c`` a compile-time constant) over the
  nodes of colour ``k`` (a preallocated int32 index array); by default the rows
  of each colour are kept as a CSR slice of their own (:data:`SLICED`), so the
  kernel reads the colour's entries contiguously.  ``tpr`` threads
  share a row (a node's rows) and reduce with warp shuffles, about one entry
  per lane (:func:`gs_threads_per_row`: a colour launch is latency-bound).  The
  residual is computed in registers and ``x`` is updated in place: no
  temporaries, no allocation, no host synchronisation, so a sweep can be
  recorded in a CUDA graph.
* CPU (the twin, also the reference of the tests): the rows of colour ``k``
  as a SciPy CSR row slice prepared at setup; ``r = b_C - A_C x`` is one
  compiled product and the update one vectorised NumPy expression.

GPU and CPU results differ by the order of the row sums only (round-off).
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, to_host
from .kernels import _ctype as ctype_of

__all__ = ["make_colored_sweep", "ColoredSweep", "MAX_GPU_BLOCK", "SLICED", "kernel_name",
           "gs_threads_per_row"]

#: largest block size with a device kernel (the node's residual lives in registers)
MAX_GPU_BLOCK = 16

_GS_SRC = r"""
// Gauss-Seidel update of the rows of one colour: x_i += omega dinv_i (b_i - A_i x).
// tpr threads per row (1 or a power of two <= 32) reduce with shuffles; every thread of
// the grid reaches the shuffles (loads are guarded, the shuffles are not).
// sliced != 0: (indptr, indices, data) hold only the rows of this colour, in order (row t of
// the slice is matrix row rows[t]): contiguous, coalesced reads of the colour's entries.
extern "C" __global__ void adaptmg_gs_point_{T}(
    const int m, const int tpr, const int sliced, const int* __restrict__ rows,
    const int* __restrict__ indptr, const int* __restrict__ indices, const {T}* __restrict__ data,
    const {T}* __restrict__ b, const {T}* __restrict__ dinv, const {T} omega, {T}* x)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int i = t < m ? rows[t] : 0;
    const int r = sliced ? t : i;
    {T} s = 0;
    if (t < m)
        for (int k = indptr[r] + lane; k < indptr[r + 1]; k += tpr) s += data[k] * x[indices[k]];
    for (int off = tpr / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, tpr);
    if (t < m && lane == 0) x[i] += omega * dinv[i] * (b[i] - s);
}
"""

_GS_BLOCK_SRC = r"""
// Block Gauss-Seidel update of the nodes of one colour: rows c p .. c p + c - 1 of node p,
// x_P += omega Binv_p (b_P - A_P x), Binv_p the inverse c x c diagonal block (row-major).
extern "C" __global__ void adaptmg_gs_block{C}_{T}(
    const int m, const int tpr, const int sliced, const int* __restrict__ nodes,
    const int* __restrict__ indptr, const int* __restrict__ indices, const {T}* __restrict__ data,
    const {T}* __restrict__ b, const {T}* __restrict__ binv, const {T} omega, {T}* x)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int p = t < m ? nodes[t] : 0;
    {T} r[{C}];
#pragma unroll
    for (int q = 0; q < {C}; ++q) {
        {T} s = 0;
        if (t < m) {
            const int i = sliced ? t * {C} + q : p * {C} + q;
            for (int k = indptr[i] + lane; k < indptr[i + 1]; k += tpr) s += data[k] * x[indices[k]];
        }
        for (int off = tpr / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, tpr);
        r[q] = s;
    }
    if (t < m && lane == 0) {
        const {T}* B = binv + (size_t)p * ({C} * {C});
#pragma unroll
        for (int q = 0; q < {C}; ++q) r[q] = b[p * {C} + q] - r[q];
        {T} u[{C}];
#pragma unroll
        for (int q = 0; q < {C}; ++q) {
            {T} acc = 0;
#pragma unroll
            for (int l = 0; l < {C}; ++l) acc += B[q * {C} + l] * r[l];
            u[q] = acc;
        }
#pragma unroll
        for (int q = 0; q < {C}; ++q) x[p * {C} + q] += omega * u[q];
    }
}
"""


def _ctype(dtype):
    return ctype_of(dtype, "Gauss-Seidel kernels")


def kernel_name(block_size, dtype):
    """Name of the device kernel for ``block_size`` and ``dtype`` (``adaptmg_gs_...``)."""
    ct = _ctype(dtype)
    return f"adaptmg_gs_point_{ct}" if block_size == 1 else f"adaptmg_gs_block{int(block_size)}_{ct}"


@functools.lru_cache(maxsize=None)
def _gs_module(xp, ctype, block_size):
    """The RawModule holding ``kernel_name(block_size, ctype)`` (built once per key)."""
    if block_size == 1:
        code = _GS_SRC.replace("{T}", ctype)
    else:
        code = _GS_BLOCK_SRC.replace("{T}", ctype).replace("{C}", str(int(block_size)))
    return xp.RawModule(code=code)


class ColoredSweep:
    """Plan of the colour updates of one matrix on one backend (see the module docstring).

    ``color(k, x, b, omega)`` updates the rows of colour ``k`` in place;
    ``sweep(x, b, omega, order)`` runs the colours in ``order`` (a sequence of
    colour indices).  Built by :func:`make_colored_sweep`.
    """

    def __init__(self, A, groups, block_size):
        self.A = A
        self.block_size = int(block_size)
        self.ncolors = len(groups)
        self.sizes = tuple(int(g.size) for g in groups)

    def color(self, k, x, b, omega):  # pragma: no cover - abstract
        raise NotImplementedError

    def sweep(self, x, b, omega, order):
        for k in order:
            self.color(k, x, b, omega)
        return x


class _CpuColoredSweep(ColoredSweep):
    """NumPy/SciPy twin: per colour the CSR row slice ``A[C, :]`` and ``D_CC^{-1}``.

    With ``be`` the GPU backend (``A`` given on the host) the same code runs on CuPy
    arrays and cupyx slices: the fallback for complex matrices, which the RawKernels
    do not cover (one SpMV and a few element-wise launches per colour)."""

    def __init__(self, A, groups, inv, block_size, be=None):
        super().__init__(A, groups, block_size)
        c = self.block_size
        self._xp = np if be is None else be.xp
        mv = (lambda M: M) if be is None else be.asmatrix
        av = (lambda v: v) if be is None else be.asarray
        self._rows, self._A, self._inv = [], [], []
        for g in groups:
            g = np.asarray(g, dtype=np.int64)
            rows = g if c == 1 else (g[:, None] * c + np.arange(c)[None, :]).ravel()
            self._rows.append(av(rows))
            self._A.append(mv(A[rows]))                 # CSR row slice, same dtype as A
            self._inv.append(av(inv[rows] if c == 1 else np.ascontiguousarray(inv[g])))

    def color(self, k, x, b, omega):
        rows = self._rows[k]
        r = b[rows] - self._A[k] @ x
        if self.block_size == 1:
            r *= self._inv[k]
        else:
            c = self.block_size
            r = self._xp.einsum("mkl,ml->mk", self._inv[k], r.reshape(-1, c)).reshape(-1)
        r *= omega
        x[rows] += r
        return x


#: GPU: keep a copy of each colour's rows as its own CSR slice (contiguous reads; one more
#: copy of the matrix entries in device memory) instead of indexing into ``A``
SLICED = True


def gs_threads_per_row(nnz_per_row: float) -> int:
    """Threads per row of the colour kernels: the power of two <= min(32, nnz_per_row).

    A colour holds 1/K of the rows (K = 7-15 colours for 3-D Q1), so a colour launch has few
    rows and each thread's loop over its row is a chain of dependent loads (``indices[k]``,
    then ``x[indices[k]]``): latency, not bandwidth, sets the time.  About one entry per
    lane shortens the chain to one or two loads; the fused full-matrix kernels' rule
    (:func:`~adaptmg.device.kernels.threads_per_row`, about five entries per lane) is
    tuned for launches over every row.  Measured on an H200, 3-D elasticity (edge 6,
    104,955 DoFs, 15 colours, V(2,2) symmetric block GS, CUDA graph): cycle 9.0 -> 2.5 ms,
    CG solve 83.9 -> 22.9 ms (block Jacobi: 0.23 ms and 4.3 ms).  Reading a node's c rows
    as one contiguous range in one strided loop instead of one loop per row measured
    the same (2.46 ms): what is left is launches and the load chain nodes -> indptr ->
    indices -> x of each small launch."""
    t = 1
    while t < 32 and 2 * t <= nnz_per_row:
        t *= 2
    return t


class _GpuColoredSweep(ColoredSweep):
    """CuPy: one RawKernel launch per colour over a preallocated int32 node index array."""

    _THREADS = 128

    def __init__(self, A, groups, inv, block_size, be, A_host=None, sliced=None):
        super().__init__(A, groups, block_size)
        c = self.block_size
        if c > MAX_GPU_BLOCK:
            raise ValueError(f"block Gauss-Seidel on the GPU supports block_size <= {MAX_GPU_BLOCK}, "
                             f"got {c}")
        if A.indices.dtype != np.int32 or A.indptr.dtype != np.int32:
            raise TypeError("the Gauss-Seidel kernels need int32 CSR indices")
        dt = np.dtype(A.dtype)
        self._t = dt.type
        self._fn = _gs_module(be.xp, _ctype(dt), c).get_function(kernel_name(c, dt))
        self._inv = be.asarray(np.ascontiguousarray(inv, dtype=dt).reshape(-1))
        nnz_row = A.nnz / max(A.shape[0], 1)
        self._tpr = gs_threads_per_row(nnz_row)
        tpr = self._tpr
        sliced = SLICED if sliced is None else bool(sliced)
        if sliced:
            A_host = to_host(A) if A_host is None else A_host
            A_host = sp.csr_matrix(A_host)
        self.sliced = sliced
        self._launch = []
        for g in groups:
            idx = be.asarray(np.asarray(g, dtype=np.int32))
            m = int(g.size)
            grid = ((m * tpr + self._THREADS - 1) // self._THREADS,)
            if sliced:
                rows = g if c == 1 else (np.asarray(g)[:, None] * c + np.arange(c)).ravel()
                S = A_host[rows]
                csr = (be.asarray(S.indptr.astype(np.int32)), be.asarray(S.indices.astype(np.int32)),
                       be.asarray(S.data.astype(dt)))
            else:
                csr = (A.indptr, A.indices, A.data)
            self._launch.append((grid, np.int32(m), idx, csr))
        self._tpr32 = np.int32(tpr)
        self._sliced32 = np.int32(1 if sliced else 0)

    def color(self, k, x, b, omega):
        grid, m, idx, (indptr, indices, data) = self._launch[k]
        self._fn(grid, (self._THREADS,), (m, self._tpr32, self._sliced32, idx, indptr, indices, data,
                                           b, self._inv, self._t(omega), x))
        return x


def make_colored_sweep(A, groups, inv, block_size=1, A_host=None, sliced=None):
    """Plan of the colour updates of ``A`` on ``A``'s backend.

    ``A``: CSR matrix on its backend (SciPy or cupyx, the smoother's dtype);
    ``groups``: host int arrays, the nodes of each colour; ``inv``: host
    ``D^{-1}`` -- the inverse diagonal (length ``n``) for ``block_size = 1``,
    else the inverse node blocks, shape ``(n / c, c, c)``.  GPU only:
    ``sliced`` (default :data:`SLICED`) stores each colour's rows as a CSR slice
    of their own, cut from ``A_host`` (the host copy of ``A``; copied from the
    device when not given).
    """
    c = int(block_size)
    n = A.shape[0]
    inv = np.asarray(to_host(inv))
    want = (n,) if c == 1 else (n // c, c, c)
    if inv.shape != want:
        raise ValueError(f"make_colored_sweep: inverse diagonal must have shape {want}, got {inv.shape}")
    be = backend_of(A)
    if be.is_gpu and np.dtype(A.dtype).kind == "c":       # no complex RawKernel: cupyx
        A_host = sp.csr_matrix(to_host(A) if A_host is None else A_host).astype(A.dtype)
        return _CpuColoredSweep(A_host, groups, inv.astype(A.dtype), c, be)
    if be.is_gpu:
        return _GpuColoredSweep(A, groups, inv, c, be, A_host=A_host, sliced=sliced)
    if not (sp.issparse(A) and A.format == "csr"):
        raise TypeError(f"make_colored_sweep: A must be a CSR matrix, got {type(A).__name__}")
    return _CpuColoredSweep(A, groups, inv.astype(A.dtype, copy=False), c)
