"""The sort-based device pattern (the reference :mod:`._device` replaced; kept for
comparisons and benchmarks): sparsity pattern and element-matrix summation on the GPU
(written against ``xp``: NumPy runs the same code in the CPU tests).  It sorts all
``E = ncells * nr * ncl`` keys at once and keeps a permutation of E int32, so it needs
E < 2^31 and ~2.9 KB of device memory per DoF at its peak for 3-D Q1:
:class:`._device.DevicePattern` has neither limit and gives the same bits.

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
2. the element entries (computed on the host and copied up chunk by chunk, or computed
   on the device: :mod:`.on_device`) are summed per run by one kernel
   ``adaptmg_segment_sum``:
   :math:`a_k = \\sum_{t=seg_k}^{seg_{k+1}-1} K_{order_t}`, sequentially from 0.

The run order equals the order in which ``np.add.at`` visits the entries, so for the same
element entries the summed values are bit-identical to the host pattern's; the matrix comes back to
the host as SciPy CSR (the assembly contract), only ``data`` being copied per
call: the index arrays are copied down once per pattern, and only when a host result is
asked for (``keep_on_device`` results never leave the device).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend, in_host_memory, stable_argsort, to_host
from ..fe.sparsity import Pattern, _index_dtype, cell_tables
from ._device import DevicePattern

__all__ = ["SortedDevicePattern", "segment_sum"]

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
    if in_host_memory(out):
        return _np_segment_sum(seg, order, K, out)
    _segment_sum_kernel()(seg, order, K, out)
    return out


class SortedDevicePattern:
    """Merged sparsity pattern of the pairs (row_cells[c, i], col_cells[c, j]), built on the GPU.

    Attributes: ``shape``, ``cell_shape`` (ncells, nr, ncl), ``nnz``, host ``indptr`` and
    ``indices`` (identical to :class:`._sparse.Pattern`'s; downloaded on first use), and on
    the device ``order``
    (entries sorted by matrix position, stable), ``seg`` (nnz + 1 run starts) and the same
    ``d_indptr`` / ``d_indices`` (for :meth:`device_csr`).
    """

    def __init__(self, backend, row_cells, col_cells, nrows, ncols):
        be = get_backend(backend)
        xp = be.xp                       # CuPy; NumPy runs the same code (the CPU tests)
        row_cells, col_cells, (nc, nr, ncl), (nrows, ncols) = cell_tables(row_cells, col_cells, nrows, ncols)
        nent = nc * nr * ncl
        if nent > _INT32_MAX:
            raise ValueError(f"SortedDevicePattern: {nent} element entries exceed its 32-bit run indices "
                             "(2^31 - 1); adaptmg.assemble._device.DevicePattern has no such limit")
        self.backend = be
        self.shape = (nrows, ncols)
        self.cell_shape = (nc, nr, ncl)
        r = xp.asarray(row_cells).astype(xp.int64)
        c = xp.asarray(col_cells).astype(xp.int64)
        keys = (r[:, :, None] * ncols + c[:, None, :]).reshape(-1)
        del r, c
        order = stable_argsort(keys)                   # a run keeps entry order
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

    def sum(self, K, on_device=False):
        """Summed entries (nnz,) from all element entries ``K`` (device, (E,) float64): a host
        array, or with ``on_device`` the device array."""
        xp = self.backend.xp
        out = xp.empty(self.nnz, dtype=xp.float64)
        segment_sum(self.seg, self.order, K, out)
        return out if on_device else to_host(out)

    # the host index copies, the device CSR and the host CSRs: DevicePattern's (the same attributes)
    _host_index = DevicePattern._host_index
    indptr = DevicePattern.indptr
    indices = DevicePattern.indices
    device_csr = DevicePattern.device_csr
    csr = Pattern.csr
    block_csr = Pattern.block_csr
