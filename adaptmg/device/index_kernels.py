r"""Fused kernels of the device mesh set-up and the estimator, each with a NumPy twin.

On the GPU the set-up of a level is bound by CuPy's per-call host overhead (an elementwise
op ~10 us, a boolean mask or ``flatnonzero`` ~100 us: it reads its size back), not by
bandwidth (issue 36).  A chain of elementwise tests and gathers that ends in one
``flatnonzero`` is folded here into one ``ElementwiseKernel`` (made once, lazily, named
``adaptmg_<name>``) and that one ``flatnonzero``.

Dispatch is on the array type: a NumPy array (the host, and the stand-ins of the CPU tests,
``tests/mesh/strict_cupy.py`` / ``tests/distributed/fake_cupy.py``, whose arrays are NumPy
subclasses) runs the *twin*, the plain array code of the same formula (it is the host's
path, unchanged); a CuPy array runs the kernel.  Both give the same integers (the GPU tests
of ``tests/mesh/test_index_kernels.py`` compare them).  :data:`FUSED` names the functions,
so that ``scripts/census_device_ops.py`` can count a twin's call as the one launch it is on
the device.

Kernels
=======

``registry_midpoints``
    The registered midpoints of the edges (or centres of the faces) of cells, where they are
    vertices of the cells looked at: for cell row ``r`` (forest vertex ids :math:`K_{r\cdot}`)
    and entity ``e`` with local vertices :math:`v_{e0}, v_{e1}` (an edge) or
    :math:`v_{e0..e3}` (a face, lexicographic), the key is :math:`(a \ll 32) | b` with
    :math:`a, b` the edge's sorted ends, or the face's smallest corner and the corner
    diagonally opposite (:math:`v_{e,3-j}` of :math:`v_{ej}`), as the forest registers them;
    a binary search in the sorted registry ``keys`` gives the node :math:`n` (``vals``), and

    .. math::  M_{re} = n \text{ if the key is registered, } s_n
               \text{ and } J_{K_{r v}} \text{ for every vertex } v \text{ of the entity, else } -1.

``face_corners``
    The reference coordinates, in the neighbour cell, of the vertices ``v`` of matched faces
    (``estimate/faces.py``): a vertex of the neighbour (row ``W`` of its vertex ids) is its
    corner :math:`\hat c_k`; a hanging node is the mean of its parents' corners,

    .. math::  \hat R = \frac{1}{n_p} \sum_{p \in \mathrm{par}(v)} \hat c_{k(p)},

    and ``ok`` says that each parent is a vertex of the neighbour (exact: sums of 0/1 and one
    division, the same bits on both sides).

``grouped_table_product``
    The product of basis tables :math:`T_g` (R, K) with cells-last data B (L, K, n) where
    column j uses the table of its group :math:`g(j)` (groups of consecutive columns):

    .. math::  O_{l r j} = \sum_{k < K} (T_{g(j)})_{r k} B_{l k j}.

    One thread per output entry (its table from the column's table id, an array already on
    the device: :class:`ColumnGroups`) instead of a matmul and a copy per group; the twin is
    that loop (sums of K products in another order than cuBLAS's: the same numbers to
    round-off).

``csr_row_entries``
    The entries of chosen rows of a CSR matrix, packed: with the new row pointer ``ptr``
    (m + 1) and the rows' first entries ``start`` (m) in the matrix, entry p of the packed
    rows is the matrix entry :math:`\mathrm{start}_r + p - \mathrm{ptr}_r`,
    :math:`r = \max\{r : \mathrm{ptr}_r \le p\}` (a binary search; empty rows are skipped),
    its column as int64 and its value as float64 (copies: exact).

``constrained_csr``
    :math:`K = Z B Z + s (I - Z)` of a canonical CSR ``B`` and the free mask ``z``: a free row
    keeps its entries in free columns that are not zero, any other row is the single
    diagonal entry ``s``.  Row r has :math:`c_r = \#\{p : z_{j_p} \wedge b_p \ne 0\}` entries
    (free) or 1; the row pointer is their running sum and a second pass writes the entries
    in place: canonical CSR without a COO -> CSR sort (the host's twin: the COO path).

``constrained_rows``
    Chosen rows :math:`r_k` of the same :math:`K` (a rank's owned rows of a distributed
    level): row k is row :math:`r_k` of :math:`Z B Z` when :math:`r_k` is free, else the single
    entry ``s`` in column :math:`r_k`; the count pass also returns :math:`|B_{r_k r_k}|` of the
    free rows, so ``s`` (the mean over every rank's free rows) needs no second pass.

``weight_rows_csr``
    The hanging-node matrix before its chains are resolved: identity rows on the regular
    nodes, and on hanging node :math:`h_k` the weights :math:`W_{kj} \ne 0` in the columns
    :math:`C_{kj}` (distinct per row; sorted by an insertion sort in the row's thread):
    canonical CSR by a count kernel, a running sum and a fill kernel.

``split_rows_count`` / ``split_rows_fill``
    A rank's CSR rows (global columns :math:`j_p`) split into the owned-columns block and
    the ghost-columns block of :mod:`adaptmg.distributed.csr`: with the local index
    :math:`\ell(j)` (a table, or :math:`j - lo` on the range ``lo <= j < hi``; -1 where
    another rank owns ``j``), row r has :math:`g_r = \#\{p : \ell(j_p) < 0\}` ghost entries;
    with :math:`G_r = \sum_{s < r} g_s` the fill pass writes, in order, the owned entries
    at :math:`\mathrm{ip}_r - G_r + \dots` (column :math:`\ell(j_p)`) and the ghost ones at
    :math:`G_r + \dots` (global column :math:`j_p`): one read of the rows per pass instead
    of a gather, two mask compactions and a search per entry.  With chosen rows
    :math:`s_r` (row r of the result is row :math:`s_r` of the matrix) the count pass also
    writes the owned count :math:`o_r`, and the owned entries start at
    :math:`O_r = \sum_{q < r} o_q`: the split of ``M[s]`` without the copy ``M[s]``.

``q1_forest_rows`` / ``q1_forest_fill``
    The rows of the Q1 embedding between two meshes of one forest
    (:func:`adaptmg.multilevel.transfer._q1_forest_csr`).  Fine node i with forest id
    :math:`f_i` is a coarse node (:math:`c_{f_i} \ge 0`: kind 0, its one parent itself) or
    the midpoint of a coarse entity of kind :math:`k \ge 1` with the :math:`2^k` forest
    parents :math:`P_{f_i j}`; each parent's column code is :math:`m_{c_p}` (``colmap``: the
    coarse node, ``ncn`` for a masked-out one, ``ncn + 1 + node`` for a hanging one).  The
    rows kernel writes a row's codes sorted (``ncn``-padded to ``W = 2^d``), its kept count
    :math:`\#\{j : m_j < ncn\}`, its kind (-1 for a row the fine mask drops), whether a
    parent hangs (the row then goes through H: count 0 here) and ``bad`` (a new node of
    kind 0, or a parent that is no coarse node); the fill kernel writes a plain row's
    entries at ``c ip_i + r cnt_i + j``: column ``c m_j + r``, weight :math:`2^{-k}`.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, constant, csr_from_arrays, get_backend, in_host_memory, repeat, to_host

__all__ = ["registry_midpoints", "face_key_ends", "face_corners", "grouped_table_product", "ColumnGroups",
           "csr_row_entries", "constrained_csr", "constrained_rows", "weight_rows_csr",
           "q1_forest_rows", "q1_forest_fill", "owned_ghost_rows", "FUSED", "KERNEL_NAMES"]

#: the fused functions of this module (the census counts a call as one launch)
FUSED = ("registry_midpoints", "face_corners", "grouped_table_product", "csr_row_entries",
         "constrained_csr_count", "constrained_csr_fill", "constrained_rows_count", "constrained_rows_fill",
         "weight_rows_count", "weight_rows_fill", "q1_forest_rows", "q1_forest_fill",
         "split_rows_count", "split_rows_fill")

_SPECS = {
    # one thread per (cell, entity); K (n, nv) row-major vertex ids, ent (ne, 4) local
    # vertices (an edge: 2, -1 padded; a face: 4, lexicographic); keys sorted
    "registry_midpoints": (
        "raw C K, raw int32 ent, int32 ne, int32 nv, raw int64 keys, int64 nkeys, raw V vals,"
        " raw bool seen, raw bool jump", "int64 m",
        "long long row = i / ne; int e = (int)(i % ne);"
        " const int* t = &ent[e * 4];"
        " long long a = (long long)K[row * nv + t[0]], b = (long long)K[row * nv + t[1]], lo, hi;"
        " bool all_jump = jump[a] && jump[b];"
        " if (t[2] < 0) { lo = a < b ? a : b; hi = a < b ? b : a; }"
        " else {"
        "   long long c2 = (long long)K[row * nv + t[2]], c3 = (long long)K[row * nv + t[3]];"
        "   lo = min(min(a, b), min(c2, c3));"
        "   hi = a == lo ? c3 : (b == lo ? c2 : (c2 == lo ? b : a));"
        "   all_jump = all_jump && jump[c2] && jump[c3];"
        " }"
        " long long key = (lo << 32) | hi, first = 0, count = nkeys;"
        " while (count > 0) {"
        "   long long step = count / 2, mid = first + step;"
        "   if (keys[mid] < key) { first = mid + 1; count -= step + 1; } else count = step;"
        " }"
        " long long n = -1;"
        " if (all_jump && first < nkeys && keys[first] == key) {"
        "   long long v = (long long)vals[first];"
        "   if (seen[v]) n = v;"
        " }"
        " m = n;"),
    # one thread per (face, face vertex): its corner in the neighbour, or its parents' mean
    "face_corners": (
        "V v, raw V W, raw P par, raw F cor, int32 nfv, int32 nv, int32 d", "bool ok, raw float64 R",
        "long long row = i / nfv; int c = -1;"
        " for (int k = 0; k < nv; ++k) if (W[row * nv + k] == v) { c = k; break; }"
        " if (c >= 0) {"
        "   for (int a = 0; a < d; ++a) R[i * d + a] = (double)cor[c * d + a];"
        "   ok = true;"
        " } else {"
        "   double acc[3] = {0.0, 0.0, 0.0}; int cnt = 0, found = 0;"
        "   for (int k = 0; k < 4; ++k) {"
        "     long long p = (long long)par[(long long)v * 4 + k];"
        "     if (p < 0) continue;"
        "     ++cnt;"
        "     for (int q = 0; q < nv; ++q) if ((long long)W[row * nv + q] == p) {"
        "       for (int a = 0; a < d; ++a) acc[a] += (double)cor[q * d + a];"
        "       ++found; break; }"
        "   }"
        "   double den = cnt > 0 ? (double)cnt : 1.0;"
        "   for (int a = 0; a < d; ++a) R[i * d + a] = acc[a] / den;"
        "   ok = found == cnt && cnt > 0;"
        " }"),
    # one thread per output entry (l, r, j); tid: the table of column j
    "grouped_table_product": (
        "raw T tab, raw T B, raw I tid, int32 R, int32 K, int64 n", "T out",
        "long long j = i % n, lr = i / n; long long r = lr % R, l = lr / R;"
        " long long t0 = ((long long)tid[j] * R + r) * K, b0 = l * K * n + j;"
        " T s = 0;"
        " for (int k = 0; k < K; ++k) s += tab[t0 + k] * B[b0 + k * n];"
        " out = s;"),
    # one thread per packed entry p: its row r by a binary search of ptr, then two copies
    "csr_row_entries": (
        "raw int64 ptr, raw int64 start, raw I col, raw F val, int64 m", "int64 ind, float64 dat",
        "long long lo = 0, hi = m - 1;"
        " while (lo < hi) { long long mid = (lo + hi + 1) / 2; if (ptr[mid] <= i) lo = mid; else hi = mid - 1; }"
        " long long pos = start[lo] + i - ptr[lo];"
        " ind = (long long)col[pos]; dat = (double)val[pos];"),
    # one thread per row: the entries K keeps there (a free row) or 1 (its diagonal)
    "constrained_csr_count": (
        "bool z, raw I ip, raw I col, raw F val, raw bool zc", "int64 cnt",
        "if (!z) { cnt = 1; } else {"
        "   long long c = 0;"
        "   for (long long p = ip[i]; p < ip[i + 1]; ++p) if (zc[col[p]] && val[p] != (F)0) ++c;"
        "   cnt = c; }"),
    # one thread per row: its entries written from its offset in the new row pointer
    "constrained_csr_fill": (
        "bool z, raw I ip, raw I col, raw F val, raw bool zc, raw I ptr, F s", "raw I kcol, raw F kval",
        "long long o = ptr[i];"
        " if (!z) { kcol[o] = (I)i; kval[o] = s; } else {"
        "   for (long long p = ip[i]; p < ip[i + 1]; ++p) if (zc[col[p]] && val[p] != (F)0) {"
        "     kcol[o] = col[p]; kval[o] = val[p]; ++o; } }"),
    # one thread per chosen row k (matrix row r): its entry count and |B_rr| (a free row)
    "constrained_rows_count": (
        "int64 r, raw I ip, raw I col, raw F val, raw bool zc", "int64 cnt, float64 ad",
        "if (!zc[r]) { cnt = 1; ad = 0.0; } else {"
        "   long long c = 0; double a = 0.0;"
        "   for (long long p = ip[r]; p < ip[r + 1]; ++p) {"
        "     long long j = (long long)col[p];"
        "     if (zc[j] && val[p] != (F)0) ++c;"
        "     if (j == r) a = fabs((double)val[p]); }"
        "   cnt = c; ad = a; }"),
    # one thread per chosen row k: its entries from its offset in the new row pointer
    "constrained_rows_fill": (
        "int64 r, raw I ip, raw I col, raw F val, raw bool zc, raw J ptr, F s", "raw I kcol, raw F kval",
        "long long o = (long long)ptr[i];"
        " if (!zc[r]) { kcol[o] = (I)r; kval[o] = s; } else {"
        "   for (long long p = ip[r]; p < ip[r + 1]; ++p) if (zc[col[p]] && val[p] != (F)0) {"
        "     kcol[o] = col[p]; kval[o] = val[p]; ++o; } }"),
    # one thread per node: 1 (a regular node) or its nonzero weights (hanging: row h of W)
    "weight_rows_count": (
        "int64 h, raw F W, int32 nv", "int64 cnt",
        "if (h < 0) { cnt = 1; } else {"
        "   long long c = 0;"
        "   for (int k = 0; k < nv; ++k) if (W[h * nv + k] != (F)0) ++c;"
        "   cnt = c; }"),
    # one thread per node: its entries from its offset, columns sorted in place
    "weight_rows_fill": (
        "int64 h, raw F W, raw C cols, raw I ptr, int32 nv", "raw I kcol, raw F kval",
        "long long o = ptr[i];"
        " if (h < 0) { kcol[o] = (I)i; kval[o] = (F)1; } else {"
        "   int m = 0;"
        "   for (int k = 0; k < nv; ++k) {"
        "     F w = W[h * nv + k];"
        "     if (w == (F)0) continue;"
        "     I c = (I)cols[h * nv + k];"
        "     int j = m;"
        "     while (j > 0 && kcol[o + j - 1] > c) { kcol[o + j] = kcol[o + j - 1]; kval[o + j] = kval[o + j - 1]; --j; }"
        "     kcol[o + j] = c; kval[o + j] = w; ++m; } }"),
    # W = 32: one warp per row (i = 32 r + lane; the row's entries read 32 at a time,
    # coalesced), W = 1: one thread per row (short rows); the row's ghost entries (local
    # index -1; ``table`` 0: owned is the range lo .. hi - 1); ``has_sel``: row r is the
    # matrix's row sel[r], and its owned count goes to o[r] too
    "split_rows_count": (
        "raw I ip, raw C col, raw L local, int64 lo, int64 hi, int32 table, int32 W, raw int64 sel,"
        " int32 has_sel", "raw int64 g, raw int64 o",
        "long long r = i / W; int lane = (int)(i % W); long long s = has_sel ? sel[r] : r;"
        " long long b = (long long)ip[s], e = (long long)ip[s + 1]; int c = 0;"
        " for (long long p = b + lane; p - lane < e; p += W) {"
        "   bool ghost = false;"
        "   if (p < e) { long long j = (long long)col[p];"
        "     ghost = table ? local[j] < 0 : (unsigned long long)(j - lo) >= (unsigned long long)(hi - lo); }"
        "   c += W == 1 ? (int)ghost : __popc(__ballot_sync(0xffffffffu, ghost)); }"
        " if (lane == 0) { g[r] = c; if (has_sel) o[r] = e - b - c; }"),
    # the same rows: owned entries from O_r (ip_r - G_r without a selection; local columns),
    # ghost ones from G_r; with W = 32 each lane's place among its chunk's entries of its kind
    # by a ballot's prefix count
    "split_rows_fill": (
        "raw I ip, raw C col, raw F val, raw L local, int64 lo, int64 hi, int32 table, int32 W,"
        " raw int64 sel, int32 has_sel, raw int64 optr, raw int64 gptr",
        "raw O ocol, raw F oval, raw int64 gcol, raw F gval",
        "long long r = i / W; int lane = (int)(i % W); long long s = has_sel ? sel[r] : r;"
        " long long b = (long long)ip[s], e = (long long)ip[s + 1];"
        " long long g = gptr[r], o = has_sel ? optr[r] : b - g; unsigned below = (1u << lane) - 1u;"
        " for (long long p = b + lane; p - lane < e; p += W) {"
        "   long long j = -1, l = -1;"
        "   if (p < e) { j = (long long)col[p];"
        "     l = table ? (long long)local[j]"
        "               : ((unsigned long long)(j - lo) < (unsigned long long)(hi - lo) ? j - lo : -1); }"
        "   unsigned gm = p < e && l < 0, om = l >= 0;"
        "   if (W > 1) { gm = __ballot_sync(0xffffffffu, gm); om = __ballot_sync(0xffffffffu, om); }"
        "   if (l >= 0) { long long at = o + __popc(om & below); ocol[at] = (O)l; oval[at] = val[p]; }"
        "   else if (p < e) { long long at = g + __popc(gm & below); gcol[at] = j; gval[at] = val[p]; }"
        "   g += __popc(gm); o += __popc(om); }"),
    # one thread per fine node: its sorted parent codes, kept count, kind and flags
    "q1_forest_rows": (
        "int64 f, raw C cmap, raw K nkind, raw P npar, raw I colmap, raw bool free, int32 use_free,"
        " int32 stride, int64 ncn, int32 W", "raw I codes, int64 cnt, int8 kind, bool hang, bool bad, bool old",
        "long long p = (long long)cmap[f];"
        " bool o = p >= 0; int k = o ? 0 : (int)nkind[f]; bool b = !o && k == 0;"
        " old = o;"
        " if (use_free && !free[i]) { kind = -1; cnt = 0; hang = false; bad = b; } else {"
        "   I cc[8]; int m = 0;"
        "   if (o) { cc[0] = colmap[p]; m = 1; }"
        "   else if (k > 0) { m = 1 << k;"
        "     for (int j = 0; j < m; ++j) {"
        "       long long q = (long long)npar[f * stride + j];"
        "       long long qc = q >= 0 ? (long long)cmap[q] : -1;"
        "       if (qc < 0) { b = true; cc[j] = (I)ncn; } else cc[j] = colmap[qc]; } }"
        "   for (int a = 1; a < m; ++a) { I v = cc[a]; int j = a;"
        "     while (j > 0 && cc[j - 1] > v) { cc[j] = cc[j - 1]; --j; } cc[j] = v; }"
        "   long long n0 = 0; bool h = false;"
        "   for (int j = 0; j < m; ++j) { if ((long long)cc[j] < ncn) ++n0; else if ((long long)cc[j] > ncn) h = true; }"
        "   for (int j = 0; j < W; ++j) codes[(long long)i * W + j] = j < m ? cc[j] : (I)ncn;"
        "   kind = (signed char)k; cnt = h ? 0 : n0; hang = h; bad = b; }"),
    # one thread per fine node: a plain row's c x cnt entries from its offset ip
    "q1_forest_fill": (
        "int64 cnt, int8 kind, bool hang, raw I codes, raw int64 ip, int32 W, int32 c",
        "raw J indices, raw float64 data",
        "if (!hang && kind >= 0 && cnt > 0) {"
        "   double w = ldexp(1.0, -(int)kind); long long o = ip[i] * c;"
        "   for (int r = 0; r < c; ++r) for (long long j = 0; j < cnt; ++j) {"
        "     long long at = o + r * cnt + j;"
        "     indices[at] = (J)((long long)codes[(long long)i * W + j] * c + r); data[at] = w; } }"),
}

KERNEL_NAMES = tuple(f"adaptmg_{n}" for n in _SPECS)


def kernel_factory(specs):
    """The memoised factory ``name -> `` the CuPy ``ElementwiseKernel`` ``adaptmg_<name>`` of
    ``specs`` (name -> (inputs, outputs, operation); each built once)."""
    @functools.lru_cache(maxsize=None)
    def kernel(name: str):
        xp = get_backend("gpu").xp
        ins, outs, op = specs[name]
        return xp.ElementwiseKernel(ins, outs, op, f"adaptmg_{name}")
    return kernel


_kernel = kernel_factory(_SPECS)


def face_key_ends(c0, c1, c2, c3):
    """The registry key's ends ``(lo, hi)`` of quadrilateral faces with corners ``c0 .. c3``
    (lexicographic): the smallest corner and the one diagonally opposite to it (corner
    ``3 - j`` of corner ``j``) -- the rule by which the forest registers face centres
    (:meth:`adaptmg.mesh._tree.Forest.split`) and :func:`registry_midpoints` looks them up."""
    xp = backend_of(c0).xp
    lo = xp.minimum(xp.minimum(c0, c1), xp.minimum(c2, c3))
    return lo, xp.where(c0 == lo, c3, xp.where(c1 == lo, c2, xp.where(c2 == lo, c1, c0)))


def registry_midpoints(K, ent, keys, vals, seen, jump):
    """The (n, ne) int64 registered midpoints / centres ``M`` of the entities ``ent`` (ne, 4)
    int32 local vertices -- edges ``[a, b, -1, -1]`` or faces (4 corners, lexicographic), all
    of one kind -- of the cells ``K`` (n, nv) forest vertex ids, in the sorted registry
    ``keys`` -> ``vals`` (int64; :class:`adaptmg.mesh._tree.Forest`), -1 where the key is not
    registered, its node is not ``seen`` or a vertex of the entity is not a ``jump`` node (the
    module's formula).  One kernel on the device; the twin: the keys by whole-array operations
    and one ``searchsorted``."""
    xp = backend_of(K).xp
    n, ne = int(K.shape[0]), int(ent.shape[0])
    if not in_host_memory(K):
        return _kernel("registry_midpoints")(K, constant(ent, xp, np.int32), np.int32(ne),
                                             np.int32(K.shape[1]), keys, np.int64(keys.size), vals, seen,
                                             jump, size=n * ne).reshape(n, ne)
    e = np.asarray(ent)
    C = [xp.take(K, xp.asarray(e[:, j]), axis=1).astype(np.int64) for j in range(2 if e[0, 2] < 0 else 4)]
    if len(C) == 2:
        lo, hi = xp.minimum(C[0], C[1]), xp.maximum(C[0], C[1])
    else:
        lo, hi = face_key_ends(*C)
    key = (lo << 32) | hi
    if keys.size == 0:
        return xp.full(key.shape, -1, dtype=np.int64)
    at = xp.minimum(xp.searchsorted(keys, key), keys.size - 1)
    node = vals.take(at).astype(np.int64)
    ok = (keys.take(at) == key) & seen.take(node)
    for c in C:
        ok &= jump.take(c)
    return xp.where(ok, node, -1)


def face_corners(Vs, W, par, cor, cor_i):
    """``(R, ok)``: ``R`` (n, nfv, d) float64 reference coordinates in the neighbour of the
    face vertices ``Vs`` (n, nfv) node ids, the neighbour's vertex ids ``W`` (n, nv) (distinct
    per row), the hanging parents ``par`` (num_nodes, 4) -1 padded, the corners ``cor``
    (nv, d) float (``cor_i`` the same as integers); ``ok`` (host bool): every vertex is a
    vertex of the neighbour or a hanging node whose parents all are.  One kernel and one
    reduction on the device; the twin runs a loop over the 2^d corners and 4 parent slots."""
    xp = backend_of(Vs).xp
    n, nfv = Vs.shape
    nv, d = cor.shape
    if not in_host_memory(Vs):
        R = xp.empty((n, nfv, d), dtype=np.float64)
        ok = xp.empty((n, nfv), dtype=bool)
        _kernel("face_corners")(Vs, W, par, cor, np.int32(nfv), np.int32(nv), np.int32(d), ok, R)
        return R, bool(ok.all())
    corner = xp.zeros(Vs.shape, dtype=np.intp)
    isd = xp.zeros(Vs.shape, dtype=bool)
    eq = xp.empty(Vs.shape, dtype=bool)
    vals = xp.arange(nv, dtype=np.intp)                            # corner numbers as array scalars
    for v in range(nv):                                            # loop over the 2^d corners only
        xp.equal(Vs, W[:, v, None], out=eq)
        xp.copyto(corner, vals[v], where=eq)
        isd |= eq
    R = cor.take(corner, axis=0)                                   # (n, nfv, d)
    # hanging vertices of fine sub-faces: mean of their parents' corners in the neighbour
    h_rows = xp.flatnonzero(~isd.all(1))
    if not h_rows.size:
        return R, True
    P = par[Vs[h_rows]]                                            # (nh, nfv, 4)
    Wh = W[h_rows][:, None, :]
    acc = xp.zeros((h_rows.size, nfv, d))
    cnt_p = (P >= 0).sum(-1)
    found = xp.zeros(P.shape[:2], dtype=np.int64)
    for k in range(P.shape[2]):                                    # 4 parent slots
        hit = (P[:, :, k, None] == Wh) & (P[:, :, k, None] >= 0)
        ok = hit.any(-1)
        acc += ok[..., None] * cor_i[xp.argmax(hit, axis=-1)]
        found += ok
    Rp = acc / xp.maximum(cnt_p, 1)[..., None]
    ok = isd[h_rows] | ((found == cnt_p) & (cnt_p > 0))
    R[h_rows] = xp.where(isd[h_rows][..., None], R[h_rows], Rp)
    return R, bool(ok.all())


class ColumnGroups(list):
    """Table groups ``(start, stop, i)`` (a list, host ints) with ``ids``: the table id of
    every column (an int array of the data's module, or None) for the one-kernel product."""

    def __init__(self, groups, ids=None):
        super().__init__(groups)
        self.ids = ids


def grouped_table_product(tables, B, groups):
    """``out[..., :, s:e] = tables[i] @ B[..., :, s:e]`` for every group ``(s, e, i)`` (host
    ints) of ``groups``; ``tables`` a sequence of (R, K) arrays of ``B``'s module and dtype, B
    (..., K, n).  On the device with :class:`ColumnGroups` ``ids``: one kernel (and the
    stack of the tables); otherwise (the twin) the loop over the groups, one matmul each."""
    xp = backend_of(B).xp
    R, K = tables[0].shape
    n = B.shape[-1]
    out = xp.empty(B.shape[:-2] + (R, n), dtype=B.dtype)
    ids = getattr(groups, "ids", None)
    if ids is not None and not in_host_memory(B):
        _kernel("grouped_table_product")(xp.stack(tables), xp.ascontiguousarray(B), ids,
                                         np.int32(R), np.int32(K), np.int64(n), out)
        return out
    for s, e, i in groups:            # loop over the few table groups only
        out[..., s:e] = xp.matmul(tables[i], B[..., s:e])
    return out


def csr_row_entries(ptr, start, indices, data, total: int):
    """``(indices, data)`` (int64, float64) of the packed rows (the module's formula): ``ptr``
    (m + 1) int64 the packed row pointer (``ptr[-1] == total``), ``start`` (m) int64 the rows'
    first entries in the matrix's ``indices``/``data``.  One kernel on the device; the twin
    gathers through a search of every entry's row."""
    xp = backend_of(ptr).xp
    if not in_host_memory(ptr):
        ind = xp.empty(total, dtype=np.int64)
        dat = xp.empty(total, dtype=np.float64)
        if total:
            _kernel("csr_row_entries")(ptr, start, indices, data, np.int64(start.shape[0]), ind, dat)
        return ind, dat
    own = xp.searchsorted(ptr, xp.arange(total, dtype=xp.int64), side="right") - 1
    pos = start[own] + xp.arange(total, dtype=xp.int64) - ptr[own]
    return indices[pos].astype(xp.int64), data[pos].astype(xp.float64)


def constrained_csr(B, z, scale):
    """``K = Z B Z + scale (I - Z)`` (the module's formula) of the CSR ``B`` in canonical form
    (sorted, no duplicates) and the free mask ``z`` (bool, of ``B.data``'s module), zeros of
    free rows dropped; ``K`` canonical CSR of ``B``'s module.  On the device two row kernels
    and a running sum (one read: the entry count); the twin goes through COO."""
    be = backend_of(B)
    xp, spm = be.xp, be.sparse
    if not in_host_memory(B.data):
        n = B.shape[0]
        ip, col, val = B.indptr, B.indices, B.data
        cnt = _kernel("constrained_csr_count")(z, ip, col, val, z)
        ptr = xp.zeros(n + 1, dtype=ip.dtype)
        ptr[1:] = xp.cumsum(cnt)
        nnz = int(ptr[-1])
        kcol, kval = xp.empty(nnz, dtype=col.dtype), xp.empty(nnz, dtype=val.dtype)
        _kernel("constrained_csr_fill")(z, ip, col, val, z, ptr, val.dtype.type(scale), kcol, kval)
        K = csr_from_arrays(spm, kval, kcol, ptr, B.shape)
        K.has_canonical_format = True
        return K
    C = B.tocoo()
    keep = xp.flatnonzero(z[C.row] & z[C.col] & (C.data != 0))      # one read for 3 gathers
    fixed = xp.flatnonzero(~z).astype(C.row.dtype)
    rows = xp.concatenate([C.row.take(keep), fixed])
    cols = xp.concatenate([C.col.take(keep), fixed])
    vals = xp.concatenate([C.data.take(keep), xp.full(fixed.size, scale, dtype=C.data.dtype)])
    K = spm.coo_matrix((vals, (rows, cols)), shape=B.shape).tocsr()
    K.sum_duplicates()
    return K


def constrained_rows(B, rows, z, scale):
    """Rows ``rows`` of ``K = Z B Z + s (I - Z)`` (the module's formula) of the canonical CSR
    ``B`` (n x N) with the free mask ``z`` (bool, N), as a canonical CSR (len(rows) x N) of
    ``B``'s module: a free row's entries in free columns that are not zero, a fixed row the
    single entry ``s`` in its own column.  ``s = scale(d, m)``, ``d`` the sum of
    :math:`|B_{rr}|` over the m free rows among ``rows`` (a callable: e.g. the mean over
    every rank's rows by one allreduce).  On the device a count kernel (which also yields
    the diagonals), one read of the sums, a running sum and a fill kernel; the twin selects
    the rows and goes through COO."""
    be = backend_of(B)
    xp, spm = be.xp, be.sparse
    m, N = int(rows.shape[0]), B.shape[1]
    rows = rows.astype(xp.int64, copy=False)
    if not in_host_memory(B.data):
        ip, col, val = B.indptr, B.indices, B.data
        cnt, ad = _kernel("constrained_rows_count")(rows, ip, col, val, z)
        d, nf = to_host(xp.stack([ad.sum(), z.take(rows).sum().astype(ad.dtype)])) if m else (0.0, 0)
        s = scale(float(d), int(nf))                  # one read for both numbers
        ptr = xp.zeros(m + 1, dtype=ip.dtype)
        if m:
            ptr[1:] = xp.cumsum(cnt)
        nnz = int(ptr[-1])
        kcol, kval = xp.empty(nnz, dtype=col.dtype), xp.empty(nnz, dtype=val.dtype)
        if m:
            _kernel("constrained_rows_fill")(rows, ip, col, val, z, ptr, val.dtype.type(s), kcol, kval)
        K = csr_from_arrays(spm, kval, kcol, ptr, (m, N))
        K.has_canonical_format = True
        return K, s
    zr = z[rows]
    d = float((xp.abs(B.diagonal()[rows]) * zr).sum()) if m else 0.0
    s = scale(d, int(zr.sum()))
    C = B[rows].tocoo() if m else spm.coo_matrix((0, N))
    keep = xp.flatnonzero(zr[C.row] & z[C.col] & (C.data != 0))
    fixed = xp.flatnonzero(~zr)
    K = spm.coo_matrix((xp.concatenate([C.data[keep], xp.full(fixed.size, s, dtype=B.data.dtype)]),
                        (xp.concatenate([C.row[keep], fixed]), xp.concatenate([C.col[keep], rows[fixed]]))),
                       shape=(m, N)).tocsr()
    K.sum_duplicates()
    return K, s


def weight_rows_csr(be, n, is_h, hanging, cols, W):
    """The (n x n) canonical CSR of the module's ``weight_rows_csr``: identity rows on the nodes
    not ``is_h``, the nonzero weights ``W`` (nh, nv) in the columns ``cols`` on the
    ``hanging`` rows (distinct nodes; distinct columns per row); arrays of ``be``.  On the
    device two node kernels and a running sum (one read: the entry count); the twin goes
    through COO."""
    xp = be.xp
    if not in_host_memory(W):
        h = xp.full(n, -1, dtype=np.int64)
        h[hanging] = xp.arange(hanging.shape[0], dtype=np.int64)
        nv = np.int32(W.shape[1])
        cnt = _kernel("weight_rows_count")(h, W, nv)
        ptr = xp.zeros(n + 1, dtype=np.int64)
        ptr[1:] = xp.cumsum(cnt)
        nnz = int(ptr[-1])
        it = xp.int32 if n + nnz < np.iinfo(np.int32).max else xp.int64
        ptr = ptr.astype(it)
        kcol, kval = xp.empty(nnz, dtype=it), xp.empty(nnz, dtype=W.dtype)
        _kernel("weight_rows_fill")(h, W, cols, ptr, nv, kcol, kval)
        H = csr_from_arrays(be.sparse, kval, kcol, ptr, (n, n))
        H.has_canonical_format = True
        return H
    nz = W != 0
    reg = xp.flatnonzero(~is_h)
    at = xp.flatnonzero(nz.ravel())                           # one read for the weights' gathers
    rows = xp.concatenate([reg, repeat(hanging.astype(xp.int64), nz.sum(axis=1), at.size)])
    cc = xp.concatenate([reg, cols.ravel().take(at).astype(reg.dtype)])
    vv = xp.concatenate([xp.ones(reg.shape[0]), W.ravel().take(at)])
    it = xp.int32 if n + int(cc.shape[0]) < np.iinfo(np.int32).max else xp.int64
    H = be.sparse.coo_matrix((vv, (rows.astype(it), cc.astype(it))), shape=(n, n)).tocsr()
    H.sum_duplicates()
    return H


def q1_forest_rows(fid, cmap, node_kind, node_par, colmap, fine_free, ncn: int, dim: int):
    """The module's ``q1_forest_rows`` for the fine nodes with forest ids ``fid``: ``(codes
    (nf, 2^dim) of colmap's dtype, cnt int64, kind int8, hang, bad, old)``.  ``cmap``: forest
    id -> coarse node (-1: none); ``node_kind`` / ``node_par`` the forest's tables;
    ``colmap`` (ncn,) the parents' column codes; ``fine_free`` a mask over the fine nodes
    or None.  One kernel on the device; the twin works on (nf, 2^dim) arrays (rows sorted
    whole: the same kept codes first, the same set of codes)."""
    xp = backend_of(fid).xp
    nf, W = fid.shape[0], 1 << dim
    if not in_host_memory(fid):
        codes = xp.empty((nf, W), dtype=colmap.dtype)
        cnt, kind = xp.empty(nf, dtype=np.int64), xp.empty(nf, dtype=np.int8)
        hang, bad, old = (xp.empty(nf, dtype=bool) for _ in range(3))
        free = fine_free if fine_free is not None else xp.zeros(1, dtype=bool)
        _kernel("q1_forest_rows")(fid, cmap, node_kind, node_par, colmap, free, np.int32(fine_free is not None),
                                  np.int32(node_par.shape[1]), np.int64(ncn), np.int32(W),
                                  codes, cnt, kind, hang, bad, old)
        return codes, cnt, kind, hang, bad, old
    p = cmap.take(fid).astype(np.int64)
    old = p >= 0
    k = np.where(old, 0, node_kind.take(fid)).astype(np.int64)
    bad = ~old & (k == 0)
    m = np.where(old, 1, np.where(k > 0, 1 << k, 0))
    j = np.arange(W)
    par = node_par[fid, :W].astype(np.int64)
    qc = np.where(par >= 0, cmap.take(np.maximum(par, 0)), -1).astype(np.int64)
    inside = (j < m[:, None]) & ~old[:, None]
    codes = np.where(inside & (qc >= 0), colmap.take(np.maximum(qc, 0)), colmap.dtype.type(ncn))
    codes = codes.astype(colmap.dtype)
    codes[old, 0] = colmap.take(p[old])
    fr = np.ones(nf, dtype=bool) if fine_free is None else np.asarray(fine_free, dtype=bool)
    bad |= fr & (inside & (qc < 0)).any(axis=1)
    codes.sort(axis=1)
    hang = fr & (codes > ncn).any(axis=1)
    cnt = np.where(fr & ~hang, (codes < ncn).sum(axis=1), 0).astype(np.int64)
    kind = np.where(fr, k, -1).astype(np.int8)
    return codes, cnt, kind, hang, bad, old


def q1_forest_fill(cnt, kind, hang, codes, ip, c: int, indices, data):
    """The module's ``q1_forest_fill``: the entries of the plain rows (not ``hang``, kind >= 0)
    written into ``indices`` / ``data`` (the row pointer of node row i: ``c ip[i]``)."""
    W = codes.shape[1]
    if not in_host_memory(cnt):
        _kernel("q1_forest_fill")(cnt, kind, hang, codes, ip, np.int32(W), np.int32(c), indices, data)
        return
    rows = np.flatnonzero(~hang & (kind >= 0) & (cnt > 0))
    n = cnt[rows]
    tot = int(n.sum())
    r_of = np.repeat(rows, n)
    j = np.arange(tot) - np.repeat(np.cumsum(n) - n, n)
    w = np.ldexp(1.0, -kind[r_of].astype(np.int32))
    for r in range(c):
        at = ip[r_of] * c + r * n.repeat(n) + j
        indices[at] = (codes[r_of, j].astype(np.int64) * c + r).astype(indices.dtype)
        data[at] = w


#: the mean entries a row from which :func:`owned_ghost_rows` gives each row a warp
SPLIT_WARP_ROW = 12


def owned_ghost_rows(ip, col, val, local=None, lo=0, hi=0, rows=None):
    """The owned / ghost split of CSR rows ``(ip, col, val)`` (sorted within rows, global
    columns) -- the module's ``split_rows`` formula: ``local`` the local index of every
    global column (-1: owned elsewhere), or None for ownership of the range ``lo <= j < hi``
    (local index ``j - lo``); ``rows`` (int64, of the arrays' module): only those rows of
    the matrix, in that order (None: every row) -- its rows without a gathered copy of them
    first (two H200, a rank's 21M rows of a 42M-row prolongation: that copy, ``P[rows]``,
    took 3.7 ms).  Returns ``(optr, ocol, oval, gptr, gcol, gval)``: the owned
    block (int64 row pointer, local columns int32 where ``hi - lo`` / the table fit, else
    int64) and the ghost block (int64 row pointer, int64 global columns), each in the rows'
    order.  On the device a count kernel, a running sum, one read of the ghost count and a
    fill kernel, one warp a row where rows average :data:`SPLIT_WARP_ROW` entries or more (32
    read at a time: a 3-D Q1 row of 27 is one coalesced load, where a thread a row reads 27
    strided ones -- DistCSR's whole split of 500M entries on an H200: 68 ms a thread a row,
    13 ms a warp a row), else one thread a row (a prolongation's rows of 1 - 8 entries would
    leave most of a warp idle: 62M entries in 19M rows, 2.9 against 9.4 ms).  The twin: the
    chosen rows gathered, then the local indices by one gather, two mask compactions and one
    search of the row starts among the ghost entries."""
    xp = backend_of(val).xp
    sel = rows is not None
    n = int(rows.shape[0]) if sel else int(ip.shape[0]) - 1
    table = local is not None
    width = int(local.size) if table else int(hi - lo)
    it = np.int32 if width < np.iinfo(np.int32).max else np.int64
    if not in_host_memory(val):
        loc = local if table else xp.zeros(1, dtype=np.int32)
        rows_all = max(int(ip.shape[0]) - 1, 1)
        W = 32 if col.size >= SPLIT_WARP_ROW * rows_all else 1          # lanes a row
        pick = rows.astype(np.int64, copy=False) if sel else xp.zeros(1, dtype=np.int64)
        args = (ip, col, loc, np.int64(lo), np.int64(hi), np.int32(table), np.int32(W), pick, np.int32(sel))
        gptr = xp.zeros(n + 1, dtype=np.int64)
        optr = xp.zeros(n + 1, dtype=np.int64) if sel else None
        if n:
            gcnt, ocnt = _kernel("split_rows_count")(*args, xp.empty(n, dtype=np.int64),
                                                     xp.empty(n if sel else 1, dtype=np.int64), size=W * n)
            xp.cumsum(gcnt, out=gptr[1:])
            if sel:
                xp.cumsum(ocnt, out=optr[1:])
        if sel:                      # one read of both counts
            ng, no = (int(v) for v in to_host(xp.stack([gptr[-1], optr[-1]])))
        else:
            ng = int(gptr[-1])
            no = int(col.size) - ng
            optr = ip.astype(np.int64) - gptr
        ocol, oval = xp.empty(no, dtype=it), xp.empty(no, dtype=val.dtype)
        gcol, gval = xp.empty(ng, dtype=np.int64), xp.empty(ng, dtype=val.dtype)
        if n and no + ng:
            _kernel("split_rows_fill")(*args[:2], val, *args[2:], optr, gptr, ocol, oval, gcol, gval, size=W * n)
        return optr, ocol, oval, gptr, gcol, gval
    if sel:                          # the chosen rows gathered, then split as every row
        start = ip[rows].astype(np.int64)
        cnt = ip[rows + 1].astype(np.int64) - start
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cnt, out=ptr[1:])
        at = np.repeat(start - ptr[:-1], cnt) + np.arange(ptr[-1], dtype=np.int64)
        return owned_ghost_rows(ptr, col[at], val[at], local, lo, hi)
    j = col.astype(np.int64)
    if table:
        lc = local[j]
    else:
        lc = j - lo
        lc[(j < lo) | (j >= hi)] = -1
    own = lc >= 0
    gp = xp.flatnonzero(~own)
    gptr = xp.searchsorted(gp, ip.astype(gp.dtype)).astype(np.int64)   # ghost entries before each row
    return (ip.astype(np.int64) - gptr, lc[own].astype(it), val[own], gptr, j[gp], val[gp])
