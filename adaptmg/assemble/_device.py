r"""Sparsity pattern and element-matrix summation on the GPU without element-sized index arrays
(written against ``xp``: NumPy runs the same code in the CPU tests).

With ``E = ncells * nr * ncl`` element entries, the earlier device pattern
(:mod:`._device_sorted`) sorted all E keys at once (a 2E-word temporary) and kept a
permutation of E int32 for the sums, and the element matrices of all cells (E float64)
were alive during the sum: about 2.9 KB per DoF for 3-D Q1, and nothing above E = 2^31.
Here no array of size E exists:

1. **Incidence.**  The pairs (row node, cell) of the ``nc * nr`` incidences ``p = c nr + i``
   (``row_cells[c, i]``), sorted stably by row node: ``inc`` with row pointer ``inc_ptr``
   (for Q1 hex 8x smaller than E); within a row the incidences ascend in p, i.e. in (c, i).
   On the device without a sort (its key/value buffers): counts and slots by atomics
   (``adaptmg_incidence_count``, ``adaptmg_incidence_scatter``), then every row's few
   incidences put in order by one thread (``adaptmg_incidence_sort``); the twin is the
   stable argsort.
2. **Pattern.**  Row r's columns are the distinct values of its candidates
   :math:`C_r = \{\mathrm{col\_cells}_{c,j} : (c, i) \in \mathrm{inc}(r),\ j < ncl\}`.
   On the device one thread per row merges the sorted column lists of its cells (a copy of
   the column table sorted within each cell by ``adaptmg_sorted_cell_columns``, one thread a
   cell, made for the build): with at most 16 cells a
   head per list, :math:`s_{k+1} = \min_q \mathrm{head}_q` and every list whose head is
   :math:`s_{k+1}` advances past it (:math:`O(16\,nnz_r)` reads); with more, iterated minima
   :math:`s_{k+1} = \min\{s \in C_r : s > s_k\}` over all candidates -- no buffer, any
   number of cells per row: a count kernel
   (``adaptmg_row_columns_count``), the running sum -> ``indptr``, a fill kernel
   (``adaptmg_row_columns_fill``) -> ``indices``.  The NumPy twin sorts the keys
   ``row * ncols + col`` of blocks of whole rows of at most :data:`PATTERN_CHUNK_ENTRIES`
   candidates and keeps the distinct ones.  Both give the integers of
   :class:`~adaptmg.fe.sparsity.Pattern` (columns ascending within rows).
3. **Sums.**  For a chunk of cells :math:`[c_0, c_1)` and its element matrices K, one thread
   per row r (kernel ``adaptmg_row_walk_sum``) walks r's incidences (c, i) with
   :math:`c_0 \le c < c_1` in ascending order and for j = 0..ncl-1 adds
   :math:`K_{c,i,j}` into the entry of column ``col_cells[c, j]`` (binary search in the row's
   sorted columns; eight columns of a cell searched in lockstep, their entries loaded before
   any is stored -- a cell's columns are distinct entries -- so the thread has eight loads in
   flight instead of one: 3-D Q1 at 20.7M cells on one H200 167 -> 34 ms, the same bits):

   .. math:: a_{(r,s)} \mathrel{+}= K_{c,i,j}, \qquad (c, i, j) \text{ ascending},\
             \mathrm{row\_cells}_{c,i} = r,\ \mathrm{col\_cells}_{c,j} = s.

   Chunks are added in ascending cell order, so every matrix entry receives the same terms
   in the same order as ``np.add.at`` over all entries in (c, i, j) order (the host
   pattern) and as the segment sums of :mod:`._device_sorted`: the result is bit-identical,
   whatever the chunking.  The NumPy twin finds the same positions by a vectorised binary
   search and adds them with ``np.add.at`` (entry order).

The element matrices are thus computed and added chunk by chunk
(:meth:`DevicePattern.add`, used by the forms with :data:`ASSEMBLY_CHUNK_BYTES`); a full
(E,) array can still be summed (:meth:`DevicePattern.sum`).  Memory of a pattern:
``inc`` (nc nr int32), ``inc_ptr`` (nrows + 1 int64), ``indptr``/``indices``.  Patterns are
memoised like the host ones.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import csr_from_arrays, get_backend, in_host_memory, repeat, stable_argsort, to_host
from ..fe.csr_ops import row_positions
from ..fe.sparsity import Pattern, _index_dtype, cell_tables, memoised

__all__ = ["DevicePattern", "get_device_pattern", "row_walk_sum", "MIN_DEVICE_ENTRIES", "KERNEL_NAMES",
           "PATTERN_CHUNK_ENTRIES", "ASSEMBLY_CHUNK_BYTES", "chunk_cells"]

# below this many element entries the copies and launches cost more than the host pattern
MIN_DEVICE_ENTRIES = 1 << 18
#: candidate (row, column) keys sorted at once by the NumPy twin of the pattern's row kernels
#: (8 bytes each, and the sort's scratch): its temporaries are bounded whatever the mesh size
PATTERN_CHUNK_ENTRIES = 1 << 27
#: bytes of element matrices (float64) computed and summed at once by the device forms: the
#: chunk's K (cells x nr x ncl; the forms' chunks are also at most the geometry's
#: DEVICE_CHUNK_CELLS = 2^20 cells): 3-D Q1 2^20 cells (512 MiB, 1 GiB with return_mass, the
#: geometry's chunks unchanged), 3-D Q2 ~184k cells
ASSEMBLY_CHUNK_BYTES = 1 << 30
_INT32_MAX = np.iinfo(np.int32).max

_ROW_WALK_SUM = r"""
const long long nrl = nr, ncll = ncl;
long long lo = inc_ptr[i], hi = inc_ptr[i + 1];
const long long end = hi, first = c0 * nrl, stop = c1 * nrl;
while (lo < hi) {                       // first incidence of the row in the chunk
  long long mid = (lo + hi) >> 1;
  if ((long long)inc[mid] < first) lo = mid + 1; else hi = mid;
}
const long long b = ip[i], len = ip[i + 1] - b;
for (long long t = lo; t < end; ++t) {
  const long long p = inc[t];
  if (p >= stop) break;
  const long long c = p / nrl;
  const long long kb = (p - first) * ncll;   // K[f, c - c0, p - c nr, :]
  const long long cb = c * ncll;
  for (long long j0 = 0; j0 < ncll; j0 += 8) {      // eight of the cell's columns at a time
    const int m = ncll - j0 < 8 ? (int)(ncll - j0) : 8;
    long long s[8], at[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { s[q] = q < m ? (long long)cols[cb + j0 + q] : -1; at[q] = b; }
    // their eight lower bounds in the row's sorted columns, in lockstep (the same halvings)
    for (long long n = len; n > 1; ) {
      const long long half = n >> 1;
#pragma unroll
      for (int q = 0; q < 8; ++q) at[q] = ((long long)ind[at[q] + half] < s[q]) ? at[q] + half : at[q];
      n -= half;
    }
    bool distinct = true;                 // a cell's columns: distinct but in a degenerate table
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      at[q] += ((long long)ind[at[q]] < s[q]);
#pragma unroll
      for (int r = 0; r < q; ++r) distinct = distinct && (q >= m || at[q] != at[r]);
    }
    for (int f = 0; f < nf; ++f) {
      double v[8], d[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = q < m ? K[f * kfld + kb + j0 + q] : 0.0;
      if (distinct) {                     // every load before the stores
#pragma unroll
        for (int q = 0; q < 8; ++q) d[q] = q < m ? data[at[q] * dpos + f * dfld] : 0.0;
#pragma unroll
        for (int q = 0; q < 8; ++q) if (q < m) data[at[q] * dpos + f * dfld] = d[q] + v[q];
      } else {                            // (unrolled: a runtime index would put at[], v[] in local memory)
#pragma unroll
        for (int q = 0; q < 8; ++q) if (q < m) data[at[q] * dpos + f * dfld] += v[q];
      }
    }
  }
}
"""


# one thread per row: its distinct columns in ascending order, merged from the sorted
# column lists scols[c, :] of its cells (incidences t0 .. t1-1): with at most 16 incidences a
# head per list, kept in registers -- the next column is the smallest head, and every list
# whose head it is advances past it, loading its next head (one load per list entry; the heads
# were re-read at every step before: 3-D Q1, 20.7M cells, one H200, count + fill 41 -> 19 ms);
# with more, the smallest column above the last one found, scanning all candidates again
# (O(|C_r| nnz_r)) -- no buffer, any number of cells at a node
_ROW_COLUMNS = r"""
const long long t0 = inc_ptr[i], t1 = inc_ptr[i + 1];
const long long BIG = 0x7fffffffffffffffLL;
const int k = (int)(t1 - t0);
long long o = START, last = -1;
if (k <= 16) {                        // the lists' heads in registers: one load per advance
  long long base[16], head[16]; int pos[16];
#pragma unroll
  for (int q = 0; q < 16; ++q) {
    pos[q] = 0; base[q] = 0; head[q] = BIG;
    if (q < k) { base[q] = ((long long)inc[t0 + q] / nr) * ncl; head[q] = scols[base[q]]; }
  }
  while (true) {
    long long best = BIG;
#pragma unroll
    for (int q = 0; q < 16; ++q) best = head[q] < best ? head[q] : best;
    if (best == BIG) break;
    EMIT;
#pragma unroll
    for (int q = 0; q < 16; ++q)       // past best (a list may hold it more than once)
      while (head[q] == best) { ++pos[q]; head[q] = pos[q] < ncl ? (long long)scols[base[q] + pos[q]] : BIG; }
  }
} else {
  while (true) {
    long long best = BIG;
    for (long long t = t0; t < t1; ++t) {
      const long long cb = ((long long)inc[t] / nr) * ncl;
      for (int j = 0; j < ncl; ++j) {
        const long long s = scols[cb + j];
        if (s > last && s < best) best = s;
      }
    }
    if (best == BIG) break;
    last = best;
    EMIT;
  }
}
"""

_SPECS = {
    # one thread per incidence p (its row node): the row's incidence count
    "incidence_count": (
        "C node, int64 nrows", "raw int64 cnt",
        "if (node >= 0 && node < nrows) atomicAdd((unsigned long long*)&cnt[node], 1ULL);"),
    # one thread per incidence p: into a free slot of its row (in any order)
    "incidence_scatter": (
        "C node, raw int64 inc_ptr, int64 nrows", "raw int32 fill, raw P inc",
        "if (node >= 0 && node < nrows) { const int s = atomicAdd(&fill[node], 1);"
        " inc[inc_ptr[node] + s] = (P)i; }"),
    # one thread per row: its incidences in ascending order (insertion sort)
    "incidence_sort": (
        "raw int64 inc_ptr", "raw P inc",
        "const long long b = inc_ptr[i], e = inc_ptr[i + 1];"
        " for (long long t = b + 1; t < e; ++t) {"
        "   const P v = inc[t]; long long q = t;"
        "   while (q > b && inc[q - 1] > v) { inc[q] = inc[q - 1]; --q; }"
        "   inc[q] = v; }"),
    # one thread per cell: its columns sorted (insertion sort of ncl values)
    "sorted_cell_columns": (
        "raw C cols, int32 ncl", "raw C out",
        "const long long b = (long long)i * ncl;"
        " for (int j = 0; j < ncl; ++j) {"
        "   const C v = cols[b + j]; int q = j;"
        "   while (q > 0 && out[b + q - 1] > v) { out[b + q] = out[b + q - 1]; --q; }"
        "   out[b + q] = v; }"),
    "row_columns_count": (
        "raw P inc, raw int64 inc_ptr, raw C scols, int32 nr, int32 ncl", "int64 cnt",
        _ROW_COLUMNS.replace("START", "0").replace("EMIT", "++o") + "cnt = o;"),
    "row_columns_fill": (
        "raw P inc, raw int64 inc_ptr, raw C scols, raw I ip, int32 nr, int32 ncl", "raw I ind",
        _ROW_COLUMNS.replace("START", "ip[i]").replace("EMIT", "ind[o++] = (I)best")),
    "row_walk_sum": (
        "raw P inc, raw int64 inc_ptr, raw I ip, raw J ind, raw C cols, raw float64 K, "
        "int64 c0, int64 c1, int32 nr, int32 ncl, int32 nf, int64 kfld, int64 dpos, int64 dfld",
        "raw float64 data", _ROW_WALK_SUM),
}

#: the CuPy kernels of this module (made once, on first use)
KERNEL_NAMES = tuple(f"adaptmg_{n}" for n in _SPECS)


@functools.lru_cache(maxsize=None)
def _kernel(name):
    """CuPy kernel ``adaptmg_<name>``: the pattern's row kernels (step 2), the row walk (step 3)."""
    xp = get_backend("gpu").xp
    ins, outs, op = _SPECS[name]
    return xp.ElementwiseKernel(ins, outs, op, f"adaptmg_{name}")


def _np_row_walk_sum(pat, data, c0, K):
    """NumPy twin of ``adaptmg_row_walk_sum``: the entries' positions by a bisection of their
    rows (:func:`adaptmg.fe.csr_ops.row_positions`), then ``np.add.at`` in (c, i, j) order per
    field (the same sums, bit for bit)."""
    nc, nr, ncl = pat.cell_shape
    nf, n = K.shape[0], K.shape[1]
    h = lambda a: a.view(np.ndarray)          # noqa: E731  (the tests' device stand-ins: host views)
    out, K = h(data).reshape(pat.nnz, nf), h(K)
    ip, ind, rtab, ctab = h(pat.d_indptr), h(pat.d_indices), h(pat._row_cells), h(pat._col_cells)
    step = max(1, _NP_TWIN_ENTRIES // max(nr * ncl, 1))
    for s in range(0, n, step):              # cell chunks of bounded temporaries
        m = min(step, n - s)
        rc = rtab[c0 + s:c0 + s + m]
        cc = ctab[c0 + s:c0 + s + m]
        rows = np.broadcast_to(rc[:, :, None], (m, nr, ncl)).reshape(-1).astype(np.int64)
        vals = np.broadcast_to(cc[:, None, :], (m, nr, ncl)).reshape(-1)
        pos = row_positions(np, ip, ind, vals, rows=rows)
        for f in range(nf):                  # loop over fields only
            np.add.at(out[:, f], pos, K[f, s:s + m].reshape(-1))
    return data


_NP_TWIN_ENTRIES = 1 << 22        # entries per step of the twin (its index temporaries)


def row_walk_sum(pat, data, c0, K):
    """``data`` += the element entries ``K`` (nf, n, nr, ncl) of the cells ``c0 .. c0 + n - 1``
    on the pattern ``pat`` (the module's step 3); ``data`` C-contiguous (nnz,) for nf = 1 or
    (nnz, nf): the kernel on the device, the twin on NumPy."""
    if in_host_memory(data):
        return _np_row_walk_sum(pat, data, c0, K)
    nf, n = K.shape[0], K.shape[1]
    if n and pat.shape[0]:
        nr, ncl = pat.cell_shape[1:]
        _kernel("row_walk_sum")(pat.inc, pat.inc_ptr, pat.d_indptr, pat.d_indices, pat._col_cells,
                                K.reshape(-1), np.int64(c0), np.int64(c0 + n), np.int32(nr), np.int32(ncl),
                                np.int32(nf), np.int64(n * nr * ncl), np.int64(nf), np.int64(1),
                                data.reshape(-1), size=pat.shape[0])
    return data


def _int64_sparse(xp):
    """Whether ``xp``'s sparse matrices keep 64-bit indices (CuPy >= 14.3; earlier versions cast
    them to int32, which wraps above 2^31 - 1 entries)."""
    v = getattr(xp, "__version__", "0")
    try:
        major, minor = (int(x) for x in v.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (14, 3)


def chunk_cells(per_cell, budget=None):
    """Cells per chunk whose element entries (``per_cell`` float64 each) fit ``budget`` bytes
    (default :data:`ASSEMBLY_CHUNK_BYTES`); at least 1."""
    budget = ASSEMBLY_CHUNK_BYTES if budget is None else budget
    return max(1, int(budget) // (8 * max(int(per_cell), 1)))


class DevicePattern:
    """Merged sparsity pattern of the pairs (row_cells[c, i], col_cells[c, j]), built on the
    backend's device without element-sized arrays (the module's steps 1-2).

    Attributes: ``shape``, ``cell_shape`` (ncells, nr, ncl), ``nnz``, the device ``d_indptr``
    and ``d_indices`` (the same integers as :class:`~adaptmg.fe.sparsity.Pattern`'s; host
    copies ``indptr``/``indices`` made on first use) and the incidence ``inc``/``inc_ptr``.
    """

    def __init__(self, backend, row_cells, col_cells, nrows, ncols):
        be = get_backend(backend)
        xp = be.xp                       # CuPy; NumPy runs the same code (the CPU tests)
        row_cells, col_cells, (nc, nr, ncl), (nrows, ncols) = cell_tables(row_cells, col_cells, nrows, ncols)
        self.backend = be
        self.shape = (nrows, ncols)
        self.cell_shape = (nc, nr, ncl)
        ninc = nc * nr
        node_t = _index_dtype(max(nrows, ncols))
        rc = xp.ascontiguousarray(xp.asarray(row_cells), dtype=node_t)
        cc = rc if col_cells is row_cells else xp.ascontiguousarray(xp.asarray(col_cells), dtype=node_t)
        self._row_cells, self._col_cells = rc, cc
        # 1. incidence: p = c*nr + i sorted stably by row node
        inc_t = _index_dtype(ninc)
        self.inc_ptr = xp.zeros(nrows + 1, dtype=xp.int64)
        if in_host_memory(rc):
            self.inc = stable_argsort(rc.reshape(-1)).astype(inc_t)
            counts = xp.bincount(rc.reshape(-1), minlength=nrows) if ninc else xp.zeros(nrows, dtype=xp.int64)
            xp.cumsum(counts[:nrows], out=self.inc_ptr[1:])
        else:       # counted and scattered by atomics, then each row's incidences sorted
            counts = xp.zeros(nrows, dtype=xp.int64)
            self.inc = xp.empty(ninc, dtype=inc_t)
            if ninc and nrows:
                flat = rc.reshape(-1)
                _kernel("incidence_count")(flat, np.int64(nrows), counts)
                xp.cumsum(counts, out=self.inc_ptr[1:])
                _kernel("incidence_scatter")(flat, self.inc_ptr, np.int64(nrows), xp.zeros(nrows, dtype=xp.int32),
                                             self.inc)
                _kernel("incidence_sort")(self.inc_ptr, self.inc, size=nrows)
        ranges = xp.stack([rc.min(), rc.max(), cc.min(), cc.max()]).astype(xp.int64) if ninc and ncl \
            else xp.asarray(np.array([0, max(nrows - 1, 0), 0, max(ncols - 1, 0)], dtype=np.int64))
        # 2. the pattern: row kernels on the device, sorts of row blocks on NumPy (the twin)
        indptr = xp.zeros(nrows + 1, dtype=xp.int64)
        if in_host_memory(rc):
            lo_hi, rowcnt, indices = self._sorted_blocks(xp, counts, ranges)
            if rowcnt is not None:
                xp.cumsum(rowcnt, out=indptr[1:])
            nnz = int(indptr[-1])
        else:       # out-of-range table entries only miscount (no access out of bounds): checked after
            scols = None
            if ninc and ncl and nrows:                     # each cell's columns sorted
                scols = xp.empty_like(cc)
                _kernel("sorted_cell_columns")(cc, np.int32(ncl), scols, size=nc)
                cnt = _kernel("row_columns_count")(self.inc, self.inc_ptr, scols, np.int32(nr), np.int32(ncl),
                                                    xp.empty(nrows, dtype=xp.int64))
                xp.cumsum(cnt, out=indptr[1:])
                del cnt
            got = to_host(xp.concatenate([ranges, indptr[-1:]]))          # the one read
            lo_hi, nnz = got[:4], int(got[4])
        if lo_hi[0] < 0 or lo_hi[1] >= max(nrows, 1) or lo_hi[2] < 0 or lo_hi[3] >= max(ncols, 1):
            raise ValueError(f"DevicePattern: cell tables index rows {lo_hi[0]}..{lo_hi[1]} "
                             f"and columns {lo_hi[2]}..{lo_hi[3]}, outside a {nrows} x {ncols} matrix")
        self.nnz = nnz
        idx_t = _index_dtype(max(nnz, nrows, ncols))
        self.d_indptr = indptr.astype(idx_t)
        del indptr
        if in_host_memory(rc):
            self.d_indices = indices.astype(idx_t, copy=False)
        else:
            self.d_indices = xp.empty(nnz, dtype=idx_t)
            if nnz:
                _kernel("row_columns_fill")(self.inc, self.inc_ptr, scols, self.d_indptr, np.int32(nr),
                                            np.int32(ncl), self.d_indices, size=nrows)
            del scols
        self._host = None

    def _sorted_blocks(self, xp, counts, ranges):
        """NumPy twin of the row kernels: ``(ranges on the host, entries per row, indices)`` by
        blocks of whole rows of at most :data:`PATTERN_CHUNK_ENTRIES` candidates: the keys
        ``row * ncols + col`` of a block's incidences sorted, their distinct values.  Written
        against ``xp`` (the tests' device stand-ins)."""
        (nrows, ncols), (nc, nr, ncl) = self.shape, self.cell_shape
        ninc, cc = nc * nr, self._col_cells
        per_block = max(1, PATTERN_CHUNK_ENTRIES // max(ncl, 1))
        cuts = xp.searchsorted(self.inc_ptr, xp.arange(per_block, ninc, per_block, dtype=xp.int64))
        bounds = xp.concatenate([xp.zeros(1, dtype=xp.int64), cuts.astype(xp.int64),
                                 xp.full(1, nrows, dtype=xp.int64)])
        got = to_host(xp.concatenate([bounds, self.inc_ptr[bounds], ranges]))    # one read
        nb = bounds.shape[0]
        bounds, at, lo_hi = got[:nb], got[nb:2 * nb], got[2 * nb:]
        pieces, rowcnt = [], []
        if lo_hi[0] < 0 or lo_hi[1] >= max(nrows, 1) or lo_hi[2] < 0 or lo_hi[3] >= max(ncols, 1):
            return lo_hi, None, None                                # the caller raises
        for k in range(bounds.size - 1):                            # loop over row blocks only
            r0, r1, t0, t1 = int(bounds[k]), int(bounds[k + 1]), int(at[k]), int(at[k + 1])
            if t1 == t0:
                rowcnt.append(xp.zeros(r1 - r0, dtype=xp.int64))
                continue
            cells = self.inc[t0:t1] // nr
            rl = repeat(xp.arange(r1 - r0, dtype=xp.int64), counts[r0:r1], t1 - t0, xp=xp)
            keys = (rl[:, None] * ncols + cc[cells]).reshape(-1)
            del cells, rl
            keys.sort()
            head = xp.empty(keys.size, dtype=bool)
            head[0] = True
            xp.not_equal(keys[1:], keys[:-1], out=head[1:])
            uk = keys[xp.flatnonzero(head)]
            del keys, head
            rows = uk // ncols
            pieces.append((uk - rows * ncols).astype(cc.dtype))
            rowcnt.append(xp.bincount(rows, minlength=r1 - r0))
            del uk, rows
        rowcnt = xp.concatenate(rowcnt) if rowcnt else xp.zeros(nrows, dtype=xp.int64)
        return lo_hi, rowcnt, (xp.concatenate(pieces) if pieces else xp.zeros(0, dtype=cc.dtype))

    def _host_index(self):
        if self._host is None:           # downloaded once, only for host results
            self._host = (to_host(self.d_indptr), to_host(self.d_indices))
        return self._host

    @property
    def indptr(self):
        """Host copy of ``d_indptr`` (made on first use: device results never need it)."""
        return self._host_index()[0]

    @property
    def indices(self):
        """Host copy of ``d_indices`` (made on first use)."""
        return self._host_index()[1]

    def zeros(self):
        """A zero data array (nnz,) float64 on the device, to :meth:`add` chunks into."""
        return self.backend.xp.zeros(self.nnz, dtype=np.float64)

    def add(self, data, c0, K):
        """``data`` += the element entries ``K`` (device, float64) of the cells
        ``c0 .. c0 + n - 1``: ``data`` (nnz,) and ``K`` (n, nr * ncl) or (n, nr, ncl); or nf
        fields, ``data`` (nnz, nf) and ``K`` (nf, n * nr * ncl) or (nf, n, nr, ncl).  Chunks
        added in ascending cell order give the entries of :meth:`sum` of all of them, bit for
        bit."""
        nc, nr, ncl = self.cell_shape
        xp = self.backend.xp
        nf = 1 if data.ndim == 1 else data.shape[1]
        per = nr * ncl
        n = K.size // max(nf * per, 1) if per else 0
        if (data.shape[0] != self.nnz or data.ndim > 2 or data.dtype != np.float64
                or not data.flags.c_contiguous):
            raise ValueError(f"DevicePattern.add: data must be C-contiguous float64 (nnz,) or "
                             f"(nnz, fields) with nnz = {self.nnz}, got {data.dtype} {tuple(data.shape)}")
        if c0 < 0 or c0 + n > nc or K.size != nf * n * per or (nf > 1 and K.shape[0] != nf):
            raise ValueError(f"DevicePattern.add: {tuple(K.shape)} entries ({nf} field(s)) at cell {c0} "
                             f"do not fit {nc} cells of {nr} x {ncl} entries")
        return row_walk_sum(self, data, int(c0), xp.ascontiguousarray(K, dtype=np.float64).reshape(nf, n, nr, ncl))

    def sum(self, K, on_device=False):
        """Summed entries (nnz,) from all element entries ``K`` (device, (E,) float64, cell-major
        (c, i, j)): a host array, or with ``on_device`` the device array."""
        nc, nr, ncl = self.cell_shape
        if K.size != nc * nr * ncl:
            raise ValueError(f"DevicePattern.sum: {K.size} entries, expected {nc} x {nr} x {ncl}")
        out = self.add(self.zeros(), 0, K.reshape(nc, nr, ncl))
        return out if on_device else to_host(out)

    def device_csr(self, data):
        """cupyx CSR matrix of the summed device ``data`` (nnz,) on this pattern (canonical: rows
        sorted, no duplicates); its index arrays are copies, so the memoised pattern never
        changes through the matrix."""
        csp = self.backend.sparse
        if max(self.nnz, *self.shape) > _INT32_MAX and not _int64_sparse(self.backend.xp):
            raise ValueError(f"DevicePattern.device_csr: {self.nnz} entries in a {self.shape[0]} x "
                             f"{self.shape[1]} matrix need 64-bit CSR indices, which cupyx.scipy.sparse "
                             f"has from CuPy 14.3 on (this is {getattr(self.backend.xp, '__version__', '?')}): "
                             "at most 2^31 - 1 entries per device matrix (split the mesh over ranks)")
        A = csr_from_arrays(csp, data, self.d_indices.copy(), self.d_indptr.copy(), self.shape)
        A.has_canonical_format = True
        return A

    # scalar / node-block host CSR from summed data: the same host index arrays as Pattern's
    csr = Pattern.csr
    block_csr = Pattern.block_csr


def get_device_pattern(backend, row_cells, col_cells, nrows, ncols):
    """:class:`DevicePattern` for these cell tables, memoised like :func:`._sparse.get_pattern`."""
    be = get_backend(backend)
    dev = int(be.xp.cuda.Device().id)
    return memoised(row_cells, col_cells, ("gpu", dev, int(nrows), int(ncols)),
                    lambda: DevicePattern(be, row_cells, col_cells, nrows, ncols))
