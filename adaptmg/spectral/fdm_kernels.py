r"""Fused CUDA kernel of the fine scale ``P^f`` of seed 004 (3-D, fast diagonalisation).

For one cell's box of ``m = k + 3`` GLL nodes a direction (local index
``q = (z m + y) m + x``, x fastest; see :class:`~adaptmg.spectral.schwarz.FineSchwarz`)
the kernel computes, with ``r_w = w * r`` (``w`` the multiplicity weight),

.. math::

    t_{zyx} = [q \text{ valid}]\; r_w[\mathrm{index}_q], \qquad
    \hat t = (S_2 \otimes S_1 \otimes S_0)^T t, \\
    \hat t_{zyx} \leftarrow \hat t_{zyx}\, \frac{s}{c_m + c_k(\lambda^0_x + \lambda^1_y + \lambda^2_z)}, \qquad
    y = (S_2 \otimes S_1 \otimes S_0)\, \hat t,

``S_d`` the cell's pencil eigenvectors along axis d (one of the 9 variants of
:func:`adaptmg.spectral.basis.pencil_factors`, picked by the per-cell variant id, so the
launch reads (9, m, m) numbers, not (cells, 3, m, m)), ``lambda^d`` the cell's scaled
eigenvalues (cells, 3, m), ``s = 1 / prod_d h_d``.  ``index == N`` marks a box node that is
no DoF of the patch (its value is 0, its output is dropped by the scatter).  The global
``P^f r = w * (R^T y)`` is the deterministic scatter kernel of
:mod:`adaptmg.spectral.kernels` (the ``scatter_matrix`` sums, its values not read) and one
product with ``w``.

Block: EPB cells, thread (a, b, e) = node column (x = a, y = b) of cell e, looping over z;
the z transforms stay in registers, the x and y transforms read shared memory (two
buffers of m^3 a cell), the three S_d of each cell sit in shared memory.  Sources are
templates over T (double/float), I (index type) and M, compiled once per key (CuPy
``RawModule`` through ``get_backend("gpu").xp``; this module never imports CuPy);
:func:`fdm_source` is also what the host tests compile.
"""
from __future__ import annotations

import functools

import numpy as np

from ..device.kernels import _ctype
from .kernels import items_per_block, render_source, scatter_sum

__all__ = ["fdm_source", "fdm_cells_per_block", "fdm_smem_per_cell", "fdm_cell_apply", "fdm_apply"]

_SRC = r"""
extern "C" __global__ void __launch_bounds__({M} * {M} * {EPB})
{NAME}(const long long ncells, const long long ndofs, const {I}* __restrict__ index,
       const {T}* __restrict__ r, const {T}* __restrict__ w, const {T}* __restrict__ S9,
       const int* __restrict__ variant, const {T}* __restrict__ lam,
       const {T}* __restrict__ scale, const {T} cm, const {T} ck, {T}* __restrict__ y)
{
    __shared__ {T} sS[{EPB}][3][{M}][{M}];         // the cell's S_0, S_1, S_2
    __shared__ {T} sA[{EPB}][{M}][{M}][{M}];
    __shared__ {T} sB[{EPB}][{M}][{M}][{M}];
    const int a = threadIdx.x, b = threadIdx.y, e = threadIdx.z;
    const long long cell = (long long)blockIdx.x * {EPB} + e;
    const bool active = cell < ncells;
    const long long base = cell * ({M} * {M} * {M});
    for (int t = b * {M} + a; t < 3 * {M} * {M}; t += {M} * {M}) {
        const int d = t / ({M} * {M}), ij = t % ({M} * {M});
        sS[e][d][ij / {M}][ij % {M}] = active ? S9[variant[cell * 3 + d] * ({M} * {M}) + ij] : ({T})0;
    }
    {T} u[{M}], v[{M}];
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // gather w r into the column
        {T} val = 0;
        if (active) {
            const long long q = (long long)index[base + (c * {M} + b) * {M} + a];
            if (q < ndofs) val = w[q] * r[q];
        }
        u[c] = val;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_2^T along z in registers
        {T} s = 0;
#pragma unroll
        for (int i = 0; i < {M}; ++i) s += sS[e][2][i][c] * u[i];
        sA[e][c][b][a] = s;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_0^T along x: A -> B
        {T} s = 0;
#pragma unroll
        for (int i = 0; i < {M}; ++i) s += sS[e][0][i][a] * sA[e][c][b][i];
        sB[e][c][b][a] = s;
    }
    __syncthreads();
    {T} l0 = 0, l1 = 0, sc = 0;
    if (active) {
        l0 = lam[cell * 3 * {M} + a];
        l1 = lam[cell * 3 * {M} + {M} + b];
        sc = scale[cell];
    }
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_1^T along y, the eigenvalue scaling
        {T} s = 0;
#pragma unroll
        for (int j = 0; j < {M}; ++j) s += sS[e][1][j][b] * sB[e][c][j][a];
        const {T} l2 = active ? lam[cell * 3 * {M} + 2 * {M} + c] : ({T})0;
        sA[e][c][b][a] = active ? s * (sc / (cm + ck * ((l0 + l1) + l2))) : ({T})0;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_1 along y: A -> B
        {T} s = 0;
#pragma unroll
        for (int j = 0; j < {M}; ++j) s += sS[e][1][b][j] * sA[e][c][j][a];
        sB[e][c][b][a] = s;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_0 along x into the column
        {T} s = 0;
#pragma unroll
        for (int i = 0; i < {M}; ++i) s += sS[e][0][a][i] * sB[e][c][b][i];
        v[c] = s;
    }
    if (!active) return;
#pragma unroll
    for (int c = 0; c < {M}; ++c) {               // S_2 along z, the box output
        {T} s = 0;
#pragma unroll
        for (int i = 0; i < {M}; ++i) s += sS[e][2][c][i] * v[i];
        y[base + (c * {M} + b) * {M} + a] = s;
    }
}
"""


