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

Some rows only (``rows=``): the kernels run one thread per asked row, reading that row of
:math:`H^T` from an ``m x n`` matrix of just those rows, and the row scale comes from the
caller's ``scale(dsum, nfree)`` between the count and the fill.  :mod:`adaptmg.distributed.local`
builds a rank's owned rows so, from the matrix of its needed cells (no :math:`H^T A H` of the
whole local matrix, the scale one ``Allreduce``): measured on two H200 at 19M DoFs per rank,
the local levels' matrix phase 0.60 -> 0.48 s.

Split rows (:func:`constrained_split_rows`, :func:`kernel_split_rows`): for a distributed
matrix the count kernel also counts a row's columns owned elsewhere (``loc[q] < 0`` in the
layout's table of local indices) and a fill variant writes the row's owned entries (local
columns) and its ghost entries (global columns) into two arrays, each part sorted -- what
:func:`~.index_kernels.owned_ghost_rows` makes of the plain rows, without writing and reading
them again (two H200, 21M DoFs a rank: that split of the finest level took 11 ms).
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, csr_from_arrays, in_host_memory, to_host
from .index_kernels import owned_ghost_rows

__all__ = ["constrained_congruence", "constrained_split_rows", "kernel_rows", "kernel_split_rows", "available",
           "fits", "twin", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_congruence_count", "adaptmg_congruence_fill", "adaptmg_congruence_count_split",
                "adaptmg_congruence_fill_split")

