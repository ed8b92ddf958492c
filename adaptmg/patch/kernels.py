"""CUDA kernels (CuPy RawKernel) of the Cartesian Q_k path.

Two kernel families, generated from the templates below for each (dim, k,
precision) and memoised:

``adaptmg_patch_lap{2,3}d`` -- the matrix-free operator (seed 000 §3, "Matrix-
    Free Multiplication").  A thread block holds CPB cells; a cell's (k+1)^d
    values sit in shared memory; one thread per DoF in 2D and one thread per
    DoF *column* (fixed x, y; z in registers) in 3D (§3.1.2, Fig. 5 "2D
    structure").  The sum factorisation is the 7-contraction form of
    operator.py: x- and y-contractions read shared memory, the z-contraction
    runs on the thread's registers.  Results go to the global vector with
    atomicAdd (the choice of [18] over cell colouring).

``adaptmg_patch_smooth{2,3}d`` -- one colour of the multiplicative vertex-
    patch smoother, fused (Table 4 "Fused"): load Rbar_j x and R_j b, local
    residual r_j = R_j b - Abar_j Rbar_j x (eq. 2.8) by sum factorisation,
    local solve by fast diagonalisation (eqs. 2.13/2.14), x_j += A_j^{-1} r_j
    written straight back; nothing else touches global memory.  One block per
    patch (PPB patches for small k).  Threads are indexed linearly over the
    *active* index set of each stage (the (2k-1)(2k+1) outputs of the x-stage,
    the (2k-1)^2 interior columns of the later stages), so idle threads sit in
    the last warp only (§4.1.1 "Linear Indexing").

``adaptmg_patch_smooth3dp`` -- the same colour step in *pencil* form (the 3D
    default for k <= 4, 5 in fp32): every stage is a batch of 1D contractions
    along one axis, one thread per pencil with the pencil in registers and the
    1D matrices compiled in as ``__constant__`` arrays (uniform FMA operands),
    shared memory only between stages.  Same sums in the same order, except
    that the local solve multiplies by a per-level table of the reciprocal
    eigenvalue sums instead of dividing; NOTES.md has the figures.

``adaptmg_patch_smooth3db`` -- the *Boundary* form (seed 000 §4.1.3, the 3D
    default for larger k): an exact local solve lets the step set
    x^I <- A_j^{-1} (b^I - A^{IB} x^B), so only the patch shell is loaded and
    the residual, split by eq. (4.2) into the z-, y- and x-face groups, costs
    O(k^3) instead of O(k^4) per patch; the local solve is the pencil form's.

Shared-memory layout of the column form (§4.1.2): every buffer is stored with its fastest index
equal to the thread's fastest index, rows of odd length (2k+1 or 2k-1, the
operator pads k+1 to odd), and the 1D matrices are read as ``M[a * ld + j]``
with odd ``ld`` or, for the symmetric operator matrices, as ``M[j * ld + a]``
(consecutive threads, consecutive words).  Within a warp a read then hits
distinct banks or one broadcast address: no bank conflicts (Listing 2's aim).

Only ``adaptmg.backend`` imports CuPy; we get it as ``get_backend("gpu").xp``.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from ..backend import get_backend
from .tensor import ell_form, eigenvalue_sums, patch_fast_diag, patch_matrices, reference_matrices

__all__ = ["GpuLaplace", "GpuPatchSmoother", "laplace_source", "smoother_source",
           "cells_per_block", "patches_per_block"]

_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def cells_per_block(dim, k):
    return max(1, 256 // (k + 1) ** 2)


def patches_per_block(dim, k):
    n = (2 * k + 1) ** 2
    return max(1, (256 if dim == 2 else 128) // n)


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

# The pieces the pencil and Boundary forms share (inserted into both templates
# below): _PATCH_INDEX, the patch of this thread block (y index), its place in
# the level and whether the thread owns an interior (a0, a1) pencil;
# _FD_HELPERS, the compiled-in 1D matrices and the y-pencil and S^T_z helpers; _FD_SOLVE,
# the local solve's stages 5-8 (S^T_y; S^T_x, the division DIVIDE, S_x; S_y;
# S_z and the update $XUPDATE of x).
_PATCH_INDEX = r"""    const int tid = threadIdx.x;
    const long long npatch = (long long)P0 * P1 * P2;
    const long long pid = (long long)blockIdx.x * PPB + threadIdx.y;
    const bool active = pid < npatch;
    const int m0 = (int)(pid % P0), m1 = (int)((pid / P0) % P1), m2 = (int)(pid / ((long long)P0 * P1));
    const int s0 = (col0 + 2 * m0) * K, s1 = (col1 + 2 * m1) * K, s2 = (col2 + 2 * m2) * K;
    const int N0 = n0 * K - 1, N1 = n1 * K - 1, N2 = n2 * K - 1;
    const long long plane = (long long)N0 * N1;
    const bool inner = tid < NI * NI;
