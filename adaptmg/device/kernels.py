"""Fused CSR kernels and preplanned sparse products for the solver.

The fused element-wise kernels (``axpby``, the Jacobi and Chebyshev updates,
``add_cast``, ``get_kernel``) live in :mod:`.elementwise` and the CUDA source of the
CSR kernels in :mod:`.csr_source`; both are re-exported here, so
``adaptmg.device.kernels`` stays the one place the solver imports them from.  Each
operation has a NumPy twin with the same semantics (the CPU path and the tests'
reference) and dispatches on the type of its output array.

The fused CSR kernels (:func:`csr_jacobi_sweep`, :func:`csr_chebyshev_step`,
:func:`csr_residual`, ...) do a Jacobi sweep, a Chebyshev step or a residual of a
small level in one launch; :data:`CSR_THREADS_PER_ROW` (None: by nnz per row,
:func:`threads_per_row`) sets their threads per row.

Sparse products go through :func:`make_spmv`, which returns a *plan*
``plan(x, y, alpha=1.0, beta=0.0)`` computing ``y <- alpha A x + beta y`` into
a preallocated ``y``.  On the GPU the plan calls cuSPARSE ``SpMV`` with the
matrix descriptor and work buffer created once at setup and the dense-vector
descriptors cached by device pointer, so a call costs one Python->C call
instead of cupyx's create/query/allocate/destroy sequence.  On the CPU it calls
SciPy's compiled ``csr_matvec`` (``y += A x``) into ``y``.

Private library internals (this package is the only place that may use them):

* ``scipy.sparse._sparsetools.csr_matvec``: SciPy's public ``A @ x`` allocates the
  result; the compiled routine accumulates into a preallocated ``y``, which the
  cycle needs (no allocation per SpMV).  If SciPy moves it, the plans fall back to
  ``A @ x`` plus an axpby.
* ``cupy_backends.cuda.libs.cusparse``, ``cupy._core._dtype``, ``cupy.cuda.device``:
  the raw cuSPARSE ``spMV`` call with a matrix descriptor and work buffer created
  once; ``cupyx.cusparse.spmv`` recreates both on every call (several host calls
  per SpMV).  If they are unavailable the plan falls back to ``cupyx.cusparse.spmv``.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, get_backend, in_host_memory, is_device_sparse, to_host
from . import pdl
from .csr_source import _CSR_SRC
from .elementwise import (KERNEL_NAMES, add_cast, axpby, chebyshev_start,  # noqa: F401
                          chebyshev_start_zero, chebyshev_update, get_kernel,
                          indexed_jacobi_update, jacobi_residual_update, jacobi_update,
                          jacobi_zero)

__all__ = [
    "get_kernel", "axpby", "jacobi_update", "jacobi_residual_update",
    "jacobi_zero", "chebyshev_start", "chebyshev_start_zero",
    "chebyshev_update", "add_cast", "indexed_jacobi_update", "csr_jacobi_sweep", "csr_chebyshev_step", "csr_residual",
    "csr_jacobi_zero_sweeps", "csr_restricted_residual", "csr_correct_jacobi",
    "smooth_restrict_matrix", "csr_smooth_restrict", "is_int32_csr", "csr_product64",
    "threads_per_row", "csr_threads_per_row",
    "make_spmv", "SpMVPlan", "dense_matvec",
    "KERNEL_NAMES",
]


#: threads per row (one block) of the captured dense GEMV (a multiple of 32, <= 1024)
_GEMV_BLOCK = 128


def dense_matvec(M, b, out):
    """``out <- M b`` for a dense (small) matrix, one GEMV, no allocation.

    GPU: cuBLAS GEMV; while the current stream is being captured into a CUDA
    graph (CuPy refuses cuBLAS there) the RawKernel ``adaptmg_dense_gemv_<type>``:
    one block of 128 threads per row of the C-contiguous ``M``, four independent
    partial sums per thread, then a block reduction.  (One warp per row with one load
    in flight per thread was latency-bound: 10.4 us for n = 1089 on an H100, the
    largest kernel of a small CG iteration.)  Measured and not kept (H100, graph CG
    iteration at 66,049 DoFs, 62 us): the whole row loaded before the grid wait (double2
    loads) and L2 residency of ``M`` (a persisting L2 set-aside with ``evict_last`` loads)
    gained nothing, although ncu shows ``M`` read from DRAM in every iteration; ``M``
    stored in float32 with float64 sums gained 2 us there and lost 0.3-1.2 us at 16,641.
    """
    if in_host_memory(out):
        return np.dot(M, b, out=out)
    xp = get_backend("gpu").xp
    if xp.cuda.get_current_stream().is_capturing():
        if not (M.flags.c_contiguous and M.dtype == b.dtype == out.dtype):
            raise TypeError("dense_matvec under graph capture needs a C-contiguous M and one dtype")
        n, m = M.shape
        ct = _ctype(out.dtype)
        _csr_module(ct).get_function(f"adaptmg_dense_gemv_{ct}")(
            (n,), (_GEMV_BLOCK,), (np.int32(n), np.int32(m), M, b, out))
        return out
    return xp.dot(M, b, out=out)


# --------------------------------------------------------------------------
# Fused CSR kernels (one launch per Jacobi sweep / residual; small levels)
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _csr_module(ctype: str):
    cp = get_backend("gpu").xp
    return pdl.module(cp, _CSR_SRC.replace("{T}", ctype))


def _ctype(dtype, what="fused CSR kernels"):
    """The CUDA C type of a float dtype (``TypeError`` naming ``what`` for any other)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return "double"
    if dtype == np.float32:
        return "float"
    raise TypeError(f"{what} support float32/float64, got {dtype}")


