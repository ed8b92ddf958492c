"""Sparsity pattern of a cell-wise assembly and the scatter of element matrices into CSR.

Assembly adds, for every cell c and local pair (i, j), the element-matrix entry
``K[c, i, j]`` to the global position ``(row_cells[c, i], col_cells[c, j])``.
Instead of the generic COO -> CSR conversion (a sort of all ``ncells * nloc**2``
entries on every call, plus several temporaries of that size) the
:class:`Pattern` is built once from the cell-to-node tables:

1. the ``ncells * nloc`` node-cell incidences are grouped by row node; this
   enumerates all entries row by row without sorting them. When every node is
   local index i of at most one cell (cells of one orientation: structured and
   adaptive meshes, Q1 and Q2) the slot (node, i) is unique and the grouping is a
   counting scatter into a (nodes, nloc) table; otherwise one stable argsort;
2. the rows are processed in blocks of about ``_BLOCK_ENTRIES`` entries, so that
   the entry-sized temporaries below stay in cache: within each row the columns
   are sorted by SciPy's ``csr_sort_indices`` (per-row ``std::sort`` on short
   rows), carrying the entry numbers along;
3. equal neighbours are merged; the result is ``pos``, the CSR position of every
   element entry (cell-major order), plus ``indptr``/``indices``.

Element matrices are then added chunk by chunk with ``np.add.at(data, pos[chunk], K)``,
so the full (ncells, nloc, nloc) array never exists. Vector-valued operators use
the node pattern with dense rb x cb blocks (BSR), converted to CSR by SciPy.

Performance note: on virtualised machines first-touching fresh memory costs
more than the arithmetic (a page fault per 4 KiB); the code therefore keeps
the number of entry-sized temporaries small, reuses buffers, and processes
cells in chunks small enough for the allocator to recycle.

Patterns of read-only cell tables are memoised (weakly, by array identity), so a
second operator on the same space pays only for its element matrices.
"""
from __future__ import annotations

import weakref

import numpy as np
import scipy.sparse as sp

from ..backend import is_device_array

__all__ = ["Pattern", "FieldSums", "get_pattern", "componentwise", "clear_cache", "counting_order"]

_INT32_MAX = np.iinfo(np.int32).max


def _index_dtype(n):
    return np.int32 if n <= _INT32_MAX else np.int64


def _row_grouped(row_cells, nrows):
    """Incidence ids e = c*nr + i grouped by row node ``row_cells[c, i]`` (any order inside a row).

    Returns (ids, by_slot). If every node is local index i of at most one cell for each i
    (true on meshes whose cells share the reference orientation: structured and adaptive
    meshes, Q1 and Q2), the slot (node, i) is unique and the grouping is one scatter of
    e into a (nrows, nr) table, read back row by row (``by_slot=True``); the scatter is
    checked by counting the filled slots (ninc of them iff no slot was written twice; no
    gather reading it back).  Otherwise (or when the table would be much larger than the
    incidences) the stable argsort's permutation of the row nodes, by a counting sort.
    """
    nc, nr = row_cells.shape
    ninc = nc * nr
    inc_t = _index_dtype(ninc)
    if ninc and nrows * nr <= 16 * ninc:
        slot = (row_cells * nr + np.arange(nr)).reshape(-1)
        ids = np.arange(ninc, dtype=inc_t)
        table = np.full(nrows * nr, -1, dtype=inc_t)
        table[slot] = ids
        filled = table >= 0
        if np.count_nonzero(filled) == ninc:             # ninc distinct slots: none written twice
            return table[filled], True
    flat = row_cells.reshape(-1)
    if ninc and nrows and flat.min() >= 0 and flat.max() < nrows:
        return counting_order(flat, nrows).astype(inc_t, copy=False), False
    return np.argsort(flat, kind="stable").astype(inc_t, copy=False), False


def counting_order(x, n):
    """The stable argsort of the host ints ``0 <= x < n`` as a counting sort, O(x.size + n):
    SciPy's C++ CSC -> CSR transposition of the (n x x.size) incidence matrix (one entry per
    column) lists every row's columns in increasing order -- the same permutation."""
    m = x.size
    it = _index_dtype(max(m, n))
    K = sp.csc_matrix((np.ones(m, dtype=np.int8), x.astype(it, copy=False), np.arange(m + 1, dtype=it)),
                      shape=(n, m), copy=False)
    return K.tocsr().indices