_SRC = r"""
#define ADAPTMG_CONG_BLOCK 32
#define ADAPTMG_CONG_CAP 64
#define ADAPTMG_CONG_DECL \
    const int* __restrict__ tp, const int* __restrict__ ti, const double* __restrict__ tv, \
    const int* __restrict__ ap, const int* __restrict__ ai, const double* __restrict__ av, \
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv, \
    const bool* __restrict__ z
#define ADAPTMG_CONG_ARGS tp, ti, tv, ap, ai, av, hp, hi, hv, z
// the terms (column q, value) in free columns of the output row r -- (H^T)_{pi} A_ij H_jq over
// the entries (i, (H^T)_{pi}) of row r of tp/ti/tv --, in a fixed order; fn returns false to stop
template <class Fn>
__device__ __forceinline__ void adaptmg_cong_terms(long long r, ADAPTMG_CONG_DECL, Fn fn)
{
    for (int t = tp[r]; t < tp[r + 1]; ++t) {
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

// n output rows; output row r is row rmap[r] of K when mapped (else row r), its terms row r of tp/ti/tv
#define ADAPTMG_CONG_PARAMS \
    long long n, const long long* __restrict__ rmap, int mapped, ADAPTMG_CONG_DECL
// a kernel's thread: its output row r (none past n), K's row p of it, the lane and the block's
// shared column slots
#define ADAPTMG_CONG_ROW \
    __shared__ int sc[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK]; \
    __shared__ double sv[ADAPTMG_CONG_CAP * ADAPTMG_CONG_BLOCK]; \
    const int lane = threadIdx.x; \
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; \
    if (r >= n) return; \
    const long long p = mapped ? rmap[r] : r;

// whether term k (column q) of row r is the first with its column; then *s is the column's sum
__device__ __forceinline__ bool adaptmg_cong_first(long long r, long long q, long long k, double* s,
                                                   ADAPTMG_CONG_DECL)
{
    long long m = 0;
    bool first = true;
    double acc = 0.0;
    adaptmg_cong_terms(r, ADAPTMG_CONG_ARGS, [&](long long c, double v) {
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
__device__ __forceinline__ int adaptmg_cong_buffer(long long r, int* __restrict__ sc, double* __restrict__ sv,
                                                   int lane, ADAPTMG_CONG_DECL)
{
    int u = 0;
    bool over = false;
    adaptmg_cong_terms(r, ADAPTMG_CONG_ARGS, [&](long long q, double v) {
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

// fn(q, s) for each distinct free column q of row r and its sum s (zero sums too): sorted by
// column from the slots (returns true), or past CAP columns term by term, in the order of the
// columns' first terms (returns false; quadratic in the row's terms)
template <class Fn>
__device__ __forceinline__ bool adaptmg_cong_columns(long long r, int* __restrict__ sc, double* __restrict__ sv,
                                                     int lane, ADAPTMG_CONG_DECL, Fn fn)
{
    const int u = adaptmg_cong_buffer(r, sc, sv, lane, ADAPTMG_CONG_ARGS);
    if (u >= 0) {
        for (int t = 0; t < u; ++t)
            fn((long long)sc[t * ADAPTMG_CONG_BLOCK + lane], sv[t * ADAPTMG_CONG_BLOCK + lane]);
        return true;
    }
    long long k = 0;
    adaptmg_cong_terms(r, ADAPTMG_CONG_ARGS, [&](long long q, double v) {
        double s;
        if (adaptmg_cong_first(r, q, k, &s, ADAPTMG_CONG_ARGS)) fn(q, s);
        ++k;
        return true;
    });
    return false;
}

extern "C" __global__ void adaptmg_congruence_count(ADAPTMG_CONG_PARAMS, long long* cnt, double* ad)
{
    ADAPTMG_CONG_ROW
    if (!z[p]) { cnt[r] = 1; ad[r] = 0.0; return; }
    long long c = 0;
    double d = 0.0;
    adaptmg_cong_columns(r, sc, sv, lane, ADAPTMG_CONG_ARGS, [&](long long q, double s) {
        if (s != 0.0) ++c;
        if (q == p) d = s;
    });
    cnt[r] = c;
    ad[r] = d < 0.0 ? -d : d;
}

// the entries [a0, a1) of a row sorted by column (insertion sort: the rows past CAP columns)
template <class C>
__device__ __forceinline__ void adaptmg_cong_sort(C* __restrict__ col, double* __restrict__ val,
                                                  long long a0, long long a1)
{
    for (long long a = a0 + 1; a < a1; ++a) {
        const C c = col[a];
        const double v = val[a];
        long long b = a - 1;
        while (b >= a0 && col[b] > c) { col[b + 1] = col[b]; val[b + 1] = val[b]; --b; }
        col[b + 1] = c;
        val[b + 1] = v;
    }
}

extern "C" __global__ void adaptmg_congruence_fill(ADAPTMG_CONG_PARAMS, const int* __restrict__ ptr,
                                                   double scale, int* kcol, double* kval)
{
    ADAPTMG_CONG_ROW
    const long long o0 = ptr[r];
    if (!z[p]) { kcol[o0] = (int)p; kval[o0] = scale; return; }
    long long o = o0;
    const bool sorted = adaptmg_cong_columns(r, sc, sv, lane, ADAPTMG_CONG_ARGS, [&](long long q, double s) {
        if (s != 0.0) { kcol[o] = (int)q; kval[o] = s; ++o; }
    });
    if (!sorted) adaptmg_cong_sort(kcol, kval, o0, o);
}

// the rows split as a distributed matrix keeps them: loc[q] the local column of an owned
// column q (-1: a ghost, kept by its global number); the count kernel also counts the ghosts
extern "C" __global__ void adaptmg_congruence_count_split(ADAPTMG_CONG_PARAMS, const int* __restrict__ loc,
                                                          long long* cnt, long long* gcnt, double* ad)
{
    ADAPTMG_CONG_ROW
    if (!z[p]) { cnt[r] = 1; gcnt[r] = loc[p] < 0 ? 1 : 0; ad[r] = 0.0; return; }
    long long c = 0, g = 0;
    double d = 0.0;
    adaptmg_cong_columns(r, sc, sv, lane, ADAPTMG_CONG_ARGS, [&](long long q, double s) {
        if (s != 0.0) { ++c; if (loc[q] < 0) ++g; }
        if (q == p) d = s;
    });
    cnt[r] = c;
    gcnt[r] = g;
    ad[r] = d < 0.0 ? -d : d;
}

// owned entries (local columns) from optr[r] = ptr[r] - gptr[r], ghost entries (global
// columns) from gptr[r], each part sorted by column
extern "C" __global__ void adaptmg_congruence_fill_split(ADAPTMG_CONG_PARAMS, const long long* __restrict__ ptr,
                                                         const long long* __restrict__ gptr, double scale,
                                                         const int* __restrict__ loc, int* ocol, double* oval,
                                                         long long* gcol, double* gval)
{
    ADAPTMG_CONG_ROW
    const long long g0 = gptr[r], o0 = ptr[r] - g0;
    long long o = o0, g = g0;
    auto put = [&](long long q, double s) {
        const int l = loc[q];
        if (l >= 0) { ocol[o] = l; oval[o] = s; ++o; }
        else { gcol[g] = q; gval[g] = s; ++g; }
    };
    if (!z[p]) { put(p, scale); return; }
    const bool sorted = adaptmg_cong_columns(r, sc, sv, lane, ADAPTMG_CONG_ARGS, [&](long long q, double s) {
        if (s != 0.0) put(q, s);
    });
    if (sorted) return;
    adaptmg_cong_sort(ocol, oval, o0, o);
    adaptmg_cong_sort(gcol, gval, g0, g);
}
"""