"""
_FD_HELPERS = r"""__constant__ T cMb[NI * NP] = {$MB};
__constant__ T cAb[NI * NP] = {$AB};
__constant__ T cS[NI * NI] = {$SS};
__constant__ T cL[NI] = {$LAM};
// S^T (TRANS) or S along y on the pencil (a0, a2) of src [a2][a1 (row PT)][a0];
// the result goes to dst as [a2][a1][a0] (for the x-stage, TRANS) or as
// [a1][a0][a2] (for the z-stage)
template <bool TRANS>
__device__ __forceinline__ void pencil_y(const T* __restrict__ src, T* __restrict__ dst, int tid)
{
    const int a0 = tid % NI, a2 = tid / NI;
    T tr[NI];
    #pragma unroll
    for (int j = 0; j < NI; ++j) tr[j] = src[a2 * PT + j * NI + a0];
    #pragma unroll
    for (int a1 = 0; a1 < NI; ++a1) {
        T s = 0;
        #pragma unroll
        for (int j = 0; j < NI; ++j) s += cS[TRANS ? j * NI + a1 : a1 * NI + j] * tr[j];
        dst[TRANS ? (a2 * NI + a1) * NI + a0 : (a1 * NI + a0) * NI + a2] = s;
    }
}
// S^T along z of the local residual r of the pencil (a0, a1): the first factor
// of the local solve (eq. 2.14), into sT [c][a1 (row PT)][a0]
__device__ __forceinline__ void st_along_z(const T (&r)[NI], T* __restrict__ sT, int a0, int a1)
{
    #pragma unroll
    for (int c = 0; c < NI; ++c) {
        T s = 0;
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) s += cS[a2 * NI + c] * r[a2];
        sT[c * PT + a1 * NI + a0] = s;
    }
}
"""
_FD_SOLVE = r"""    // 5. S^T along y, pencil (a0, a2)
    if (inner) pencil_y<true>(sT, sU, tid);
    __syncthreads();
    // 6. pencil (a1, a2): S^T along x, divide by the eigenvalue sums (eq. 2.13: DIVIDE), S along x
    if (inner) {
        const int a1 = tid % NI, a2 = tid / NI;
        T yr[NI], zr[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) yr[j] = sU[tid * NI + j];
        #pragma unroll
        for (int a0 = 0; a0 < NI; ++a0) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += cS[j * NI + a0] * yr[j];
            zr[a0] = DIVIDE(s, a0, a1, a2);
        }
        #pragma unroll
        for (int a0 = 0; a0 < NI; ++a0) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += cS[a0 * NI + j] * zr[j];
            sT[a2 * PT + a1 * NI + a0] = s;
        }
    }
    __syncthreads();
    // 7. S along y, pencil (a0, a2)
    if (inner) pencil_y<false>(sT, sU, tid);
    __syncthreads();
    // 8. S along z, pencil (a0, a1); $XNOTE
    if (inner && active) {
        const int a0 = tid % NI, a1 = tid / NI;
        T tr[NI];
        #pragma unroll
        for (int j = 0; j < NI; ++j) tr[j] = sU[tid * NI + j];
        const long long gb = (long long)(s1 + a1) * N0 + (s0 + a0);
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0;
            #pragma unroll
            for (int j = 0; j < NI; ++j) s += cS[a2 * NI + j] * tr[j];
            x[(s2 + a2) * plane + gb] $XUPDATE s;
        }
    }
}
"""


def _with_shared_pieces(tpl, xnote, xupdate):
    """Insert _PATCH_INDEX, _FD_HELPERS and _FD_SOLVE into a 3D smoother
    template; ``xupdate`` ("+=" or "=") is how stage 8 writes x, ``xnote`` says so."""
    solve = _FD_SOLVE.replace("$XNOTE", xnote).replace("$XUPDATE", xupdate)
    return tpl.replace("$PATCH_INDEX\n", _PATCH_INDEX).replace("$FD_HELPERS", _FD_HELPERS) \
        .replace("$FD_SOLVE", solve)


# Pencil form of the 3D smoother: every stage is a set of 1D contractions along
# one axis, one thread per pencil, the pencil in registers, the 1D matrices
# compile-time __constant__ arrays (uniform operands of the FMAs: no shared-
# memory load per FMA), and shared memory only to turn the data between stages.
_SMOOTH3D_PENCIL = r"""
typedef $T T;
#define K $K
#define NP (2 * K + 1)
#define NI (2 * K - 1)
#define PPB $PPB
#define PT $PT
#define OFF_T $OFFT
#define PATCH_SMEM $PSMEM
// the eigenvalue sums' reciprocals dinv[a2][a1][a0], a per-level table: a product
// instead of an FP64 division (+8 % at k = 3, 4 in fp64); tid = the (a1, a2) pencil
#define DIVIDE(s, a0, a1, a2) ((s) * dinv[tid * NI + (a0)])
$FD_HELPERSextern "C" __global__ void __launch_bounds__(NP * NP * PPB, $MINB)
adaptmg_patch_smooth3dp_$NAME(T* __restrict__ x, const T* __restrict__ b,
                              int n0, int n1, int n2, int col0, int col1, int col2,
                              int P0, int P1, int P2, T c0, T c1, T c2,
                              const T* __restrict__ dinv)
{
    extern __shared__ unsigned char smem_raw[];
    T* const sX = reinterpret_cast<T*>(smem_raw) + threadIdx.y * PATCH_SMEM;
    T* const sV = sX + NP * NP * NP;     // [i2][i1][a0], then W
    T* const sW = sV + NP * NP * NI;
    T* const sP = sX;                    // [a1][a0][i2], then Q
    T* const sQ = sX + NI * NI * NP;
    T* const sT = sX + OFF_T;            // [a2][a1 (row PT)][a0]: after z and x stages
    T* const sU = sX;                    // [a2][a1][a0] / [a1][a0][a2]: after the y stages
$PATCH_INDEX
    // 1. load Rbar_j x, one thread per z-column (coalesced along x)
    $LOADX(sX)
    // the local right-hand side R_j b, prefetched for the z-stage
    T br[NI];
    {
        const int a0 = tid % NI, a1 = tid / NI;
        const long long gb = (long long)(s1 + a1) * N0 + (s0 + a0);
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) br[a2] = (inner && active) ? b[(s2 + a2) * plane + gb] : (T)0;
    }
    __syncthreads();
    // 2. x-stage, pencil (i1, i2): v = Mb_x x, w = Ab_x x
    {
        const int i1 = tid % NP, i2 = tid / NP;
        T xr[NP];
        #pragma unroll
        for (int j = 0; j < NP; ++j) xr[j] = sX[tid * NP + j];
        T* const v = sV + (i2 * NP + i1) * NI;
        T* const w = sW + (i2 * NP + i1) * NI;
        #pragma unroll
        for (int a0 = 0; a0 < NI; ++a0) {
            T s = 0, t = 0;
            #pragma unroll
            for (int j = 0; j < NP; ++j) { s += cMb[a0 * NP + j] * xr[j]; t += cAb[a0 * NP + j] * xr[j]; }
            v[a0] = s; w[a0] = t;
        }
    }
    __syncthreads();
    // 3. y-stage, pencil (a0, i2): p = Mb_y v, q = c1 Ab_y v + c0 Mb_y w
    {
        const bool on = tid < NI * NP;
        const int a0 = tid % NI, i2 = tid / NI;
        T vr[NP], wr[NP];
        if (on) {
            #pragma unroll
            for (int j = 0; j < NP; ++j) { vr[j] = sV[(i2 * NP + j) * NI + a0]; wr[j] = sW[(i2 * NP + j) * NI + a0]; }
        }
        __syncthreads();               // p, q overwrite x and v
        if (on) {
            #pragma unroll
            for (int a1 = 0; a1 < NI; ++a1) {
                T sp = 0, sa = 0, smm = 0;
                #pragma unroll
                for (int j = 0; j < NP; ++j) {
                    sp += cMb[a1 * NP + j] * vr[j]; sa += cAb[a1 * NP + j] * vr[j]; smm += cMb[a1 * NP + j] * wr[j];
                }
                sP[(a1 * NI + a0) * NP + i2] = sp;
                sQ[(a1 * NI + a0) * NP + i2] = c1 * sa + c0 * smm;
            }
        }
    }
    __syncthreads();
    // 4. z-stage, pencil (a0, a1): r = R_j b - (c2 Ab_z p + Mb_z q)   (eq. 2.8),
    //    then the first factor of the local solve, S^T along z (eq. 2.14)
    if (inner) {
        const int a0 = tid % NI, a1 = tid / NI;
        T pr[NP], qr[NP], r[NI];
        #pragma unroll
        for (int j = 0; j < NP; ++j) { pr[j] = sP[tid * NP + j]; qr[j] = sQ[tid * NP + j]; }
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = 0, t = 0;
            #pragma unroll
            for (int j = 0; j < NP; ++j) { s += cAb[a2 * NP + j] * pr[j]; t += cMb[a2 * NP + j] * qr[j]; }
            r[a2] = br[a2] - (c2 * s + t);
        }
        st_along_z(r, sT, a0, a1);
    }
    __syncthreads();
