"""CUDA sources of the vertex-patch smoother in *column* form (3D and 2D).

``adaptmg_patch_smooth{2,3}d`` -- one colour of the multiplicative vertex-
patch smoother, fused (seed 000 Table 4 "Fused"): load Rbar_j x and R_j b, local
residual r_j = R_j b - Abar_j Rbar_j x (eq. 2.8) by sum factorisation,
local solve by fast diagonalisation (eqs. 2.13/2.14), x_j += A_j^{-1} r_j
written straight back; nothing else touches global memory.  One block per
patch (PPB patches for small k).  Threads are indexed linearly over the
*active* index set of each stage (the (2k-1)(2k+1) outputs of the x-stage,
the (2k-1)^2 interior columns of the later stages), so idle threads sit in
the last warp only (§4.1.1 "Linear Indexing").

Shared-memory layout (§4.1.2): every buffer is stored with its fastest index
equal to the thread's fastest index, rows of odd length (2k+1 or 2k-1, the
operator pads k+1 to odd), and the 1D matrices are read as ``M[a * ld + j]``
with odd ``ld`` or, for the symmetric operator matrices, as ``M[j * ld + a]``
(consecutive threads, consecutive words).  Within a warp a read then hits
distinct banks or one broadcast address: no bank conflicts (Listing 2's aim).

The patch load ``$LOADX`` (:func:`_with_patch_load`) is shared with the pencil
form (:mod:`.cuda_pencil`).  Launched by :class:`.kernels.GpuPatchSmoother`.
"""
from __future__ import annotations

import re

import numpy as np

from .cuda_build import _TYPES, _fill


