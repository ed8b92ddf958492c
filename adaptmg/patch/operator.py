"""Matrix-free Laplace operator on Cartesian Q_k by cell-wise sum factorisation.

The stiffness matrix is never stored.  With the cell stiffness written as a
sum of Kronecker products of the 1D reference matrices (seed 000, §2.3),

    2D:  A^K = c_1 Ah x Mh + c_0 Mh x Ah,
    3D:  A^K = c_2 Ah x Mh x Mh + c_1 Mh x Ah x Mh + c_0 Mh x Mh x Ah,

(``c_d = prod(h) / h_d^2``, x is the last factor), the product ``A u`` is
``sum_K R_K^T A^K R_K u``.  Each cell term is evaluated by sum factorisation:
contractions along one direction at a time, reusing the common partial
products (seed 000 §3.1.1, [16]),

    v = Mh_x u,  w = Ah_x u,
    p = Mh_y v,  q = c_1 Ah_y v + c_0 Mh_y w,           (3D)
    A^K u = c_2 Ah_z p + Mh_z q,

i.e. 7 one-dimensional contractions of cost (k+1)^4 per cell in 3D instead
of the (k+1)^6 of a dense cell matrix.

CPU: one vectorised NumPy pass over all cells (the cells are a strided view
of the vector padded with its Dirichlet zeros; the cell results are folded
back by adding the shared end nodes).  GPU: a CuPy RawKernel with the cell in
shared memory, one thread per DoF (2D) or per DoF column (3D), and atomic
adds into the result (:mod:`adaptmg.patch.kernels`).
"""
from __future__ import annotations

import numpy as np

from ..backend import get_backend, is_device_array
from ..device.kernels import axpby
from .space import CartesianSpace
from .tensor import reference_matrices

__all__ = ["LaplaceOperator", "check_dtype", "cell_windows", "fold_cells"]


def check_dtype(dtype):
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    return dt


def _check_space(space):
    if not isinstance(space, CartesianSpace):
        raise TypeError(f"space must be a CartesianSpace, got {type(space).__name__}")
    return space


