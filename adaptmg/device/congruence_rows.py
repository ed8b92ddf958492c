r"""The constrained matrix :math:`K = Z H^T A H Z + s (I - Z)` in two row kernels (issue 36).

For a device CSR ``A``, the hanging-node matrix ``H`` (identity rows on the regular DoFs,
the parents' weights on the hanging ones) and its transpose, row ``p`` of
:math:`B = H^T A H` is

.. math::  B_{pq} = \sum_{i} (H^T)_{pi} \sum_{j} A_{ij} H_{jq} ,

the terms :math:`(H^T)_{pi} A_{ij} H_{jq}` of the rows ``i`` of :math:`H^T`'s row ``p`` (``p``
itself and the hanging DoFs it is a parent of), enumerated in a fixed order.  A free row
(``z[p]``) of ``K`` keeps the columns ``q`` that are free and whose sum is not zero; any other
row is the single diagonal entry ``s``, the mean of :math:`|B_{pp}|` over the free rows (1 when
that is zero).  One thread per row, the same terms in the same order in both kernels (so
both keep the same entries): the *count* kernel writes the row's entry count and
:math:`|B_{pp}|`, a running sum gives the row pointer, the *fill* kernel writes the row's
entries sorted by column: canonical CSR, no SpGEMM, no COO -> CSR sort.

A row's distinct columns and their sums are kept sorted in 64 slots of shared memory per
lane (blocks of 32 lanes, 24 KB; a binary search per term): in 2-D a Q1 row of B has <= 11
columns and a Q2 one <= 33, in 3-D Q1 <= 45 (from up to ~470 terms at a coarse vertex of a
refinement interface), in 3-D Q2 up to ~270 (a box with a refined ball).  A row past 64
columns is done term by term: a term is summed with the later ones of its column if no
earlier term has that column (quadratic in the terms; then the row's entries are sorted in
place).  Measured on an H200: the 2.66M-DoF 3-D adaptive mesh's finest constrained matrix
9 ms against 25-29 ms by two SpGEMMs (the quadratic search alone took 150 ms).  The sums run
in another order than SciPy's or cuSPARSE's products: the same matrix to rounding (an entry
that cancels may be dropped on one side and kept as a round-off-sized number on the other).

:class:`adaptmg.Constraints` calls them for spaces on a device mesh whose rows fit the slots
(2-D, and scalar Q1 in 3-D; a vector or Q2 row in 3-D has ~130-270 columns); they replace
there, where they apply (:func:`available`), the device path's two cuSPARSE SpGEMMs of
:func:`adaptmg.fe.congruence.congruence_by_products`, their ``H`` built from the hanging rows,
the diagonal's mean and :func:`~.index_kernels.constrained_csr`: ~60 CuPy calls and 4 reads of
the device a level become ~12 calls and one read.  The NumPy twin (host arrays, and the CPU
tests' stand-ins) is that path's formula through SciPy: :func:`twin`.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, in_host_memory, to_host

__all__ = ["constrained_congruence", "rows", "available", "twin", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_congruence_count", "adaptmg_congruence_fill")

_SRC = r"""
#define ADAPTMG_CONG_BLOCK 32
#define ADAPTMG_CONG_CAP 64
// the terms (column q, value) of row p of H^T A H in free columns, in a fixed order;
// fn returns false to stop early
template <class Fn>
__device__ __forceinline__ void adaptmg_cong_terms(
    long long p, const int* __restrict__ tp, const int* __restrict__ ti, const double* __restrict__ tv,
    const int* __restrict__ ap, const int* __restrict__ ai, const double* __restrict__ av,
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv,
    const bool* __restrict__ z, Fn fn)
{
    for (int t = tp[p]; t < tp[p + 1]; ++t) {
        const long long i = ti[t];
        const double wi = tv[t];
        for (int a = ap[i]; a < ap[i + 1]; ++a) {
            const long long j = ai[a];
            const double v = wi * av[a];
            for (int b = hp[j]; b < hp[j + 1]; ++b) {
                const long long q = hi[b];
                if (z[q] && !fn(q, v * hv[b])) return;
            }
        }
    }
}

#define ADAPTMG_CONG_ARGS tp, ti, tv, ap, ai, av, hp, hi, hv, z
#define ADAPTMG_CONG_PARAMS \
    long long n, const int* __restrict__ tp, const int* __restrict__ ti, const double* __restrict__ tv, \
    const int* __restrict__ ap, const int* __restrict__ ai, const double* __restrict__ av, \
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv, \
    const bool* __restrict__ z

// whether term k (column q) of row p is the first with its column; then *s is the column's sum
__device__ __forceinline__ bool adaptmg_cong_first(
    long long p, long long q, long long k, double* s,
    const int* __restrict__ tp, const int* __restrict__ ti, const double* __restrict__ tv,
    const int* __restrict__ ap, const int* __restrict__ ai, const double* __restrict__ av,
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv,
    const bool* __restrict__ z)
{
    long long m = 0;
    bool first = true;
    double acc = 0.0;
    adaptmg_cong_terms(p, ADAPTMG_CONG_ARGS, [&](long long c, double v) {
        if (c == q) {
            if (m < k) { first = false; return false; }
            acc += v;
        }
        ++m;
        return true;
    });
    *s = acc;
    return first;
}