$FD_SOLVE"""
_SMOOTH3D_PENCIL = _with_shared_pieces(_SMOOTH3D_PENCIL, "x_j += A_j^{-1} r_j", "+=")

# The "Boundary" form of the 3D colour step (seed 000 §4.1.3, eq. 4.2): with an
# exact local solver, x_j + R_j^T A_j^{-1} R_j (b - A x) keeps the patch
# boundary values x^B and sets the interior to
#     x^I <- A_j^{-1} (b^I - A^{IB} x^B),
# so the interior values are never read and the local residual needs only the
# patch shell.  A^{IB} x^B splits by the first boundary direction from z:
#     z on the boundary:            F_z^B (x) F_y (x) F_x    (two z faces, NP x NP)
#     z interior, y on the boundary: F_z^I (x) F_y^B (x) F_x  (two y faces, NI x NP)
#     z, y interior, x boundary:     F_z^I (x) F_y^I (x) F_x^B (two x faces, NI x NI)
# (F = the sum over the three c_d-weighted Kronecker products; ^I / ^B the
# interior / boundary columns of the 1D rows Mb, Ab).  Each group contracts its
# two long directions first and expands the two-column boundary direction last,
# so the residual costs O(k^3) instead of O(k^4) per patch; the local solve
# (stages 5-8) is the pencil form's.
_SMOOTH3D_BOUNDARY = r"""
typedef $T T;
#define K $K
#define NP (2 * K + 1)
#define NI (2 * K - 1)
#define NT (NP * NP)
#define PPB $PPB
#define PT $PT
#define PATCH_SMEM $PSMEM
// stage-1 and stage-2 pencils: three groups, first thread G*, loop end G*END
#define G1Y $G1Y
#define G1X $G1X
#define G1END $G1END
#define G2Y $G2Y
#define G2X $G2X
#define G2END $G2END
// shared layout (elements) of one patch
#define O_DZ 0                          // z faces  [f][i1][i0]
#define O_DY (O_DZ + 2 * NP * NP)       // y faces  [i2'][f][i0]
#define O_DX (O_DY + 2 * NI * NP)       // x faces  [i2'][i1'][f]
#define O_VZ (O_DX + 2 * NI * NI)       // Mb_x dZ  [f][i1][a0]
#define O_WZ (O_VZ + 2 * NP * NI)       // Ab_x dZ
#define O_VY (O_WZ + 2 * NP * NI)       // Mb_x dY  [i2'][f][a0]
#define O_WY (O_VY + 2 * NI * NI)       // Ab_x dY
#define O_YM (O_WY + 2 * NI * NI)       // Mi_y dX  [i2'][a1][f]
#define O_YA (O_YM + 2 * NI * NI)       // Ai_y dX
#define O_B $OB                         // stage-2 outputs, later sU
#define O_PZ (O_B)                      // [f][a1][a0]
#define O_QZ (O_PZ + 2 * NI * NI)
#define O_H1 (O_QZ + 2 * NI * NI)       // [f][a2][a0]
#define O_H2 (O_H1 + 2 * NI * NI)
#define O_K1 (O_H2 + 2 * NI * NI)       // [a2][a1][f]
#define O_K2 (O_K1 + 2 * NI * NI)
#define O_BB (O_B + 12 * NI * NI)       // R_j b [a2][a1][a0]
// a table of reciprocals (the pencil form's DIVIDE) was slower here at k = 6..8
#define DIVIDE(s, a0, a1, a2) ((s) / ((c0 * cL[a0] + c1 * cL[a1]) + c2 * cL[a2]))
$FD_HELPERS// one row-pencil of length N (stride 1 at src) through the NI x NP rows of
// Mb and Ab, columns OFF .. OFF + N - 1: v = Mb src, w = Ab src (stride SO out)
template <int N, int OFF, int SO>
__device__ __forceinline__ void pencil_mb_ab(const T* __restrict__ src, int si,
                                             T* __restrict__ v, T* __restrict__ w)
{
    T d[N];
    #pragma unroll
    for (int j = 0; j < N; ++j) d[j] = src[j * si];
    #pragma unroll $UO
    for (int a = 0; a < NI; ++a) {
        T s = 0, t = 0;
        #pragma unroll
        for (int j = 0; j < N; ++j) { s += cMb[a * NP + OFF + j] * d[j]; t += cAb[a * NP + OFF + j] * d[j]; }
        v[a * SO] = s; w[a * SO] = t;
    }
}
extern "C" __global__ void __launch_bounds__(NT * PPB, $MINB)
adaptmg_patch_smooth3db_$NAME(T* __restrict__ x, const T* __restrict__ b,
                              int n0, int n1, int n2, int col0, int col1, int col2,
                              int P0, int P1, int P2, T c0, T c1, T c2)
{
    extern __shared__ unsigned char smem_raw[];
    T* const sm = reinterpret_cast<T*>(smem_raw) + threadIdx.y * PATCH_SMEM;
    T* const sT = sm;                    // [a2][a1 (row PT)][a0]
    T* const sU = sm + O_B;              // [a2][a1][a0] / [a1][a0][a2]
$PATCH_INDEX
    // 1. the patch shell x^B (zero outside the domain: Dirichlet) and R_j b
    {
        const int i0 = tid % NP, i1 = tid / NP;          // z faces: one thread per (i0, i1)
        const int g0 = s0 + i0 - 1, g1 = s1 + i1 - 1;
        const bool ok = active && g0 >= 0 && g0 < N0 && g1 >= 0 && g1 < N1;
        const long long base = (long long)g1 * N0 + g0;
        const int z0 = s2 - 1, z1 = s2 + NI;
        sm[O_DZ + tid] = (ok && z0 >= 0) ? x[z0 * plane + base] : (T)0;
        sm[O_DZ + NT + tid] = (ok && z1 < N2) ? x[z1 * plane + base] : (T)0;
    }
    if (tid < NI * NP) {                                 // y faces: (i0, i2')
        const int i0 = tid % NP, j2 = tid / NP;
        const int g0 = s0 + i0 - 1;
        const bool ok = active && g0 >= 0 && g0 < N0;
        const long long base = (long long)(s2 + j2) * plane + g0;
        const int y0 = s1 - 1, y1 = s1 + NI;
        sm[O_DY + (j2 * 2) * NP + i0] = (ok && y0 >= 0) ? x[base + (long long)y0 * N0] : (T)0;
        sm[O_DY + (j2 * 2 + 1) * NP + i0] = (ok && y1 < N1) ? x[base + (long long)y1 * N0] : (T)0;
    }
    if (inner) {                                         // x faces: (i1', i2')
        const int j1 = tid % NI, j2 = tid / NI;
        const long long base = (long long)(s2 + j2) * plane + (long long)(s1 + j1) * N0;
        const int x0 = s0 - 1, x1 = s0 + NI;
        sm[O_DX + tid * 2] = (active && x0 >= 0) ? x[base + x0] : (T)0;
        sm[O_DX + tid * 2 + 1] = (active && x1 < N0) ? x[base + x1] : (T)0;
    }
    // R_j b straight into shared memory (cp.async where the GPU has it: no
    // registers held through stages 2-3), zero for an inactive patch
    if (inner) {
        const int a0 = tid % NI, a1 = tid / NI;
        const long long gb = (long long)(s1 + a1) * N0 + (s0 + a0);
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
#if __CUDA_ARCH__ >= 800
            const unsigned dst = (unsigned)__cvta_generic_to_shared(sm + O_BB + a2 * NI * NI + tid);
            const T* src = active ? b + (s2 + a2) * plane + gb : b;
            asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                         :: "r"(dst), "l"(src), "n"((int)sizeof(T)), "r"(active ? (int)sizeof(T) : 0));
#else
            sm[O_BB + a2 * NI * NI + tid] = active ? b[(s2 + a2) * plane + gb] : (T)0;
#endif
        }
    }
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
    __syncthreads();
    // 2. first contraction of each group
    for (int p = tid; p < G1END; p += NT) {
        if (p < 2 * NP) {                                // z faces along x: pencil (f, i1)
            pencil_mb_ab<NP, 0, 1>(sm + O_DZ + p * NP, 1, sm + O_VZ + p * NI, sm + O_WZ + p * NI);
        } else if (p >= G1Y && p < G1Y + 2 * NI) {       // y faces along x: pencil (i2', f)
            const int q = p - G1Y;
            pencil_mb_ab<NP, 0, 1>(sm + O_DY + q * NP, 1, sm + O_VY + q * NI, sm + O_WY + q * NI);
        } else if (p >= G1X && p < G1X + 2 * NI) {       // x faces along y (interior): pencil (i2', f)
            const int q = p - G1X, j2 = q >> 1, f = q & 1;
            pencil_mb_ab<NI, 1, 2>(sm + O_DX + j2 * 2 * NI + f, 2,
                                   sm + O_YM + j2 * 2 * NI + f, sm + O_YA + j2 * 2 * NI + f);
        }
    }
    __syncthreads();
    // 3. second contraction of each group
    for (int p = tid; p < G2END; p += NT) {
        if (p < 2 * NI) {                                // z faces along y: pencil (f, a0)
            const int f = p / NI, a0 = p % NI;
            T vr[NP], wr[NP];
            #pragma unroll
            for (int j = 0; j < NP; ++j) {
                vr[j] = sm[O_VZ + (f * NP + j) * NI + a0]; wr[j] = sm[O_WZ + (f * NP + j) * NI + a0];
            }
            #pragma unroll $UO
            for (int a1 = 0; a1 < NI; ++a1) {
                T sp = 0, sa = 0, smm = 0;
                #pragma unroll
                for (int j = 0; j < NP; ++j) {
                    sp += cMb[a1 * NP + j] * vr[j]; sa += cAb[a1 * NP + j] * vr[j]; smm += cMb[a1 * NP + j] * wr[j];
                }
                sm[O_PZ + (f * NI + a1) * NI + a0] = sp;
                sm[O_QZ + (f * NI + a1) * NI + a0] = c1 * sa + c0 * smm;
            }
        } else if (p >= G2Y && p < G2Y + 2 * NI) {       // y faces along z (interior): pencil (f, a0)
            const int q = p - G2Y, f = q / NI, a0 = q % NI;
            T vr[NI], wr[NI];
            #pragma unroll
            for (int j = 0; j < NI; ++j) {
                vr[j] = sm[O_VY + (j * 2 + f) * NI + a0]; wr[j] = sm[O_WY + (j * 2 + f) * NI + a0];
            }
            #pragma unroll $UO
            for (int a2 = 0; a2 < NI; ++a2) {
                T g1 = 0, g2 = 0, g3 = 0;
                #pragma unroll
                for (int j = 0; j < NI; ++j) {
                    g1 += cAb[a2 * NP + j + 1] * vr[j]; g2 += cMb[a2 * NP + j + 1] * vr[j];
                    g3 += cMb[a2 * NP + j + 1] * wr[j];
                }
                sm[O_H1 + (f * NI + a2) * NI + a0] = c2 * g1 + c0 * g3;
                sm[O_H2 + (f * NI + a2) * NI + a0] = c1 * g2;
            }
        } else if (p >= G2X && p < G2X + 2 * NI) {       // x faces along z (interior): pencil (a1, f)
            const int q = p - G2X;
            T mr[NI], ar[NI];
            #pragma unroll
            for (int j = 0; j < NI; ++j) { mr[j] = sm[O_YM + j * 2 * NI + q]; ar[j] = sm[O_YA + j * 2 * NI + q]; }
            #pragma unroll $UO
            for (int a2 = 0; a2 < NI; ++a2) {
                T g1 = 0, g2 = 0, g3 = 0;
                #pragma unroll
                for (int j = 0; j < NI; ++j) {
                    g1 += cAb[a2 * NP + j + 1] * mr[j]; g2 += cMb[a2 * NP + j + 1] * ar[j];
                    g3 += cMb[a2 * NP + j + 1] * mr[j];
                }
                sm[O_K1 + a2 * 2 * NI + q] = c2 * g1 + c1 * g2;
                sm[O_K2 + a2 * 2 * NI + q] = c0 * g3;
            }
        }
    }
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::);
#endif
    __syncthreads();
    // 4. pencil (a0, a1): r = R_j b - A^{IB} x^B (the boundary direction of each
    //    group expanded here), then S^T along z (eq. 2.14)
    if (inner) {
        const int a0 = tid % NI, a1 = tid / NI;
        const T mx0 = cMb[a0 * NP], mx1 = cMb[a0 * NP + NP - 1];
        const T ax0 = cAb[a0 * NP], ax1 = cAb[a0 * NP + NP - 1];
        const T my0 = cMb[a1 * NP], my1 = cMb[a1 * NP + NP - 1];
        const T ay0 = cAb[a1 * NP], ay1 = cAb[a1 * NP + NP - 1];
        const T p0 = sm[O_PZ + a1 * NI + a0], p1 = sm[O_PZ + (NI + a1) * NI + a0];
        const T q0 = sm[O_QZ + a1 * NI + a0], q1 = sm[O_QZ + (NI + a1) * NI + a0];
        T r[NI];
        #pragma unroll
        for (int a2 = 0; a2 < NI; ++a2) {
            T s = c2 * (cAb[a2 * NP] * p0 + cAb[a2 * NP + NP - 1] * p1)
                + (cMb[a2 * NP] * q0 + cMb[a2 * NP + NP - 1] * q1);
            s += my0 * sm[O_H1 + a2 * NI + a0] + my1 * sm[O_H1 + (NI + a2) * NI + a0]
               + ay0 * sm[O_H2 + a2 * NI + a0] + ay1 * sm[O_H2 + (NI + a2) * NI + a0];
            const int kq = O_K1 + a2 * 2 * NI + a1 * 2;
            s += mx0 * sm[kq] + mx1 * sm[kq + 1]
               + ax0 * sm[kq + 2 * NI * NI] + ax1 * sm[kq + 2 * NI * NI + 1];
            r[a2] = sm[O_BB + a2 * NI * NI + tid] - s;
        }
        st_along_z(r, sT, a0, a1);
    }
    __syncthreads();