def cell_tables(row_cells, col_cells, nrows, ncols):
    """Checked (row_cells, col_cells, (ncells, nr, ncl), (nrows, ncols)) of a pattern's input."""
    if not (is_device_array(row_cells) and is_device_array(col_cells)):   # a device mesh's stay there
        row_cells, col_cells = np.asarray(row_cells), np.asarray(col_cells)
    nc, nr = row_cells.shape
    ncl = col_cells.shape[1]
    if col_cells.shape[0] != nc:
        raise ValueError(f"row and column cell tables differ in length: {row_cells.shape} vs {col_cells.shape}")
    return row_cells, col_cells, (nc, nr, ncl), (int(nrows), int(ncols))


_BLOCK_ENTRIES = 1 << 19     # entries per row block of Pattern: temporaries stay cache-sized


class Pattern:
    """Merged sparsity pattern of the pairs (row_cells[c, i], col_cells[c, j]).

    Attributes: ``shape``, ``indptr``, ``indices``, ``nnz`` and ``pos`` (ncells*nr*ncl,)
    with the CSR position of entry (c, i, j) at ``pos[(c*nr + i)*ncl + j]``.
    """

    def __init__(self, row_cells, col_cells, nrows, ncols):
        row_cells, col_cells, (nc, nr, ncl), (nrows, ncols) = cell_tables(row_cells, col_cells, nrows, ncols)
        self.shape = (nrows, ncols)
        self.cell_shape = (nc, nr, ncl)
        nent = nc * nr * ncl
        ent_t = _index_dtype(nent)
        col_t = _index_dtype(max(ncols, nent))
        counts = np.bincount(row_cells.reshape(-1), minlength=nrows)
        inc_ptr = np.zeros(nrows + 1, dtype=np.int64)
        np.cumsum(counts, out=inc_ptr[1:])
        order, self._by_slot = _row_grouped(row_cells, nrows)
        # column rows as single opaque items: a 1-D gather of ncl*itemsize-byte records is
        # several times faster than fancy-indexing the rows of a 2-D array
        ctab = np.ascontiguousarray(col_cells, dtype=col_t)
        crec = ctab.view(np.dtype((np.void, ncl * ctab.itemsize))).reshape(nc) if ncl else None
        pos = np.empty(nent, dtype=ent_t)
        rec = np.dtype((np.void, max(ncl, 1) * pos.itemsize))
        prec = pos.view(rec) if nent else None           # the ncl positions of one incidence as one record
        rownnz = np.zeros(nrows, dtype=np.int64)
        parts = []
        done = 0                                         # merged entries of the previous blocks
        # blocks of whole rows with about _BLOCK_ENTRIES entries each
        cuts = np.searchsorted(inc_ptr * ncl, np.arange(_BLOCK_ENTRIES, nent, _BLOCK_ENTRIES))
        bounds = np.unique(np.concatenate([[0], cuts, [nrows]])) if nent else np.zeros(1, dtype=np.int64)
        for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            inc = order[inc_ptr[r0]:inc_ptr[r1]]
            if inc.size == 0:
                continue
            # entries of incidence e = c*nr + i are e*ncl + j: enumerate them row-grouped
            cols = np.take(crec, inc // nr).view(col_t)
            src = np.arange(cols.size, dtype=ent_t)      # local entry number k = (incidence in block)*ncl + j
            lptr = ((inc_ptr[r0:r1 + 1] - inc_ptr[r0]) * ncl).astype(col_t)
            # sort the columns within each row, carrying the local entry number along as "data"
            tmp = sp.csr_matrix((src, cols, lptr), shape=(r1 - r0, ncols), copy=False)
            tmp.has_sorted_indices = False
            tmp.sort_indices()
            cols, src = tmp.indices, tmp.data
            del tmp
            new = np.empty(cols.size, dtype=bool)
            new[0] = True
            np.not_equal(cols[1:], cols[:-1], out=new[1:])
            new[lptr[:-1][counts[r0:r1] > 0]] = True    # a new row always starts a new entry
            cum = np.cumsum(new, dtype=ent_t)
            ends = lptr[1:]
            at_end = np.where(ends > 0, cum[np.maximum(ends - 1, 0)], 0)
            rownnz[r0:r1] = np.diff(at_end, prepend=0)
            parts.append(cols[new])
            cum += ent_t(done - 1)
            rank = np.empty_like(cum)
            rank[src] = cum                              # back to block order (a cache-local scatter)
            np.put(prec, inc, rank.view(rec))            # ncl consecutive positions per incidence
            done = int(cum[-1]) + 1
        nnz = done
        idx_t = _index_dtype(max(nnz, nrows, ncols))
        self.indptr = np.zeros(nrows + 1, dtype=idx_t)
        np.cumsum(rownnz, out=self.indptr[1:])
        self.indices = (np.concatenate(parts) if parts else np.zeros(0, col_t)).astype(idx_t, copy=False)
        self.pos = pos
        self.nnz = nnz

    def cell_slice(self, sl):
        """Entry positions of the cells in slice ``sl`` (a view)."""
        _, nr, ncl = self.cell_shape
        m = nr * ncl
        return self.pos[sl.start * m: sl.stop * m]

    def new_data(self, tail=()):
        return np.zeros((self.nnz,) + tuple(tail))

    def add(self, data, sl, K):
        """Add element entries ``K`` of the cells ``sl`` (n, nr, ncl[, ...] or n, nr*ncl[, ...]) into ``data``."""
        p = self.cell_slice(sl)
        np.add.at(data, p, K.reshape((p.shape[0],) + data.shape[1:]))   # 1-D index: add.at's fast path

    def csr(self, data):
        """Scalar CSR matrix of shape ``self.shape`` from the summed ``data`` (nnz,)."""
        A = sp.csr_matrix((data, self.indices, self.indptr), shape=self.shape, copy=False)
        A.has_sorted_indices = True
        A.has_canonical_format = True
        return A

    def block_csr(self, data, rb, cb):
        """CSR of shape (nrows*rb, ncols*cb) from summed blocks ``data`` (nnz, rb*cb).

        Block entry (r, s) of node pair (n, m) goes to row n*rb + r, column m*cb + s
        (DoF index = node * components + component).
        """
        B = sp.bsr_matrix((data.reshape(-1, rb, cb), self.indices, self.indptr),
                          shape=(self.shape[0] * rb, self.shape[1] * cb))
        A = B.tocsr()
        _shrink_indices(A)
        return A

    def assemble(self, K):
        """One-shot: CSR from full element matrices (ncells, nr, ncl)."""
        data = self.new_data()
        self.add(data, slice(0, self.cell_shape[0]), np.asarray(K, dtype=np.float64))
        return self.csr(data)


class FieldSums:
    """Sums of several element-entry fields into (nnz,) targets, in entry order like
    :meth:`Pattern.add` (``np.add.at``), hence with the same values bit for bit.

    ``targets``: one per field, either a float64 array (nnz,) or ``(A, c)``: column c of a
    float64 array A (nnz, k) with contiguous rows. Two consecutive targets that are the
    adjacent columns c, c + 1 of one A share one ``np.add.at`` on their complex128 view (real
    and imaginary parts are added independently, each part is the real sum); the chunk's
    positions are converted to ``intp`` once for all fields. ``step``: the largest number of
    cells per :meth:`add` (buffers; larger chunks reallocate).
    """

    def __init__(self, pattern, targets, step):
        self.pattern = pattern
        nc, nr, ncl = pattern.cell_shape
        self._groups = []                     # (first field, number of fields, 1-D target view)
        f, nt = 0, len(targets)
        while f < nt:
            t = targets[f]
            if isinstance(t, tuple):
                A, c = t
                nxt = targets[f + 1] if f + 1 < nt else None
                if (isinstance(nxt, tuple) and nxt[0] is A and nxt[1] == c + 1
                        and A.dtype == np.float64 and A.strides[1] == A.itemsize):
                    self._groups.append((f, 2, A[:, c:c + 2].view(np.complex128)[:, 0]))
                    f += 2
                    continue
                t = A[:, c]
            self._groups.append((f, 1, t))
            f += 1
        for _, _, v in self._groups:
            if v.shape != (pattern.nnz,):
                raise ValueError(f"FieldSums: targets must have nnz = {pattern.nnz} entries, got {v.shape}")
        self.nfields = nt
        self._pbuf = np.empty(max(1, int(step)) * nr * ncl, dtype=np.intp)
        self._cbuf = np.empty((self._pbuf.size, 2))

    def add(self, sl, K):
        """Add the entries ``K`` (nfields, n, nr*ncl) (or (nfields, n, nr, ncl)) of the cells ``sl``."""
        p = self.pattern.cell_slice(sl)
        m = p.shape[0]
        if m > self._pbuf.shape[0]:
            self._pbuf = np.empty(m, dtype=np.intp)
            self._cbuf = np.empty((m, 2))
        pi = self._pbuf[:m]
        np.copyto(pi, p, casting="safe")
        K = K.reshape(self.nfields, m)
        for f, k, v in self._groups:
            if k == 2:
                cb = self._cbuf[:m]
                np.copyto(cb[:, 0], K[f])
                np.copyto(cb[:, 1], K[f + 1])
                np.add.at(v, pi, cb.view(np.complex128).reshape(m))
            else:
                np.add.at(v, pi, K[f])


def _shrink_indices(A):
    """Use int32 index arrays when they fit (SciPy may return int64)."""
    if A.indices.dtype != np.int32 and max(A.nnz, *A.shape) <= _INT32_MAX:
        A.indices = A.indices.astype(np.int32)
        A.indptr = A.indptr.astype(np.int32)


_CACHE = {}
_CACHE_MAX = 8


def memoised(row_cells, col_cells, key, build):
    """``build()`` memoised by the identity of two read-only cell tables plus ``key``.

    The memo holds the tables weakly: an entry disappears when either table is
    garbage collected (e.g. with its space), and at most ``_CACHE_MAX`` are kept.
    Writeable tables (or non-arrays) are never memoised.
    """
    cacheable = (isinstance(row_cells, np.ndarray) and isinstance(col_cells, np.ndarray)
                 and not row_cells.flags.writeable and not col_cells.flags.writeable)
    if not cacheable:
        return build()
    key = (id(row_cells), id(col_cells), row_cells.shape, col_cells.shape) + tuple(key)
    hit = _CACHE.get(key)
    if hit is not None:
        rref, cref, val = hit
        if rref() is row_cells and cref() is col_cells:
            return val
    val = build()
    while len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))

    def drop(_ref, key=key):
        _CACHE.pop(key, None)
    _CACHE[key] = (weakref.ref(row_cells, drop), weakref.ref(col_cells, drop), val)
    return val


