r"""The rows of the Q1 embedding whose coarse parents hang, expanded through H, in two node
kernels (issue 36).

:func:`adaptmg.multilevel.transfer._q1_forest_csr` builds :math:`P = Z_f \chi H_c Z_c` between
two meshes of one forest: fine node ``i`` of kind ``k`` has :math:`2^k` coarse parents, each with
weight :math:`2^{-k}`, whose column codes (:func:`~.index_kernels.q1_forest_rows`, sorted) are
the coarse node (kept), ``ncn`` (masked out) or ``ncn + 1 + h`` for a coarse *hanging* node
``h``.  A row with a hanging parent is :math:`\sum_j 2^{-k} (H_c)_{h_j \cdot}`:

.. math::  P_{iq} = \sum_{j:\, c_j < ncn} 2^{-k} [q = c_j]
           + \sum_{j:\, c_j > ncn} 2^{-k} \sum_b (H_c)_{h_j q_b} [q = q_b]\, z_c(q_b) ,

at most :math:`2^d \cdot 4` terms in a few distinct columns.  One thread per fine node: the
*count* kernel writes the number of distinct columns of a row with a hanging parent (``hang``;
the other rows' counts stay as they are); after the running sum of the counts, the *fill*
kernel writes such a row's entries (a column's sum taken at its first term, the later terms of
that column added in their order), sorted by column, for each of the ``c`` components
(entry ``j`` of DoF row ``i c + r`` at ``c ip_i + r cnt_i + j``, column ``c q + r``).  The
weights are positive dyadic numbers (:math:`2^{-k}` times Q1 hanging weights 1/2, 1/4), so
every sum is exact and no entry cancels: the matrix equals the host's bit for bit.

They replace, on the device, :func:`~adaptmg.multilevel.transfer._hanging_parent_rows` (the
hanging rows of H gathered, every parent expanded, COO -> CSR) and the scatter of its rows:
~100 CuPy calls a level become two launches.  On host arrays that path is the twin.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import in_host_memory, is_device_sparse

__all__ = ["available", "count", "fill", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_forest_hang_count", "adaptmg_forest_hang_fill")

_SRC = r"""
// the terms (coarse column q, weight) of fine row i, in a fixed order
template <class Fn>
__device__ __forceinline__ void adaptmg_fh_terms(
    long long i, int W, const int* __restrict__ codes, long long ncn, double w,
    const int* __restrict__ hp, const int* __restrict__ hi, const double* __restrict__ hv,
    const bool* __restrict__ cfree, int use_free, Fn fn)
{
    for (int j = 0; j < W; ++j) {
        const long long code = codes[i * W + j];
        if (code == ncn) continue;                          // masked out
        if (code < ncn) { fn(code, w); continue; }
        const long long h = code - (ncn + 1);               // a hanging coarse node: its parents
        for (int b = hp[h]; b < hp[h + 1]; ++b) {
            const long long q = hi[b];
            if (!use_free || cfree[q]) fn(q, w * hv[b]);
        }
    }
}

#define ADAPTMG_FH_PARAMS \
    long long n, int W, const int* __restrict__ codes, const signed char* __restrict__ kind, \
    const bool* __restrict__ hang, long long ncn, const int* __restrict__ hp, \
    const int* __restrict__ hi, const double* __restrict__ hv, const bool* __restrict__ cfree, int use_free
#define ADAPTMG_FH_ARGS i, W, codes, ncn, w, hp, hi, hv, cfree, use_free

extern "C" __global__ void adaptmg_forest_hang_count(ADAPTMG_FH_PARAMS, long long* cnt)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !hang[i]) return;
    const double w = 1.0 / (double)(1 << (int)kind[i]);         // 2^-k, exact
    long long k = 0, c = 0;
    adaptmg_fh_terms(ADAPTMG_FH_ARGS, [&](long long q, double) {
        long long m = 0;
        bool first = true;
        adaptmg_fh_terms(ADAPTMG_FH_ARGS, [&](long long q2, double) {
            if (m < k && q2 == q) first = false;
            ++m;
        });
        if (first) ++c;
        ++k;
    });
    cnt[i] = c;
}