$FD_SOLVE"""
_SMOOTH3D_BOUNDARY = _with_shared_pieces(_SMOOTH3D_BOUNDARY, "x^I <- A_j^{-1} r", "=")


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


def _fill(tpl, **kw):
    out = tpl
    for key in sorted(kw, key=len, reverse=True):      # $KP before $K
        out = out.replace("$" + key, str(kw[key]))
    return out


def laplace_source(dim, k, dtype):
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    kp = (k + 1) | 1                       # odd row length
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}"
    tpl = _LAP3D if dim == 3 else _LAP2D
    return _fill(tpl, T=T, K=k, KP=kp, CPB=cells_per_block(dim, k), NAME=name), \
        f"adaptmg_patch_lap{dim}d_{name}"


def smoother_smem_bytes(dim, k, dtype, variant="column"):
    isz = np.dtype(dtype).itemsize
    if variant == "pencil":
        return patches_per_block(dim, k) * pencil_layout(k)[2] * isz
    if variant == "boundary":
        return patches_per_block(dim, k) * boundary_layout(k)["PSMEM"] * isz
    NP, NI = 2 * k + 1, 2 * k - 1
    nmat = 2 * NI * NP + NI * NI + NI
    nmat = ((nmat + 1) // 2) * 2
    per = NP ** 3 + 2 * NP * NP * NI if dim == 3 else NP * NP + 2 * NP * NI + 2 * NI * NI
    return (nmat + patches_per_block(dim, k) * per) * isz


# Minimum resident blocks per SM asked of the compiler (register cap) for the 3D
# smoother, by (k, dtype); 1 = no cap.  Tuned with bench_patch.py --sections tune
# (figures in NOTES.md): uncapped, fp64 k=7 needs 166 registers, i.e. one
# 225-thread block (8 warps) per SM.
SMOOTH3D_MIN_BLOCKS = {(7, "float64"): 2, (6, "float32"): 3, (7, "float32"): 3,
                       (8, "float32"): 2}

# The 3D smoother's forms (see GpuPatchSmoother) and the default: "tuned" takes
# the form and register cap of SMOOTH3D_TUNED for each (k, dtype), the pencil
# form elsewhere.  Tuned with bench_patch.py --sections tune (H100, NOTES.md):
# the pencil form is 1.1-1.8x faster than the column form for k = 3..8; the
# Boundary form is faster still for k >= 6 (fp64 also k = 5) and slower below.
SMOOTH3D_VARIANTS = ("column", "pencil", "boundary")
SMOOTH3D_VARIANT = "tuned"
SMOOTH3D_PENCIL_MIN_BLOCKS = {(5, "float64"): 3, (6, "float64"): 3, (7, "float64"): 2,
                              (8, "float64"): 2, (4, "float32"): 2, (5, "float32"): 2,
                              (6, "float32"): 2, (7, "float32"): 3, (8, "float32"): 3}
# (k, dtype) -> (form, minimum blocks per SM, unroll of the Boundary form's
# residual stages); pairs not listed use the pencil form.
SMOOTH3D_TUNED = {(5, "float64"): ("boundary", 1, ""), (6, "float64"): ("boundary", 4, "2"),
                  (7, "float64"): ("boundary", 2, "2"), (8, "float64"): ("boundary", 2, "1"),
                  (6, "float32"): ("boundary", 2, "2"), (7, "float32"): ("boundary", 4, "2"),
                  (8, "float32"): ("boundary", 3, "2")}


def smoother_form(k, dtype, variant=None, minb=None, unroll=None):
    """(form, minb, unroll) of the 3D smoothing kernel for degree ``k`` and
    ``dtype``: ``variant`` None takes ``SMOOTH3D_VARIANT``; "tuned" the tuned
    table; a named form its tuned cap where the table has one (else none, and
    unroll "2" for the Boundary form); ``minb`` and ``unroll`` override them."""
    name = np.dtype(dtype).name
    variant = SMOOTH3D_VARIANT if variant is None else variant
    if variant == "tuned":
        variant = SMOOTH3D_TUNED.get((k, name), ("pencil",))[0]
    if variant not in SMOOTH3D_VARIANTS:
        raise ValueError(f"variant must be one of {SMOOTH3D_VARIANTS + ('tuned',)}, got {variant!r}")
    tuned = SMOOTH3D_TUNED.get((k, name))
    unr = ""
    if variant == "boundary":
        cap, unr = (tuned[1], tuned[2]) if tuned and tuned[0] == "boundary" else (1, "2")
    elif variant == "pencil":
        cap = SMOOTH3D_PENCIL_MIN_BLOCKS.get((k, name), 1)
    else:
        cap = SMOOTH3D_MIN_BLOCKS.get((k, name), 1)
    return variant, cap if minb is None else minb, unr if unroll is None else str(unroll)


def _literals(values, dtype):
    """Exact C literals (hexadecimal floats) of ``values`` rounded to ``dtype``."""
    dt = np.dtype(dtype)
    suffix = "f" if dt == np.float32 else ""
    return ", ".join(float(v).hex() + suffix for v in np.asarray(values, dtype=dt).ravel())


def pencil_layout(k):
    """Shared-memory layout of the pencil smoother (in elements): the row
    stride ``PT`` of the z/x-stage outputs (>= NI^2 and = NI mod 32, so that
    the y-stage threads read distinct banks), their offset ``OFF_T`` (after
    the y-stage outputs p, q) and the size of one patch's region."""
    NP, NI = 2 * k + 1, 2 * k - 1
    PT = NI * NI + (NI - NI * NI) % 32
    off_t = 2 * NI * NI * NP
    return PT, off_t, max(NP ** 3 + 2 * NP * NP * NI, off_t + NI * PT)


