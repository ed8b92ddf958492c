"""One-pass GPU gather for a Kronecker product of narrow 1D matrices (the low-order transfers).

For ``T = M_2 (x) M_1 (x) M_0`` (x = axis 0 fastest) with 1D matrices in ELL form
(``W_a`` entries a row, padded with zero weights),

    v[i2, i1, i0] <- alpha sum_{a, b, c} M_2[i2, a] M_1[i1, b] M_0[i0, c] u[a, b, c] + beta v

one thread an output, the sum nested as ``sum_a M_2 (sum_b M_1 (sum_c M_0 u))``.  It
reads ``u`` once from DRAM (the W_0 W_1 W_2 loads of neighbouring outputs overlap in
L1/L2) and writes ``v`` once, where the axis passes of :class:`.kernels.GpuAxisMatrix`
write and read two intermediate arrays.  The gathers grow like ``W^d``:
:class:`~adaptmg.patch.transfer.KronTransfer` takes the kernel with ``gather=True`` (the
Q1 transfers: prolongation 2^3 = 8 entries a row, restriction 3^3 = 27) where the rows
hold at most :data:`MAX_GATHER` entries.  A 2D product is the 3D one with ``M_2 = [1]``.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend
from .cuda_build import _TYPES, _load
from .tensor import ell_form

__all__ = ["MAX_GATHER", "gather_width", "kron_gather_source", "GpuKronGather"]

#: the largest number of entries a row of the Kronecker product may gather (W_0 W_1 W_2)
MAX_GATHER = 27

_SOURCE = r"""
typedef $T T;
#define W0 $W0
#define W1 $W1
#define W2 $W2
// the widths are compile-time constants: the loops unroll and a thread keeps its
// x-row of M_0 in registers (loaded once, not once an output)
extern "C" __global__ void __launch_bounds__(128)
$KNAME(const T* __restrict__ u, T* __restrict__ v,
       const int* __restrict__ c0, const T* __restrict__ w0,
       const int* __restrict__ c1, const T* __restrict__ w1,
       const int* __restrict__ c2, const T* __restrict__ w2,
       int I0, int I1, int O0, int O1, int O2, T alpha, T beta)
{
    const int i0 = blockIdx.x * blockDim.x + threadIdx.x;
    if (i0 >= O0) return;
    int cx[W0];
    T wx[W0];
    #pragma unroll
    for (int c = 0; c < W0; ++c) { cx[c] = c0[i0 * W0 + c]; wx[c] = w0[i0 * W0 + c]; }
    const long long in_plane = (long long)I0 * I1, out_plane = (long long)O0 * O1;
    for (int i2 = blockIdx.z; i2 < O2; i2 += gridDim.z)
        for (int i1 = blockIdx.y; i1 < O1; i1 += gridDim.y) {
            T s = 0;
            #pragma unroll
            for (int a = 0; a < W2; ++a) {
                const T* pa = u + c2[i2 * W2 + a] * in_plane;
                T sa = 0;
                #pragma unroll
                for (int b = 0; b < W1; ++b) {
                    const T* row = pa + (long long)c1[i1 * W1 + b] * I0;
                    T sb = 0;
                    #pragma unroll
                    for (int c = 0; c < W0; ++c) sb += wx[c] * row[cx[c]];
                    sa += w1[i1 * W1 + b] * sb;
                }
                s += w2[i2 * W2 + a] * sa;
            }
            const long long g = i2 * out_plane + (long long)i1 * O0 + i0;
            v[g] = beta == (T)0 ? alpha * s : alpha * s + beta * v[g];
        }
}
"""

_THREADS = 128
_GRID_MAX = 65535


def kron_gather_source(dtype, widths):
    """CUDA source and kernel name of the gather for ``dtype`` (float64 or float32) and
    the ELL widths ``(W_0, W_1, W_2)``."""
    T = _TYPES[np.dtype(dtype)]
    w = tuple(int(v) for v in widths)
    name = f"adaptmg_kron_gather_{'f64' if T == 'double' else 'f32'}_{w[0]}_{w[1]}_{w[2]}"
    src = _SOURCE.replace("$T", T).replace("$KNAME", name)
    for i, v in enumerate(w):
        src = src.replace(f"$W{i}", str(v))
    return src, name


@functools.lru_cache(maxsize=None)
def _kernel(dtype_str, widths):
    return _load(*kron_gather_source(np.dtype(dtype_str), widths))


def gather_width(mats) -> int:
    """``W_0 W_1 ...``: the entries a row of the Kronecker product of ``mats`` gathers."""
    return int(np.prod([ell_form(m)[2] for m in mats]))


class GpuKronGather:
    """``v <- alpha (M_2 (x) M_1 (x) M_0) u + beta v`` on the GPU in one pass; ``mats`` are
    scipy CSR matrices, x first (2 or 3 of them)."""

    def __init__(self, mats, dtype):
        if len(mats) not in (2, 3):
            raise ValueError(f"GpuKronGather needs 2 or 3 matrices, got {len(mats)}")
        import scipy.sparse as sp
        if len(mats) == 2:
            mats = list(mats) + [sp.identity(1, format="csr")]
        cp = get_backend("gpu").xp
        self.dtype = np.dtype(dtype)
        self.parts, widths = [], []
        for m in mats:
            cols, vals, width = ell_form(m)
            self.parts += [cp.asarray(cols), cp.asarray(vals, dtype=self.dtype)]
            widths.append(width)
        self.out_n = tuple(int(m.shape[0]) for m in mats)     # x first
        self.in_n = tuple(int(m.shape[1]) for m in mats)
        self.kernel = _kernel(self.dtype.str, tuple(widths))
        self.cp = cp

    def apply(self, u, out, alpha=1.0, beta=0.0):
        """``out <- alpha T u + beta out`` (``beta == 0``: ``out`` is not read); ``u`` and
        ``out`` contiguous vectors of the input and output sizes, not overlapping."""
        O0, O1, O2 = self.out_n
        T = self.dtype.type
        grid = (-(-O0 // _THREADS), min(O1, _GRID_MAX), min(O2, _GRID_MAX))
        self.kernel(grid, (_THREADS,), (u, out, *self.parts, np.int32(self.in_n[0]),
                                        np.int32(self.in_n[1]), np.int32(O0), np.int32(O1),
                                        np.int32(O2), T(alpha), T(beta)))
        return out
