"""CUDA source of the matrix-free operator of the Cartesian Q_k path.

``adaptmg_patch_lap{2,3}d`` (seed 000 §3, "Matrix-Free Multiplication").  A
thread block holds CPB cells; a cell's (k+1)^d values sit in shared memory; one
thread per DoF in 2D and one thread per DoF *column* (fixed x, y; z in
registers) in 3D (§3.1.2, Fig. 5 "2D structure").  The sum factorisation is
the 7-contraction form of operator.py: x- and y-contractions read shared
memory, the z-contraction runs on the thread's registers.  Results go to the
global vector with atomicAdd (the choice of [18] over cell colouring).
Launched by :class:`.kernels.GpuLaplace`.
"""
from __future__ import annotations

import numpy as np

from .cuda_build import _TYPES, _fill


def cells_per_block(dim, k):
    return max(1, 256 // (k + 1) ** 2)


_LAP3D = r"""
typedef $T T;
#define K $K
#define K1 (K + 1)
#define KP $KP
#define CPB $CPB
extern "C" __global__ void __launch_bounds__(K1 * K1 * CPB)
adaptmg_patch_lap3d_$NAME(const T* __restrict__ u, T* __restrict__ v,
                          const T* __restrict__ mats, int n0, int n1, int n2,
                          T c0, T c1, T c2, T alpha)
{
    __shared__ T sM[K1 * K1], sA[K1 * K1];
    __shared__ T s1[CPB][K1][K1][KP];
    __shared__ T s2[CPB][K1][K1][KP];
    const int tid = threadIdx.x, lc = threadIdx.y;
    const int lin = lc * K1 * K1 + tid;
    for (int i = lin; i < K1 * K1; i += K1 * K1 * CPB) { sM[i] = mats[i]; sA[i] = mats[K1 * K1 + i]; }
    const long long ncell = (long long)n0 * n1 * n2;
    const long long cell = (long long)blockIdx.x * CPB + lc;
    const bool active = cell < ncell;
    const int cx = (int)(cell % n0), cy = (int)((cell / n0) % n1), cz = (int)(cell / ((long long)n0 * n1));
    const int a0 = tid % K1, a1 = tid / K1;
    const int N0 = n0 * K - 1, N1 = n1 * K - 1, N2 = n2 * K - 1;
    const int i0 = cx * K + a0 - 1, i1 = cy * K + a1 - 1;
    const bool col = active && i0 >= 0 && i0 < N0 && i1 >= 0 && i1 < N1;
    const long long base = (long long)i1 * N0 + i0, plane = (long long)N0 * N1;
    #pragma unroll
    for (int a2 = 0; a2 < K1; ++a2) {
        const int i2 = cz * K + a2 - 1;
        s1[lc][a2][a1][a0] = (col && i2 >= 0 && i2 < N2) ? u[i2 * plane + base] : (T)0;
    }
    __syncthreads();
    // x: v = Mh_x u, w = Ah_x u    (Mh, Ah symmetric: read column-wise, conflict free)
    T rv[K1], rw[K1], mr[K1], ar[K1];
    #pragma unroll
    for (int j = 0; j < K1; ++j) { mr[j] = sM[j * K1 + a0]; ar[j] = sA[j * K1 + a0]; }
    #pragma unroll
    for (int a2 = 0; a2 < K1; ++a2) {
        T sv = 0, sw = 0;
        #pragma unroll
        for (int j = 0; j < K1; ++j) {
            const T x = s1[lc][a2][a1][j];
            sv += mr[j] * x;
            sw += ar[j] * x;
        }
        rv[a2] = sv; rw[a2] = sw;
    }
    __syncthreads();
    #pragma unroll
    for (int a2 = 0; a2 < K1; ++a2) { s1[lc][a2][a1][a0] = rv[a2]; s2[lc][a2][a1][a0] = rw[a2]; }
    __syncthreads();
    // y: p = Mh_y v, q = c1 Ah_y v + c0 Mh_y w
    T p[K1], q[K1];
    #pragma unroll
    for (int j = 0; j < K1; ++j) { mr[j] = sM[j * K1 + a1]; ar[j] = sA[j * K1 + a1]; }
    #pragma unroll
    for (int a2 = 0; a2 < K1; ++a2) {
        T sp = 0, sa = 0, sm = 0;
        #pragma unroll
        for (int j = 0; j < K1; ++j) {
            const T vv = s1[lc][a2][j][a0], ww = s2[lc][a2][j][a0];
            const T m = mr[j], a = ar[j];
            sp += m * vv; sa += a * vv; sm += m * ww;
        }
        p[a2] = sp; q[a2] = c1 * sa + c0 * sm;
    }
    // z in registers: out = c2 Ah_z p + Mh_z q
    if (col) {
        #pragma unroll
        for (int a2 = 0; a2 < K1; ++a2) {
            const int i2 = cz * K + a2 - 1;
            if (i2 < 0 || i2 >= N2) continue;
            T s = 0, t = 0;
            #pragma unroll
            for (int j = 0; j < K1; ++j) { s += sA[a2 * K1 + j] * p[j]; t += sM[a2 * K1 + j] * q[j]; }
            atomicAdd(v + i2 * plane + base, alpha * (c2 * s + t));
        }
    }
}
"""


_LAP2D = r"""
typedef $T T;
#define K $K
#define K1 (K + 1)
#define KP $KP
#define CPB $CPB
extern "C" __global__ void __launch_bounds__(K1 * K1 * CPB)
adaptmg_patch_lap2d_$NAME(const T* __restrict__ u, T* __restrict__ v,
                          const T* __restrict__ mats, int n0, int n1, T c0, T c1, T alpha)
{
    __shared__ T sM[K1 * K1], sA[K1 * K1];
    __shared__ T s1[CPB][K1][KP];
    __shared__ T s2[CPB][K1][KP];
    const int tid = threadIdx.x, lc = threadIdx.y;
    const int lin = lc * K1 * K1 + tid;
    for (int i = lin; i < K1 * K1; i += K1 * K1 * CPB) { sM[i] = mats[i]; sA[i] = mats[K1 * K1 + i]; }
    const long long cell = (long long)blockIdx.x * CPB + lc;
    const bool active = cell < (long long)n0 * n1;
    const int cx = (int)(cell % n0), cy = (int)(cell / n0);
    const int a0 = tid % K1, a1 = tid / K1;
    const int N0 = n0 * K - 1, N1 = n1 * K - 1;
    const int i0 = cx * K + a0 - 1, i1 = cy * K + a1 - 1;
    const bool ok = active && i0 >= 0 && i0 < N0 && i1 >= 0 && i1 < N1;
    const long long g = (long long)i1 * N0 + i0;
    s1[lc][a1][a0] = ok ? u[g] : (T)0;
    __syncthreads();
    T sv = 0, sw = 0;
    #pragma unroll
    for (int j = 0; j < K1; ++j) {
        const T x = s1[lc][a1][j];
        sv += sM[j * K1 + a0] * x; sw += sA[j * K1 + a0] * x;
    }
    __syncthreads();
    s1[lc][a1][a0] = sv; s2[lc][a1][a0] = sw;
    __syncthreads();
    T sa = 0, sm = 0;
    #pragma unroll
    for (int j = 0; j < K1; ++j) {
        sa += sA[j * K1 + a1] * s1[lc][j][a0];
        sm += sM[j * K1 + a1] * s2[lc][j][a0];
    }
    if (ok) atomicAdd(v + g, alpha * (c1 * sa + c0 * sm));
}
"""


def laplace_source(dim, k, dtype):
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    kp = (k + 1) | 1                       # odd row length
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}"
    tpl = _LAP3D if dim == 3 else _LAP2D
    return _fill(tpl, T=T, K=k, KP=kp, CPB=cells_per_block(dim, k), NAME=name), \
        f"adaptmg_patch_lap{dim}d_{name}"