def _thread_groups(sizes, nt, aligned):
    """First thread of each group of pencils and the end of the range: groups
    start on a warp boundary when ``aligned`` and that fits in ``nt`` threads
    (no warp runs two groups' code), else back to back."""
    def starts(step):
        out, at = [], 0
        for n in sizes:
            out.append(at)
            at += -(-n // step) * step
        return out, out[-1] + sizes[-1]
    first, end = starts(32)
    if not aligned or end > nt:
        first, end = starts(1)
    return first, end


def boundary_layout(k):
    """Shared-memory layout and thread groups of the Boundary smoother
    (``_SMOOTH3D_BOUNDARY``), elements: the shell and first-stage outputs
    (2 NP^2 + 6 NI NP + 10 NI^2, overlaid later by the PT-strided sT), the
    second-stage outputs (12 NI^2) at ``OB``, overlaid later by sU (NI^3)."""
    NP, NI = 2 * k + 1, 2 * k - 1
    PT = pencil_layout(k)[0]
    shell = 2 * NP * NP + 6 * NI * NP + 10 * NI * NI
    ob = max(shell, NI * PT)
    aligned = patches_per_block(3, k) == 1
    (_, g1y, g1x), g1end = _thread_groups((2 * NP, 2 * NI, 2 * NI), NP * NP, aligned)
    (_, g2y, g2x), g2end = _thread_groups((2 * NI, 2 * NI, 2 * NI), NP * NP, aligned)
    return dict(PT=PT, OB=ob, PSMEM=ob + 12 * NI * NI + NI ** 3, G1Y=g1y, G1X=g1x,
                G1END=g1end, G2Y=g2y, G2X=g2x, G2END=g2end)


def boundary_smoother_source(k, dtype, minb=1, unroll=""):
    """CUDA source of the Boundary form of the 3D smoother (``_SMOOTH3D_BOUNDARY``)
    with this degree's 1D matrices compiled in as ``__constant__`` arrays.
    ``unroll``: the unroll factor of the output loops of the residual stages
    ("" = full; "1" or "2" keep fewer accumulators live: fewer registers)."""
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    Mb, Ab, _, _ = patch_matrices(k)
    S, lam = patch_fast_diag(k)
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}" + (f"_mb{minb}" if minb != 1 else "") \
        + (f"_u{unroll}" if unroll != "" else "")
    src = _fill(_SMOOTH3D_BOUNDARY, T=T, K=k, PPB=patches_per_block(3, k), NAME=name, MINB=minb,
                UO=unroll, MB=_literals(Mb, dt), AB=_literals(Ab, dt), SS=_literals(S, dt),
                LAM=_literals(lam, dt), **boundary_layout(k))
    return src, f"adaptmg_patch_smooth3db_{name}"