#: threads per row of the fused CSR kernels: 1 (one thread per row) or a power
#: of two <= 32 (sub-warp rows with a shuffle reduction); None = choose by nnz/row
CSR_THREADS_PER_ROW = None


def threads_per_row(nnz_per_row: float) -> int:
    """Threads per row for the fused CSR kernels: the power of two <= max(1, nnz_per_row/5).

    Measured on an H100 (V(2,2)-cycle with all levels fused, in fine-SpMV
    units): 2-D Q1, 9.0 mean nnz/row: 1 thread 10.2, 2: 10.1-10.3, 4: 10.6-10.8,
    8: 12.3; 3-D Q1, 20.6 mean nnz/row (27 in the interior): 1 thread 12.1,
    2: 7.1, 4: 6.0, 8: 6.6.  This rule picks 1 and 4.
    """
    t = 1
    while t < 32 and 2 * t <= nnz_per_row / 5.0:
        t *= 2
    return t


def _rows_tpr(n, nnz):
    """Threads per row for a row kernel over ``n`` rows touching ``nnz`` entries in all
    (:data:`CSR_THREADS_PER_ROW` when set, else :func:`threads_per_row`)."""
    t = CSR_THREADS_PER_ROW
    if t is None:
        return threads_per_row(nnz / max(n, 1))
    if t not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"CSR_THREADS_PER_ROW must be 1, 2, 4, 8, 16 or 32, got {t!r}")
    return t


def csr_threads_per_row(A) -> int:
    """Threads per row that the fused CSR kernels use for ``A`` (:data:`CSR_THREADS_PER_ROW`
    when set, else :func:`threads_per_row` of its mean nnz per row)."""
    return _rows_tpr(A.shape[0], A.nnz)


_tpr = csr_threads_per_row


