"""Sparse x dense-block products ``Y <- alpha A X + beta Y`` (SpMM) for block solves.

A block of ``k`` vectors is an ``(n, k)`` array.  One SpMM reads the matrix once for
all ``k`` columns, so a block multigrid cycle costs far less than ``k`` cycles when
the matrix traffic dominates.  The layout follows each library's native kernel:

* host (SciPy CSR): row-major (C order) blocks, SciPy's compiled ``csr_matvecs``
  (``Y += A X`` over all columns of a row at once; the ``alpha``/``beta`` scaling
  trick of :class:`adaptmg.device.kernels.SpMVPlan` avoids a temporary), one call per
  row chunk on the host threads for large blocks (:func:`adaptmg.threads.map_rows`);
* device (cupyx CSR): row-major (C order) blocks too, the row kernels of
  :mod:`adaptmg.device.block_kernels` (all ``k`` columns of a row per warp; also a fused
  residual and a fused out-of-place Jacobi sweep); column-major (Fortran order) blocks go to
  cuSPARSE's generic SpMM (``cupyx.cusparse.spmm``, which accepts only F-contiguous
  operands), other dtypes (complex) to ``A @ X``.

:func:`block_order` says which layout the backend's blocks use.  Every plan also has
``plan.jacobi(X, B, dinv, omega, Y)``: ``Y <- X + omega diag(dinv) (B - A X)``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend, is_device_sparse
from ..threads import ROW_SPLIT_ENTRIES, default_threads, map_rows, pool_map
from . import block_kernels as BK
from .kernels import SpMVPlan, _CpuCsrPlan, _GenericPlan

__all__ = ["make_spmm", "block_order", "scale_rows"]


def scale_rows(B, w, out):
    """``out <- w * B`` (``w`` of shape (n, 1)) by row chunks on the host threads when the
    block is large (:func:`adaptmg.threads.map_rows`)."""
    if not (B.flags.c_contiguous and out.flags.c_contiguous):
        return np.multiply(B, w, out=out)
    map_rows(lambda a, b: np.multiply(B[a:b], w[a:b], out=out[a:b]), B.shape[0], B.size)
    return out


def _row_chunks(A, threads):
    """``(r0, r1, indptr, indices, data)`` of ``threads`` row ranges of CSR ``A`` with about
    equal entries (views of ``A``'s arrays, the row pointers rebased), or None for one
    thread or a small matrix."""
    m = A.shape[0]
    if threads < 2 or m < 4 * threads or A.nnz == 0:
        return None
    ip = A.indptr
    cuts = np.searchsorted(ip, np.linspace(0, A.nnz, threads + 1)[1:-1]).tolist()
    bounds = [0] + sorted(set(min(max(c, 1), m - 1) for c in cuts)) + [m]
    out = []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):          # O(threads) pieces, not O(rows)
        s, e = int(ip[r0]), int(ip[r1])
        out.append((r0, r1, (ip[r0:r1 + 1] - s).astype(ip.dtype), A.indices[s:e], A.data[s:e]))
    return out


def block_order(backend):
    """``"C"`` (row-major) on both backends: SciPy's ``csr_matvecs`` and the device row
    kernels (:mod:`adaptmg.device.block_kernels`) read a row's ``k`` values at once."""
    return "C"


class _BlockJacobiMixin:
    """``Y <- X + omega diag(dinv) (B - A X)`` from the plan's product and four block
    passes (the host CSR plan needs three, the device row kernel none)."""

    def jacobi(self, X, B, dinv, omega, Y):
        self(X, Y, 1.0, 0.0)
        Y -= B
        Y *= dinv.reshape(-1, 1)
        Y *= -omega
        Y += X
        return Y


class _CpuSpMM(_BlockJacobiMixin, _CpuCsrPlan):
    """SciPy CSR times a C-ordered block: the one-vector plan's scaling trick around
    ``csr_matvecs`` (``Y += A X`` for all columns of a row at once)."""

    def __init__(self, A):
        super().__init__(A)
        try:   # private SciPy routine, as csr_matvec in adaptmg.device.kernels
            from scipy.sparse import _sparsetools
            vecs = _sparsetools.csr_matvecs
        except (ImportError, AttributeError):  # pragma: no cover - private SciPy API moved
            vecs = None
        self._vecs = vecs
        self._chunks = _row_chunks(A, default_threads())
        self._matvec = None if vecs is None else self._accumulate

    def sweep(self, S, H, Y):
        """``Y <- S + H + A S`` (``Y`` distinct from ``S``): a host Jacobi sweep with a
        scaled matrix (see :class:`adaptmg.multilevel.block._BlockJacobi`), each row chunk's
        sum and product in one task of the host threads."""
        m, n = self.A.shape
        k = S.shape[1]
        if (self._vecs is None or not all(M.flags.c_contiguous and M.dtype == self.A.dtype
                                          for M in (S, H, Y))):
            np.add(S, H, out=Y)
            return self(S, Y, 1.0, 1.0)
        chunks = self._chunks if m * k >= ROW_SPLIT_ENTRIES else None
        vecs, s = self._vecs, S.ravel()

        def run(c):
            r0, r1, cp, cj, cd = c
            np.add(S[r0:r1], H[r0:r1], out=Y[r0:r1])
            vecs(r1 - r0, n, k, cp, cj, cd, s, Y[r0:r1].ravel())
        A = self.A
        if chunks is None:
            run((0, m, A.indptr, A.indices, A.data))
        else:
            pool_map(run, chunks)
        return Y

    def _accumulate(self, m, n, p, j, d, X, Y):
        """``Y += A X`` (all columns of a row at once): one ``csr_matvecs`` call, or one per
        row chunk on the host threads when the block is large (SciPy releases the GIL in
        it; measured on 2 cores at 263k rows x 32 columns: 22 -> 13 ms)."""
        k = X.shape[1]
        chunks = self._chunks
        if chunks is None or m * k < ROW_SPLIT_ENTRIES or m != self.A.shape[0]:
            self._vecs(m, n, k, p, j, d, X.ravel(), Y.ravel())
            return
        vecs, x = self._vecs, X.ravel()

        def run(c):
            r0, r1, cp, cj, cd = c
            vecs(r1 - r0, n, k, cp, cj, cd, x, Y[r0:r1].ravel())
        pool_map(run, chunks)

    def __call__(self, X, Y, alpha=1.0, beta=0.0):
        if not (X.flags.c_contiguous and Y.flags.c_contiguous):
            return _GenericPlan.__call__(self, X, Y, alpha, beta)
        return super().__call__(X, Y, alpha, beta)

    def _minus_b(self, X, B, Y):
        """``Y <- A X - B`` (``csr_matvecs`` accumulates onto ``-B``), or False when the
        compiled routine does not take these blocks."""
        A = self.A
        if (self._matvec is None or not all(M.flags.c_contiguous and M.dtype == A.dtype
                                            for M in (X, B, Y))):
            return False
        np.negative(B, out=Y)
        self._matvec(A.shape[0], A.shape[1], A.indptr, A.indices, A.data, X, Y)
        return True

    def residual(self, X, B, R):
        """``R <- B - A X``: two passes over the block besides the product (not four)."""
        if not self._minus_b(X, B, R):
            return super().residual(X, B, R)
        return np.negative(R, out=R)

    def jacobi(self, X, B, dinv, omega, Y):
        """``Y <- X + omega diag(dinv) (B - A X)`` as ``Y = A X - B``, ``Y *= -omega dinv``,
        ``Y += X``."""
        if not self._minus_b(X, B, Y):
            return super().jacobi(X, B, dinv, omega, Y)
        Y *= dinv.reshape(-1, 1) * (-omega)
        Y += X
        return Y


class _GpuSpMM(_BlockJacobiMixin, SpMVPlan):
    """cupyx CSR times a block: C-ordered float32/64 blocks with the row kernels of
    :mod:`adaptmg.device.block_kernels` (product, fused residual, fused Jacobi sweep);
    F-ordered blocks with cuSPARSE's generic SpMM, written into ``Y``.

    As the SpMV plan (:class:`adaptmg.device.kernels._GpuCsrPlan`), the descriptor of
    ``A`` is made once, those of the dense blocks are cached by (address, shape) and the
    work buffer by the number of columns, so a call is one ``cusparseSpMM`` (at 1M rows
    ``cupyx.cusparse.spmm`` spends tens of microseconds per call making them again).
    If the private CuPy modules are missing the plan calls ``cupyx.cusparse.spmm``
    (``self.cached`` False, ``self.why`` says why)."""

    _MAX_CACHE = 256

    def __init__(self, A):
        super().__init__(A)
        from cupyx import cusparse as cxs
        self._cxs = cxs
        self._spmm = cxs.spmm if cxs.check_availability("spmm") else None
        # cuSPARSE's SpMM refuses a matrix not flagged canonical: a canonical copy then
        # (never sum_duplicates in place: other plans hold descriptors of A's arrays)
        self._Ac = A
        if self._spmm is not None and not A.has_canonical_format:
            self._Ac = A.copy()
            self._Ac.sum_duplicates()
        self.dtype = np.dtype(A.dtype)
        self.cached, self.why = False, None
        if self._spmm is None:
            self.why = "cuSPARSE SpMM is not available"
            return
        try:   # private CuPy modules, as in _GpuCsrPlan
            from cupy_backends.cuda.libs import cusparse as _cs
            from cupy._core import _dtype
            from cupy.cuda import device as _device
            self._cs, self._device = _cs, _device
            self._cuda_dtype = _dtype.to_cuda_dtype(self.dtype)
            self._op = _cs.CUSPARSE_OPERATION_NON_TRANSPOSE
            self._alg = _cs.CUSPARSE_MM_ALG_DEFAULT          # as cupyx.cusparse.spmm
            self._desc_A = cxs.SpMatDescriptor.create(self._Ac)
            self._DnMat = cxs.DnMatDescriptor
        except (ImportError, AttributeError) as exc:       # pragma: no cover - other CuPy
            self.why = f"cupyx.cusparse.spmm per call ({type(exc).__name__}: {exc})"
            return
        self._mats, self._bufs, self._scalars = {}, {}, {}
        self.cached = True

    def _mat(self, M):
        key = (M.data.ptr, M.shape)
        d = self._mats.get(key)
        if d is None:
            if len(self._mats) >= self._MAX_CACHE:
                self._mats.clear()
            d = self._mats[key] = self._DnMat.create(M)
        return d

    def _rows(self, X, *others):
        return (BK.available(self.A, X)
                and all(o.dtype == X.dtype and o.flags.c_contiguous for o in others))

    def residual(self, X, B, R):
        if self._rows(X, B, R):
            return BK.csr_block("residual", self.A, X, R, B=B)
        return super().residual(X, B, R)

    def jacobi(self, X, B, dinv, omega, Y):
        if self._rows(X, B, Y) and dinv.dtype == X.dtype and dinv.flags.c_contiguous:
            return BK.csr_block("jacobi", self.A, X, Y, omega, B=B, dinv=dinv)
        return super().jacobi(X, B, dinv, omega, Y)

    def __call__(self, X, Y, alpha=1.0, beta=0.0):
        if self._rows(X, Y):
            return BK.csr_block("spmm", self.A, X, Y, alpha, beta)
        if (self._spmm is None or self.A.nnz == 0 or X.dtype != self.dtype
                or Y.dtype != self.dtype or not (X.flags.f_contiguous and Y.flags.f_contiguous)):
            return _GenericPlan.__call__(self, X, Y, alpha, beta)
        if self.cached:
            try:
                return self._cached_spmm(X, Y, alpha, beta)
            except (TypeError, AttributeError) as exc:     # pragma: no cover - CuPy API drift
                self.cached, self.why = False, f"cupyx.cusparse.spmm per call ({exc})"
        out = self._spmm(self._Ac, X, c=Y, alpha=alpha, beta=beta)
        if out is not Y:               # pragma: no cover - a CuPy that returns a new array
            Y[...] = out
        return Y

    def _cached_spmm(self, X, Y, alpha, beta):
        ab = self._scalars.get((alpha, beta))
        if ab is None:
            if len(self._scalars) > 64:
                self._scalars.clear()
            ab = self._scalars[(alpha, beta)] = (np.array(alpha, self.dtype),
                                                 np.array(beta, self.dtype))
        a, b = ab
        cs, handle = self._cs, self._device.get_cusparse_handle()
        dx, dy = self._mat(X), self._mat(Y)
        k = X.shape[1]
        buf = self._bufs.get(k)
        if buf is None:
            size = cs.spMM_bufferSize(handle, self._op, self._op, a.ctypes.data,
                                      self._desc_A.desc, dx.desc, b.ctypes.data, dy.desc,
                                      self._cuda_dtype, self._alg)
            xp = get_backend("gpu").xp
            buf = self._bufs[k] = xp.empty(max(int(size), 1), np.int8)
        cs.spMM(handle, self._op, self._op, a.ctypes.data, self._desc_A.desc, dx.desc,
                b.ctypes.data, dy.desc, self._cuda_dtype, self._alg, buf.data.ptr)
        return Y


def make_spmm(A):
    """The SpMM plan of ``A`` on its own backend: ``plan(X, Y, alpha=1, beta=0)`` computes
    ``Y <- alpha A X + beta Y`` for ``(n, k)`` blocks in the backend's layout
    (:func:`block_order`), ``plan.residual(X, B, R)`` ``R <- B - A X`` (the interface of
    :class:`~adaptmg.device.kernels.SpMVPlan`); any other operator: ``A @ X``."""
    if sp.issparse(A) and A.format == "csr":
        return _CpuSpMM(A)
    if is_device_sparse(A) and getattr(A, "format", None) == "csr":
        return _GpuSpMM(A)
    return _GenericSpMM(A)


class _GenericSpMM(_BlockJacobiMixin, _GenericPlan):
    """Any operator with ``A @ X``."""