def pencil_smoother_source(k, dtype, minb=1):
    """CUDA source of the pencil form of the 3D smoother (``_SMOOTH3D_PENCIL``)
    with this degree's 1D matrices compiled in as ``__constant__`` arrays."""
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    Mb, Ab, _, _ = patch_matrices(k)
    S, lam = patch_fast_diag(k)
    PT, off_t, psmem = pencil_layout(k)
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}" + (f"_mb{minb}" if minb != 1 else "")
    src = _fill(_with_patch_load(_SMOOTH3D_PENCIL), T=T, K=k, PPB=patches_per_block(3, k), NAME=name, MINB=minb,
                PT=PT, OFFT=off_t, PSMEM=psmem, MB=_literals(Mb, dt), AB=_literals(Ab, dt),
                SS=_literals(S, dt), LAM=_literals(lam, dt))
    return src, f"adaptmg_patch_smooth3dp_{name}"


def smoother_source(dim, k, dtype, minb=None):
    dt = np.dtype(dtype)
    T = _TYPES[dt]
    if minb is None:
        minb = SMOOTH3D_MIN_BLOCKS.get((k, dt.name), 1) if dim == 3 else 1
    name = f"k{k}_{'f64' if T == 'double' else 'f32'}" + (f"_mb{minb}" if minb != 1 else "")
    tpl = _with_patch_load(_SMOOTH3D) if dim == 3 else _SMOOTH2D
    return _fill(tpl, T=T, K=k, PPB=patches_per_block(dim, k), NAME=name, MINB=minb), \
        f"adaptmg_patch_smooth{dim}d_{name}"


