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
2. **Pattern.**  By blocks of whole rows with at most :data:`PATTERN_CHUNK_ENTRIES`
   candidates: the keys ``row * ncols + col_cells[c, j]`` of the block's incidences, sorted,
   their distinct values -> ``indices`` (columns ascending within rows) and the row counts ->
   ``indptr``.  The same integers as :class:`~adaptmg.fe.sparsity.Pattern`.
3. **Sums.**  For a chunk of cells :math:`[c_0, c_1)` and its element matrices K, one thread
   per row r (kernel ``adaptmg_row_walk_sum``) walks r's incidences (c, i) with
   :math:`c_0 \le c < c_1` in ascending order and for j = 0..ncl-1 adds
   :math:`K_{c,i,j}` into the entry of column ``col_cells[c, j]`` (binary search in the row's
   sorted columns):

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

from ..backend import get_backend, in_host_memory, repeat, stable_argsort, to_host
from ..fe.sparsity import Pattern, _index_dtype, cell_tables, memoised

__all__ = ["DevicePattern", "get_device_pattern", "row_walk_sum", "MIN_DEVICE_ENTRIES",
           "PATTERN_CHUNK_ENTRIES", "ASSEMBLY_CHUNK_BYTES", "chunk_cells"]

# below this many element entries the copies and launches cost more than the host pattern
MIN_DEVICE_ENTRIES = 1 << 18
#: candidate (row, column) keys sorted at once while building a pattern: 8 bytes each, plus
#: the sort's scratch (about as much again) -- ~2-3 GiB of temporaries whatever the mesh size
PATTERN_CHUNK_ENTRIES = 1 << 27
#: bytes of element matrices (float64) computed and summed at once by the device forms: the
#: chunk's K (cells x nr x ncl) -- for 3-D Q1 2^21 cells, for 3-D Q2 ~184k cells
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
const long long b = ip[i], e = ip[i + 1];
for (long long t = lo; t < end; ++t) {
  const long long p = inc[t];
  if (p >= stop) break;
  const long long c = p / nrl;
  const long long kb = (p - first) * ncll;   // K[c - c0, p - c nr, :]
  const long long cb = c * ncll;
  for (long long j = 0; j < ncll; ++j) {
    const long long s = cols[cb + j];
    long long l = b, h = e - 1;
    while (l < h) {
      long long m = (l + h) >> 1;
      if ((long long)ind[m] < s) l = m + 1; else h = m;
    }
    data[l] += K[kb + j];
  }
}
"""


@functools.lru_cache(maxsize=None)
def _row_walk_kernel():
    """CuPy kernel ``adaptmg_row_walk_sum`` (one thread per row; the module's step 3)."""
    xp = get_backend("gpu").xp
    return xp.ElementwiseKernel(
        "raw P inc, raw int64 inc_ptr, raw I ip, raw J ind, raw C cols, raw float64 K, "
        "int64 c0, int64 c1, int32 nr, int32 ncl", "raw float64 data",
        _ROW_WALK_SUM, "adaptmg_row_walk_sum")


def _segment_search(ip, ind, rows, vals, steps):
    """Positions of the columns ``vals`` in the sorted rows ``rows`` of the CSR index
    (``ip``, ``ind``), vectorised: ``steps`` >= ceil(log2(longest row)) bisection steps."""
    lo = ip[rows].astype(np.int64)
    hi = ip[rows + 1].astype(np.int64) - 1
    for _ in range(steps):                   # loop over bisection steps only
        mid = (lo + hi) >> 1
        go = ind[mid] < vals
        np.copyto(lo, mid + 1, where=go)
        np.copyto(hi, mid, where=~go)
    return lo


def _np_row_walk_sum(pat, data, c0, K):
    """NumPy twin of ``adaptmg_row_walk_sum``: the entries' positions by a bisection of their
    rows, then ``np.add.at`` in (c, i, j) order (the same sums, bit for bit)."""
    nc, nr, ncl = pat.cell_shape
    n = K.shape[0]
    h = lambda a: a.view(np.ndarray)          # noqa: E731  (the tests' device stand-ins: host views)
    out, K = h(data), h(K)
    ip, ind, rtab, ctab = h(pat.d_indptr), h(pat.d_indices), h(pat._row_cells), h(pat._col_cells)
    step = max(1, _NP_TWIN_ENTRIES // max(nr * ncl, 1))
    for s in range(0, n, step):              # cell chunks of bounded temporaries
        m = min(step, n - s)
        rc = rtab[c0 + s:c0 + s + m]
        cc = ctab[c0 + s:c0 + s + m]
        rows = np.broadcast_to(rc[:, :, None], (m, nr, ncl)).reshape(-1).astype(np.int64)
        vals = np.broadcast_to(cc[:, None, :], (m, nr, ncl)).reshape(-1)
        pos = _segment_search(ip, ind, rows, vals, pat._steps)
        np.add.at(out, pos, K[s:s + m].reshape(-1))
    return data


_NP_TWIN_ENTRIES = 1 << 22        # entries per step of the twin (its index temporaries)


def row_walk_sum(pat, data, c0, K):
    """``data`` += the element entries ``K`` (n, nr, ncl) of the cells ``c0 .. c0 + n - 1`` on
    the pattern ``pat`` (the module's step 3): the kernel on the device, the twin on NumPy."""
    if in_host_memory(data):
        return _np_row_walk_sum(pat, data, c0, K)
    n = K.shape[0]
    if n and pat.shape[0]:
        _row_walk_kernel()(pat.inc, pat.inc_ptr, pat.d_indptr, pat.d_indices, pat._col_cells,
                           K, np.int64(c0), np.int64(c0 + n), np.int32(pat.cell_shape[1]),
                           np.int32(pat.cell_shape[2]), data, size=pat.shape[0])
    return data


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
        cc = xp.ascontiguousarray(xp.asarray(col_cells), dtype=node_t)
        self._row_cells, self._col_cells = rc, cc
        # 1. incidence: p = c*nr + i sorted stably by row node
        self.inc = stable_argsort(rc.reshape(-1)).astype(_index_dtype(ninc))
        counts = xp.bincount(rc.reshape(-1), minlength=nrows) if ninc else xp.zeros(nrows, dtype=xp.int64)
        self.inc_ptr = xp.zeros(nrows + 1, dtype=xp.int64)
        xp.cumsum(counts[:nrows], out=self.inc_ptr[1:])
        # 2. pattern by blocks of whole rows of at most PATTERN_CHUNK_ENTRIES candidates: the
        # blocks' first rows and incidences, and the tables' ranges, in one read
        per_block = max(1, PATTERN_CHUNK_ENTRIES // max(ncl, 1))
        cuts = xp.searchsorted(self.inc_ptr, xp.arange(per_block, ninc, per_block, dtype=xp.int64))
        bounds = xp.concatenate([xp.zeros(1, dtype=xp.int64), cuts.astype(xp.int64),
                                 xp.full(1, nrows, dtype=xp.int64)])
        ranges = xp.stack([rc.min(), rc.max(), cc.min(), cc.max()]).astype(xp.int64) if ninc and ncl \
            else xp.array([0, max(nrows - 1, 0), 0, max(ncols - 1, 0)], dtype=xp.int64)
        got = to_host(xp.concatenate([bounds, self.inc_ptr[bounds], ranges]))
        nb = bounds.shape[0]
        bounds, at, lo_hi = got[:nb], got[nb:2 * nb], got[2 * nb:]
        if lo_hi[0] < 0 or lo_hi[1] >= max(nrows, 1) or lo_hi[2] < 0 or lo_hi[3] >= max(ncols, 1):
            raise ValueError(f"DevicePattern: cell tables index rows {lo_hi[0]}..{lo_hi[1]} "
                             f"and columns {lo_hi[2]}..{lo_hi[3]}, outside a {nrows} x {ncols} matrix")
        pieces, rowcnt = [], []
        for k in range(bounds.size - 1):                          # loop over row blocks only
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
            pieces.append((uk - rows * ncols).astype(node_t))
            rowcnt.append(xp.bincount(rows, minlength=r1 - r0))
            del uk, rows
        rowcnt = xp.concatenate(rowcnt) if rowcnt else xp.zeros(nrows, dtype=xp.int64)
        indptr = xp.zeros(nrows + 1, dtype=xp.int64)
        xp.cumsum(rowcnt, out=indptr[1:])
        self.nnz = nnz = int(indptr[-1])
        idx_t = _index_dtype(max(nnz, nrows, ncols))
        self.d_indptr = indptr.astype(idx_t)
        self.d_indices = (xp.concatenate(pieces) if pieces else xp.zeros(0, dtype=node_t)).astype(idx_t, copy=False)
        del pieces
        self._host = None

    @property
    def _steps(self):
        """Bisection steps of the twin's search: ceil(log2(longest row)) + 1 (host only)."""
        ip = self.d_indptr.view(np.ndarray)
        return int(np.diff(ip).max() if ip.size > 1 else 0).bit_length() + 1

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
        """``data`` += the element entries ``K`` (n, nr * ncl) or (n, nr, ncl) (device,
        float64) of the cells ``c0 .. c0 + n - 1``.  Chunks added in ascending cell order give
        the entries of :meth:`sum` of all of them, bit for bit."""
        nc, nr, ncl = self.cell_shape
        n = K.shape[0]
        if c0 < 0 or c0 + n > nc or K.size != n * nr * ncl:
            raise ValueError(f"DevicePattern.add: {tuple(K.shape)} entries at cell {c0} do not "
                             f"fit {nc} cells of {nr} x {ncl} entries")
        return row_walk_sum(self, data, int(c0), self.backend.xp.ascontiguousarray(K).reshape(n, nr, ncl))

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
        A = csp.csr_matrix((data, self.d_indices.copy(), self.d_indptr.copy()), shape=self.shape)
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