def get_pattern(row_cells, col_cells, nrows, ncols):
    """:class:`Pattern` for these cell tables, memoised when both tables are read-only arrays
    (see :func:`memoised`)."""
    return memoised(row_cells, col_cells, ("host", int(nrows), int(ncols)),
                    lambda: Pattern(row_cells, col_cells, nrows, ncols))


def clear_cache():
    """Forget memoised sparsity patterns (host and device)."""
    _CACHE.clear()


def componentwise(A, c):
    r"""Block-diagonal expansion :math:`A \otimes I_c` in the node*c + component layout.

    Entry (n, m) of the scalar matrix becomes entries (n*c + r, m*c + r), r < c; no
    explicit zeros are stored. Built as the component-major block diagonal
    diag(A, ..., A) whose column labels are already node-major (m*c + r), followed
    by one row permutation (SciPy's C++ row gather); the rows stay sorted.
    """
    if c == 1:
        return A
    A = A.tocsr()
    if not A.has_sorted_indices:
        A = A.sorted_indices()
    N, M = A.shape
    nnz = A.nnz
    idx_t = _index_dtype(max(c * nnz, N * c, M * c))
    indptr = np.empty(c * N + 1, dtype=idx_t)
    indices = np.empty(c * nnz, dtype=idx_t)
    for r in range(c):                                   # loop over components only
        indptr[r * N:(r + 1) * N] = A.indptr[:-1] + r * nnz
        np.multiply(A.indices, c, out=indices[r * nnz:(r + 1) * nnz], dtype=idx_t, casting="unsafe")
        indices[r * nnz:(r + 1) * nnz] += r
    indptr[-1] = c * nnz
    data = np.tile(A.data, c)
    big = sp.csr_matrix((data, indices, indptr), shape=(c * N, c * M), copy=False)
    big.has_sorted_indices = True
    rows = (np.arange(c, dtype=np.int64)[None, :] * N + np.arange(N, dtype=np.int64)[:, None]).reshape(-1)
    out = big[rows]
    out.has_sorted_indices = True
    _shrink_indices(out)
    return out