def cubin_name(src, name):
    """File name of a prebuilt cubin for this exact source (hash-tagged)."""
    import hashlib
    return f"{name}_{hashlib.sha1(src.encode()).hexdigest()[:12]}.cubin"


def build_cubins(outdir, arch="sm_90", nvcc="nvcc"):
    """Compile every kernel with nvcc into ``outdir`` (ahead of time, so a
    fresh device machine skips NVRTC).  Loaded when the environment variable
    ADAPTMG_PATCH_CUBIN names that folder; sources are hash-checked."""
    import os
    import subprocess
    import tempfile
    os.makedirs(outdir, exist_ok=True)
    jobs = []
    for dim, kmax in ((2, 10), (3, 8)):
        for k in range(1, kmax + 1):
            for dt in (np.float64, np.float32):
                jobs += [laplace_source(dim, k, dt), smoother_source(dim, k, dt)]
    for k in range(4, 9):                       # register-capped variants (tuning)
        for dt in (np.float64, np.float32):
            jobs += [smoother_source(3, k, dt, minb) for minb in (2, 3)]
    for k in range(1, 9):
        for dt in (np.float64, np.float32):
            jobs += [pencil_smoother_source(k, dt, minb) for minb in (1, 2, 3)]
            jobs += [boundary_smoother_source(k, dt, minb, u) for minb in (1, 2, 3, 4)
                     for u in ("", "1", "2")]
    jobs += [axis_source(np.float64), axis_source(np.float32)]
    running, codes = [], []
    tmp = tempfile.mkdtemp()
    for src, name in jobs:
        out = os.path.join(outdir, cubin_name(src, name))
        if os.path.exists(out):
            continue
        cu = os.path.join(tmp, name + ".cu")
        with open(cu, "w") as f:
            f.write(src)
        if len(running) >= (os.cpu_count() or 1):          # one nvcc per core at a time
            codes.append(running.pop(0).wait())
        running.append(subprocess.Popen([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", "-O3",
                                         cu, "-o", out]))
    return codes + [p.wait() for p in running]


def _load(src, name):
    import os
    cp = get_backend("gpu").xp
    d = os.environ.get("ADAPTMG_PATCH_CUBIN")
    if d:
        path = os.path.join(d, cubin_name(src, name))
        if os.path.exists(path):
            try:
                return cp.RawModule(path=path).get_function(name)
            except Exception:           # wrong arch / driver: compile instead
                pass
    return cp.RawKernel(src, name, options=("-std=c++17",))


@functools.lru_cache(maxsize=None)
def _raw_kernel(kind, dim, k, dtype_str, minb=None, unroll=""):
    if kind == "lap":
        src, name = laplace_source(dim, k, np.dtype(dtype_str))
    elif kind == "pencil":
        src, name = pencil_smoother_source(k, np.dtype(dtype_str), minb)
    elif kind == "boundary":
        src, name = boundary_smoother_source(k, np.dtype(dtype_str), minb, unroll)
    else:
        src, name = smoother_source(dim, k, np.dtype(dtype_str), minb)
    ker = _load(src, name)
    if kind != "lap":
        nbytes = smoother_smem_bytes(dim, k, np.dtype(dtype_str),
                                     kind if kind in ("pencil", "boundary") else "column")
        if nbytes > 48 * 1024:
            ker.max_dynamic_shared_size_bytes = nbytes
    return ker


