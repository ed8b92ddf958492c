"""Sparsity pattern and element-matrix summation on the GPU, for host assembly of large meshes.

Host assembly (:mod:`._sparse`) spends most of its time on two steps whose cost
grows with the number of element entries ``E = ncells * nr * ncl``: building the
pattern (grouping the entries by row and sorting their columns) and adding the
element matrices into it (``np.add.at``).  Both are a sort and a segmented sum,
which a GPU does in a few milliseconds for millions of entries:

1. the key ``row * ncols + col`` of every entry (cell-major order ``(c, i, j)``)
   is sorted by one stable radix sort; equal keys -- the entries summed into one
   matrix position -- become a run ``order[seg[k]:seg[k+1]]``, still in entry
   order; the distinct keys give ``indptr``/``indices`` (rows sorted, columns
   sorted within rows, as on the host);
2. the element entries (computed on the host, copied up chunk by chunk) are
   summed per run by one kernel ``adaptmg_segment_sum``:
   :math:`a_k = \\sum_{t=seg_k}^{seg_{k+1}-1} K_{order_t}`, sequentially from 0.

The run order equals the order in which ``np.add.at`` visits the entries, so the
summed values are bit-identical to the host pattern's; the matrix comes back to
the host as SciPy CSR (the assembly contract), only ``data`` being copied per
call: the index arrays are copied down once per pattern, and only when a host result is
asked for (``keep_on_device`` results never leave the device).  Patterns are memoised
like the host ones (:func:`._sparse.memoised`).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend
from ..fe.sparsity import Pattern, _index_dtype, cell_tables, memoised

__all__ = ["DevicePattern", "DeviceFieldSums", "get_device_pattern", "segment_sum", "MIN_DEVICE_ENTRIES"]

# below this many element entries the copies and launches cost more than the host pattern
MIN_DEVICE_ENTRIES = 1 << 18
_INT32_MAX = np.iinfo(np.int32).max

_SEGMENT_SUM = r"""
double s = 0.0;
for (I t = seg[i]; t < seg[i + 1]; ++t) s += K[order[t]];
out = s;
"""


@functools.lru_cache(maxsize=None)
def _segment_sum_kernel():
    """CuPy kernel ``adaptmg_segment_sum``: out[i] = sum of K[order[t]], t in [seg[i], seg[i+1])."""
    xp = get_backend("gpu").xp
    return xp.ElementwiseKernel("raw I seg, raw I order, raw float64 K", "float64 out",
                                _SEGMENT_SUM, "adaptmg_segment_sum")


def _np_segment_sum(seg, order, K, out):
    """NumPy twin of ``adaptmg_segment_sum`` (sequential sums from 0, like ``np.add.at``)."""
    out[...] = 0.0
    counts = np.diff(seg)
    rows = np.repeat(np.arange(out.size), counts)
    np.add.at(out, rows, K[order])
    return out


def segment_sum(seg, order, K, out):
    """out[k] = sum_{t = seg[k]}^{seg[k+1]-1} K[order[t]] (in t order); NumPy or CuPy arrays."""
    if isinstance(out, np.ndarray):
        return _np_segment_sum(seg, order, K, out)
    _segment_sum_kernel()(seg, order, K, out)
    return out


class DevicePattern:
    """Merged sparsity pattern of the pairs (row_cells[c, i], col_cells[c, j]), built on the GPU.

    Attributes: ``shape``, ``cell_shape`` (ncells, nr, ncl), ``nnz``, host ``indptr`` and
    ``indices`` (identical to :class:`._sparse.Pattern`'s; downloaded on first use), and on
    the device ``order``
    (entries sorted by matrix position, stable), ``seg`` (nnz + 1 run starts) and the same
    ``d_indptr`` / ``d_indices`` (for :meth:`device_csr`).
    """

    def __init__(self, backend, row_cells, col_cells, nrows, ncols):
        be = get_backend(backend)
        if not be.is_gpu:
            raise ValueError(f"DevicePattern needs the GPU backend, got {be.name!r}")
        xp = be.xp
        row_cells, col_cells, (nc, nr, ncl), (nrows, ncols) = cell_tables(row_cells, col_cells, nrows, ncols)
        nent = nc * nr * ncl
        if nent > _INT32_MAX:
            raise ValueError(f"DevicePattern: {nent} element entries exceed the 32-bit run indices")
        self.backend = be
        self.shape = (nrows, ncols)
        self.cell_shape = (nc, nr, ncl)
        r = xp.asarray(row_cells).astype(xp.int64)
        c = xp.asarray(col_cells).astype(xp.int64)
        keys = (r[:, :, None] * ncols + c[:, None, :]).reshape(-1)
        del r, c
        order = xp.argsort(keys)                       # stable: a run keeps entry order
        sk = keys[order]
        del keys
        head = xp.empty(nent, dtype=bool)
        if nent:
            head[0] = True
            xp.not_equal(sk[1:], sk[:-1], out=head[1:])
        starts = xp.flatnonzero(head)
        uk = sk[starts]
        del sk, head
        nnz = int(starts.size)
        rows = uk // ncols
        idx_t = _index_dtype(max(nnz, nrows, ncols))
        indptr = xp.searchsorted(rows, xp.arange(nrows + 1, dtype=rows.dtype))
        self.d_indices = (uk - rows * ncols).astype(idx_t)
        self.d_indptr = indptr.astype(idx_t)
        self._host = None
        del uk, rows, indptr
        self.order = order.astype(xp.int32)
        del order
        self.seg = xp.empty(nnz + 1, dtype=xp.int32)
        self.seg[:nnz] = starts
        self.seg[nnz] = nent
        self.nnz = nnz

    def _host_index(self):
        if self._host is None:           # downloaded once, only for host results
            self._host = (self.d_indptr.get(), self.d_indices.get())
        return self._host

    @property
    def indptr(self):
        """Host copy of ``d_indptr`` (made on first use: device results never need it)."""
        return self._host_index()[0]

    @property
    def indices(self):
        """Host copy of ``d_indices`` (made on first use)."""
        return self._host_index()[1]

    def sum(self, K, on_device=False):
        """Summed entries (nnz,) from all element entries ``K`` (device, (E,) float64): a host
        array, or with ``on_device`` the device array."""
        xp = self.backend.xp
        out = xp.empty(self.nnz, dtype=xp.float64)
        segment_sum(self.seg, self.order, K, out)
        return out if on_device else out.get()

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


class DeviceFieldSums:
    """Sums of several element-entry fields on the GPU, into host targets: the device
    counterpart of :class:`adaptmg.fe.sparsity.FieldSums` (same ``targets`` convention: a
    float64 array (nnz,) or ``(A, c)``, column c of a float64 array A (nnz, k)).

    :meth:`add` copies a chunk's entries (nfields, n, nr*ncl) up in one transfer into a
    device buffer (nfields, E); :meth:`finish` sums every field by the pattern's runs
    (:func:`segment_sum`: entry order, so bit-identical to ``np.add.at`` on the host pattern)
    and copies the (nnz,) sums down into the targets.  Device memory: nfields * E * 8 bytes.
    """

    def __init__(self, pattern, targets, step):
        xp = pattern.backend.xp
        self.pattern = pattern
        nc, nr, ncl = pattern.cell_shape
        self.per = nr * ncl
        self.targets = list(targets)
        self.nfields = len(self.targets)
        for t in self.targets:
            v = t[0][:, t[1]] if isinstance(t, tuple) else t
            if v.shape != (pattern.nnz,):
                raise ValueError(f"DeviceFieldSums: targets must have nnz = {pattern.nnz} entries, got {v.shape}")
        self._K = xp.empty((self.nfields, nc * self.per), dtype=xp.float64)
        self._stage = xp.empty(self.nfields * max(1, int(step)) * self.per, dtype=xp.float64)

    def add(self, sl, K):
        """Copy up the entries ``K`` (nfields, n, nr*ncl) (host, C-contiguous) of the cells ``sl``."""
        m = (sl.stop - sl.start) * self.per
        K = np.ascontiguousarray(K, dtype=np.float64).reshape(self.nfields, m)
        if K.size > self._stage.size:
            self._stage = self.pattern.backend.xp.empty(K.size, dtype=np.float64)
        st = self._stage[:K.size]
        st.set(K.reshape(-1))
        self._K[:, sl.start * self.per:sl.stop * self.per] = st.reshape(self.nfields, m)

    def finish(self):
        """Sum every field and write the sums into the host targets; frees the device buffer."""
        for f, t in enumerate(self.targets):
            s = self.pattern.sum(self._K[f])
            if isinstance(t, tuple):
                t[0][:, t[1]] = s
            else:
                t[...] = s
        self._K = self._stage = None


def get_device_pattern(backend, row_cells, col_cells, nrows, ncols):
    """:class:`DevicePattern` for these cell tables, memoised like :func:`._sparse.get_pattern`."""
    be = get_backend(backend)
    dev = int(be.xp.cuda.Device().id)
    return memoised(row_cells, col_cells, ("gpu", dev, int(nrows), int(ncols)),
                    lambda: DevicePattern(be, row_cells, col_cells, nrows, ncols))
