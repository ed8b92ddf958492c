r"""Fused CUDA element kernel of the collocated 3-D spectral operator (BP3/BK3 shape).

For a GLL-collocated space (``B = I``) the cell operator of
:class:`~adaptmg.spectral.operators.SpectralOperator` at the n^3 nodes of a cell,
``n = k + 1`` and the local index ``q = (c n + b) n + a`` (x = a fastest), is

.. math::

    y_{cba} = c_k \Big[ \sum_m D_{ma} f^0_{cbm} + \sum_m D_{mb} f^1_{cma}
              + \sum_m D_{mc} f^2_{mba} \Big] + c_m\, (w \det J)_{cba}\, u_{cba},

    f^i = \sum_j G_{ij} g^j, \qquad
    g^0_{cba} = \sum_m D_{am} u_{cbm},\;
    g^1_{cba} = \sum_m D_{bm} u_{cma},\;
    g^2_{cba} = \sum_m D_{cm} u_{mba},

with ``u = x[cell_dofs]``, D the 1-D GLL derivative matrix (``SpectralOperator.DB``) and
G the stored symmetric factors (6 numbers a node, order 00, 11, 22, 01, 02, 12, laid out
(6, cells, n^3)).  One launch of ``adaptmg_spectral_ax3d_n<n>_<T>_<I>`` computes the
element outputs ``y`` (cells, n^3) in one pass: a thread block holds EPB elements, one
thread per node column (a, b) looping over c; u is gathered with ``cell_dofs`` inside the
kernel into shared memory (and the thread's own column into registers), the x and y
derivatives read shared memory, the z derivative and the z part of the transpose stay in
registers, the fluxes f^0, f^1 go through shared memory.  Memory traffic a node: the
gather index, x, 6 G (and w det J when c_m != 0) read, y written once -- no (cells, n^3)
temporaries.  The global sum (deterministic either way) is ``adaptmg_spectral_scatter_<T>``
(``SpectralOperator``'s default ``scatter="kernel"``): the sums of the ``scatter_matrix``
SpMV in the same order, a thread a DoF, without reading the matrix's values (ones); or that
SpMV itself (``scatter="spmv"``).

Sources are templates over T (double/float), I (the index type of ``cell_dofs``) and N,
compiled once per key by :func:`_element_kernel` (CuPy ``RawModule``); ``xp`` is
``get_backend("gpu").xp`` -- this module never imports CuPy.  :func:`kernel_source` is
also what the host tests compile (nvcc syntax/shared-memory check, a C++ thread emulation).
"""
from __future__ import annotations

import functools

import numpy as np

from ..device.kernels import _ctype

__all__ = ["kernel_source", "elements_per_block", "fused_cell_apply", "scatter_source", "scatter_sum", "render_source",
           "items_per_block",
           "SMEM_BUDGET"]

#: static shared memory a block may use (bytes); the hard limit is 48 KB
SMEM_BUDGET = 40 * 1024

_INDEX_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}