def patches_per_block(dim, k):
    n = (2 * k + 1) ** 2
    return max(1, (256 if dim == 2 else 128) // n)


# --- smoother -------------------------------------------------------------
# Both 3D smoother forms start alike: Rbar_j x into the shared buffer DST
# [i2][i1][i0], zero outside the domain (Dirichlet), one thread per z-column.
_LOAD_PATCH3D = r"""{
        const int i0 = tid % NP, i1 = tid / NP;
        const int g0 = s0 + i0 - 1, g1 = s1 + i1 - 1;
        const bool ok = active && g0 >= 0 && g0 < N0 && g1 >= 0 && g1 < N1;
        const long long base = (long long)g1 * N0 + g0;
        #pragma unroll
        for (int i2 = 0; i2 < NP; ++i2) {
            const int g2 = s2 + i2 - 1;
            DST[(i2 * NP + i1) * NP + i0] = (ok && g2 >= 0 && g2 < N2) ? x[g2 * plane + base] : (T)0;
        }
    }"""


def _with_patch_load(tpl):
    """Expand ``$LOADX(buf)`` in a 3D smoother template into _LOAD_PATCH3D on ``buf``."""
    return re.sub(r"\$LOADX\((\w+)\)", lambda m: _LOAD_PATCH3D.replace("DST", m.group(1)), tpl)


# mats layout: Mb (NI x NP), Ab (NI x NP), S (NI x NI), lam (NI)
_SMOOTH3D = r"""
typedef $T T;
#define K $K
#define NP (2 * K + 1)
#define NI (2 * K - 1)
#define PPB $PPB
#define SX (NP * NP * NP)
#define SV (NP * NP * NI)
#define PATCH_SMEM (SX + 2 * SV)
extern "C" __global__ void __launch_bounds__(NP * NP * PPB, $MINB)
adaptmg_patch_smooth3d_$NAME(T* __restrict__ x, const T* __restrict__ b,
                             const T* __restrict__ mats, int n0, int n1, int n2,
                             int col0, int col1, int col2, int P0, int P1, int P2,
                             T c0, T c1, T c2)
{
    extern __shared__ unsigned char smem_raw[];
    T* sm = reinterpret_cast<T*>(smem_raw);
    T* sMb = sm; T* sAb = sMb + NI * NP; T* sS = sAb + NI * NP; T* sL = sS + NI * NI;
    const int nmat = 2 * NI * NP + NI * NI + NI;
    T* sx = sm + ((nmat + 1) / 2) * 2 + threadIdx.y * PATCH_SMEM;
    T* sv = sx + SX;           // [NP][NP][NI]
    T* sw = sv + SV;
    T* b1 = sx;                // [NI][NI][NI], aliases sx once sx is consumed
    T* b2 = sv;                // aliases sv once sv/sw are consumed
    const int tid = threadIdx.x;
    for (int i = threadIdx.y * NP * NP + tid; i < nmat; i += NP * NP * PPB) sm[i] = mats[i];
    const long long npatch = (long long)P0 * P1 * P2;
    const long long pid = (long long)blockIdx.x * PPB + threadIdx.y;
    const bool active = pid < npatch;
    const int m0 = (int)(pid % P0), m1 = (int)((pid / P0) % P1), m2 = (int)(pid / ((long long)P0 * P1));
    // patch start (full numbering) s = (p - 1) K with vertex p = 1 + col + 2 m
    const int s0 = (col0 + 2 * m0) * K, s1 = (col1 + 2 * m1) * K, s2 = (col2 + 2 * m2) * K;
    const int N0 = n0 * K - 1, N1 = n1 * K - 1, N2 = n2 * K - 1;
    const long long plane = (long long)N0 * N1;
    // 1. load Rbar_j x, one thread per z-column (coalesced along x)
    if (tid < NP * NP) $LOADX(sx)
    __syncthreads();
    // 2. x-stage of Abar: v = Mb_x x, w = Ab_x x on (a0, i1), linear thread index
    if (tid < NI * NP) {
        const int a0 = tid % NI, i1 = tid / NI;
        T mr[NP], ar[NP];                    // this thread's matrix rows, in registers
        #pragma unroll
        for (int j = 0; j < NP; ++j) { mr[j] = sMb[a0 * NP + j]; ar[j] = sAb[a0 * NP + j]; }
        T rv[NP], rw[NP];
        #pragma unroll
        for (int i2 = 0; i2 < NP; ++i2) {
            T s = 0, t = 0;
            #pragma unroll
            for (int j = 0; j < NP; ++j) {
                const T xx = sx[(i2 * NP + i1) * NP + j];
                s += mr[j] * xx; t += ar[j] * xx;
            }
            rv[i2] = s; rw[i2] = t;
        }
        #pragma unroll
        for (int i2 = 0; i2 < NP; ++i2) { sv[i2 * NP * NI + tid] = rv[i2]; sw[i2 * NP * NI + tid] = rw[i2]; }
    }
    __syncthreads();
    const bool inner = tid < NI * NI;
    const int a0 = tid % NI, a1 = tid / NI;
    T r[NI];
    if (inner) {
        // 3. y-stage: p = Mb_y v, q = c1 Ab_y v + c0 Mb_y w
        T p[NP], q[NP];
        {
            T mr[NP], ar[NP];
            #pragma unroll
            for (int j = 0; j < NP; ++j) { mr[j] = sMb[a1 * NP + j]; ar[j] = sAb[a1 * NP + j]; }
            #pragma unroll
            for (int i2 = 0; i2 < NP; ++i2) {
                T sp = 0, sa = 0, smm = 0;
                #pragma unroll
                for (int j = 0; j < NP; ++j) {
                    const T vv = sv[(i2 * NP + j) * NI + a0], ww = sw[(i2 * NP + j) * NI + a0];
                    sp += mr[j] * vv; sa += ar[j] * vv; smm += mr[j] * ww;
                }
                p[i2] = sp; q[i2] = c1 * sa + c0 * smm;
            }
        }
        // 4. z-stage in registers and local residual r = R_j b - Abar_j Rbar_j x (eq. 2.8)
        const long long gb = (long long)(s1 + a1) * N0 + (s0 + a0);
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0, t = 0;
            #pragma unroll
            for (int j = 0; j < NP; ++j) { s += sAb[a2 * NP + j] * p[j]; t += sMb[a2 * NP + j] * q[j]; }
            r[a2] = (active ? b[(s2 + a2) * plane + gb] : (T)0) - (c2 * s + t);
        }
        // 5. fast diagonalisation (eq. 2.14): S^T along z in registers
        T t2[NI];
        #pragma unroll
        for (int c = 0; c < NI; ++c) {
            T s = 0;
            #pragma unroll
            for (int a2 = 0; a2 < NI; ++a2) s += sS[a2 * NI + c] * r[a2];
            t2[c] = s;
        }
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) b1[a2 * NI * NI + tid] = t2[a2];
    }
    __syncthreads();
    if (inner) {   // S^T along y
        T sc[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) sc[j] = sS[j * NI + a1];
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += sc[j] * b1[(a2 * NI + j) * NI + a0];
            r[a2] = s;
        }
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) b2[a2 * NI * NI + tid] = r[a2];
    }
    __syncthreads();
    if (inner) {   // S^T along x, divide by the eigenvalue sums
        const T d01 = c0 * sL[a0] + c1 * sL[a1];
        T sc[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) sc[j] = sS[j * NI + a0];
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += sc[j] * b2[(a2 * NI + a1) * NI + j];
            r[a2] = s / (d01 + c2 * sL[a2]);
        }
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) b1[a2 * NI * NI + tid] = r[a2];
    }
    __syncthreads();
    if (inner) {   // S along x
        T sc[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) sc[j] = sS[a0 * NI + j];
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += sc[j] * b1[(a2 * NI + a1) * NI + j];
            r[a2] = s;
        }
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) b2[a2 * NI * NI + tid] = r[a2];
    }
    __syncthreads();
    if (inner && active) {   // S along y, then z in registers; x_j += A_j^{-1} r_j
        T sc[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) sc[j] = sS[a1 * NI + j];
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += sc[j] * b2[(a2 * NI + j) * NI + a0];
            r[a2] = s;
        }
        const long long gb = (long long)(s1 + a1) * N0 + (s0 + a0);
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += sS[a2 * NI + j] * r[j];
            x[(s2 + a2) * plane + gb] += s;
        }
    }
}
"""


_SMOOTH2D = r"""
typedef $T T;
#define K $K
#define NP (2 * K + 1)
#define NI (2 * K - 1)
#define PPB $PPB
#define PATCH_SMEM (NP * NP + 2 * NP * NI + 2 * NI * NI)
extern "C" __global__ void __launch_bounds__(NP * NP * PPB)
adaptmg_patch_smooth2d_$NAME(T* __restrict__ x, const T* __restrict__ b,
                             const T* __restrict__ mats, int n0, int n1,
                             int col0, int col1, int P0, int P1, T c0, T c1)
{
    extern __shared__ unsigned char smem_raw[];
    T* sm = reinterpret_cast<T*>(smem_raw);
    T* sMb = sm; T* sAb = sMb + NI * NP; T* sS = sAb + NI * NP; T* sL = sS + NI * NI;
    const int nmat = 2 * NI * NP + NI * NI + NI;
    T* sx = sm + ((nmat + 1) / 2) * 2 + threadIdx.y * PATCH_SMEM;
    T* sv = sx + NP * NP;      // [NP][NI]
    T* sw = sv + NP * NI;
    T* b1 = sw + NP * NI;      // [NI][NI]
    T* b2 = b1 + NI * NI;
    const int tid = threadIdx.x;
    for (int i = threadIdx.y * NP * NP + tid; i < nmat; i += NP * NP * PPB) sm[i] = mats[i];
    const long long pid = (long long)blockIdx.x * PPB + threadIdx.y;
    const bool active = pid < (long long)P0 * P1;
    const int m0 = (int)(pid % P0), m1 = (int)(pid / P0);
    const int s0 = (col0 + 2 * m0) * K, s1 = (col1 + 2 * m1) * K;
    const int N0 = n0 * K - 1, N1 = n1 * K - 1;
    {
        const int i0 = tid % NP, i1 = tid / NP;
        const int g0 = s0 + i0 - 1, g1 = s1 + i1 - 1;
        const bool ok = active && g0 >= 0 && g0 < N0 && g1 >= 0 && g1 < N1;
        sx[tid] = ok ? x[(long long)g1 * N0 + g0] : (T)0;
    }
    __syncthreads();
    if (tid < NI * NP) {       // x-stage on (a0, i1)
        const int a0 = tid % NI, i1 = tid / NI;
        T s = 0, t = 0;
        #pragma unroll
        for (int j = 0; j < NP; ++j) {
            const T xx = sx[i1 * NP + j];
            s += sMb[a0 * NP + j] * xx; t += sAb[a0 * NP + j] * xx;
        }
        sv[tid] = s; sw[tid] = t;
    }
    __syncthreads();
    const bool inner = tid < NI * NI;
    const int a0 = tid % NI, a1 = tid / NI;
    const long long g = (long long)(s1 + a1) * N0 + (s0 + a0);
    if (inner) {               // y-stage, local residual (eq. 2.8)
        T sa = 0, smm = 0;
        #pragma unroll
        for (int j = 0; j < NP; ++j) {
            sa += sAb[a1 * NP + j] * sv[j * NI + a0];
            smm += sMb[a1 * NP + j] * sw[j * NI + a0];
        }
        b1[tid] = (active ? b[g] : (T)0) - (c1 * sa + c0 * smm);
    }
    __syncthreads();
    if (inner) {               // S^T along x
        T s = 0;
        #pragma unroll
        for (int j = 0; j < NI; ++j) s += sS[j * NI + a0] * b1[a1 * NI + j];
        b2[tid] = s;
    }
    __syncthreads();
    if (inner) {               // S^T along y, divide (eq. 2.13)
        T s = 0;
        #pragma unroll
        for (int j = 0; j < NI; ++j) s += sS[j * NI + a1] * b2[j * NI + a0];
        b1[tid] = s / (c0 * sL[a0] + c1 * sL[a1]);
    }
    __syncthreads();
    if (inner) {               // S along x
        T s = 0;
        #pragma unroll
        for (int j = 0; j < NI; ++j) s += sS[a0 * NI + j] * b1[a1 * NI + j];
        b2[tid] = s;
    }
    __syncthreads();
    if (inner && active) {     // S along y; x_j += A_j^{-1} r_j
        T s = 0;
        #pragma unroll
        for (int j = 0; j < NI; ++j) s += sS[a1 * NI + j] * b2[j * NI + a0];
        x[g] += s;
    }
}
"""


# Minimum resident blocks per SM asked of the compiler (register cap) for the 3D
# smoother, by (k, dtype); 1 = no cap.  Tuned with bench_patch.py --sections tune
# (figures in NOTES.md): uncapped, fp64 k=7 needs 166 registers, i.e. one
# 225-thread block (8 warps) per SM.
SMOOTH3D_MIN_BLOCKS = {(7, "float64"): 2, (6, "float32"): 3, (7, "float32"): 3,
                       (8, "float32"): 2}


def smoother_source(dim, k, dtype, minb=None):
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    if minb is None:
        minb = SMOOTH3D_MIN_BLOCKS.get((k, dt.name), 1) if dim == 3 else 1
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}" + (f"_mb{minb}" if minb != 1 else "")
    tpl = _with_patch_load(_SMOOTH3D) if dim == 3 else _SMOOTH2D
    return _fill(tpl, T=T, K=k, PPB=patches_per_block(dim, k), NAME=name, MINB=minb), \
        f"adaptmg_patch_smooth{dim}d_{name}"