def fdm_cells_per_block(m, dtype):
    """Cells a block holds: about 256 threads, static shared memory (two m^3 buffers and
    three m x m matrices a cell) within ``kernels.SMEM_BUDGET``."""
    return items_per_block(m * m, fdm_smem_per_cell(m, dtype))


def fdm_smem_per_cell(m, dtype):
    """Static shared memory of one cell in a block (bytes)."""
    return (2 * m ** 3 + 3 * m * m) * np.dtype(dtype).itemsize


def fdm_source(m, dtype, index_dtype=np.int32):
    """``(source, name)`` of the P^f kernel for boxes of ``m = k + 3`` nodes a direction (4..11)."""
    m = int(m)
    return render_source(_SRC, "adaptmg_spectral_fdm3d_m{M}_{T}_{I}", dtype, index_dtype,
                         "the fused fine-scale kernel", "the patch index", ("m = k + 3", m, 4, 11),
                         M=m, EPB=fdm_cells_per_block(m, dtype))


@functools.lru_cache(maxsize=None)
def _fdm_kernel(xp, ctype, m, index_name):
    """The kernel's function of one (dtype, m, index type) (its RawModule built once)."""
    src, name = fdm_source(m, np.float64 if ctype == "double" else np.float32, np.dtype(index_name))
    return xp.RawModule(code=src).get_function(name)


def fdm_cell_apply(r, weight, index, S9, variant, lam, scale, mass, stiffness, out=None):
    """Box outputs ``y`` (cells, m^3) of the fine scale in one launch (GPU; see the module
    docstring).  ``r``, ``weight`` (N,); ``index`` (cells, m^3) int32/int64 (N: none);
    ``S9`` (9, m, m); ``variant`` (cells, 3) int32 in 0..8; ``lam`` (cells, 3, m);
    ``scale`` (cells,); all on the device, C-contiguous, floats in one dtype."""
    from ..backend import get_backend
    xp = get_backend("gpu").xp
    nc, mm = index.shape
    m = int(S9.shape[-1])
    dtype = np.dtype(S9.dtype)
    if mm != m ** 3 or S9.shape != (9, m, m) or variant.shape != (nc, 3) or lam.shape != (nc, 3, m) \
            or scale.shape != (nc,) or r.shape != weight.shape or r.ndim != 1:
        raise ValueError(f"fused fine-scale kernel: shapes do not fit m = {m}: index {index.shape}, "
                         f"S9 {S9.shape}, variant {variant.shape}, lam {lam.shape}, scale {scale.shape}, "
                         f"r {r.shape}, weight {weight.shape}")
    for name, arr in (("r", r), ("weight", weight), ("S9", S9), ("lam", lam), ("scale", scale)):
        if np.dtype(arr.dtype) != dtype or not arr.flags.c_contiguous:
            raise ValueError(f"fused fine-scale kernel: {name} must be C-contiguous {dtype}")
    if np.dtype(variant.dtype) != np.int32 or not variant.flags.c_contiguous or not index.flags.c_contiguous:
        raise ValueError("fused fine-scale kernel: variant must be C-contiguous int32 and index C-contiguous")
    if out is None:
        out = xp.empty((nc, mm), dtype=dtype)
    if nc == 0:
        return out
    fn = _fdm_kernel(xp, _ctype(dtype), m, np.dtype(index.dtype).name)
    epb = fdm_cells_per_block(m, dtype)
    T = dtype.type
    fn(((nc + epb - 1) // epb,), (m, m, epb),
       (np.int64(nc), np.int64(r.size), index, r, weight, S9, variant, lam, scale, T(mass), T(stiffness), out))
    return out


def fdm_apply(fine, r):
    """``P^f r`` of a :class:`~adaptmg.spectral.schwarz.FineSchwarz` by the fused kernel and
    the scatter kernel (GPU, 3-D)."""
    xp = fine.xp
    r = xp.ascontiguousarray(r, dtype=fine.dtype)
    y = fdm_cell_apply(r, fine.weight, fine.index, fine.S9, fine.variant, fine.lam, fine.scale,
                       fine.mass, fine.stiffness)
    out = scatter_sum(fine.scatter_matrix, y.reshape(-1))
    out *= fine.weight
    return out
