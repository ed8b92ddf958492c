"""Sparse x dense-block products ``Y <- alpha A X + beta Y`` (SpMM) for block solves.

A block of ``k`` vectors is an ``(n, k)`` array.  One SpMM reads the matrix once for
all ``k`` columns, so a block multigrid cycle costs far less than ``k`` cycles when
the matrix traffic dominates.  The layout follows each library's native kernel:

* host (SciPy CSR): row-major (C order) blocks, SciPy's compiled ``csr_matvecs``
  (``Y += A X`` over all columns of a row at once; the ``alpha``/``beta`` scaling
  trick of :class:`adaptmg.device.kernels.SpMVPlan` avoids a temporary);
* device (cupyx CSR): column-major (Fortran order) blocks, cuSPARSE's generic SpMM
  (``cupyx.cusparse.spmm``, which accepts only F-contiguous operands).

:func:`block_order` says which layout the backend's blocks use.
"""
from __future__ import annotations

import scipy.sparse as sp

from ..backend import is_device_sparse

__all__ = ["make_spmm", "block_order", "SpMMPlan"]


def block_order(backend):
    """``"F"`` (column-major) on the GPU (cuSPARSE SpMM), ``"C"`` on the host (SciPy)."""
    return "F" if backend.is_gpu else "C"


class SpMMPlan:
    """``plan(X, Y, alpha=1, beta=0)``: ``Y <- alpha A X + beta Y`` in place for ``(n, k)``
    blocks ``X``, ``Y`` in the backend's layout (:func:`block_order`); ``plan.residual(X,
    B, R)``: ``R <- B - A X``.  This generic plan forms ``A @ X`` (one temporary)."""

    def __init__(self, A):
        self.A = A
        self.shape = tuple(A.shape)

    def __call__(self, X, Y, alpha=1.0, beta=0.0):
        AX = self.A @ X
        if beta == 0:
            Y[...] = AX
            if alpha != 1:
                Y *= alpha
        else:
            if beta != 1:
                Y *= beta
            if alpha != 1:
                AX *= alpha
            Y += AX
        return Y

    def residual(self, X, B, R):
        """``R <- B - A X`` (``R`` distinct from ``X`` and ``B``)."""
        R[...] = B
        return self(X, R, -1.0, 1.0)


class _CpuSpMM(SpMMPlan):
    """SciPy CSR times a C-ordered block with ``csr_matvecs`` (accumulates ``Y += A X``)."""

    def __init__(self, A):
        super().__init__(A)
        try:   # private SciPy routine, as csr_matvec in adaptmg.device.kernels
            from scipy.sparse import _sparsetools
            self._matvecs = _sparsetools.csr_matvecs
        except (ImportError, AttributeError):  # pragma: no cover - private SciPy API moved
            self._matvecs = None

    def __call__(self, X, Y, alpha=1.0, beta=0.0):
        A = self.A
        if (self._matvecs is None or X.dtype != A.dtype or Y.dtype != A.dtype
                or not (X.flags.c_contiguous and Y.flags.c_contiguous)):
            return SpMMPlan.__call__(self, X, Y, alpha, beta)
        if alpha == 0:
            Y *= beta
            return Y
        if beta == 0:
            Y.fill(0)
        elif beta != alpha:
            Y *= beta / alpha
        m, n = self.shape
        self._matvecs(m, n, X.shape[1], A.indptr, A.indices, A.data, X.ravel(), Y.ravel())
        if alpha != 1:
            Y *= alpha
        return Y


class _GpuSpMM(SpMMPlan):
    """cupyx CSR times an F-ordered block with cuSPARSE SpMM, written into ``Y``."""

    def __init__(self, A):
        super().__init__(A)
        from cupyx import cusparse as cxs
        self._spmm = cxs.spmm if cxs.check_availability("spmm") else None
        # cuSPARSE's SpMM wrapper refuses a matrix not flagged canonical: a canonical copy
        # then (never sum_duplicates in place: other plans hold descriptors of A's arrays)
        self._Ac = A
        if self._spmm is not None and not A.has_canonical_format:
            self._Ac = A.copy()
            self._Ac.sum_duplicates()

    def __call__(self, X, Y, alpha=1.0, beta=0.0):
        if (self._spmm is None or self.A.nnz == 0 or X.dtype != self.A.dtype
                or Y.dtype != self.A.dtype or not (X.flags.f_contiguous and Y.flags.f_contiguous)):
            return SpMMPlan.__call__(self, X, Y, alpha, beta)
        out = self._spmm(self._Ac, X, c=Y, alpha=alpha, beta=beta)
        if out is not Y:               # pragma: no cover - a CuPy that returns a new array
            Y[...] = out
        return Y


def make_spmm(A) -> SpMMPlan:
    """The SpMM plan of ``A`` on its own backend (SciPy CSR, cupyx CSR, or any ``A @ X``)."""
    if sp.issparse(A) and A.format == "csr":
        return _CpuSpMM(A)
    if is_device_sparse(A) and getattr(A, "format", None) == "csr":
        return _GpuSpMM(A)
    return SpMMPlan(A)