_BLOCK = 32            # ADAPTMG_CONG_BLOCK: one lane a row, CAP slots each in shared memory


@functools.lru_cache(maxsize=None)
def _module(xp):
    return xp.RawModule(code=_SRC)


def fits(space) -> bool:
    """Whether the rows of ``space``'s :math:`H^T A H` fit the kernels' 64 column slots: 2-D
    (Q1 <= 11 columns a node row, Q2 <= 33) and 3-D scalar Q1 (<= 45).  3-D Q2 and vector rows
    reach ~130-270 columns, whose term-by-term path is quadratic in hundreds to thousands of
    terms: callers keep the SpGEMM products for them."""
    return space.dim == 2 or (space.degree == 1 and space.components == 1)


def _int32_csr(M):
    return M.indptr.dtype == np.int32 and M.indices.dtype == np.int32


def available(A, H, HT, rows=None) -> bool:
    """Whether the kernels take these matrices: device CSR, float64 values, int32 indices (what
    cupyx holds), ``A`` square (``n x n``), ``H`` ``n x k``, ``HT`` ``k x n`` (``len(rows) x n``
    with ``rows``)."""
    n, k = A.shape[0], H.shape[1]
    m = k if rows is None else int(rows.shape[0])
    return (not in_host_memory(A.data) and A.dtype == np.float64 and H.dtype == np.float64
            and HT.dtype == np.float64 and A.shape == (n, n) and H.shape == (n, k) and HT.shape == (m, n)
            and _int32_csr(A) and _int32_csr(H) and _int32_csr(HT))


