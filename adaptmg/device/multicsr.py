r"""Several sparse matrices on one sparsity pattern (:class:`MultiCSR`), with NumPy twins.

Math.  ``K`` matrices :math:`A_0, \dots, A_{K-1}` of shape ``nr x nc`` are stored on
the union of their sparsity patterns: one ``indptr``/``indices`` pair and values of
shape ``(nnz, K)`` (entry ``e`` of matrix ``k`` is ``vals[e, k]``; an entry absent
from one matrix is a stored zero).  A product then reads the shared pattern **once**
for all matrices and all right-hand sides.  Vectors are stored component-major
("structure of arrays"): ``x`` of shape ``(NO, nc)`` holds ``NO`` vectors of length
``nc``.  With host scalars ``alpha``, ``beta`` (``beta = 0`` never reads ``y``):

=================  ====================================================================  ==============
``vec(x, y)``      :math:`y_o = \alpha A_0 x_o + \beta y_o`, ``x (NO, nc)``, ``y (NO, nr)``  one matrix, NO vectors
``conv(W, y)``     :math:`y_o = \alpha\sum_k A_k W_{o,k} + \beta y_o`, ``W (NO, K, nc)``      sum over the matrices
``grad(x, y)``     :math:`y_o = \alpha A_o x + \beta y_o`, ``x (nc,)``, ``y (K, nr)``         block column
``div(x, y)``      :math:`y = \alpha\sum_k A_k x_k + \beta y`, ``x (K, nc)``, ``y (nr,)``      block row
=================  ====================================================================  ==============

All of these are launch-only kernels on fixed buffers (capturable in a CUDA graph,
:mod:`adaptmg.device.cudagraph`).  The multigrid cycle's own row kernels (residual,
Jacobi and Chebyshev steps) are CSR kernels of :mod:`adaptmg.device.kernels`.

Storage on the GPU: ELL (:func:`ell_from_csr`), slot-major over the rows,
``cols[k*nr + i]`` and ``vals[(k*K + kk)*nr + i]`` for slot ``k < width`` of row ``i``
(padded with column 0 and value 0).  One thread per row; consecutive threads (rows)
read consecutive addresses, where a thread-per-row loop over CSR makes the 32 threads
of a warp touch 32 different cache lines per load.  ``use_kernels=False`` replaces every custom kernel by one cuSPARSE SpMV with
the equivalent block matrix (``I_NO (x) A_0``, ``I_NO (x) [A_0 .. A_{K-1}]``,
``[A_0; ..; A_{K-1}]``, ``[A_0 .. A_{K-1}]``, :meth:`MultiCSR.block`), kept for comparison.

Kernels come from memoised factories (:func:`functools.lru_cache`, keyed by the CuPy
module of the arrays and the template parameters) and are named
``adaptmg_multicsr_*``; on the host the NumPy/SciPy twins (multi-vector
``csr_matvecs``) compute the same products and serve as the reference in the tests.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend, in_host_memory

__all__ = ["MultiCSR", "ell_from_csr", "KERNEL_NAMES"]

#: the kernels of this module
KERNEL_NAMES = ("adaptmg_multicsr_ell_vec", "adaptmg_multicsr_ell_conv", "adaptmg_multicsr_ell_grad",
                "adaptmg_multicsr_ell_div")


def _check(name, a, shape, like=None):
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if like is not None and a.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype}, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


# --------------------------------------------------------------------------
# ELL product kernels (one thread per row)
# --------------------------------------------------------------------------
_ELL_HEAD = r"""
T acc[NO];
#pragma unroll
for (int o = 0; o < NO; ++o) acc[o] = 0;
for (int k = 0; k < width; ++k) {
    const ptrdiff_t e = (ptrdiff_t)k * nr + i;
    const ptrdiff_t j = cols[e];
    BODY
}
#pragma unroll
for (int o = 0; o < NO; ++o) {
    const ptrdiff_t t = (ptrdiff_t)o * nr + i;
    y[t] = (beta == T(0)) ? alpha * acc[o] : alpha * acc[o] + beta * y[t];
}
"""

#: V(kk) = value of matrix kk in slot k of row i
_ELL_V = "vals[((ptrdiff_t)k * KK + {kk}) * nr + i]"

_ELL_BODY = {
    # y_o = A_0 x_o
    "vec": ("const T a = " + _ELL_V.format(kk="0") + ";\n"
            "#pragma unroll\n for (int o = 0; o < NO; ++o) acc[o] += a * x[(ptrdiff_t)o * nc + j];"),
    # y_o = sum_k A_k W[o, k]
    "conv": ("#pragma unroll\n for (int kk = 0; kk < KK; ++kk) { const T a = " + _ELL_V.format(kk="kk") + ";\n"
             "#pragma unroll\n for (int o = 0; o < NO; ++o) acc[o] += a * x[((ptrdiff_t)o * KK + kk) * nc + j]; }"),
    # y_o = A_o x
    "grad": ("const T xv = x[j];\n"
             "#pragma unroll\n for (int o = 0; o < NO; ++o) acc[o] += " + _ELL_V.format(kk="o") + " * xv;"),
    # y = sum_k A_k x_k
    "div": ("#pragma unroll\n for (int kk = 0; kk < KK; ++kk) acc[0] += " + _ELL_V.format(kk="kk")
            + " * x[(ptrdiff_t)kk * nc + j];"),
}

_ELL_PARAMS = "raw I cols, raw T vals, raw T x, int32 nr, int32 nc, int32 width, T alpha, T beta"


@functools.lru_cache(maxsize=None)
def _ell_kernel(cp, kind, K, NO):
    """``adaptmg_multicsr_ell_<kind>`` for ``K`` matrices and ``NO`` outputs (``cp``: the CuPy module)."""
    body = _ELL_HEAD.replace("BODY", _ELL_BODY[kind]).replace("NO", str(NO)).replace("KK", str(K))
    return cp.ElementwiseKernel(_ELL_PARAMS, "raw T y", body, f"adaptmg_multicsr_ell_{kind}")


def ell_from_csr(indptr, indices, vals, nrows):
    """ELL arrays (width, cols (width*nrows,), vals (width*K*nrows,)) of a multi-matrix CSR pattern.

    ``vals`` has shape (nnz, K); the layout is the slot-major one of the module docstring.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    lens = np.diff(indptr)
    width = int(lens.max()) if lens.size else 0
    K = vals.shape[1]
    row = np.repeat(np.arange(nrows, dtype=np.int64), lens)
    slot = np.arange(indptr[-1], dtype=np.int64) - indptr[row]
    cols = np.zeros((width, nrows), dtype=np.int32)
    cols[slot, row] = indices
    ev = np.zeros((width, K, nrows))
    ev[slot, :, row] = vals
    return width, cols.reshape(-1), ev.reshape(-1)


