"""Grid transfer between nested Cartesian Q_k levels.

The fine space contains the coarse one, so prolongation is polynomial
interpolation; on a tensor mesh it factors as ``P = P_z x P_y x P_x`` with a
1D interpolation matrix per direction (``tensor.prolongation_1d``: each
coarse cell's k+1 Lagrange functions evaluated at the 2k+1 fine Gauss-Lobatto
points of its two children).  Restriction is the transpose,
``R = R_z x R_y x R_x`` with ``R_d = P_d^T`` stored explicitly (the design
note: no transposed SpMV at solve time).  A Kronecker product is applied
direction by direction (sparse 1D matrix times the vector viewed as a
matrix), which is matrix-free with respect to the d-dimensional operator:
only the 1D CSR matrices (about (k+1) entries per fine node and direction)
are stored.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_backend
from ..device.kernels import axpby
from .operator import _check_space, check_dtype
from .tensor import prolongation_1d

__all__ = ["KronTransfer", "prolongation", "restriction"]


class KronTransfer:
    """``T @ u`` for a Kronecker product of 1D sparse matrices (x first); also
    ``T.spmv(u, y, alpha, beta)``.  On the GPU one pass per axis (ELL kernel), or with
    ``gather=True`` and rows of at most :data:`.kron_gather.MAX_GATHER` entries one
    gather pass for all axes (:mod:`.kron_gather`; the Q1 transfers take it: H100, 133M
    fine DoFs, R 1.34 -> 0.69 ms fp64 and 0.90 -> 0.41 ms fp32, P 1.76 -> 1.69 / 1.39 ->
    1.02 ms; the Q2 prolongation, 8 entries a row too, was 15 % slower, so it keeps the
    axis passes)."""

    def __init__(self, mats, in_shape, out_shape, backend, dtype, gather=False):
        self.backend = backend
        self.gather = bool(gather)
        self.dtype = dtype
        self._host_mats = mats                  # scipy CSR, kept for to()
        self._gather = self._mats = None
        if backend.is_gpu:
            from .kron_gather import MAX_GATHER, GpuKronGather, gather_width
            if self.gather and len(mats) in (2, 3) and gather_width(mats) <= MAX_GATHER:
                self._gather = GpuKronGather(mats, dtype)     # narrow rows: one pass
            else:                                             # ELL kernel along an axis
                from .kernels import GpuAxisMatrix
                self._mats = [GpuAxisMatrix(m, dtype) for m in mats]
        else:
            self._mats = [backend.asmatrix(m, dtype=dtype) for m in mats]   # x first
        self.in_shape = in_shape        # numpy order
        self.out_shape = out_shape
        self.shape = (int(np.prod(out_shape)), int(np.prod(in_shape)))

    def __repr__(self):
        return f"KronTransfer({self.shape[0]}x{self.shape[1]}, {self.backend.name}, {self.dtype})"

    def to(self, backend=None, dtype=None):
        """The same transfer on ``backend`` in ``dtype`` (self when both are unchanged)."""
        be = self.backend if backend is None else get_backend(backend)
        dt = self.dtype if dtype is None else check_dtype(dtype)
        if be == self.backend and dt == self.dtype:
            return self
        return KronTransfer(self._host_mats, self.in_shape, self.out_shape, be, dt, self.gather)

    def __matmul__(self, u):
        return self.matvec(u)

    def dot(self, u):
        return self.matvec(u)

    def matvec(self, u):
        return self._apply(u)

    def spmv(self, u, y, alpha=1.0, beta=0.0):
        """``y <- alpha T u + beta y`` in place (``beta == 0``: ``y`` is not read); returns
        ``y``.  On the GPU the last axis pass writes into ``y`` itself: no temporary of
        the output's size and no separate update pass."""
        if getattr(y, "shape", None) != (self.shape[0],) or getattr(y, "dtype", None) != self.dtype:
            raise ValueError(f"spmv output must be a vector of shape ({self.shape[0]},) and dtype "
                             f"{self.dtype}, got {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}")
        if self.backend.is_gpu:
            if not y.flags.c_contiguous:
                raise ValueError("spmv output must be contiguous on the GPU (the kernel writes "
                                 "through its pointer)")
            return self._apply(u, (y, alpha, beta))
        return axpby(alpha, self._apply(u), beta, y)

    def _apply(self, u, into=None):
        """``T u`` as a new vector, or with ``into = (y, alpha, beta)`` (GPU only)
        ``y <- alpha T u + beta y``."""
        if getattr(u, "shape", None) != (self.shape[1],):
            raise ValueError(f"transfer of shape {self.shape} applied to a vector of shape "
                             f"{getattr(u, 'shape', None)}")
        if u.dtype != self.dtype:
            raise TypeError(f"vector dtype {u.dtype} != transfer dtype {self.dtype}")
        xp = self.backend.xp
        if self._gather is not None:          # reads u through its pointer: contiguous
            y, alpha, beta = into if into is not None else (xp.empty(self.shape[0], self.dtype), 1.0, 0.0)
            return self._gather.apply(xp.ascontiguousarray(u), y, alpha, beta)
        d = len(self.in_shape)
        U = u.reshape(self.in_shape)
        if self.backend.is_gpu:
            for ax in range(d - 1):
                U = self._mats[d - 1 - ax].apply(U, ax)
            if into is None:                        # the last pass (x) into a new vector
                return self._mats[0].apply(U, d - 1).reshape(-1)
            y, alpha, beta = into                   # ... or into y
            self._mats[0].apply(U, d - 1, out=y, alpha=alpha, beta=beta)
            return y
        for ax in range(d):                         # numpy axis ax <-> direction d-1-ax
            M = self._mats[d - 1 - ax]
            U = xp.moveaxis(U, ax, 0)
            sh = U.shape
            U = M @ xp.ascontiguousarray(U).reshape(sh[0], -1)
            U = xp.moveaxis(U.reshape((M.shape[0],) + sh[1:]), 0, ax)
        return xp.ascontiguousarray(U).reshape(-1)


def prolongation(coarse, backend="cpu", dtype=np.float64):
    """Interpolation from ``coarse`` to ``coarse.refine()``."""
    coarse = _check_space(coarse)
    be = get_backend(backend)
    dt = check_dtype(dtype)
    fine = coarse.refine()
    mats = [prolongation_1d(coarse.k, n) for n in coarse.cells]
    return KronTransfer(mats, coarse.shape, fine.shape, be, dt, gather=coarse.k == 1)


def restriction(coarse, backend="cpu", dtype=np.float64):
    """Transpose of :func:`prolongation` (stored explicitly)."""
    coarse = _check_space(coarse)
    be = get_backend(backend)
    dt = check_dtype(dtype)
    fine = coarse.refine()
    mats = [prolongation_1d(coarse.k, n).T.tocsr() for n in coarse.cells]
    return KronTransfer(mats, fine.shape, coarse.shape, be, dt, gather=coarse.k == 1)