extern "C" __global__ void adaptmg_forest_hang_fill(ADAPTMG_FH_PARAMS, const long long* __restrict__ cnt,
                                                    const long long* __restrict__ ip, int c,
                                                    int* indices, double* data)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !hang[i]) return;
    const double w = 1.0 / (double)(1 << (int)kind[i]);         // 2^-k, exact
    const long long o = ip[i] * c, len = cnt[i];
    long long k = 0, e = 0;
    adaptmg_fh_terms(ADAPTMG_FH_ARGS, [&](long long q, double) {
        long long m = 0;
        bool first = true;
        double s = 0.0;
        adaptmg_fh_terms(ADAPTMG_FH_ARGS, [&](long long q2, double v2) {
            if (q2 == q) { if (m < k) first = false; else s += v2; }
            ++m;
        });
        if (first) {                                        // inserted in column order
            long long b = e;
            while (b > 0 && (long long)indices[o + b - 1] > q * c) {
                indices[o + b] = indices[o + b - 1]; data[o + b] = data[o + b - 1]; --b;
            }
            indices[o + b] = (int)(q * c); data[o + b] = s; ++e;
        }
        ++k;
    });
    for (int r = 1; r < c; ++r)                             // the other components' copies
        for (long long j = 0; j < len; ++j) {
            indices[o + r * len + j] = indices[o + j] + r;
            data[o + r * len + j] = data[o + j];
        }
}
"""

_BLOCK = 128


@functools.lru_cache(maxsize=None)
def _module(xp):
    return xp.RawModule(code=_SRC)


def available(H, codes) -> bool:
    """Whether the kernels take these arrays: the coarse ``H`` a device CSR of float64 with
    int32 indices and device ``codes`` of int32 (the output indices must be int32 too)."""
    return (is_device_sparse(H) and not in_host_memory(codes) and H.dtype == np.float64
            and H.indptr.dtype == np.int32 and H.indices.dtype == np.int32 and codes.dtype == np.int32)


def _args(xp, codes, kind, hang, H, cfree, ncn):
    n, W = int(codes.shape[0]), int(codes.shape[1])
    use = cfree is not None
    # raw pointers: a strided mask (a component's column of a DoF mask) made contiguous
    cf = xp.ascontiguousarray(cfree, dtype=bool) if use else xp.zeros(1, dtype=bool)
    codes = xp.ascontiguousarray(codes)
    return n, (np.int64(n), np.int32(W), codes, kind, hang, np.int64(ncn), H.indptr, H.indices, H.data,
               cf, np.int32(use))


def _launch(xp, name, n, args):
    if n:
        _module(xp).get_function(name)(((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,), args)


def count(xp, codes, kind, hang, H, cfree, ncn, cnt):
    """Write into ``cnt`` (int64, one per fine node) the entry count of every row with a
    hanging parent (``hang``), from its sorted ``codes`` (n, 2^d) int32, ``kind`` (int8), the
    coarse ``H`` (CSR: ``indptr``, ``indices``, ``data``) and the coarse free mask ``cfree``
    (bool, or None: all); the other entries of ``cnt`` are left as they are."""
    n, args = _args(xp, codes, kind, hang, H, cfree, ncn)
    _launch(xp, "adaptmg_forest_hang_count", n, args + (cnt,))


def fill(xp, codes, kind, hang, H, cfree, ncn, cnt, ip, c, indices, data):
    """Write the entries of the rows with a hanging parent into ``indices`` (int32) /
    ``data`` (float64) of the DoF CSR (node row ``i``'s ``c`` copies from ``c ip[i]``, the
    counts ``cnt`` after :func:`count`)."""
    n, args = _args(xp, codes, kind, hang, H, cfree, ncn)
    _launch(xp, "adaptmg_forest_hang_fill", n, args + (cnt, ip, np.int32(c), indices, data))