def _same_pattern(mats):
    A0 = mats[0]
    return all(A.shape == A0.shape and A.nnz == A0.nnz and np.array_equal(A.indptr, A0.indptr)
               and np.array_equal(A.indices, A0.indices) for A in mats[1:])


class MultiCSR:
    """``K`` CSR matrices of one shape stored on one (union) sparsity pattern (see the module doc).

    Build with :meth:`from_matrices` (host SciPy matrices), move with :meth:`to`.
    Attributes: ``shape``, ``K``, ``nnz``, ``indptr``, ``indices``, ``vals`` (nnz, K)
    on the object's backend, ``backend``, ``use_kernels``.
    """

    def __init__(self, indptr, indices, vals, shape, backend="cpu", use_kernels=True, host=None):
        self.indptr, self.indices, self.vals = indptr, indices, vals
        self.shape = tuple(int(s) for s in shape)
        self.K = int(vals.shape[1])
        self.nnz = int(vals.shape[0]) if host is None else host.nnz
        self.backend = get_backend(backend)
        self.use_kernels = bool(use_kernels)
        self._host = host if host is not None else self
        self._cache = {}

    # ---------------------------------------------------------------- build
    @classmethod
    def from_matrices(cls, mats):
        """Stack SciPy sparse matrices (same shape) on their common pattern.

        When all matrices already share ``indptr``/``indices`` (the assembly of
        :mod:`adaptmg.assemble` scatters into one memoised pattern) their data
        are stacked as they are; otherwise the union pattern is built with one
        sort of the (row, column) keys.
        """
        if not mats:
            raise ValueError("MultiCSR.from_matrices needs at least one matrix")
        mats = [sp.csr_matrix(A) for A in mats]
        shape = mats[0].shape
        for k, A in enumerate(mats):
            if A.shape != shape:
                raise ValueError(f"matrix {k} has shape {A.shape}, matrix 0 has {shape}")
            A.sort_indices()
        if _same_pattern(mats):
            vals = np.ascontiguousarray(np.stack([A.data for A in mats], axis=1), dtype=np.float64)
            indptr, indices = mats[0].indptr, mats[0].indices
        else:
            keys = []
            for A in mats:
                c = A.tocoo()
                keys.append(c.row.astype(np.int64) * shape[1] + c.col)
            allk = np.concatenate(keys)
            uniq, inv = np.unique(allk, return_inverse=True)
            vals = np.zeros((uniq.size, len(mats)))
            off = 0
            for k, A in enumerate(mats):
                vals[inv[off:off + A.nnz], k] = A.tocoo().data
                off += A.nnz
            rows = uniq // shape[1]
            indices = (uniq % shape[1])
            indptr = np.zeros(shape[0] + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
        idx_t = np.int32 if max(vals.shape[0], *shape) < np.iinfo(np.int32).max else np.int64
        return cls(np.ascontiguousarray(indptr, dtype=idx_t),
                   np.ascontiguousarray(indices, dtype=idx_t), vals, shape)

    def to(self, backend, use_kernels=True):
        """A copy on ``backend`` (``use_kernels=False``: plain cuSPARSE SpMV on the GPU)."""
        be = get_backend(backend)
        host = self._host
        if not be.is_gpu:
            return MultiCSR(host.indptr, host.indices, host.vals, host.shape, "cpu", use_kernels, host)
        if not use_kernels:               # plain cuSPARSE path: block matrices built by prepare()
            return MultiCSR(None, None, host.vals[:0], host.shape, be, False, host)
        width, cols, ev = ell_from_csr(host.indptr, host.indices, host.vals, host.shape[0])
        out = MultiCSR(None, None, host.vals[:0], host.shape, be, True, host)
        out.K = host.K
        out.width, out.ell_cols, out.ell_vals = width, be.asarray(cols), be.asarray(ev)
        return out

    def matrix(self, k):
        """Host SciPy CSR of matrix ``k``."""
        h = self._host
        key = ("A", k)
        if key not in h._cache:
            h._cache[key] = sp.csr_matrix((np.ascontiguousarray(h.vals[:, k]), h.indices, h.indptr),
                                          shape=h.shape)
        return h._cache[key]

    def _hstack(self):
        h = self._host
        if "G" not in h._cache:
            h._cache["G"] = sp.hstack([self.matrix(k) for k in range(self.K)], format="csr")
        return h._cache["G"]

    def block(self, kind, NO):
        """The host block matrix that one plain SpMV would use for ``kind`` (see module doc)."""
        if kind == "vec":
            return sp.kron(sp.identity(NO, format="csr"), self.matrix(0), format="csr")
        if kind == "conv":
            return sp.kron(sp.identity(NO, format="csr"), self._hstack(), format="csr")
        if kind == "grad":
            return sp.vstack([self.matrix(k) for k in range(self.K)], format="csr")
        if kind == "div":
            return self._hstack()
        raise ValueError(f"unknown MultiCSR product {kind!r}")

    def prepare(self, kind, NO=None):
        """Build what product ``kind`` needs (host block matrices or the SpMV plan) ahead of time."""
        NO = self.K if NO is None else NO
        if not self.backend.is_gpu:
            if kind in ("conv", "div"):
                self._hstack()
            elif kind == "grad" and "grad" not in self._host._cache:
                self._host._cache["grad"] = self.block("grad", self.K)
            else:
                self.matrix(0)
        elif not self.use_kernels and ("plan", kind, NO) not in self._cache:
            from .kernels import make_spmv
            self._cache[("plan", kind, NO)] = make_spmv(self.backend.asmatrix(self.block(kind, NO)))
        return self

    # ---------------------------------------------------------------- apply
    def _gpu(self, kind, NO, x, y, alpha, beta):
        if self.use_kernels:
            nr, nc = self.shape
            T = y.dtype.type
            _ell_kernel(self.backend.xp, kind, self.K, NO)(
                self.ell_cols, self.ell_vals, x, np.int32(nr), np.int32(nc), np.int32(self.width),
                T(alpha), T(beta), y, size=nr)
            return y
        key = ("plan", kind, NO)
        plan = self._cache.get(key)
        if plan is None:
            from .kernels import make_spmv
            plan = make_spmv(self.backend.asmatrix(self.block(kind, NO)))
            self._cache[key] = plan
        plan(x.reshape(-1), y.reshape(-1), alpha, beta)
        return y

    @staticmethod
    def _finish(y, r, alpha, beta):
        if beta == 0:
            np.multiply(r, alpha, out=y)
        else:
            y *= beta
            y += alpha * r
        return y

    def vec(self, x, y, alpha=1.0, beta=0.0):
        r"""``y[o] = alpha A_0 x[o] + beta y[o]`` for all o; ``x (NO, nc)``, ``y (NO, nr)``."""
        nr, nc = self.shape
        NO = x.shape[0]
        _check("x", x, (NO, nc))
        _check("y", y, (NO, nr), x)
        if in_host_memory(y):
            return self._finish(y, (self.matrix(0) @ np.ascontiguousarray(x.T)).T, alpha, beta)
        return self._gpu("vec", NO, x, y, alpha, beta)

    def conv(self, W, y, alpha=1.0, beta=0.0):
        r"""``y[o] = alpha sum_k A_k W[o, k] + beta y[o]``; ``W (NO, K, nc)``, ``y (NO, nr)``."""
        nr, nc = self.shape
        NO = W.shape[0]
        _check("W", W, (NO, self.K, nc))
        _check("y", y, (NO, nr), W)
        if in_host_memory(y):
            Wt = np.ascontiguousarray(W.reshape(NO, -1).T)           # (K*nc, NO) for csr_matvecs
            return self._finish(y, (self._hstack() @ Wt).T, alpha, beta)
        return self._gpu("conv", NO, W, y, alpha, beta)

    def grad(self, x, y, alpha=1.0, beta=0.0):
        r"""``y[o] = alpha A_o x + beta y[o]``, o < K; ``x (nc,)``, ``y (K, nr)``."""
        nr, nc = self.shape
        _check("x", x, (nc,))
        _check("y", y, (self.K, nr), x)
        if in_host_memory(y):
            if "grad" not in self._host._cache:
                self._host._cache["grad"] = self.block("grad", self.K)
            return self._finish(y, (self._host._cache["grad"] @ x).reshape(self.K, nr), alpha, beta)
        return self._gpu("grad", self.K, x, y, alpha, beta)

    def div(self, x, y, alpha=1.0, beta=0.0):
        r"""``y = alpha sum_k A_k x[k] + beta y``; ``x (K, nc)``, ``y (nr,)``."""
        nr, nc = self.shape
        _check("x", x, (self.K, nc))
        _check("y", y, (nr,), x)
        if in_host_memory(y):
            return self._finish(y, self._hstack() @ x.reshape(-1), alpha, beta)
        return self._gpu("div", 1, x, y, alpha, beta)