_SRC = r"""
extern "C" __global__ void __launch_bounds__({N} * {N} * {EPB})
{NAME}(const long long ncells, const int gather, const {I}* __restrict__ dofs,
       const {T}* __restrict__ x, const {T}* __restrict__ G, const {T}* __restrict__ wdet,
       const {T}* __restrict__ Dg, const {T} cm, const {T} ck, {T}* __restrict__ y)
{
    // thread (a, b, e) = (threadIdx.x, .y, .z): node column (a, b) of element e of the block
    __shared__ {T} sD[{N}][{N}];
    __shared__ {T} su[{EPB}][{N}][{N}][{N}];
    __shared__ {T} sf0[{EPB}][{N}][{N}][{N}];
    __shared__ {T} sf1[{EPB}][{N}][{N}][{N}];
    const int a = threadIdx.x, b = threadIdx.y, e = threadIdx.z;
    for (int t = (e * {N} + b) * {N} + a; t < {N} * {N}; t += {N} * {N} * {EPB})
        sD[t / {N}][t % {N}] = Dg[t];
    const long long cell = (long long)blockIdx.x * {EPB} + e;
    const bool active = cell < ncells;
    const long long base = cell * ({N} * {N} * {N}), nq = ncells * ({N} * {N} * {N});
    {T} ru[{N}], rf2[{N}];
#pragma unroll
    for (int c = 0; c < {N}; ++c) {               // gather u, no temporary in global memory
        const long long p = base + (c * {N} + b) * {N} + a;
        ru[c] = active ? x[gather ? (long long)dofs[p] : p] : ({T})0;
        su[e][c][b][a] = ru[c];
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < {N}; ++c) {               // reference gradient, fluxes f = G g
        {T} g0 = 0, g1 = 0, g2 = 0;
#pragma unroll
        for (int m = 0; m < {N}; ++m) {
            g0 += sD[a][m] * su[e][c][b][m];
            g1 += sD[b][m] * su[e][c][m][a];
            g2 += sD[c][m] * ru[m];
        }
        {T} f0 = 0, f1 = 0, f2 = 0;
        if (active && ck != ({T})0) {
            const long long p = base + (c * {N} + b) * {N} + a;
            const {T} G00 = G[p], G11 = G[nq + p], G22 = G[2 * nq + p];
            const {T} G01 = G[3 * nq + p], G02 = G[4 * nq + p], G12 = G[5 * nq + p];
            f0 = G00 * g0 + G01 * g1 + G02 * g2;
            f1 = G01 * g0 + G11 * g1 + G12 * g2;
            f2 = G02 * g0 + G12 * g1 + G22 * g2;
        }
        sf0[e][c][b][a] = f0;
        sf1[e][c][b][a] = f1;
        rf2[c] = f2;
    }
    __syncthreads();
    if (!active) return;                          // after the last barrier
#pragma unroll
    for (int c = 0; c < {N}; ++c) {               // D^T along x, y (shared) and z (registers)
        {T} v = 0;
#pragma unroll
        for (int m = 0; m < {N}; ++m)
            v += sD[m][a] * sf0[e][c][b][m] + sD[m][b] * sf1[e][c][m][a] + sD[m][c] * rf2[m];
        const long long p = base + (c * {N} + b) * {N} + a;
        {T} out = ck * v;
        if (cm != ({T})0) out += cm * (wdet[p] * ru[c]);
        y[p] = out;
    }
}
"""


_SCATTER_SRC = r"""
extern "C" __global__ void {NAME}(const long long nrows, const int* __restrict__ indptr,
                                  const int* __restrict__ indices, const {T}* __restrict__ y,
                                  {T}* __restrict__ out)
{
    // out_r = sum of y over the element nodes of DoF r, in the CSR order of the scatter matrix
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= nrows) return;
    {T} s = 0;
    for (int j = indptr[r]; j < indptr[r + 1]; ++j) s += y[indices[j]];
    out[r] = s;
}
"""


def elements_per_block(n, dtype):
    """Elements a block holds: about 256 threads, static shared memory within SMEM_BUDGET
    (D plus three n^3 arrays an element)."""
    isz = np.dtype(dtype).itemsize
    return items_per_block(n * n, 3 * n ** 3 * isz, n * n * isz)