// the row's distinct columns and their sums, sorted by column, in the thread's slots of the
// block's shared buffer (slot t of lane l at t * BLOCK + l); -1 past CAP columns
__device__ __forceinline__ int adaptmg_cong_buffer(
    long long p, int* __restrict__ sc, double* __restrict__ sv, int lane,
    const int* __restrict__ tp, const int* __restrict__ ti, const double* __restrict__ tv,
    const int* __restrict__ ap, const int* __restrict__ ai, const double* __restrict__ av,
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv,
    const bool* __restrict__ z)
{
    int u = 0;
    bool over = false;
    adaptmg_cong_terms(p, ADAPTMG_CONG_ARGS, [&](long long q, double v) {
        int lo = 0, hi = u;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (sc[mid * ADAPTMG_CONG_BLOCK + lane] < q) lo = mid + 1; else hi = mid;
        }
        if (lo < u && sc[lo * ADAPTMG_CONG_BLOCK + lane] == q) {
            sv[lo * ADAPTMG_CONG_BLOCK + lane] += v;
            return true;
        }
        if (u == ADAPTMG_CONG_CAP) { over = true; return false; }
        for (int t = u; t > lo; --t) {
            sc[t * ADAPTMG_CONG_BLOCK + lane] = sc[(t - 1) * ADAPTMG_CONG_BLOCK + lane];
            sv[t * ADAPTMG_CONG_BLOCK + lane] = sv[(t - 1) * ADAPTMG_CONG_BLOCK + lane];
        }
        sc[lo * ADAPTMG_CONG_BLOCK + lane] = (int)q;
        sv[lo * ADAPTMG_CONG_BLOCK + lane] = v;
        ++u;
        return true;
    });
    return over ? -1 : u;
}

extern "C" __global__ void adaptmg_congruence_count(ADAPTMG_CONG_PARAMS, long long* cnt, double* ad)
{
    __shared__ int sc[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK];
    __shared__ double sv[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK];
    const int lane = threadIdx.x;
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    if (!z[p]) { cnt[p] = 1; ad[p] = 0.0; return; }
    long long c = 0;
    double d = 0.0;
    const int u = adaptmg_cong_buffer(p, sc, sv, lane, ADAPTMG_CONG_ARGS);
    if (u >= 0) {
        for (int t = 0; t < u; ++t) {
            const double s = sv[t * ADAPTMG_CONG_BLOCK + lane];
            if (s != 0.0) ++c;
            if (sc[t * ADAPTMG_CONG_BLOCK + lane] == p) d = s;
        }
    } else {                                      // more than CAP columns: term by term
        long long k = 0;
        adaptmg_cong_terms(p, ADAPTMG_CONG_ARGS, [&](long long q, double v) {
            double s;
            if (adaptmg_cong_first(p, q, k, &s, ADAPTMG_CONG_ARGS)) {
                if (s != 0.0) ++c;
                if (q == p) d = s;
            }
            ++k;
            return true;
        });
    }
    cnt[p] = c;
    ad[p] = d < 0.0 ? -d : d;
}

extern "C" __global__ void adaptmg_congruence_fill(ADAPTMG_CONG_PARAMS, const int* __restrict__ ptr,
                                                   double scale, int* kcol, double* kval)
{
    __shared__ int sc[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK];
    __shared__ double sv[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK];
    const int lane = threadIdx.x;
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    const long long o0 = ptr[p];
    if (!z[p]) { kcol[o0] = (int)p; kval[o0] = scale; return; }
    long long o = o0;
    const int u = adaptmg_cong_buffer(p, sc, sv, lane, ADAPTMG_CONG_ARGS);
    if (u >= 0) {
        for (int t = 0; t < u; ++t) {
            const double s = sv[t * ADAPTMG_CONG_BLOCK + lane];
            if (s != 0.0) { kcol[o] = sc[t * ADAPTMG_CONG_BLOCK + lane]; kval[o] = s; ++o; }
        }
        return;
    }
    long long k = 0;                              // more than CAP columns: term by term
    adaptmg_cong_terms(p, ADAPTMG_CONG_ARGS, [&](long long q, double v) {
        double s;
        if (adaptmg_cong_first(p, q, k, &s, ADAPTMG_CONG_ARGS) && s != 0.0) {
            kcol[o] = (int)q; kval[o] = s; ++o;
        }
        ++k;
        return true;
    });
    for (long long a = o0 + 1; a < o; ++a) {             // the row's entries sorted by column
        const int c = kcol[a];
        const double v = kval[a];
        long long b = a - 1;
        while (b >= o0 && kcol[b] > c) { kcol[b + 1] = kcol[b]; kval[b + 1] = kval[b]; --b; }
        kcol[b + 1] = c;
        kval[b + 1] = v;
    }
}
"""

_BLOCK = 32            # ADAPTMG_CONG_BLOCK: one lane a row, CAP slots each in shared memory


@functools.lru_cache(maxsize=None)
def _module(xp):
    return xp.RawModule(code=_SRC)


def _int32_csr(M):
    return M.indptr.dtype == np.int32 and M.indices.dtype == np.int32


def available(A, H, HT) -> bool:
    """Whether the kernels take these matrices: device CSR, float64 values, int32 indices (what
    cupyx holds), ``H`` and ``HT`` square of ``A``'s size."""
    n = A.shape[0]
    return (not in_host_memory(A.data) and A.dtype == np.float64 and H.dtype == np.float64
            and HT.dtype == np.float64 and A.shape == H.shape == HT.shape == (n, n)
            and _int32_csr(A) and _int32_csr(H) and _int32_csr(HT))