class GpuLaplace:
    """Launcher of the operator kernel for one space and dtype (at k = 1 the
    stencil kernel of :mod:`.stencil`)."""

    def __init__(self, space, dtype):
        self.space = space
        self.dtype = np.dtype(dtype)
        cp = get_backend("gpu").xp
        self.cp = cp
        self.stencil = None
        if space.k == 1:
            from .stencil import GpuQ1Stencil
            self.stencil = GpuQ1Stencil(space, self.dtype)
            return
        Mh, Ah = reference_matrices(space.k)
        self.mats = cp.asarray(np.concatenate([Mh.ravel(), Ah.ravel()]), dtype=self.dtype)
        self.kernel = _raw_kernel("lap", space.dim, space.k, self.dtype.str)
        self.cpb = cells_per_block(space.dim, space.k)
        ncell = int(np.prod(space.cells))
        self.grid = ((ncell + self.cpb - 1) // self.cpb,)
        self.block = ((space.k + 1) ** 2, self.cpb)
        T = self.dtype.type
        self.args_tail = tuple(np.int32(n) for n in space.cells) + tuple(T(c) for c in space.coeffs)

    def apply(self, u, out=None, alpha=1.0, beta=0.0):
        """``out <- alpha A u + beta out`` (a new array when ``out`` is None).  The
        kernel adds each cell's contribution with atomicAdd, so ``out`` is first
        zeroed or scaled by ``beta``; at k = 1 the stencil kernel writes it directly."""
        if self.stencil is not None:
            return self.stencil.apply(u, out, alpha, beta)
        if out is None:
            out = self.cp.zeros_like(u)
        elif beta == 0:
            out.fill(0)
        elif beta != 1:
            out *= self.dtype.type(beta)
        self.kernel(self.grid, self.block, (u, out, self.mats) + self.args_tail
                    + (self.dtype.type(alpha),))
        return out

    def residual(self, u, b, r):
        """``r <- b - A u``: at k = 1 one stencil pass reading ``b``; else a copy of ``b``
        and the cell kernel adding ``-A u`` into it."""
        if self.stencil is not None:
            return self.stencil.apply(u, r, -1.0, 1.0, z=b)
        r[...] = b
        return self.apply(u, r, -1.0, 1.0)


class GpuPatchSmoother:
    """Launcher of the fused smoothing kernel, one launch per colour.

    ``variant`` (3D only): "column" (``_SMOOTH3D``: a thread per output column,
    matrices in shared memory), "pencil" (``_SMOOTH3D_PENCIL``: a thread per
    1D pencil, matrices compiled in), "boundary" (``_SMOOTH3D_BOUNDARY``: the
    pencil form's local solve after a residual from the patch shell only,
    x^I <- A_j^{-1} (b^I - A^{IB} x^B), seed 000 §4.1.3) or "tuned" (the
    fastest of these per degree and precision, ``SMOOTH3D_TUNED``); default
    ``SMOOTH3D_VARIANT``.  At k = 1 (2D and 3D) the default is "stencil":
    the patch step is point Gauss-Seidel there, run by the one-thread-per-DoF
    kernel of :mod:`.stencil` (the patch forms stay available by name).
    ``minb``: the register cap as minimum resident blocks per SM (default from
    the tuning tables); ``unroll``: the Boundary form's unroll factor
    (``boundary_smoother_source``)."""

    def __init__(self, space, dtype, minb=None, variant=None, unroll=None):
        self.space = space
        self.dtype = np.dtype(dtype)
        cp = get_backend("gpu").xp
        self.cp = cp
        k = space.k
        self.stencil = None
        if variant == "stencil" and k != 1:
            raise ValueError(f"variant 'stencil' (point Gauss-Seidel) is the k = 1 patch step; "
                             f"got k = {k}")
        if k == 1 and variant in (None, "tuned", "stencil"):
            from .stencil import GpuQ1Stencil
            self.stencil = GpuQ1Stencil(space, self.dtype)
            self.variant, self.minb, self.unroll = "stencil", None, ""
            return
        if space.dim == 3:
            variant, minb, unroll = smoother_form(k, self.dtype, variant, minb, unroll)
        elif variant not in (None, "column"):
            raise ValueError(f"variant must be 'column' in 2D, got {variant!r}")
        else:
            variant, unroll = "column", ""
        self.variant = variant
        if variant in ("pencil", "boundary"):
            self.mats = None                      # compiled into the kernel
            self.kernel = _raw_kernel(variant, 3, k, self.dtype.str, minb, unroll)
        else:
            Mb, Ab, _, _ = patch_matrices(k)
            S, lam = patch_fast_diag(k)
            self.mats = cp.asarray(np.concatenate([Mb.ravel(), Ab.ravel(), S.ravel(), lam]),
                                   dtype=self.dtype)
            self.kernel = _raw_kernel("smooth", space.dim, k, self.dtype.str, minb)
        self.minb, self.unroll = minb, unroll
        self.ppb = patches_per_block(space.dim, k)
        self.block = ((2 * k + 1) ** 2, self.ppb)
        self.smem = smoother_smem_bytes(space.dim, k, self.dtype, variant)
        T = self.dtype.type
        self.cells = tuple(np.int32(n) for n in space.cells)
        self.coeffs = tuple(T(c) for c in space.coeffs)
        self.tail = ()
        if variant == "pencil":        # 1 / (c0 lam_a0 + c1 lam_a1 + c2 lam_a2), [a2][a1][a0]
            lam = patch_fast_diag(k)[1]
            self.tail = (cp.asarray(1.0 / eigenvalue_sums([lam] * 3, space.coeffs), dtype=self.dtype).ravel(),)

    def sweep(self, x, b, colors, reverse=False):
        """One sweep over ``colors`` (:func:`~.smoother.patch_colors`; ``reverse``:
        backwards) in place: at k = 1 the stencil's sweep (two colours a launch,
        :meth:`~.stencil.GpuQ1Stencil.sweep`), else one launch per colour."""
        if self.stencil is not None:
            self.stencil.sweep(x, b, reverse)
            return
        for col, cnt in (colors[::-1] if reverse else colors):
            self.color(x, b, col, cnt)

    def color(self, x, b, col, cnt):
        """One colour (parities ``col``, ``cnt`` patches per direction, x first) in place."""
        if self.stencil is not None:
            self.stencil.color(x, b, col, cnt)
            return
        npatch = int(np.prod(cnt))
        grid = ((npatch + self.ppb - 1) // self.ppb,)
        mats = () if self.mats is None else (self.mats,)
        args = (x, b) + mats + self.cells + tuple(np.int32(c) for c in col) \
            + tuple(np.int32(c) for c in cnt) + self.coeffs + self.tail
        self.kernel(grid, self.block, args, shared_mem=self.smem)


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


#: The axis kernel uses 32-bit index arithmetic up to this many output entries
#: plus grid stride (a test lowers it to run the 64-bit path on small vectors).
AXIS_INDEX32_LIMIT = 2 ** 31 - 1


def axis_source(dtype):
    T = _TYPES[np.dtype(dtype)]
    name = "f64" if T == "double" else "f32"
    return _fill(_AXIS, T=T, NAME=name), f"adaptmg_patch_axis_{name}"


@functools.lru_cache(maxsize=None)
def _axis_kernel(dtype_str):
    return _load(*axis_source(np.dtype(dtype_str)))


class GpuAxisMatrix:
    """A 1D sparse matrix (scipy CSR) in ELL form, applied along one axis of a
    C-ordered array without transposes: ``v[o, i, r] = sum_j M[i, j] u[o, j, r]``."""

    def __init__(self, M, dtype):
        cp = get_backend("gpu").xp
        cols, vals, width = ell_form(M)
        self.shape = M.shape
        self.width = width
        self.dtype = np.dtype(dtype)
        self.cols = cp.asarray(cols)
        self.vals = cp.asarray(vals, dtype=self.dtype)
        self.kernel = _axis_kernel(self.dtype.str)
        self.cp = cp

    def apply(self, U, ax, out=None, alpha=1.0, beta=0.0):
        """``M`` along axis ``ax`` of ``U``: a new array, or ``out <- alpha M U + beta
        out`` into ``out`` (an array of the result's size)."""
        sh = U.shape
        outer = int(np.prod(sh[:ax]))
        inner = int(np.prod(sh[ax + 1:]))
        out_shape = sh[:ax] + (self.shape[0],) + sh[ax + 1:]
        if out is None:
            V, beta = self.cp.empty(out_shape, dtype=self.dtype), 0.0
        else:
            V = out.reshape(out_shape)
        total = outer * self.shape[0] * inner
        threads = 256
        blocks = int(min((total + threads - 1) // threads, 132 * 64))
        T = self.dtype.type
        self.kernel((blocks,), (threads,), (U, V, self.cols, self.vals, np.int32(self.width),
                                             np.int64(outer), np.int32(self.shape[1]),
                                             np.int32(self.shape[0]), np.int64(inner),
                                             T(alpha), T(beta), np.int64(AXIS_INDEX32_LIMIT)))
        return V