def items_per_block(threads, smem_item, smem_fixed=0):
    """Items (elements, cells) a block of ``threads`` threads an item holds: at most about
    256 threads and ``smem_fixed + items * smem_item`` bytes within SMEM_BUDGET; at least 1."""
    return max(1, min(256 // max(threads, 1), (SMEM_BUDGET - smem_fixed) // max(smem_item, 1)))


def kernel_source(n, dtype, index_dtype=np.int32):
    """``(source, name)`` of the kernel for ``n = k + 1`` points a direction (2..9)."""
    return render_source(_SRC, "adaptmg_spectral_ax3d_n{N}_{T}_{I}", dtype, index_dtype,
                         "the fused spectral kernel", "cell_dofs", ("n = k + 1", int(n), 2, 9),
                         N=n, EPB=elements_per_block(int(n), dtype))


def render_source(template, name, dtype, index_dtype, what, index_name, size, **subs):
    """``(source, name)`` of a kernel template over ``{T}`` (double/float), ``{I}`` (int
    type of ``index_dtype``) and the integer ``subs``; ``name`` is formatted the same way
    (``{I}`` as the dtype's name).  ``size = (label, value, lo, hi)``: ValueError unless
    lo <= value <= hi; TypeError naming ``what`` for other dtypes."""
    label, value, lo, hi = size
    if not lo <= value <= hi:
        raise ValueError(f"{what} takes {label} in {lo}..{hi}, got {value}")
    T = _ctype(dtype, what)
    idt = np.dtype(index_dtype)
    if idt not in _INDEX_TYPES:
        raise TypeError(f"{index_name} must be int32 or int64 for {what}, got {idt}")
    subs = {k: str(int(v)) for k, v in subs.items()}
    name = name.replace("{T}", T).replace("{I}", idt.name)
    src = template.replace("{NAME}", name).replace("{T}", T).replace("{I}", _INDEX_TYPES[idt])
    for k, v in subs.items():
        name, src = name.replace("{" + k + "}", v), src.replace("{" + k + "}", v)
    return src, name


def scatter_source(dtype):
    """``(source, name)`` of the scatter kernel: ``out = S y`` for the 0/1 scatter matrix S
    (CSR, int32 indices) without reading its values -- a thread a DoF, deterministic."""
    T = _ctype(dtype, "the spectral scatter kernel")
    name = f"adaptmg_spectral_scatter_{T}"
    return _SCATTER_SRC.replace("{NAME}", name).replace("{T}", T), name


@functools.lru_cache(maxsize=None)
def _scatter_kernel(xp, ctype):
    """The scatter kernel's function (its RawModule built once per key)."""
    src, name = scatter_source(np.float64 if ctype == "double" else np.float32)
    return xp.RawModule(code=src).get_function(name)


def scatter_sum(S, y, out=None):
    """``S @ y`` for the scatter matrix ``S`` (cupyx CSR of ones, int32 indices) by the
    scatter kernel (GPU): the sum over each row's columns of ``y``, values not read."""
    from ..backend import get_backend
    xp = get_backend("gpu").xp
    dtype = np.dtype(y.dtype)
    if S.indptr.dtype != np.int32 or S.indices.dtype != np.int32:
        raise TypeError("the spectral scatter kernel needs int32 CSR indices")
    if y.size != S.shape[1] or not y.flags.c_contiguous:
        raise ValueError(f"scatter kernel: y must be C-contiguous with {S.shape[1]} entries, got {y.shape}")
    nrows = S.shape[0]
    if out is None:
        out = xp.empty(nrows, dtype=dtype)
    if nrows:
        fn = _scatter_kernel(xp, _ctype(dtype))
        fn(((nrows + 255) // 256,), (256,), (np.int64(nrows), S.indptr, S.indices, y, out))
    return out


@functools.lru_cache(maxsize=None)
def _element_kernel(xp, ctype, n, index_name):
    """The element kernel's function of one (dtype, n, index type) (its RawModule built
    once per key)."""
    src, name = kernel_source(n, np.float64 if ctype == "double" else np.float32, np.dtype(index_name))
    return xp.RawModule(code=src).get_function(name)


def fused_cell_apply(x, cell_dofs, G, wdet, D, mass, stiffness, out=None, gather=True):
    """Element outputs ``y`` (cells, n^3) of ``c_m M + c_k K`` in one launch (GPU).

    ``x``: the global vector (``gather``) or the cell arrays (cells * n^3, not gathered);
    ``cell_dofs`` (cells, n^3) int32/int64; ``G`` (6, cells, n^3); ``wdet`` (cells, n^3);
    ``D`` (n, n); all on the device in one float dtype and C-contiguous."""
    from ..backend import get_backend
    xp = get_backend("gpu").xp
    ncells, nn = cell_dofs.shape
    n = int(D.shape[0])
    dtype = np.dtype(D.dtype)
    if nn != n ** 3 or G.shape != (6, ncells, nn) or wdet.shape != (ncells, nn):
        raise ValueError(f"fused spectral kernel: shapes do not fit n = {n}: cell_dofs "
                         f"{cell_dofs.shape}, G {G.shape}, wdet {wdet.shape}")
    for name, arr in (("x", x), ("G", G), ("wdet", wdet), ("D", D)):
        if np.dtype(arr.dtype) != dtype or not arr.flags.c_contiguous:
            raise ValueError(f"fused spectral kernel: {name} must be C-contiguous {dtype}")
    if not cell_dofs.flags.c_contiguous:
        raise ValueError("fused spectral kernel: cell_dofs must be C-contiguous")
    if not gather and x.size != ncells * nn:
        raise ValueError(f"fused spectral kernel: cell arrays must have {ncells * nn} entries, got {x.size}")
    if out is None:
        out = xp.empty((ncells, nn), dtype=dtype)
    if ncells == 0:
        return out
    idt = np.dtype(cell_dofs.dtype)
    fn = _element_kernel(xp, _ctype(dtype), n, idt.name)
    epb = elements_per_block(n, dtype)
    T = dtype.type
    fn(((ncells + epb - 1) // epb,), (n, n, epb),
       (np.int64(ncells), np.int32(1 if gather else 0), cell_dofs, x, G, wdet, D,
        T(mass), T(stiffness), out))
    return out
