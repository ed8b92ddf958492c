"""CUDA source of a 1D sparse matrix applied along one axis (the grid transfer).

``adaptmg_patch_axis`` computes ``v[o, i, r] <- alpha sum_w vals[i, w] u[o, cols[i, w], r]
+ beta v[o, i, r]``: the matrix in ELL form (:func:`.tensor.ell_form`), applied to a
C-ordered array without transposes.  Launched by :class:`.kernels.GpuAxisMatrix`.
"""
from __future__ import annotations

import numpy as np

from .cuda_build import _TYPES, _fill

# --- 1D matrix along one axis (grid transfer) -------------------------------
_AXIS = r"""
typedef $T T;
// v[o, i, r] <- alpha sum_w vals[i, w] u[o, cols[i, w], r] + beta v[o, i, r]
// (beta == 0: v is not read).  32-bit index arithmetic while the output and the
// grid stride stay below limit32 (AXIS_INDEX32_LIMIT = 2^31 - 1): the two divisions
// per entry are then cheap (64-bit integer division is a long software sequence
// and made this kernel slow).
template <typename I>
__device__ __forceinline__ void axis_apply(const T* __restrict__ u, T* __restrict__ v,
                                           const int* __restrict__ cols, const T* __restrict__ vals,
                                           int width, I total, I n_in, I n_out, I inner, T alpha, T beta)
{
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (I)gridDim.x * blockDim.x) {
        const I t = idx / inner, in_ = idx - t * inner;
        const I o = t / n_out, i = t - o * n_out;
        const T* src = u + (long long)o * n_in * inner + in_;
        T s = 0;
        for (int w = 0; w < width; ++w) {
            const int c = cols[i * width + w];
            s += vals[i * width + w] * src[(long long)c * inner];
        }
        v[idx] = beta == (T)0 ? alpha * s : alpha * s + beta * v[idx];
    }
}

extern "C" __global__ void adaptmg_patch_axis_$NAME(
    const T* __restrict__ u, T* __restrict__ v, const int* __restrict__ cols,
    const T* __restrict__ vals, int width, long long outer, int n_in, int n_out, long long inner,
    T alpha, T beta, long long limit32)
{
    const long long total = outer * n_out * inner;
    if (total + (long long)gridDim.x * blockDim.x <= limit32)
        axis_apply<unsigned int>(u, v, cols, vals, width, (unsigned int)total, (unsigned int)n_in,
                                 (unsigned int)n_out, (unsigned int)inner, alpha, beta);
    else
        axis_apply<long long>(u, v, cols, vals, width, total, (long long)n_in, (long long)n_out,
                              inner, alpha, beta);
}
"""


def axis_source(dtype):
    T = _TYPES[np.dtype(dtype)]
    name = "f64" if T == "double" else "f32"
    return _fill(_AXIS, T=T, NAME=name), f"adaptmg_patch_axis_{name}"