def _launch_csr(name, A, out, args):
    n = A.shape[0]
    ct = _ctype(out.dtype)
    mod = _csr_module(ct)
    t = _tpr(A)
    if t == 1:
        mod.get_function(f"adaptmg_{name}_{ct}")(((n + 127) // 128,), (128,),
                                                  (np.int32(n),) + args)
    else:
        mod.get_function(f"adaptmg_{name}_vec_{ct}")(((n * t + 127) // 128,), (128,),
                                                      (np.int32(n), np.int32(t)) + args)
    return out


def _np_residual(A, x, b, out):
    """NumPy twin of the CSR row kernels' common part: ``out <- b - A x`` with no temporary."""
    from scipy.sparse import _sparsetools   # private: accumulates into out (module docstring)
    out.fill(0)
    _sparsetools.csr_matvec(A.shape[0], A.shape[1], A.indptr, A.indices, A.data, x, out)
    np.subtract(b, out, out=out)
    return out


def csr_jacobi_sweep(A, x, b, dinv, omega, out):
    """``out <- x + omega dinv (b - A x)`` in one pass over CSR ``A`` (``out`` must not alias ``x``).

    GPU: the RawKernel ``adaptmg_csr_jacobi_<type>`` (one thread per row) or
    ``adaptmg_csr_jacobi_vec_<type>`` (2..32 threads per row, shuffle
    reduction; see :func:`threads_per_row`), int32 indices.  CPU twin:
    ``csr_matvec`` + NumPy.  Traffic: one pass over ``A``, reads ``x, b,
    dinv``, writes ``out`` -- versus SpMV + fused update, which also writes
    and re-reads ``Ax`` and costs two launches.
    """
    if in_host_memory(out):
        _np_residual(A, x, b, out)
        out *= dinv
        out *= omega
        out += x
        return out
    return _launch_csr("csr_jacobi", A, out, (A.indptr, A.indices, A.data, x, b, dinv,
                                              out.dtype.type(omega), out))


def csr_chebyshev_step(A, x, b, dinv, d, c1, c2, out):
    """One Chebyshev step in one pass over CSR ``A``:
    ``d <- c1 d + c2 dinv (b - A x);  out <- x + d`` (``out`` must not alias ``x``).

    GPU: the RawKernel ``adaptmg_csr_chebyshev[_vec]_<type>`` (threads per row as
    :func:`csr_jacobi_sweep`); it replaces an SpMV and the element-wise
    ``chebyshev_update`` (two launches, ``A x`` written and read back).
    """
    if in_host_memory(out):
        _np_residual(A, x, b, out)
        out *= dinv
        out *= c2
        d *= c1
        d += out
        np.add(x, d, out=out)
        return out
    t = out.dtype.type
    return _launch_csr("csr_chebyshev", A, out, (A.indptr, A.indices, A.data, x, b, dinv, d,
                                                 t(c1), t(c2), out))


def csr_residual(A, x, b, out):
    """``out <- b - A x`` in one pass over CSR ``A`` (GPU RawKernel ``adaptmg_csr_residual_<type>``)."""
    if in_host_memory(out):
        _np_residual(A, x, b, out)
        return out
    return _launch_csr("csr_residual", A, out, (A.indptr, A.indices, A.data, x, b, out))


def csr_rows_add(indptr, indices, data, rows, x, out, alpha=1.0, scale=None):
    r"""``out[rows[i]] += alpha * scale[rows[i]] * (C x)_i`` for the row-compressed CSR block
    ``C = (indptr, indices, data)`` with ``m = rows.size`` rows (``scale`` None: 1).

    A distributed matrix's ghost-column block touches few rows (the partition boundary): kept
    compressed, its product updates only those rows -- after a one-pass kernel over the owned
    block, e.g. the Jacobi sweep's ghost term ``-omega D^{-1} A_og x_g`` -- instead of an SpMV
    over every owned row.  GPU: ``adaptmg_csr_rows_add_<type>`` (one thread a row, int32
    indices); NumPy twin for host arrays.  ``rows`` must be distinct (no two threads add to one
    entry)."""
    m = rows.size
    if m == 0:
        return out
    if in_host_memory(out):
        s = sp.csr_matrix((np.asarray(data), np.asarray(indices), np.asarray(indptr)),
                          shape=(m, x.size)) @ np.asarray(x)
        c = alpha if scale is None else alpha * scale[rows]
        out[rows] += c * s
        return out
    ct = _ctype(out.dtype)
    t = out.dtype.type
    _csr_module(ct).get_function(f"adaptmg_csr_rows_add_{ct}")(
        ((m + 127) // 128,), (128,),
        (np.int32(m), indptr, indices, data, rows, np.uintp(0) if scale is None else scale, t(alpha), x, out))
    return out


def is_int32_csr(M) -> bool:
    """True for a CSR matrix (SciPy or cupyx) with int32 ``indptr`` and ``indices``
    (what the fused CSR kernels take)."""
    return (getattr(M, "format", None) == "csr" and M.indices.dtype == np.int32
            and M.indptr.dtype == np.int32)


def _launch_rows(name, n, t, out, args):
    """Launch ``adaptmg_<name>_<type>`` with ``t`` threads per row over ``n`` rows."""
    ct = _ctype(out.dtype)
    _csr_module(ct).get_function(f"adaptmg_{name}_{ct}")(
        ((n * t + 127) // 128,), (128,), (np.int32(n), np.int32(t)) + args)
    return out


def csr_jacobi_zero_sweeps(A, b, dinv, omega, out):
    r"""The first two damped Jacobi sweeps from ``x = 0`` in one pass over CSR ``A``:

    .. math:: x^{(1)} = \omega D^{-1} b,\qquad
              \text{out} = x^{(1)} + \omega D^{-1} (b - A x^{(1)}),

    with :math:`x^{(1)}` formed on the fly (never stored): one launch instead of
    ``jacobi_zero`` + :func:`csr_jacobi_sweep`.  Same operations as those two;
    on the GPU the row sums may take another order (``tpr`` lanes).
    """
    if in_host_memory(out):
        x1 = omega * dinv * b
        _np_residual(A, x1, b, out)
        out *= dinv
        out *= omega
        out += x1
        return out
    t = out.dtype.type
    return _launch_rows("csr_jacobi0_vec", A.shape[0], _tpr(A), out,
                        (A.indptr, A.indices, A.data, b, dinv, t(omega), out))


def csr_product64(X, Y):
    """``X Y`` as a float64 CSR matrix: a cuSPARSE SpGEMM when both are device matrices (no
    download), else SciPy's product of host copies."""
    if is_device_sparse(X) and is_device_sparse(Y):
        xs = backend_of(X).sparse
        Z = (xs.csr_matrix(X, dtype=np.float64) @ xs.csr_matrix(Y, dtype=np.float64)).tocsr()
        Z.sum_duplicates()
        return Z
    X, Y = to_host(X), to_host(Y)
    return sp.csr_matrix(sp.csr_matrix(X, dtype=np.float64) @ sp.csr_matrix(Y, dtype=np.float64))


def smooth_restrict_matrix(A, R, dinv, omega, sweeps):
    r"""The CSR matrix ``S = R (I - A G)`` of :func:`csr_smooth_restrict`, in float64:
    ``G = omega D^{-1}`` (one sweep) or ``G = omega D^{-1} (2 I - omega A D^{-1})`` (two),
    so that ``G b`` is ``sweeps`` damped Jacobi sweeps on ``A x = b`` from ``x = 0`` and
    ``S b`` the restriction of their residual.  ``A``, ``R`` (CSR) and ``dinv`` (the
    inverse diagonal) on one backend: SciPy products on the host, cuSPARSE SpGEMMs on the
    device for cupyx matrices (no download of the level's matrices)."""
    if sweeps not in (1, 2):
        raise ValueError(f"smooth_restrict_matrix: sweeps must be 1 or 2, got {sweeps!r}")
    be = backend_of(A)
    if backend_of(R).name != be.name or backend_of(dinv).name != be.name:
        raise TypeError("smooth_restrict_matrix: A, R and dinv must live on one backend")
    xs = be.sparse
    A, R = xs.csr_matrix(A, dtype=np.float64), xs.csr_matrix(R, dtype=np.float64)
    Dw = xs.diags(omega * be.xp.asarray(dinv, dtype=np.float64))
    RAD = R @ A @ Dw
    RAG = RAD if sweeps == 1 else 2.0 * RAD - RAD @ (A @ Dw)
    S = (R - RAG).tocsr()
    S.sum_duplicates()
    S.sort_indices()
    return S


def csr_smooth_restrict(A, dinv, omega, sweeps, S, b, y, c):
    r"""Pre-smoothing from zero and the restriction of its residual in one launch:

    .. math:: y = G b,\qquad c = S b = R (b - A y),

    ``G b`` being ``sweeps`` (1 or 2) damped Jacobi sweeps on ``A x = b`` from ``x = 0``
    (the operations of :func:`jacobi_zero` / :func:`csr_jacobi_zero_sweeps`) and ``S``
    from :func:`smooth_restrict_matrix` (CSR, int32 indices on the GPU).  Both parts
    only read ``b``, so one grid runs them side by side: one launch for what is
    otherwise the smoothing, a residual pass and the restriction (or the smoothing and
    :func:`csr_restricted_residual`).  ``c`` equals ``R (b - A y)`` up to round-off.
    """
    if sweeps not in (1, 2):
        raise ValueError(f"csr_smooth_restrict: sweeps must be 1 or 2, got {sweeps!r}")
    if in_host_memory(y):
        if sweeps == 2:
            csr_jacobi_zero_sweeps(A, b, dinv, omega, y)
        else:
            np.multiply(omega * dinv, b, out=y)
        c[...] = S @ b
        return y
    n, m = A.shape[0], S.shape[0]
    tf, tc = _tpr(A), _tpr(S)
    nbf = (n * tf + 127) // 128
    nbc = (m * tc + 127) // 128
    ct = _ctype(y.dtype)
    _csr_module(ct).get_function(f"adaptmg_csr_smooth_restrict_{ct}")(
        (nbf + nbc,), (128,),
        (np.int32(n), np.int32(tf), np.int32(sweeps), np.int32(nbf), A.indptr, A.indices,
         A.data, b, dinv, y.dtype.type(omega), y, np.int32(m), np.int32(tc), S.indptr,
         S.indices, S.data, c))
    return y


def csr_restricted_residual(R, RA, b, x, out):
    r"""``out <- R b - (R A) x``: the restriction of the residual ``R (b - A x)`` without
    forming ``b - A x`` (one launch over the coarse rows instead of a residual pass over
    the fine rows and a restriction).

    ``RA`` is the CSR product ``R A`` (Galerkin-style, built once at set-up); both
    matrices CSR with int32 indices on the GPU.  Equal to ``R (b - A x)`` up to
    round-off (another grouping of the same sums).
    """
    if in_host_memory(out):
        np.subtract(R @ b, RA @ x, out=out)
        return out
    n = out.shape[0]
    t = _rows_tpr(n, R.nnz + RA.nnz)
    return _launch_rows("csr_rres_vec", n, t, out, (R.indptr, R.indices, R.data, RA.indptr,
                                                    RA.indices, RA.data, b, x, out))


def csr_correct_jacobi(A, AP, P, x, e, b, dinv, omega, out):
    r"""The coarse-grid correction and one damped Jacobi sweep in one pass:

    .. math:: \text{out} = x + P e + \omega D^{-1} (b - A x - (A P) e)
              = x' + \omega D^{-1} (b - A x'),\qquad x' = x + P e,

    with ``AP`` the CSR product ``A P`` built once at set-up (``out`` must not alias
    ``x``).  One launch instead of the prolongation SpMV and a Jacobi sweep; equal to
    them up to round-off.
    """
    if in_host_memory(out):
        xc = x + P @ e
        np.subtract(b, A @ x + AP @ e, out=out)
        out *= dinv
        out *= omega
        out += xc
        return out
    n = out.shape[0]
    t = _rows_tpr(n, A.nnz + AP.nnz + P.nnz)
    return _launch_rows("csr_cjac_vec", n, t, out,
                        (A.indptr, A.indices, A.data, AP.indptr, AP.indices, AP.data,
                         P.indptr, P.indices, P.data, x, e, b, dinv, out.dtype.type(omega), out))


# --------------------------------------------------------------------------
# Sparse matrix-vector product plans
# --------------------------------------------------------------------------
class SpMVPlan:
    """``plan(x, y, alpha=1, beta=0)`` computes ``y <- alpha A x + beta y`` in place.

    Built once per matrix by :func:`make_spmv`.  Subclasses: CPU CSR
    (``csr_matvec``), GPU CSR (cuSPARSE generic SpMV with cached
    descriptors), and a generic fallback for any operator with ``@``.
    """

    def __init__(self, A):
        self.A = A
        self.shape = tuple(A.shape)

    def __call__(self, x, y, alpha=1.0, beta=0.0):  # pragma: no cover - abstract
        raise NotImplementedError

    def residual(self, x, b, r):
        """``r <- b - A x`` (``r`` distinct from ``x`` and ``b``): a copy and the SpMV
        ``r <- -A x + r``; plans whose operator can do it in one pass override it."""
        r[...] = b
        return self(x, r, -1.0, 1.0)


class _GenericPlan(SpMVPlan):
    """Any operator with ``A @ x`` (matrix-free levels); allocates one temporary."""

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        return axpby(alpha, self.A @ x, beta, y)


class _OperatorPlan(SpMVPlan):
    """A matrix-free operator with its own ``A.spmv(x, y, alpha, beta)`` (``y <- alpha A x
    + beta y`` in place, e.g. :class:`adaptmg.patch.LaplaceOperator`): no temporary; its
    ``A.residual(x, b, r)`` (``r <- b - A x``), where it has one, for :meth:`residual`."""

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        self.A.spmv(x, y, alpha, beta)
        return y

    def residual(self, x, b, r):
        res = getattr(self.A, "residual", None)
        if res is None:
            return super().residual(x, b, r)
        res(x, b, r)
        return r


class _CpuCsrPlan(SpMVPlan):
    """SciPy CSR: ``y <- alpha A x + beta y`` via ``csr_matvec`` (which does ``y += A x``).

    Scaling trick: ``y <- (beta/alpha) y; y += A x; y <- alpha y`` gives
    ``alpha A x + beta y`` with no temporary vector.
    """

    def __init__(self, A):
        super().__init__(A)
        try:   # private SciPy routine: accumulates into y (see the module docstring)
            from scipy.sparse import _sparsetools
            self._matvec = _sparsetools.csr_matvec
        except (ImportError, AttributeError):  # pragma: no cover - private SciPy API moved
            self._matvec = None

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        A = self.A
        if self._matvec is None or x.dtype != A.dtype or y.dtype != A.dtype:
            return _GenericPlan.__call__(self, x, y, alpha, beta)
        if alpha == 0:
            y *= beta
            return y
        if beta == 0:
            y.fill(0)
        elif beta != alpha:
            y *= beta / alpha
        m, n = self.shape
        self._matvec(m, n, A.indptr, A.indices, A.data, x, y)
        if alpha != 1:
            y *= alpha
        return y


class _GpuCsrPlan(SpMVPlan):
    """cuSPARSE generic SpMV with descriptor and buffer created once.

    Dense-vector descriptors hold only (size, pointer, dtype); they are cached
    by that key, so a preallocated work vector gets its descriptor once.  While
    the current stream is being captured into a CUDA graph (:mod:`adaptmg.device.cudagraph`),
    where CuPy does not allow cuSPARSE, the plan launches the RawKernel
    ``adaptmg_csr_spmv_<type>`` instead (int32 CSR; same threads-per-row rule as
    the fused kernels).
    """

    _MAX_CACHE = 256

    def __init__(self, A):
        super().__init__(A)
        # private CuPy modules: descriptor and buffer made once (see the module docstring)
        import cupy
        from cupyx import cusparse as cxs
        from cupy_backends.cuda.libs import cusparse as _cs
        from cupy._core import _dtype
        from cupy.cuda import device as _device
        if not cxs.check_availability("spmv"):
            raise RuntimeError("cuSPARSE generic SpMV is not available")
        self._cp = cupy
        self._cs = _cs
        self._device = _device
        self._cxs = cxs
        self._DnVec = cxs.DnVecDescriptor
        self.dtype = np.dtype(A.dtype)
        self._cuda_dtype = _dtype.to_cuda_dtype(self.dtype)
        self._op = _cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        self._alg = _cs.CUSPARSE_MV_ALG_DEFAULT
        self._desc_A = cxs.SpMatDescriptor.create(A)
        self._vecs = {}
        self._scalars = {}
        self._one = np.array(1, self.dtype)
        self._zero = np.array(0, self.dtype)
        m, n = self.shape
        xd = cupy.zeros(n, self.dtype)
        yd = cupy.zeros(m, self.dtype)
        handle = _device.get_cusparse_handle()
        size = _cs.spMV_bufferSize(handle, self._op, self._one.ctypes.data,
                                   self._desc_A.desc, self._vec(xd).desc,
                                   self._zero.ctypes.data, self._vec(yd).desc,
                                   self._cuda_dtype, self._alg)
        self._buf = cupy.empty(max(int(size), 1), cupy.int8)
        self._vecs.clear()
        self._nnz0 = A.nnz == 0
        self._raw = (A.indices.dtype == np.int32 and A.indptr.dtype == np.int32
                     and self.dtype in (np.float32, np.float64))

    def _vec(self, v):
        key = (v.data.ptr, v.size)
        d = self._vecs.get(key)
        if d is None:
            if len(self._vecs) >= self._MAX_CACHE:
                self._vecs.clear()
            d = self._DnVec.create(v)
            self._vecs[key] = d
        return d

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        if x.dtype != self.dtype or y.dtype != self.dtype:
            raise TypeError(f"SpMV plan for {self.dtype} got x {x.dtype}, y {y.dtype}")
        if self._nnz0:
            y *= beta
            return y
        if self._raw and self._cp.cuda.get_current_stream().is_capturing():
            # CuPy refuses cuSPARSE calls during CUDA-graph capture: the same product
            # with adaptmg's CSR kernel (row sums in another order: round-off differences)
            A, t = self.A, self.dtype.type
            return _launch_csr("csr_spmv", A, y, (A.indptr, A.indices, A.data, x, t(alpha), t(beta), y))
        ab = self._scalars.get((alpha, beta))
        if ab is None:
            if len(self._scalars) > 64:
                self._scalars.clear()
            ab = (np.array(alpha, self.dtype), np.array(beta, self.dtype))
            self._scalars[(alpha, beta)] = ab
        a, b = ab
        self._cs.spMV(self._device.get_cusparse_handle(), self._op, a.ctypes.data,
                      self._desc_A.desc, self._vec(x).desc, b.ctypes.data,
                      self._vec(y).desc, self._cuda_dtype, self._alg,
                      self._buf.data.ptr)
        return y


class _GpuCupyxPlan(SpMVPlan):
    """Fallback: ``cupyx.cusparse.spmv`` (creates descriptors on every call)."""

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        from cupyx import cusparse as cxs
        cxs.spmv(self.A, x, y=y, alpha=alpha, beta=beta)
        return y


def make_spmv(A) -> SpMVPlan:
    """A plan computing ``y <- alpha A x + beta y`` for ``A`` on its own backend.

    SciPy CSR -> compiled ``csr_matvec``; cupyx CSR -> cuSPARSE SpMV with
    cached descriptors (falls back to ``cupyx.cusparse.spmv`` if the low-level
    API is unavailable); an operator with ``spmv(x, y, alpha, beta)`` -> that
    method; anything else -> ``A @ x`` plus a fused axpby.
    """
    if sp.issparse(A) and A.format == "csr":
        return _CpuCsrPlan(A)
    if is_device_sparse(A) and getattr(A, "format", None) == "csr":
        try:
            return _GpuCsrPlan(A)
        except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - CuPy build without them
            return _GpuCupyxPlan(A)
    if not sp.issparse(A) and not is_device_sparse(A) and callable(getattr(A, "spmv", None)):
        return _OperatorPlan(A)
    return _GenericPlan(A)

