"""CUDA sources of the vertex-patch smoother in *pencil* and *Boundary* form (3D).

``adaptmg_patch_smooth3dp`` -- the colour step of :mod:`.cuda_column` in pencil
form (the 3D default for k <= 4, 5 in fp32): every stage is a batch of 1D
contractions along one axis, one thread per pencil with the pencil in
registers and the 1D matrices compiled in as ``__constant__`` arrays (uniform
FMA operands), shared memory only between stages.  Same sums in the same
order, except that the local solve multiplies by a per-level table of the
reciprocal eigenvalue sums instead of dividing; NOTES.md has the figures.

``adaptmg_patch_smooth3db`` -- the *Boundary* form (seed 000 §4.1.3, the 3D
default for larger k): an exact local solve lets the step set
x^I <- A_j^{-1} (b^I - A^{IB} x^B), so only the patch shell is loaded and
the residual, split by eq. (4.2) into the z-, y- and x-face groups, costs
O(k^3) instead of O(k^4) per patch; the local solve is the pencil form's.

Launched by :class:`.kernels.GpuPatchSmoother` (``variant``).
"""
from __future__ import annotations

import numpy as np

from .cuda_build import _TYPES, _fill, _literals
from .cuda_column import _with_patch_load, patches_per_block
from .tensor import patch_fast_diag, patch_matrices

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