def _launch(xp, name, n, args):
    if n:
        _module(xp).get_function(name)(((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,), (np.int64(n),) + args)


def constrained_congruence(A, H, HT, z):
    r"""``(K, s)``: :math:`K = Z H^T A H Z + s (I - Z)` (the module's formula) and the row
    scale ``s`` (a float), for CSR ``A`` (duplicates and unsorted columns are summed and sorted
    as any terms), the hanging-node matrix ``H``, its transpose ``HT`` (CSR) and the free mask
    ``z`` (bool, ``n``).  On the device (:func:`available`) two row kernels, a running sum and one
    read; otherwise :func:`twin`."""
    if tuple(z.shape) != (A.shape[0],):
        raise ValueError(f"constrained_congruence: the free mask has shape {tuple(z.shape)}, "
                         f"the matrix {A.shape[0]} rows")
    if in_host_memory(A.data):
        return twin(A, H, z)
    if not available(A, H, HT):
        raise ValueError("constrained_congruence: the kernels take device CSR matrices of float64 with int32 "
                         f"indices, all {A.shape[0]} x {A.shape[0]}; got A {A.dtype}/{A.indices.dtype}, "
                         f"H {H.dtype}/{H.indices.dtype} {H.shape}, HT {HT.dtype}/{HT.indices.dtype} {HT.shape}")
    be = backend_of(A.data)
    ptr, kcol, kval, s = rows(be.xp, (A.indptr, A.indices, A.data), (H.indptr, H.indices, H.data),
                              (HT.indptr, HT.indices, HT.data), z)
    n = A.shape[0]
    K = be.sparse.csr_matrix((kval, kcol, ptr), shape=(n, n))
    K.has_canonical_format = True
    return K, s


def rows(xp, A, H, HT, z):
    """The kernels' part of :func:`constrained_congruence` on the array module ``xp``, the
    matrices as ``(indptr, indices, data)`` triples (int32, int32, float64): ``(indptr,
    indices, data, s)`` of K (int32 / int32 / float64 arrays of ``xp``, ``s`` a float)."""
    n = int(A[0].shape[0]) - 1
    z = xp.ascontiguousarray(z, dtype=bool)
    args = tuple(HT) + tuple(A) + tuple(H) + (z,)
    cnt, ad = xp.empty(n, dtype=np.int64), xp.empty(n, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_count", n, args + (cnt, ad))
    ptr = xp.zeros(n + 1, dtype=np.int64)
    ptr[1:] = xp.cumsum(cnt)
    # one read: the entry count, the sum of |B_pp| over the free rows and their number
    nnz, dsum, nfree = (to_host(xp.stack([ptr[-1].astype(np.float64), ad.sum(), z.sum().astype(np.float64)]))
                        if n else (0.0, 0.0, 0.0))
    nnz, nfree = int(nnz), int(nfree)
    if nnz >= 2 ** 31:
        raise ValueError(f"constrained_congruence: {nnz} entries exceed the int32 indices of cupyx")
    mean = float(dsum) / nfree if nfree else 0.0
    s = mean if mean > 0 else 1.0
    ptr32 = ptr.astype(np.int32)
    kcol, kval = xp.empty(nnz, dtype=np.int32), xp.empty(nnz, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_fill", n, args + (ptr32, np.float64(s), kcol, kval))
    return ptr32, kcol, kval, s


def twin(A, H, z):
    """The host formula of :func:`constrained_congruence`: ``H^T (A H)`` by SciPy products,
    ``s`` from its diagonal and ``Z B Z + s (I - Z)`` by masking (zeros dropped); SciPy CSR."""
    A, H = sp.csr_matrix(A), sp.csr_matrix(H)
    z = np.asarray(z, dtype=bool)
    B = (H.T @ (A @ H)).tocsr()
    B.sum_duplicates()
    d = np.abs(B.diagonal()[z])
    mean = float(d.mean()) if d.size else 0.0
    s = mean if mean > 0 else 1.0
    C = B.tocoo()
    keep = z[C.row] & z[C.col] & (C.data != 0)
    fixed = np.flatnonzero(~z)
    K = sp.coo_matrix((np.concatenate([C.data[keep], np.full(fixed.size, s)]),
                       (np.concatenate([C.row[keep], fixed]), np.concatenate([C.col[keep], fixed]))),
                      shape=A.shape).tocsr()
    K.sum_duplicates()
    return K, s
