"""CUDA source of the fused CSR kernels (one template, ``{T}`` = ``double`` or ``float``).

Row kernels with ``tpr`` threads per row (1, or a power of two <= 32 with a shuffle
reduction): Jacobi sweeps (``adaptmg_csr_jacobi``, ``jacobi0``: from x = 0), Chebyshev
steps, residuals, SpMV, the smoothed restriction, the restricted residual, the
corrected Jacobi sweep, the row-compressed
block update (``csr_rows_add``: a distributed matrix's ghost columns), and the dense GEMV used under CUDA-graph capture.  Each kernel
reads the data no kernel of a graph writes before ``ADAPTMG_GRID_WAIT()``
(:mod:`adaptmg.device.pdl`).  Compiled and launched by :mod:`adaptmg.device.kernels`.
"""
from __future__ import annotations

_CSR_SRC = r"""
// Every kernel reads what no kernel of a graph writes (CSR structure and values, dinv)
// before ADAPTMG_GRID_WAIT() and the vectors after it (adaptmg.device.pdl): launched
// programmatically, those loads overlap the previous kernel's tail.
//
// The part of a row product that does not depend on the vector: this lane's entries
// [k, e) of the row (stride tpr).
struct adaptmg_row_{T} { int k, e; };
__device__ __forceinline__ adaptmg_row_{T} adaptmg_row_begin_{T}(
    const int row, const int lane, const int n, const int* __restrict__ indptr)
{
    adaptmg_row_{T} r = {0, 0};
    if (row < n) {
        r.k = indptr[row] + lane;
        r.e = indptr[row + 1];
    }
    return r;
}
// a thread of a kernel with tpr (1, 2, 4, ..., 32) threads per row: its row and lane, its
// row bounds and, in lane 0 and when dinv is given, the row's dinv (set-up data all)
struct adaptmg_lane_{T} { int row, lane; adaptmg_row_{T} r; {T} di; };
__device__ __forceinline__ adaptmg_lane_{T} adaptmg_lane_begin_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const {T}* __restrict__ dinv)
{
    adaptmg_lane_{T} t;
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    t.row = tid / tpr;
    t.lane = tid % tpr;
    t.r = adaptmg_row_begin_{T}(t.row, t.lane, n, indptr);
    t.di = (dinv != nullptr && t.row < n && t.lane == 0) ? dinv[t.row] : ({T})0;
    return t;
}
// sum over the lane's entries of data[k] x[indices[k]], in index order from 0
__device__ __forceinline__ {T} adaptmg_row_sum_{T}(
    const adaptmg_row_{T} r, const int tpr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x)
{
    {T} s = 0;
    for (int k = r.k; k < r.e; k += tpr) s += data[k] * x[indices[k]];
    return s;
}
// the shuffle reduction of the lanes' sums; every thread of the grid must call it (the
// shuffle needs the whole sub-warp); lane 0 gets the sum
__device__ __forceinline__ {T} adaptmg_lanes_sum_{T}({T} s, const int tpr)
{
    for (int off = tpr / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, tpr);
    return s;
}
__device__ __forceinline__ {T} adaptmg_row_dot_vec_{T}(
    const adaptmg_row_{T} r, const int tpr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x)
{
    return adaptmg_lanes_sum_{T}(adaptmg_row_sum_{T}(r, tpr, indices, data, x), tpr);
}
// y <- x + omega dinv (b - A x)   (y must not alias x)
extern "C" __global__ void adaptmg_csr_jacobi_{T}(
    const int n, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    const {T}* __restrict__ dinv, const {T} omega, {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, 1, indptr, dinv);
    ADAPTMG_GRID_WAIT();
    const int i = t.row;
    if (i < n) y[i] = x[i] + omega * t.di * (b[i] - adaptmg_row_sum_{T}(t.r, 1, indices, data, x));
}
extern "C" __global__ void adaptmg_csr_jacobi_vec_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    const {T}* __restrict__ dinv, const {T} omega, {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, indptr, dinv);
    ADAPTMG_GRID_WAIT();
    const {T} s = adaptmg_row_dot_vec_{T}(t.r, tpr, indices, data, x);
    if (t.row < n && t.lane == 0) y[t.row] = x[t.row] + omega * t.di * (b[t.row] - s);
}
// r <- b - A x
extern "C" __global__ void adaptmg_csr_residual_vec_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    {T}* __restrict__ r)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, indptr, nullptr);
    ADAPTMG_GRID_WAIT();
    const {T} s = adaptmg_row_dot_vec_{T}(t.r, tpr, indices, data, x);
    if (t.row < n && t.lane == 0) r[t.row] = b[t.row] - s;
}
extern "C" __global__ void adaptmg_csr_residual_{T}(
    const int n, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    {T}* __restrict__ r)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, 1, indptr, nullptr);
    ADAPTMG_GRID_WAIT();
    const int i = t.row;
    if (i < n) r[i] = b[i] - adaptmg_row_sum_{T}(t.r, 1, indices, data, x);
}
// one Chebyshev step: d <- c1 d + c2 dinv (b - A x); y <- x + d   (y must not alias x)
extern "C" __global__ void adaptmg_csr_chebyshev_{T}(
    const int n, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    const {T}* __restrict__ dinv, {T}* __restrict__ d, const {T} c1, const {T} c2,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, 1, indptr, dinv);
    ADAPTMG_GRID_WAIT();
    const int i = t.row;
    if (i < n) {
        {T} u = c1 * d[i] + c2 * t.di * (b[i] - adaptmg_row_sum_{T}(t.r, 1, indices, data, x));
        d[i] = u;
        y[i] = x[i] + u;
    }
}
extern "C" __global__ void adaptmg_csr_chebyshev_vec_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T}* __restrict__ b,
    const {T}* __restrict__ dinv, {T}* __restrict__ d, const {T} c1, const {T} c2,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, indptr, dinv);
    ADAPTMG_GRID_WAIT();
    const {T} s = adaptmg_row_dot_vec_{T}(t.r, tpr, indices, data, x);
    if (t.row < n && t.lane == 0) {
        {T} u = c1 * d[t.row] + c2 * t.di * (b[t.row] - s);
        d[t.row] = u;
        y[t.row] = x[t.row] + u;
    }
}
// y <- alpha A x + beta y (y is not read when beta == 0)
extern "C" __global__ void adaptmg_csr_spmv_vec_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T} alpha, const {T} beta,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, indptr, nullptr);
    ADAPTMG_GRID_WAIT();
    const {T} s = adaptmg_row_dot_vec_{T}(t.r, tpr, indices, data, x);
    if (t.row < n && t.lane == 0)
        y[t.row] = beta == ({T})0 ? alpha * s : alpha * s + beta * y[t.row];
}
// rows of a row-compressed CSR block (m rows, row i lands in out[grow[i]]):
// out[grow[i]] += alpha (dinv ? dinv[grow[i]] : 1) sum_k data[k] x[indices[k]]
// (a distributed matrix's ghost-column block: few rows, few entries each; one thread a row)
extern "C" __global__ void adaptmg_csr_rows_add_{T}(
    const int m, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const int* __restrict__ grow, const {T}* __restrict__ dinv,
    const {T} alpha, const {T}* __restrict__ x, {T}* __restrict__ out)
{
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    int k = 0, e = 0, r = 0;
    {T} c = alpha;
    if (i < m) {
        k = indptr[i];
        e = indptr[i + 1];
        r = grow[i];
        if (dinv != nullptr) c *= dinv[r];     // a per-row scale (set-up data)
    }
    ADAPTMG_GRID_WAIT();
    if (i < m) {
        {T} s = 0;
        for (; k < e; ++k) s += data[k] * x[indices[k]];
        out[r] += c * s;
    }
}
extern "C" __global__ void adaptmg_csr_spmv_{T}(
    const int n, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ x, const {T} alpha, const {T} beta,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, 1, indptr, nullptr);
    ADAPTMG_GRID_WAIT();
    const int i = t.row;
    if (i < n) {
        {T} s = adaptmg_row_sum_{T}(t.r, 1, indices, data, x);
        y[i] = beta == ({T})0 ? alpha * s : alpha * s + beta * y[i];
    }
}
// sum_j A_ij x0_j of row i with x0_j = omega dinv_j b_j formed on the fly (tpr threads per
// row as adaptmg_row_dot_vec; every thread of the grid must call it; lane 0 gets the sum)
__device__ __forceinline__ {T} adaptmg_row_dot_jacobi0_{T}(
    const adaptmg_row_{T} r, const int tpr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ b, const {T}* __restrict__ dinv,
    const {T} omega)
{
    {T} s = 0;
    for (int k = r.k; k < r.e; k += tpr) {
        const int j = indices[k];
        s += data[k] * (omega * dinv[j] * b[j]);
    }
    return adaptmg_lanes_sum_{T}(s, tpr);
}
// the first two Jacobi sweeps from x = 0 in one pass: x0_j = omega dinv_j b_j (not stored),
// y_i = x0_i + omega dinv_i (b_i - sum_j A_ij x0_j); tpr threads per row (1 allowed)
extern "C" __global__ void adaptmg_csr_jacobi0_vec_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ b, const {T}* __restrict__ dinv,
    const {T} omega, {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, indptr, dinv);
    ADAPTMG_GRID_WAIT();
    const {T} s = adaptmg_row_dot_jacobi0_{T}(t.r, tpr, indices, data, b, dinv, omega);
    if (t.row < n && t.lane == 0)
        y[t.row] = omega * t.di * b[t.row] + omega * t.di * (b[t.row] - s);
}
// pre-smoothing from x = 0 and the restriction of its residual in one launch.  Blocks
// [0, nbf): the first `sweeps` (1 or 2) damped Jacobi sweeps from zero over the n fine rows
// (tpr threads per row; the formulas of jacobi_zero / csr_jacobi0_vec); blocks [nbf, ...):
// c = S b over the m coarse rows (tc threads per row), S = R (I - A G) formed at set-up
// (G b = the smoothed y).  The two parts only read b: no ordering between them.
extern "C" __global__ void adaptmg_csr_smooth_restrict_{T}(
    const int n, const int tpr, const int sweeps, const int nbf, const int* __restrict__ ap,
    const int* __restrict__ ai, const {T}* __restrict__ ad, const {T}* __restrict__ b,
    const {T}* __restrict__ dinv, const {T} omega, {T}* __restrict__ y, const int m,
    const int tc, const int* __restrict__ sp, const int* __restrict__ si,
    const {T}* __restrict__ sd, {T}* __restrict__ c)
{
    if ((int)blockIdx.x < nbf) {           // block-uniform branches: shuffles see whole rows
        const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(sweeps == 2 ? n : 0, tpr, ap, nullptr);
        const {T} di = (t.row < n && t.lane == 0) ? dinv[t.row] : ({T})0;
        ADAPTMG_GRID_WAIT();
        if (sweeps == 2) {
            const {T} s = adaptmg_row_dot_jacobi0_{T}(t.r, tpr, ai, ad, b, dinv, omega);
            if (t.row < n && t.lane == 0)
                y[t.row] = omega * di * b[t.row] + omega * di * (b[t.row] - s);
        } else if (t.row < n && t.lane == 0) {
            y[t.row] = omega * di * b[t.row];
        }
    } else {
        const int tid = blockDim.x * (blockIdx.x - nbf) + threadIdx.x;
        const int row = tid / tc, lane = tid % tc;
        const adaptmg_row_{T} ri = adaptmg_row_begin_{T}(row, lane, m, sp);
        ADAPTMG_GRID_WAIT();
        const {T} s = adaptmg_row_dot_vec_{T}(ri, tc, si, sd, b);
        if (row < m && lane == 0) c[row] = s;
    }
}
// the restriction of a residual without forming it: y = R b - (R A) x over the coarse rows
extern "C" __global__ void adaptmg_csr_rres_vec_{T}(
    const int n, const int tpr, const int* __restrict__ rp, const int* __restrict__ ri,
    const {T}* __restrict__ rd, const int* __restrict__ qp, const int* __restrict__ qi,
    const {T}* __restrict__ qd, const {T}* __restrict__ b, const {T}* __restrict__ x,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, rp, nullptr);
    const adaptmg_row_{T} q = adaptmg_row_begin_{T}(t.row, t.lane, n, qp);
    ADAPTMG_GRID_WAIT();
    {T} s = adaptmg_row_sum_{T}(t.r, tpr, ri, rd, b);
    for (int k = q.k; k < q.e; k += tpr) s -= qd[k] * x[qi[k]];
    s = adaptmg_lanes_sum_{T}(s, tpr);
    if (t.row < n && t.lane == 0) y[t.row] = s;
}
// the coarse correction and one Jacobi sweep in one pass (y must not alias x):
// y = x + P e + omega dinv (b - A x - (A P) e)
extern "C" __global__ void adaptmg_csr_cjac_vec_{T}(
    const int n, const int tpr, const int* __restrict__ ap, const int* __restrict__ ai,
    const {T}* __restrict__ ad, const int* __restrict__ qp, const int* __restrict__ qi,
    const {T}* __restrict__ qd, const int* __restrict__ pp, const int* __restrict__ pi,
    const {T}* __restrict__ pd, const {T}* __restrict__ x, const {T}* __restrict__ e,
    const {T}* __restrict__ b, const {T}* __restrict__ dinv, const {T} omega,
    {T}* __restrict__ y)
{
    const adaptmg_lane_{T} t = adaptmg_lane_begin_{T}(n, tpr, ap, dinv);
    const adaptmg_row_{T} q = adaptmg_row_begin_{T}(t.row, t.lane, n, qp);
    const adaptmg_row_{T} p = adaptmg_row_begin_{T}(t.row, t.lane, n, pp);
    ADAPTMG_GRID_WAIT();
    {T} s = adaptmg_row_sum_{T}(t.r, tpr, ai, ad, x);
    for (int k = q.k; k < q.e; k += tpr) s += qd[k] * e[qi[k]];
    {T} c = adaptmg_row_sum_{T}(p, tpr, pi, pd, e);
    // both lane sums in one loop (not adaptmg_lanes_sum twice): their shuffles overlap
    for (int off = tpr / 2; off > 0; off >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, off, tpr);
        c += __shfl_down_sync(0xffffffffu, c, off, tpr);
    }
    if (t.row < n && t.lane == 0) y[t.row] = x[t.row] + c + omega * t.di * (b[t.row] - s);
}
extern "C" __global__ void adaptmg_dense_gemv_{T}(
    const int n, const int m, const {T}* __restrict__ M, const {T}* __restrict__ b,
    {T}* __restrict__ out)
{
    // one block per row of the row-major n x m matrix M; each thread keeps four
    // independent partial sums (four loads in flight), then a block reduction; the
    // first four entries of M are read before the grid wait
    __shared__ {T} sh[32];
    const int row = blockIdx.x, st = blockDim.x;
    const {T}* __restrict__ Mr = M + (size_t)row * m;
    int j = threadIdx.x;
    const bool first = j + 3 * st < m;
    {T} m0 = 0, m1 = 0, m2 = 0, m3 = 0;
    if (first) { m0 = Mr[j]; m1 = Mr[j + st]; m2 = Mr[j + 2 * st]; m3 = Mr[j + 3 * st]; }
    ADAPTMG_GRID_WAIT();
    {T} s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    if (first) {
        s0 += m0 * b[j];
        s1 += m1 * b[j + st];
        s2 += m2 * b[j + 2 * st];
        s3 += m3 * b[j + 3 * st];
        j += 4 * st;
    }
    for (; j + 3 * st < m; j += 4 * st) {
        s0 += Mr[j] * b[j];
        s1 += Mr[j + st] * b[j + st];
        s2 += Mr[j + 2 * st] * b[j + 2 * st];
        s3 += Mr[j + 3 * st] * b[j + 3 * st];
    }
    for (; j < m; j += st) s0 += Mr[j] * b[j];
    {T} s = (s0 + s1) + (s2 + s3);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sh[w] = s;
    __syncthreads();
    if (w == 0) {
        s = (l < (st >> 5)) ? sh[l] : ({T})0;
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
        if (l == 0) out[row] = s;
    }
}
"""