def cell_windows(xp, U, k, step, width):
    """Strided view of ``U`` (full array incl. boundary) as windows of
    ``width`` nodes every ``step`` nodes in every direction: shape
    (n_z, n_y, n_x, width, width, width) (2D: without z)."""
    d = U.ndim
    n = tuple((s - width) // step + 1 for s in U.shape)
    strides = tuple(step * s for s in U.strides) + tuple(U.strides)
    return xp.lib.stride_tricks.as_strided(U, shape=n + (width,) * d, strides=strides)


def contract(M, T, axis_from_end):
    """Apply the matrix M along local axis -1 (x), -2 (y) or -3 (z) of T."""
    if axis_from_end == 1:
        return T @ M.T
    if axis_from_end == 2:
        return M @ T
    sh = T.shape
    out = M @ T.reshape(sh[:-3] + (sh[-3], sh[-2] * sh[-1]))
    return out.reshape(sh[:-3] + (M.shape[0],) + sh[-2:])


def fold_cells(xp, V, k):
    """Sum cell contributions V (n_z, n_y, n_x, k+1, k+1, k+1) into the full
    nodal array (n_z k + 1, ...): nodes shared by neighbouring cells add up."""
    d = V.ndim // 2
    order = [a for i in range(d) for a in (i, d + i)]
    W = xp.ascontiguousarray(V.transpose(order))
    for i in range(d):
        ax = i
        W = xp.moveaxis(W, (ax, ax + 1), (-2, -1))
        n = W.shape[-2]
        F = xp.zeros(W.shape[:-2] + (n * k + 1,), dtype=W.dtype)
        F[..., :n * k] = W[..., :k].reshape(W.shape[:-2] + (n * k,))
        F[..., k::k] += W[..., k]
        W = xp.moveaxis(F, -1, ax)
    return W


class LaplaceOperator:
    """``A @ u`` for the Dirichlet Laplacian on a :class:`CartesianSpace`.

    Parameters
    ----------
    space : CartesianSpace
    backend : "cpu", "gpu", "auto" or a Backend
    dtype : float32 or float64 (the arithmetic and the vectors' type)

    Behaves like a square linear operator: ``.shape``, ``.dtype``, ``A @ u``,
    ``A.matvec(u, out=None)``, ``A.spmv(u, y, alpha, beta)``; inputs must live on
    the operator's backend.  Every result of ``A @ u`` / ``A.matvec(u)`` is a new
    array (``adaptmg_fresh_result``: Krylov solvers use it without a copy).
    """

    adaptmg_fresh_result = True

    def __init__(self, space, backend="cpu", dtype=np.float64):
        self.space = _check_space(space)
        self.backend = get_backend(backend)
        self.dtype = check_dtype(dtype)
        n = space.n_dofs
        self.shape = (n, n)
        Mh, Ah = reference_matrices(space.k)
        xp = self.backend.xp
        self._Mh = xp.asarray(Mh, dtype=self.dtype)
        self._Ah = xp.asarray(Ah, dtype=self.dtype)
        self._c = tuple(space.coeffs)        # x first
        self._gpu = None
        if self.backend.is_gpu:
            from .kernels import GpuLaplace
            self._gpu = GpuLaplace(space, self.dtype)

    def __repr__(self):
        return f"LaplaceOperator({self.space}, backend={self.backend.name}, dtype={self.dtype})"

    def to(self, backend=None, dtype=None):
        """The same operator on ``backend`` in ``dtype`` (self when both are unchanged)."""
        be = self.backend if backend is None else get_backend(backend)
        dt = self.dtype if dtype is None else check_dtype(dtype)
        if be == self.backend and dt == self.dtype:
            return self
        return LaplaceOperator(self.space, be, dt)

    def _check(self, u):
        self.space.check_vector(u)
        if u.dtype != self.dtype:
            raise TypeError(f"vector dtype {u.dtype} != operator dtype {self.dtype}")
        if self.backend.is_gpu != is_device_array(u):
            raise TypeError(f"vector of type {type(u).__name__} is not on the operator's "
                            f"backend {self.backend.name!r}")
        if self.backend.is_gpu and not u.flags.c_contiguous:
            raise ValueError("the GPU kernels need contiguous vectors (got a strided view; "
                             "pass a copy)")

    def matvec(self, u, out=None):
        self._check(u)
        if self._gpu is not None:
            return self._gpu.apply(u, out)
        v = self._apply_array(u)
        if out is None:
            return v
        out[...] = v
        return out

    def spmv(self, u, y, alpha=1.0, beta=0.0):
        """``y <- alpha A u + beta y`` in place (``beta == 0``: ``y`` is not read); returns
        ``y``, without a temporary vector (the V-cycle's coarse correction; its residual
        is :meth:`residual`); on the GPU one kernel launch (the cell kernel adds into
        ``y`` after one scaling pass; at k = 1 the stencil kernel reads and writes ``y``
        once)."""
        self._check(u)
        self._check(y)
        if self._gpu is not None:
            return self._gpu.apply(u, y, alpha, beta)
        return axpby(alpha, self._apply_array(u), beta, y)

    def residual(self, u, b, r):
        """``r <- b - A u`` in place (``r`` distinct from ``u`` and ``b``); returns ``r``.
        At k = 1 on the GPU one stencil pass (no copy of ``b`` first)."""
        self._check(u)
        self._check(b)
        self._check(r)
        if r is u or r is b:
            raise ValueError("residual: r must be a vector other than u and b")
        if self._gpu is not None:
            return self._gpu.residual(u, b, r)
        xp = self.backend.xp
        return xp.subtract(b, self._apply_array(u), out=r)

    def __matmul__(self, u):
        if getattr(u, "ndim", 1) == 2:
            return self.backend.xp.stack([self.matvec(u[:, j]) for j in range(u.shape[1])], axis=1)
        return self.matvec(u)

    def dot(self, u):
        return self.matvec(u)

    def tocsr(self, max_rows=200000):
        """The same operator assembled as a SciPy CSR matrix (Kronecker sum of the
        assembled 1D matrices), on the host; for small levels (coarse solvers)."""
        import scipy.sparse as sp
        from .tensor import interval_matrices
        if self.shape[0] > max_rows:
            raise ValueError(f"refusing to assemble {self.shape[0]} rows (> max_rows={max_rows})")
        d = self.space.dim
        mats = [interval_matrices(self.space.k, n) for n in self.space.cells]   # x first
        A = None
        for dd in range(d):
            f = None
            for e in reversed(range(d)):                    # z ... x
                m = mats[e][1] if e == dd else mats[e][0]
                f = m if f is None else sp.kron(f, m, format="csr")
            A = self._c[dd] * f if A is None else A + self._c[dd] * f
        return A.tocsr().astype(self.dtype)

    def toarray(self):
        """Dense host matrix (small levels only)."""
        return self.tocsr(max_rows=20000).toarray()

    def _apply_array(self, u):
        """Vectorised sum factorisation over all cells (any xp)."""
        xp = self.backend.xp
        sp_ = self.space
        k, d = sp_.k, sp_.dim
        U = xp.pad(u.reshape(sp_.shape), 1)
        X = cell_windows(xp, U, k, k, k + 1)
        Mh, Ah = self._Mh, self._Ah
        c = self._c
        v = contract(Mh, X, 1)
        w = contract(Ah, X, 1)
        if d == 2:
            out = c[1] * contract(Ah, v, 2) + c[0] * contract(Mh, w, 2)
        else:
            p = contract(Mh, v, 2)
            q = c[1] * contract(Ah, v, 2) + c[0] * contract(Mh, w, 2)
            out = c[2] * contract(Ah, p, 3) + contract(Mh, q, 3)
        F = fold_cells(xp, out, k)
        inner = (slice(1, -1),) * d
        return xp.ascontiguousarray(F[inner]).reshape(-1)