def _launch(xp, name, n, args):
    if n:
        _module(xp).get_function(name)(((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,), (np.int64(n),) + args)


def _default_scale(dsum, nfree):
    """The row scale from the sum of :math:`|B_{pp}|` over ``nfree`` free rows: their mean, 1
    when that is zero (or there is no free row)."""
    mean = float(dsum) / nfree if nfree else 0.0
    return mean if mean > 0 else 1.0


def _check_shapes(A, H, HT, z, rows):
    """``(m, k)``, the output's rows and columns, after the shape checks of the arguments of
    :func:`constrained_congruence`."""
    n, k = A.shape[0], H.shape[1]
    if tuple(z.shape) != (k,):
        raise ValueError(f"constrained_congruence: the free mask has shape {tuple(z.shape)}, "
                         f"H has {k} columns")
    m = k if rows is None else int(rows.shape[0])
    if tuple(HT.shape) != (m, n):
        raise ValueError(f"constrained_congruence: H^T has shape {tuple(HT.shape)}, expected {(m, n)} "
                         f"({'the rows asked for' if rows is not None else 'all rows'})")
    return m, k


def _require_kernels(A, H, HT, rows):
    """A ValueError unless the kernels take these device matrices (:func:`available`)."""
    if not available(A, H, HT, rows):
        raise ValueError("constrained_congruence: the kernels take device CSR matrices of float64 with int32 "
                         f"indices, A n x n, H n x k, H^T k x n; got A {A.dtype}/{A.indices.dtype} {A.shape}, "
                         f"H {H.dtype}/{H.indices.dtype} {H.shape}, HT {HT.dtype}/{HT.indices.dtype} {HT.shape}")


def constrained_congruence(A, H, HT, z, rows=None, scale=None):
    r"""``(K, s)``: :math:`K = Z H^T A H Z + s (I - Z)` (the module's formula) and the row
    scale ``s`` (a float), for CSR ``A`` (duplicates and unsorted columns are summed and sorted
    as any terms), the hanging-node matrix ``H``, its transpose ``HT`` (CSR) and the free mask
    ``z`` (bool, ``n``).  On the device (:func:`available`) two row kernels, a running sum and one
    read; otherwise :func:`twin`.

    ``rows`` (distinct DoFs, ``m`` of them): only those rows of ``K`` (``m x n``, row ``k`` is
    row ``rows[k]``), ``HT`` then holding just the rows ``rows`` of :math:`H^T` (``m x n``;
    the rows of non-free DoFs may be empty) -- a rank's owned rows in :mod:`adaptmg.distributed`.
    ``scale(dsum, nfree)``: ``s`` from the sum of :math:`|B_{pp}|` over the ``nfree`` free rows
    among them (default: their mean, 1 when zero; a distributed caller reduces over its ranks).

    ``H`` may be rectangular, ``n x k`` (an expansion into ``k`` other unknowns, e.g. a rank's
    local nodes into the global ones they reach, :mod:`adaptmg.distributed.forest_rows`): then
    ``HT`` is ``k x n`` (``len(rows) x n``), ``z`` has ``k`` entries and ``K`` is ``k x k``
    (``len(rows) x k``)."""
    m, k = _check_shapes(A, H, HT, z, rows)
    if in_host_memory(A.data):
        return twin(A, H, z, rows=rows, scale=scale)
    _require_kernels(A, H, HT, rows)
    be = backend_of(A.data)
    ptr, kcol, kval, s = kernel_rows(be.xp, (A.indptr, A.indices, A.data), (H.indptr, H.indices, H.data),
                                     (HT.indptr, HT.indices, HT.data), z, rows, scale)
    K = csr_from_arrays(be.sparse, kval, kcol, ptr, (m, k))
    K.has_canonical_format = True
    return K, s


def constrained_split_rows(A, H, HT, z, local, rows=None, scale=None):
    """``(parts, s)``: the rows of :func:`constrained_congruence` (the same arguments) split into
    the owned and the ghost columns of a distributed matrix, ``parts = (optr, ocol, oval, gptr,
    gcol, gval)`` as :func:`~.index_kernels.owned_ghost_rows` returns them for ``local`` (the
    local index of every column of K, -1 for a column owned elsewhere; int32 on the device).
    On the device the fill kernel writes the two parts (:func:`kernel_split_rows`); otherwise
    :func:`twin`, then ``owned_ghost_rows``."""
    _, k = _check_shapes(A, H, HT, z, rows)
    if tuple(local.shape) != (k,):
        raise ValueError(f"constrained_split_rows: the local table has shape {tuple(local.shape)}, "
                         f"K has {k} columns")
    if in_host_memory(A.data):
        K, s = twin(A, H, z, rows=rows, scale=scale)
        return owned_ghost_rows(K.indptr, K.indices, K.data, np.asarray(local)), s
    if local.dtype != np.int32:
        raise ValueError(f"constrained_split_rows: the kernels take an int32 local table, got {local.dtype}")
    _require_kernels(A, H, HT, rows)
    be = backend_of(A.data)
    return kernel_split_rows(be.xp, (A.indptr, A.indices, A.data), (H.indptr, H.indices, H.data),
                             (HT.indptr, HT.indices, HT.data), z, local, rows, scale)


def _args(xp, A, H, HT, z, rows):
    """The kernels' leading arguments and the free mask of the output rows."""
    z = xp.ascontiguousarray(z, dtype=bool)
    mapped = rows is not None
    rmap = xp.ascontiguousarray(rows, dtype=np.int64) if mapped else xp.zeros(1, dtype=np.int64)
    return (rmap, np.int32(mapped)) + tuple(HT) + tuple(A) + tuple(H) + (z,), (z[rmap] if mapped else z)


def _sums(xp, ends, ad, zr, scale):
    """One read after the count: the last entries of the running sums ``ends`` (entry counts),
    the sum of |B_pp| over the free rows and their number; returns the counts (ints) and the
    row scale ``s`` from ``scale(dsum, nfree)`` (default its mean, 1 when zero)."""
    m = int(ad.shape[0])
    vals = (to_host(xp.stack([e[-1].astype(np.float64) for e in ends]
                             + [ad.sum(), zr.sum().astype(np.float64)])) if m
            else np.zeros(len(ends) + 2))
    counts = [int(v) for v in vals[:len(ends)]]
    dsum, nfree = float(vals[-2]), int(vals[-1])
    return counts, (scale or _default_scale)(dsum, nfree)


def kernel_rows(xp, A, H, HT, z, rows=None, scale=None):
    """The kernels' part of :func:`constrained_congruence` on the array module ``xp``, the
    matrices as ``(indptr, indices, data)`` triples (int32, int32, float64): ``(indptr,
    indices, data, s)`` of K's rows (int32 / int32 / float64 arrays of ``xp``, ``s`` a float)."""
    m = int(HT[0].shape[0]) - 1
    args, zr = _args(xp, A, H, HT, z, rows)
    cnt, ad = xp.empty(m, dtype=np.int64), xp.empty(m, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_count", m, args + (cnt, ad))
    ptr = xp.zeros(m + 1, dtype=np.int64)
    ptr[1:] = xp.cumsum(cnt)
    (nnz,), s = _sums(xp, [ptr], ad, zr, scale)
    if nnz >= 2 ** 31:
        raise ValueError(f"constrained_congruence: {nnz} entries exceed the int32 indices of cupyx")
    ptr32 = ptr.astype(np.int32)
    kcol, kval = xp.empty(nnz, dtype=np.int32), xp.empty(nnz, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_fill", m, args + (ptr32, np.float64(s), kcol, kval))
    return ptr32, kcol, kval, s


def kernel_split_rows(xp, A, H, HT, z, local, rows=None, scale=None):
    """:func:`kernel_rows` with K's rows split as :class:`adaptmg.distributed.csr.DistCSR` keeps
    them (the owned / ghost split of :func:`~.index_kernels.owned_ghost_rows`, written by the
    fill kernel itself: no second pass over K): ``local`` (int32, one entry a column of K) the
    local index of an owned column, -1 for a ghost.  Returns ``((optr, ocol, oval, gptr, gcol,
    gval), s)``: row pointers int64, owned columns int32 (local), ghost columns int64 (global),
    each part of a row sorted by column -- what ``owned_ghost_rows`` returns for
    :func:`kernel_rows`' K, entry for entry (the same sums, moved)."""
    m = int(HT[0].shape[0]) - 1
    args, zr = _args(xp, A, H, HT, z, rows)
    loc = xp.ascontiguousarray(local)
    cnt, gcnt, ad = xp.empty(m, dtype=np.int64), xp.empty(m, dtype=np.int64), xp.empty(m, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_count_split", m, args + (loc, cnt, gcnt, ad))
    ptr, gptr = xp.zeros(m + 1, dtype=np.int64), xp.zeros(m + 1, dtype=np.int64)
    ptr[1:] = xp.cumsum(cnt)
    gptr[1:] = xp.cumsum(gcnt)
    (nnz, ng), s = _sums(xp, [ptr, gptr], ad, zr, scale)
    ocol, oval = xp.empty(nnz - ng, dtype=np.int32), xp.empty(nnz - ng, dtype=np.float64)
    gcol, gval = xp.empty(ng, dtype=np.int64), xp.empty(ng, dtype=np.float64)
    _launch(xp, "adaptmg_congruence_fill_split", m, args + (ptr, gptr, np.float64(s), loc, ocol, oval, gcol, gval))
    return (ptr - gptr, ocol, oval, gptr, gcol, gval), s


def twin(A, H, z, rows=None, scale=None):
    """The host formula of :func:`constrained_congruence`: ``H^T (A H)`` by SciPy products,
    ``s`` from its diagonal and ``Z B Z + s (I - Z)`` by masking (zeros dropped); SciPy CSR
    (the rows ``rows`` of it with ``rows``)."""
    A, H = sp.csr_matrix(A), sp.csr_matrix(H)
    z = np.asarray(z, dtype=bool)
    B = (H.T @ (A @ H)).tocsr()
    B.sum_duplicates()
    r = np.arange(H.shape[1]) if rows is None else np.asarray(to_host(rows), dtype=np.int64)
    zr = z[r]
    s = (scale or _default_scale)(float(np.abs(B.diagonal()[r][zr]).sum()), int(zr.sum()))
    C = B[r].tocoo()
    keep = zr[C.row] & z[C.col] & (C.data != 0)
    fixed = np.flatnonzero(~zr)
    K = sp.coo_matrix((np.concatenate([C.data[keep], np.full(fixed.size, s)]),
                       (np.concatenate([C.row[keep], fixed]), np.concatenate([C.col[keep], r[fixed]]))),
                      shape=(r.size, H.shape[1])).tocsr()
    K.sum_duplicates()
    return K, s
