r"""Custom kernels of the Navier-Stokes pressure-correction solver (seed 001 §5.3), with NumPy twins.

Same pattern as :mod:`adaptmg.device.kernels`: every GPU kernel is built by a
memoised factory and named ``adaptmg_ns_*``; each has a NumPy twin with the
same semantics, used on the CPU and as the reference in the tests.  The public
functions dispatch on the array type of their output argument and write into
preallocated arrays (nothing is allocated per call on the GPU).

Layout.  Velocities are stored component-major ("structure of arrays"): an
array ``U`` of shape ``(d, n)`` with ``U[c, i]`` the component c at velocity
node i.  All velocity operators of the scheme are scalar node matrices that
act on every component (stiffness ``L``, the convection matrices
:math:`C_k`) or scalar matrices per component sharing one sparsity pattern
(the pressure gradient :math:`B_k`, divergence :math:`D_k`).  Component-major
storage lets one kernel read the shared pattern **once** for all components,
where a plain SpMV on the interleaved ``node*d + c`` numbering reads ``d``
(gradient) or ``d*d`` (convection) copies of it.

Element-wise kernels
--------------------
``products(U, W)`` -- eq. (14) of seed 001, the node-wise products of the
interpolated nonlinearity :math:`\mathcal I_h(u\otimes u)`:

.. math:: W[c, k, i] = u_{i,k}\, u_{i,c}, \qquad c, k < d,\ i < n .

(The paper stores the 6 distinct products of the symmetric tensor; we store
all :math:`d^2` so that :func:`MultiCSR.conv` can run one uniform loop.)

``axpy_field(U, S, F)``: ``U += S * F`` (explicit momentum update with
``S = dt * M_l^{-1}`` on free DoFs and 0 on Dirichlet DoFs).

``pressure_rhs(Du, total, inv_dt, inv_n, b)``: ``b = (Du - total[0] * inv_n) * inv_dt``
(rhs of the Neumann problem, projected onto zero sum; ``total`` a 1-element
device array holding ``sum(Du)``, so no host synchronisation).

``shift(x, s, scale)``: ``x -= s[0] * scale``; ``shift_copy(v, s, scale, x)``:
``x = v - s[0] * scale`` (zero-mean projections; ``s`` a device sum, no host sync).

``pressure_update(Q, Du, minv, nu, P, PQ)``: ``P += Q + nu * minv * Du``,
``PQ = P + Q`` (Step 3 of Algorithm 4 and the pressure the next momentum
step needs).

Multi-matrix kernels (:class:`MultiCSR`)
----------------------------------------
``K`` CSR matrices :math:`A_0..A_{K-1}` (``nr x nc``) with one sparsity
pattern are stored on the host as ``indptr, indices`` and ``vals`` of shape
``(nnz, K)``, on the GPU in ELL layout (:func:`ell_from_csr`: slot-major, so
that the threads of a warp -- one per row -- read consecutive addresses).
One thread per row computes (``alpha``, ``beta`` host scalars;
``beta = 0`` never reads ``y``)

=================  ===============================================================  ==========
``vec(x, y)``      :math:`y_o = \alpha A_0 x_o + \beta y_o`,  ``x (NO, nc)``        viscous term
``conv(W, y)``     :math:`y_o = \alpha\sum_k A_k W_{o,k} + \beta y_o`, ``W (d,d,nc)``   eq. (15)
``grad(p, y)``     :math:`y_o = \alpha A_o p + \beta y_o`,  ``y (K, nr)``           pressure -> velocity
``div(x, y)``      :math:`y = \alpha\sum_k A_k x_k + \beta y`,  ``x (K, nc)``        velocity -> pressure
=================  ===============================================================  ==========

plus, for the pressure multigrid (``K = 1``), ``residual`` (``r = b - A x``),
``chebyshev`` (one Chebyshev step, :mod:`adaptmg.multilevel.smoothers`) and the dense
symmetric coarse solve :func:`sym_gemv` -- all launch-only kernels with fixed
buffers, so that a whole V-cycle can be captured in a CUDA graph.

The NumPy twins use SciPy CSR products (multi-vector ``csr_matvecs``).  On the
GPU, ``use_kernels=False`` replaces each custom kernel by one cuSPARSE SpMV with
the equivalent block matrix (``I_NO (x) A_0``, ``I_d (x) [A_0 .. A_{d-1}]``,
``[A_0; ..; A_{K-1}]``, ``[A_0 .. A_{K-1}]``) -- the plain-SpMV variant of the
paper's GPU* column, kept for comparison.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from .backend import get_backend

__all__ = ["products", "axpy_field", "pressure_rhs", "shift", "shift_copy", "pressure_update", "sym_gemv",
           "ell_from_csr", "MultiCSR", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_ns_products", "adaptmg_ns_axpy_field", "adaptmg_ns_pressure_rhs",
                "adaptmg_ns_shift", "adaptmg_ns_shift_copy", "adaptmg_ns_pressure_update", "adaptmg_ns_ell_vec",
                "adaptmg_ns_ell_conv", "adaptmg_ns_ell_grad", "adaptmg_ns_ell_div",
                "adaptmg_ns_residual", "adaptmg_ns_chebyshev", "adaptmg_ns_sym_gemv")


def _is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


def _check(name, a, shape, like=None):
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if like is not None and a.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype}, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


# --------------------------------------------------------------------------
# element-wise kernels
# --------------------------------------------------------------------------
_EW_SPECS = {
    "products": ("raw T u, int32 n, int32 d", "T w",
                 "const int j = i % n; const int ck = i / n; const int k = ck % d;"
                 "const int c = ck / d; w = u[k * n + j] * u[c * n + j];"),
    "axpy_field": ("T s, T f", "T u", "u += s * f"),
    "pressure_rhs": ("T du, raw T total, T inv_dt, T inv_n", "T b",
                     "b = (du - total[0] * inv_n) * inv_dt"),
    "shift": ("raw T s, T scale", "T x", "x -= s[0] * scale"),
    "shift_copy": ("T v, raw T s, T scale", "T x", "x = v - s[0] * scale"),
    "pressure_update": ("T q, T du, T minv, T nu", "T p, T pq",
                        "T t = p + q + nu * minv * du; p = t; pq = t + q;"),
}


@functools.lru_cache(maxsize=None)
def _ew_kernel(name):
    cp = get_backend("gpu").xp
    inp, out, op = _EW_SPECS[name]
    return cp.ElementwiseKernel(inp, out, op, f"adaptmg_ns_{name}")


def products(U, W):
    r"""``W[c, k, i] = U[k, i] * U[c, i]`` (eq. 14), one element-wise launch.

    ``U``: (d, n) velocity (component-major); ``W``: (d, d, n) output.
    """
    d, n = U.shape
    _check("W", W, (d, d, n), U)
    if _is_numpy(U):
        np.multiply(U[:, None, :], U[None, :, :], out=W)
        return W
    return _ew_kernel("products")(U, np.int32(n), np.int32(d), W)


def axpy_field(U, S, F):
    """``U += S * F`` element-wise (explicit lumped-mass update)."""
    if _is_numpy(U):
        U += S * F
        return U
    return _ew_kernel("axpy_field")(S, F, U)


def pressure_rhs(Du, total, inv_dt, inv_n, b):
    """``b = (Du - total[0] * inv_n) * inv_dt`` (``total``: 1-element array with sum(Du)).

    With ``inv_n = 1/len(Du)`` this is ``Du / dt`` projected onto zero sum.
    """
    if _is_numpy(b):
        np.subtract(Du, float(total[0]) * inv_n, out=b)
        b *= inv_dt
        return b
    t = b.dtype.type
    return _ew_kernel("pressure_rhs")(Du, total, t(inv_dt), t(inv_n), b)


def shift(x, s, scale):
    """``x -= s[0] * scale`` (``s``: 1-element array, e.g. a device dot product)."""
    if _is_numpy(x):
        x -= float(s[0]) * scale
        return x
    return _ew_kernel("shift")(s, x.dtype.type(scale), x)


def shift_copy(v, s, scale, x):
    """``x = v - s[0] * scale`` (copy and shift in one launch)."""
    if _is_numpy(x):
        np.subtract(v, float(s[0]) * scale, out=x)
        return x
    return _ew_kernel("shift_copy")(v, s, x.dtype.type(scale), x)


def pressure_update(Q, Du, minv, nu, P, PQ):
    """``P <- P + Q + nu * minv * Du``; ``PQ <- P + Q`` (new P), one launch."""
    if _is_numpy(P):
        P += Q
        P += nu * (minv * Du)
        np.add(P, Q, out=PQ)
        return P, PQ
    return _ew_kernel("pressure_update")(Q, Du, minv, P.dtype.type(nu), P, PQ)


# --------------------------------------------------------------------------
# multi-matrix kernels (ELL storage on the GPU)
# --------------------------------------------------------------------------
# On the device the K matrices are stored in ELL format, column-major over the
# rows: ``cols[k*nr + i]`` and ``vals[(k*K + kk)*nr + i]`` for slot k < width of
# row i (padded with column 0 and value 0).  Consecutive threads (rows) then read
# consecutive addresses: measured on the H100, a thread-per-row CSR loop over
# 27 entries ran at half of cuSPARSE's speed, because the 32 threads of a warp
# touched 32 different cache lines per load.
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
def _ell_kernel(kind, K, NO):
    cp = get_backend("gpu").xp
    body = _ELL_HEAD.replace("BODY", _ELL_BODY[kind]).replace("NO", str(NO)).replace("KK", str(K))
    return cp.ElementwiseKernel(_ELL_PARAMS, "raw T y", body, f"adaptmg_ns_ell_{kind}")


# r = b - A x  and one Chebyshev step  d = c1 d + c2 dinv (b - A xin),  xout = xin + d  (A: K = 1)
_ELL_ROWSUM = r"""
T s = 0;
for (int k = 0; k < width; ++k) {
    const ptrdiff_t e = (ptrdiff_t)k * nr + i;
    s += vals[e] * x[cols[e]];
}
"""
_SOLVER_SPECS = {
    "residual": ("raw I cols, raw T vals, raw T x, raw T b, int32 nr, int32 width", "raw T r",
                 _ELL_ROWSUM + "r[i] = b[i] - s;"),
    "chebyshev": ("raw I cols, raw T vals, raw T x, raw T b, raw T dinv, int32 nr, int32 width, T c1, T c2",
                  "raw T d, raw T xout",
                  _ELL_ROWSUM + "const T t = c2 * dinv[i] * (b[i] - s) + (c1 == T(0) ? T(0) : c1 * d[i]);"
                  " d[i] = t; xout[i] = x[i] + t;"),
    # x = S b for a dense symmetric S (column access: coalesced over the rows i)
    "sym_gemv": ("raw T S, raw T b, int32 n", "raw T x",
                 "T s = 0; for (int j = 0; j < n; ++j) s += S[(ptrdiff_t)j * n + i] * b[j]; x[i] = s;"),
}


# Sub-warp variants (TPR = 2..32 threads per row, shuffle reduction) for the small,
# latency-bound levels of the pressure multigrid: one thread per row walks a chain of
# ``width`` dependent loads (column index, then the gathered x), so a kernel on a
# 10k-row level takes about as long as on a 70k-row one.  Launched with
# size = roundup(nr * TPR, 32), so every warp is either fully inside or fully outside
# the element-wise loop and the full-mask shuffles are well defined.
_SUB_ROWSUM = r"""
const ptrdiff_t row = i / TPR;
const int lane = (int)(i % TPR);
T s = 0;
if (row < nr) {
    for (int k = lane; k < width; k += TPR) {
        const ptrdiff_t e = (ptrdiff_t)k * nr + row;
        s += vals[e] * x[cols[e]];
    }
}
#pragma unroll
for (int off = TPR / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, TPR);
if (row < nr && lane == 0) { EPILOGUE }
"""
_SUB_SPECS = {
    "residual": ("raw I cols, raw T vals, raw T x, raw T b, int32 nr, int32 width", "raw T r",
                 "r[row] = b[row] - s;"),
    "chebyshev": ("raw I cols, raw T vals, raw T x, raw T b, raw T dinv, int32 nr, int32 width, T c1, T c2",
                  "raw T d, raw T xout",
                  "const T t = c2 * dinv[row] * (b[row] - s) + (c1 == T(0) ? T(0) : c1 * d[row]);"
                  " d[row] = t; xout[row] = x[row] + t;"),
    "spmv": ("raw I cols, raw T vals, raw T x, int32 nr, int32 width, T alpha, T beta", "raw T y",
             "y[row] = (beta == T(0)) ? alpha * s : alpha * s + beta * y[row];"),
}
_SUB_GEMV = r"""
const ptrdiff_t row = i / TPR;
const int lane = (int)(i % TPR);
T s = 0;
if (row < n) for (int j = lane; j < n; j += TPR) s += S[row * n + j] * b[j];
#pragma unroll
for (int off = TPR / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, TPR);
if (row < n && lane == 0) x[row] = s;
"""


@functools.lru_cache(maxsize=None)
def _sub_kernel(name, tpr):
    cp = get_backend("gpu").xp
    if name == "sym_gemv":
        return cp.ElementwiseKernel("raw T S, raw T b, int32 n", "raw T x",
                                    _SUB_GEMV.replace("TPR", str(tpr)), f"adaptmg_ns_{name}_sub{tpr}")
    inp, out, epi = _SUB_SPECS[name]
    body = _SUB_ROWSUM.replace("EPILOGUE", epi).replace("TPR", str(tpr))
    return cp.ElementwiseKernel(inp, out, body, f"adaptmg_ns_{name}_sub{tpr}")


def _sub_size(n, tpr):
    return ((n * tpr + 31) // 32) * 32


@functools.lru_cache(maxsize=None)
def _solver_kernel(name):
    cp = get_backend("gpu").xp
    inp, out, op = _SOLVER_SPECS[name]
    return cp.ElementwiseKernel(inp, out, op, f"adaptmg_ns_{name}")


def sym_gemv(S, b, x, tpr=1):
    """``x = S b`` for a dense symmetric ``S`` (n x n), one launch (coarse solve of the pressure MG).

    ``tpr > 1`` (GPU): ``tpr`` threads per row with a shuffle reduction.
    """
    n = b.shape[0]
    if _is_numpy(x):
        np.dot(S, b, out=x)
        return x
    if tpr > 1:
        return _sub_kernel("sym_gemv", tpr)(S, b, np.int32(n), x, size=_sub_size(n, tpr))
    return _solver_kernel("sym_gemv")(S, b, np.int32(n), x, size=n)


def ell_from_csr(indptr, indices, vals, nrows):
    """ELL arrays (width, cols (width*nrows,), vals (width*K*nrows,)) of a multi-matrix CSR pattern."""
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
    """``K`` CSR matrices of one shape stored on one (union) sparsity pattern.

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
            from .device.kernels import make_spmv
            self._cache[("plan", kind, NO)] = make_spmv(self.backend.asmatrix(self.block(kind, NO)))
        return self

    # ---------------------------------------------------------------- apply
    def _gpu(self, kind, NO, x, y, alpha, beta):
        if self.use_kernels:
            nr, nc = self.shape
            T = y.dtype.type
            _ell_kernel(kind, self.K, NO)(self.ell_cols, self.ell_vals, x, np.int32(nr), np.int32(nc),
                                          np.int32(self.width), T(alpha), T(beta), y, size=nr)
            return y
        key = ("plan", kind, NO)
        plan = self._cache.get(key)
        if plan is None:
            from .device.kernels import make_spmv
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
        if _is_numpy(y):
            return self._finish(y, (self.matrix(0) @ np.ascontiguousarray(x.T)).T, alpha, beta)
        return self._gpu("vec", NO, x, y, alpha, beta)

    def conv(self, W, y, alpha=1.0, beta=0.0):
        r"""``y[o] = alpha sum_k A_k W[o, k] + beta y[o]``; ``W (NO, K, nc)``, ``y (NO, nr)``."""
        nr, nc = self.shape
        NO = W.shape[0]
        _check("W", W, (NO, self.K, nc))
        _check("y", y, (NO, nr), W)
        if _is_numpy(y):
            Wt = np.ascontiguousarray(W.reshape(NO, -1).T)           # (K*nc, NO) for csr_matvecs
            return self._finish(y, (self._hstack() @ Wt).T, alpha, beta)
        return self._gpu("conv", NO, W, y, alpha, beta)

    def grad(self, x, y, alpha=1.0, beta=0.0):
        r"""``y[o] = alpha A_o x + beta y[o]``, o < K; ``x (nc,)``, ``y (K, nr)``."""
        nr, nc = self.shape
        _check("x", x, (nc,))
        _check("y", y, (self.K, nr), x)
        if _is_numpy(y):
            if "grad" not in self._host._cache:
                self._host._cache["grad"] = self.block("grad", self.K)
            return self._finish(y, (self._host._cache["grad"] @ x).reshape(self.K, nr), alpha, beta)
        return self._gpu("grad", self.K, x, y, alpha, beta)

    def residual(self, x, b, r, tpr=1):
        """``r = b - A_0 x`` (square ``A_0``), one launch (``tpr`` threads per row on the GPU)."""
        nr, nc = self.shape
        if _is_numpy(r):
            np.subtract(b, self.matrix(0) @ x, out=r)
            return r
        if tpr > 1:
            return _sub_kernel("residual", tpr)(self.ell_cols, self.ell_vals, x, b, np.int32(nr),
                                                np.int32(self.width), r, size=_sub_size(nr, tpr))
        return _solver_kernel("residual")(self.ell_cols, self.ell_vals, x, b, np.int32(nr),
                                          np.int32(self.width), r, size=nr)

    def chebyshev(self, x, b, dinv, d, c1, c2, xout, tpr=1):
        """One Chebyshev step on ``A_0``: ``d = c1 d + c2 dinv (b - A_0 x)``, ``xout = x + d`` (c1 = 0: d not read)."""
        nr = self.shape[0]
        if _is_numpy(xout):
            t = c2 * dinv * (b - self.matrix(0) @ x)
            if c1 != 0:
                t += c1 * d
            d[...] = t
            np.add(x, t, out=xout)
            return xout
        T = xout.dtype.type
        if tpr > 1:
            return _sub_kernel("chebyshev", tpr)(self.ell_cols, self.ell_vals, x, b, dinv, np.int32(nr),
                                                 np.int32(self.width), T(c1), T(c2), d, xout,
                                                 size=_sub_size(nr, tpr))
        return _solver_kernel("chebyshev")(self.ell_cols, self.ell_vals, x, b, dinv, np.int32(nr),
                                           np.int32(self.width), T(c1), T(c2), d, xout, size=nr)

    def spmv(self, x, y, alpha=1.0, beta=0.0, tpr=1):
        """``y = alpha A_0 x + beta y`` for 1-D ``x``, ``y`` (grid transfers of the pressure MG)."""
        nr, nc = self.shape
        if _is_numpy(y) or tpr <= 1:
            return self.vec(x.reshape(1, -1), y.reshape(1, -1), alpha, beta)
        T = y.dtype.type
        return _sub_kernel("spmv", tpr)(self.ell_cols, self.ell_vals, x, np.int32(nr), np.int32(self.width),
                                        T(alpha), T(beta), y, size=_sub_size(nr, tpr))

    def div(self, x, y, alpha=1.0, beta=0.0):
        r"""``y = alpha sum_k A_k x[k] + beta y``; ``x (K, nc)``, ``y (nr,)``."""
        nr, nc = self.shape
        _check("x", x, (self.K, nc))
        _check("y", y, (nr,), x)
        if _is_numpy(y):
            return self._finish(y, self._hstack() @ x.reshape(-1), alpha, beta)
        return self._gpu("div", 1, x, y, alpha, beta)
