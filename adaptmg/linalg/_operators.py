"""Argument checking and operator normalisation shared by the Krylov solvers.

Every solver of :mod:`adaptmg.linalg` starts with :func:`prepare_system`, which
turns whatever the caller passed into one :class:`System`:

* the *working backend* is the one that holds ``b`` (NumPy when ``b`` is a
  NumPy array or a list, CuPy when it is a CuPy array), so the solution comes
  back as the same kind of array as ``b``;
* ``A`` and ``M`` become :class:`Operator` objects, callables ``y = op(x)`` on
  1-D vectors of that backend.  Matrices (SciPy/cupyx sparse, dense NumPy/CuPy)
  are moved to the working backend *once*; foreign operators (LinearOperators,
  objects with ``matvec`` or ``@``, plain callables) are called as they are,
  with their input/output moved only when they live on the other side
  (a SciPy ``LinearOperator`` on the host while ``b`` is on the GPU, or a
  cupyx ``LinearOperator`` while ``b`` is on the host);
* every argument is validated once, with an error that names the argument and
  the shapes or values involved.

The module also holds :class:`VectorOps`: the few fused vector updates the
solvers need, written once with a NumPy twin (``out=`` arguments into a
preallocated buffer) and a CuPy ``ElementwiseKernel`` (one launch, scalars read
from device memory so that no host synchronisation is needed), and the block
products of the Arnoldi process: ``h = conj(V_k) w`` (:meth:`VectorOps.mdot`, two
launches for any ``k``, written into a slice of a preallocated device column) and
``w <- w - V_k^T h`` (:meth:`VectorOps.block_sub`, one launch).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backend import CPU, Backend, backend_of, get_backend, to_host

__all__ = ["Operator", "System", "VectorOps", "as_operator", "prepare_system",
           "check_positive_int"]

_NUMERIC_KINDS = "biufc"


# --------------------------------------------------------------------------
# classification of operator-like objects
# --------------------------------------------------------------------------
def _module(obj) -> str:
    return type(obj).__module__ or ""


def _is_cupyx_linear_operator(A) -> bool:
    return (_module(A).startswith("cupyx.scipy.sparse.linalg")
            and callable(getattr(A, "matvec", None)))


def _is_cupyx_sparse(A) -> bool:
    return (_module(A).startswith("cupyx.scipy.sparse")
            and not _is_cupyx_linear_operator(A) and hasattr(A, "tocsr"))


def _is_dense(A) -> bool:
    if isinstance(A, np.ndarray):
        return True
    return (_module(A).startswith("cupy") and not _is_cupyx_sparse(A)
            and hasattr(A, "ndim") and hasattr(A, "dtype") and hasattr(A, "shape")
            and not _is_cupyx_linear_operator(A))


def _shape_of(A) -> Optional[tuple]:
    shape = getattr(A, "shape", None)
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None
    return shape


def _dtype_of(A, name: str) -> Optional[np.dtype]:
    dtype = getattr(A, "dtype", None)
    if dtype is None:
        return None
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"{name} must have a numeric dtype, got dtype {dtype}")
    return dtype


def _classify(A, name: str):
    """Return (kind, shape, dtype) for an operator-like ``A``; TypeError if unusable.

    kind is one of "sparse", "dense", "scipy-linop", "cupyx-linop", "matvec",
    "matmul", "callable".
    """
    if A is None or isinstance(A, (str, bytes)):
        raise TypeError(f"{name} must be a sparse or dense matrix, a LinearOperator, "
                        f"an object with a matvec method or a callable, "
                        f"got {type(A).__name__}")
    if isinstance(A, spla.LinearOperator):
        kind = "scipy-linop"
    elif _is_cupyx_linear_operator(A):
        kind = "cupyx-linop"
    elif sp.issparse(A) or _is_cupyx_sparse(A):
        kind = "sparse"
    elif _is_dense(A):
        kind = "dense"
        if A.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got an array of shape {A.shape}")
    elif callable(getattr(A, "matvec", None)):
        kind = "matvec"
    elif hasattr(type(A), "__matmul__"):
        kind = "matmul"
    elif callable(A):
        kind = "callable"
    else:
        raise TypeError(f"{name} must be a sparse or dense matrix, a LinearOperator, "
                        f"an object with a matvec method or a callable, "
                        f"got {type(A).__name__}")
    shape = _shape_of(A) if kind != "callable" else None
    if shape is not None:
        if len(shape) != 2:
            raise ValueError(f"{name} must be a 2-D operator, got shape {shape}")
        if shape[0] != shape[1]:
            raise ValueError(f"{name} must be square, got shape {shape}")
    dtype = _dtype_of(A, name) if kind != "callable" else None
    return kind, shape, dtype


# --------------------------------------------------------------------------
# operators
# --------------------------------------------------------------------------
class Operator:
    """A square linear (or, for a preconditioner, possibly nonlinear) map on the backend.

    ``op(x)`` takes a 1-D array of length ``n`` on ``backend`` and returns one.
    ``fresh`` is True when every result is a newly allocated array that the
    caller may overwrite (matrix products); results of foreign callables may
    alias their input or an internal buffer and must be copied before being
    written to.
    """

    __slots__ = ("name", "n", "dtype", "backend", "kind", "fresh", "_apply")

    def __init__(self, name, n, dtype, backend, kind, fresh, apply):
        self.name, self.n, self.dtype = name, n, dtype
        self.backend, self.kind, self.fresh = backend, kind, fresh
        self._apply = apply

    @property
    def shape(self):
        return (self.n, self.n)

    def __call__(self, x):
        return self._apply(x)

    def __repr__(self):
        return (f"Operator({self.name}, kind={self.kind}, shape={self.shape}, "
                f"dtype={self.dtype}, backend={self.backend.name})")


def _foreign(f, name, n, dtype, backend: Backend, side: Backend):
    """Wrap a foreign callable living on ``side`` so that it maps backend vectors."""
    convert_in = side.name != backend.name

    def apply(x):
        y = f(side.asarray(x) if convert_in else x)
        y = backend.asarray(y)
        if y.shape != (n,):
            if y.size != n:
                raise ValueError(f"{name} returned an array of shape {y.shape} for an "
                                 f"input of shape ({n},)")
            y = y.reshape(n)
        if y.dtype != dtype:
            y = y.astype(dtype)
        return y

    return apply


def as_operator(A, n: int, dtype, backend: Backend, name: str = "A",
                classified=None) -> Operator:
    """Normalise ``A`` into an :class:`Operator` of size ``n`` on ``backend``.

    Matrices are converted to ``dtype`` and moved to ``backend`` once (sparse
    ones as CSR); other objects are wrapped.  Raises TypeError for objects that
    are not operators and ValueError when the shape is not ``(n, n)``.
    """
    kind, shape, _ = classified if classified is not None else _classify(A, name)
    if shape is not None and shape != (n, n):
        raise ValueError(f"{name} has shape {shape} but the system has size {n}; "
                         f"expected shape ({n}, {n})")
    dtype = np.dtype(dtype)
    if kind == "sparse":
        mat = backend.asmatrix(A, dtype=dtype)
        return Operator(name, n, dtype, backend, kind, True, mat.__matmul__)
    if kind == "dense":
        mat = backend.asarray(A, dtype=dtype)
        return Operator(name, n, dtype, backend, kind, True, mat.__matmul__)
    if kind == "scipy-linop":
        side, f = CPU, A.matvec
    elif kind == "cupyx-linop":
        side, f = get_backend("gpu"), A.matvec
    elif kind == "matvec":
        side, f = backend, A.matvec
    elif kind == "matmul":
        side, f = backend, A.__matmul__
    else:
        side, f = backend, A
    return Operator(name, n, dtype, backend, kind, False,
                    _foreign(f, name, n, dtype, backend, side))


# --------------------------------------------------------------------------
# scalar arguments
# --------------------------------------------------------------------------
def _check_tol(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return value


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as int; TypeError if it is not an integer, ValueError if < 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} "
                        f"{value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _as_vector(v, n, name, backend, dtype=None):
    """Return ``v`` as a 1-D array of length n on backend (shape (n,) or (n, 1) accepted)."""
    if v.ndim == 2 and v.shape[1] == 1:
        v = v.reshape(-1)
    if v.ndim != 1 or (n is not None and v.shape[0] != n):
        expected = f"({n},) or ({n}, 1)" if n is not None else "(n,) or (n, 1)"
        raise ValueError(f"{name} must have shape {expected}, got shape {v.shape}")
    return backend.asarray(v, dtype=dtype)


def _as_array(v, name):
    """Array-like -> numpy/cupy array (lists become NumPy); TypeError if non-numeric."""
    if not (isinstance(v, np.ndarray) or (_module(v).startswith("cupy") and hasattr(v, "ndim"))):
        if sp.issparse(v) or _is_cupyx_sparse(v):
            raise TypeError(f"{name} must be a dense vector, got a sparse {type(v).__name__}")
        try:
            v = np.asarray(v)
        except Exception as exc:  # ragged lists etc.
            raise TypeError(f"{name} must be an array of numbers, got {type(v).__name__}") from exc
    if v.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"{name} must have a numeric dtype, got dtype {v.dtype}")
    return v


# --------------------------------------------------------------------------
# the prepared system
# --------------------------------------------------------------------------
@dataclass
class System:
    """Everything a solver needs, validated and on one backend."""

    backend: Backend
    A: Operator
    M: Optional[Operator]
    b: Any            # 1-D, working dtype; may alias the caller's b (never written)
    x: Any            # 1-D, working dtype; a fresh copy of x0 (or zeros)
    x0_given: bool
    n: int
    dtype: np.dtype
    bnrm2: float      # ||b||
    tol: float        # max(rtol * ||b||, atol)
    maxiter: int
    callback: Optional[Callable]

    @property
    def xp(self):
        return self.backend.xp

    def norm(self, v) -> float:
        """||v||_2 as a host float (one synchronisation on the GPU)."""
        return float(self.xp.linalg.norm(v))

    def residual(self, x, out=None):
        """``out <- b - A x`` (allocates ``out`` if not given)."""
        Ax = self.A(x)
        if out is None:
            return self.b - Ax
        return self.xp.subtract(self.b, Ax, out=out)

    def start(self):
        """Initial residual of the iteration, or None when ``self.x`` already solves the system.

        Returns ``(r, ||r||)`` with r = b - A x0, or None when no iteration is needed:
        b = 0 without x0 (x = 0 is exact), x0 already meets the tolerance, or b = 0
        with an x0 that does not (x is then set to the exact solution 0).
        """
        if self.bnrm2 == 0.0 and not self.x0_given:
            return None
        r = self.xp.empty_like(self.x)
        self.residual(self.x, out=r)
        if self.x0_given:        # r + 0 x0 = r, but carries a NaN/Inf of x0 into ||r||
            with np.errstate(invalid="ignore"):     # (even where A does not see it)
                r += 0 * self.x
        rnorm = self.norm(r)
        # a non-finite x0 shows in ||r||: only then look at x0 itself
        if not math.isfinite(rnorm) and self.x0_given and not bool(self.xp.isfinite(self.x).all()):
            raise ValueError("x0 contains NaN or Inf")
        if rnorm <= self.tol:
            return None
        if self.bnrm2 == 0.0:
            self.x[...] = 0
            return None
        return r, rnorm


def _working_dtype(*dtypes) -> np.dtype:
    dtype = np.result_type(*[d for d in dtypes if d is not None])
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    if dtype == np.float16:
        return np.dtype(np.float32)
    return dtype


def prepare_system(A, b, x0, *, rtol, atol, maxiter, M, callback) -> System:
    """Validate the arguments of a solver once and normalise them (see module doc)."""
    kind_A = _classify(A, "A")
    b = _as_array(b, "b")
    backend = backend_of(b)
    n = kind_A[1][0] if kind_A[1] is not None else None
    if b.ndim not in (1, 2) or (b.ndim == 2 and b.shape[1] != 1) or \
            (n is not None and b.shape[0] != n):
        expected = f"({n},) or ({n}, 1)" if n is not None else "(n,) or (n, 1)"
        raise ValueError(f"A has shape {kind_A[1]} but b has shape {b.shape}; "
                         f"expected b of shape {expected}")
    n = b.shape[0]
    if n == 0:
        raise ValueError("b is empty (shape (0,)); the system must have at least one unknown")
    rtol = _check_tol(rtol, "rtol")
    atol = _check_tol(atol, "atol")
    maxiter = None if maxiter is None else check_positive_int(maxiter, "maxiter")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")

    if x0 is not None:
        x0 = _as_array(x0, "x0")
    dtype = _working_dtype(kind_A[2], b.dtype, None if x0 is None else x0.dtype)
    xp = backend.xp
    bw = _as_vector(b, n, "b", backend, dtype)
    x = xp.zeros(n, dtype=dtype)
    if x0 is not None:
        x[...] = _as_vector(x0, n, "x0", backend, dtype)   # a copy: x0 is never written
        # (a non-finite x0 is reported by System.start, which sees it in ||b - A x0||)

    Aop = as_operator(A, n, dtype, backend, "A", classified=kind_A)
    Mop = None if M is None else as_operator(M, n, dtype, backend, "M")
    bnrm2 = float(xp.linalg.norm(bw))
    # one synchronisation for ||b|| and the NaN/Inf test: only a non-finite norm
    # (NaN/Inf in b, or an overflow of a finite b) needs the element-wise look
    if not math.isfinite(bnrm2) and not bool(xp.isfinite(bw).all()):
        raise ValueError("b contains NaN or Inf")
    return System(backend=backend, A=Aop, M=Mop, b=bw, x=x, x0_given=x0 is not None,
                  n=n, dtype=np.dtype(dtype), bnrm2=bnrm2, tol=max(rtol * bnrm2, atol),
                  maxiter=10 * n if maxiter is None else maxiter, callback=callback)


# --------------------------------------------------------------------------
# fused vector updates
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _cupy_kernels(xp):
    """Memoised CuPy kernels (named adaptmg_krylov_*); scalars are read from device memory."""
    ek = xp.ElementwiseKernel
    return {
        # w <- w - h[0] * v  (one MGS projection step)
        "sub_scaled": ek("raw T h, T v", "T w", "w -= h[0] * v",
                         "adaptmg_krylov_sub_scaled"),
        # alpha = rz/pq (0 if pq == 0);  x <- x + alpha p;  r <- r - alpha q
        "cg_xr": ek("T p, T q, raw T rz, raw T pq", "T x, T r",
                    "const T a = (pq[0] != T(0)) ? rz[0] / pq[0] : T(0);"
                    "x += a * p; r -= a * q;",
                    "adaptmg_krylov_cg_xr"),
        # beta = rz_new/rz_old (0 if rz_old == 0);  p <- z + beta p
        "cg_p": ek("T z, raw T rznew, raw T rzold", "T p",
                   "const T c = (rzold[0] != T(0)) ? rznew[0] / rzold[0] : T(0);"
                   "p = z + c * p;",
                   "adaptmg_krylov_cg_p"),
        # w <- w - sum_{r<k} h[r] V[r*n + i]  (V: the flattened row-major basis)
        "block_sub": ek("raw T V, raw T h, int32 k, int64 n", "T w",
                        "T s = T(0);"
                        "for (int r = 0; r < k; ++r) s += h[r] * V[(long long)r * n + i];"
                        "w -= s;",
                        "adaptmg_krylov_block_sub"),
    }


_MDOT_THREADS = 256          # block size of both mdot kernels (a power of two)

_MDOT_SOURCE = r"""
INCLUDE
typedef CTYPE T;
#define CONJ(x) CONJEXPR

// part[r * gridDim.x + b] = sum over the grid-stride slice of block b of conj(V[r, i]) w[i]
extern "C" __global__ void adaptmg_krylov_mdot_part_SFX(
        const T* V, const T* w, T* part, const long long n, const int k)
{
    __shared__ __align__(16) char raw[THREADS * sizeof(T)];
    T* sdata = reinterpret_cast<T*>(raw);
    const unsigned int tid = threadIdx.x;
    const long long stride = (long long)gridDim.x * THREADS;
    for (int r = 0; r < k; ++r) {
        const T* v = V + (long long)r * n;
        T s = T(0);
        for (long long i = (long long)blockIdx.x * THREADS + tid; i < n; i += stride)
            s += CONJ(v[i]) * w[i];
        sdata[tid] = s;
        __syncthreads();
        for (unsigned int o = THREADS / 2; o > 0; o >>= 1) {
            if (tid < o) sdata[tid] = sdata[tid] + sdata[tid + o];
            __syncthreads();
        }
        if (tid == 0) part[(long long)r * gridDim.x + blockIdx.x] = sdata[0];
        __syncthreads();
    }
}

// out[r] = sum_b part[r * nb + b]  (one block per r);  acc[r] += out[r] if accumulate
extern "C" __global__ void adaptmg_krylov_mdot_fin_SFX(
        const T* part, T* out, T* acc, const int nb, const int accumulate)
{
    __shared__ __align__(16) char raw[THREADS * sizeof(T)];
    T* sdata = reinterpret_cast<T*>(raw);
    const unsigned int tid = threadIdx.x;
    const int r = blockIdx.x;
    T s = T(0);
    for (int b = tid; b < nb; b += THREADS) s += part[(long long)r * nb + b];
    sdata[tid] = s;
    __syncthreads();
    for (unsigned int o = THREADS / 2; o > 0; o >>= 1) {
        if (tid < o) sdata[tid] = sdata[tid] + sdata[tid + o];
        __syncthreads();
    }
    if (tid == 0) {
        const T t = sdata[0];
        out[r] = t;
        if (accumulate) acc[r] = acc[r] + t;
    }
}
"""

_CTYPES = {"float32": ("float", "f32"), "float64": ("double", "f64"),
           "complex64": ("complex<float>", "c64"), "complex128": ("complex<double>", "c128")}


@functools.lru_cache(maxsize=None)
def _cupy_mdot_kernels(xp, dtype_name):
    """Memoised RawKernels ``adaptmg_krylov_mdot_{part,fin}_<type>`` for one dtype."""
    ctype, sfx = _CTYPES[dtype_name]
    cplx = dtype_name.startswith("complex")
    src = (_MDOT_SOURCE.replace("INCLUDE", "#include <cupy/complex.cuh>" if cplx else "")
           .replace("CTYPE", ctype).replace("CONJEXPR", "conj(x)" if cplx else "(x)")
           .replace("SFX", sfx).replace("THREADS", str(_MDOT_THREADS)))
    return (xp.RawKernel(src, f"adaptmg_krylov_mdot_part_{sfx}"),
            xp.RawKernel(src, f"adaptmg_krylov_mdot_fin_{sfx}"))


class VectorOps:
    """In-place vector updates with scalars that may stay on the device.

    On the CPU, scalars are NumPy scalars and the updates use ``out=`` into one
    preallocated work vector; on the GPU each update is one fused kernel and
    scalars are 0-d device arrays, so the loop never waits for the device except
    in :meth:`host`.
    """

    def __init__(self, backend: Backend, n: int, dtype, rows: int = 0):
        """``rows``: the most rows ``V`` may have in :meth:`mdot` (0: no mdot)."""
        self.xp = backend.xp
        self.gpu = backend.is_gpu
        self.n = int(n)
        dtype = np.dtype(dtype)
        self.complex = dtype.kind == "c"
        if self.gpu:
            self._k = _cupy_kernels(self.xp)
            if rows > 0:
                if dtype.name not in _CTYPES:
                    raise TypeError(f"the GPU Arnoldi kernels support float32/64 and "
                                    f"complex64/128, got dtype {dtype}")
                self._mdot = _cupy_mdot_kernels(self.xp, dtype.name)
                # blocks of the partial-sum kernel: ~2 entries per thread, at most 1024
                self._nb = int(min(max(1, -(-self.n // (2 * _MDOT_THREADS))), 1024))
                self._part = self.xp.empty(rows * self._nb, dtype=dtype)
                self._n64 = np.int64(self.n)
        else:
            self._tmp = np.empty(n, dtype=dtype)

    def dot(self, a, b):
        """conj(a) . b, a device scalar on the GPU."""
        return self.xp.vdot(a, b)

    def host(self, *scalars):
        """Bring device scalars to the host with one transfer; returns Python numbers."""
        if self.gpu:
            arrays = [self.xp.asarray(s) for s in scalars]
            vals = to_host(self.xp.stack(arrays))      # common dtype: maybe complex
            return tuple(v.item() if a.dtype.kind == "c" else v.real.item()
                         for a, v in zip(arrays, vals))
        return tuple(np.asarray(s).item() for s in scalars)

    def fetch(self, src, dst):
        """Copy the device vector ``src`` into the host array ``dst`` (same shape): one transfer."""
        if self.gpu:
            src.get(out=dst)
        else:
            dst[...] = src
        return dst

    def mdot(self, V, w, out, acc=None):
        r"""``out[r] = conj(V[r]) . w`` for the rows of the C-contiguous block ``V`` (k, n).

        ``out`` (length k) is written in place (a slice of a preallocated array);
        with ``acc`` (length k) also ``acc += out``.  GPU: two launches for any k
        (per-block partial sums over a fixed grid, then one block per row: the
        summation order is fixed, so the result is deterministic), no allocation,
        no synchronisation.  ``mdot(w[None], w, out)`` gives ``||w||^2``.
        """
        k = V.shape[0]
        if self.gpu:
            part, fin = self._mdot
            nb = self._nb
            buf = self._part[:k * nb]
            part((nb,), (_MDOT_THREADS,), (V, w, buf, self._n64, np.int32(k)))
            fin((k,), (_MDOT_THREADS,),
                (buf, out, out if acc is None else acc, np.int32(nb),
                 np.int32(0 if acc is None else 1)))
        else:
            if self.complex:                       # conj(V) w = conj(V conj(w))
                np.conjugate(w, out=self._tmp)
                np.dot(V, self._tmp, out=out)
                np.conjugate(out, out=out)
            else:
                np.dot(V, w, out=out)
            if acc is not None:
                acc += out

    def block_sub(self, w, V, h):
        """``w -= V[:k]^T h`` with ``k = len(h)``; ``V`` the C-contiguous basis (rows, n).

        GPU: one fused launch (each thread sums its ``k`` terms, then subtracts).
        """
        k = h.shape[0]
        if self.gpu:
            self._k["block_sub"](V.reshape(-1), h, np.int32(k), self._n64, w)
        else:
            np.dot(h, V[:k], out=self._tmp)
            np.subtract(w, self._tmp, out=w)

    def sub_scaled(self, w, h, v):
        """``w -= h * v``; ``h`` a 0-d/1-element array (device) or a scalar (host)."""
        if self.gpu:
            self._k["sub_scaled"](self.xp.asarray(h, dtype=w.dtype).reshape(1), v, w)
        else:
            np.multiply(v, h, out=self._tmp)
            np.subtract(w, self._tmp, out=w)

    def cg_update_xr(self, x, r, p, q, rz, pq):
        """alpha = rz/pq (0 if pq == 0); ``x += alpha p``; ``r -= alpha q``."""
        if self.gpu:
            self._k["cg_xr"](p, q, rz.reshape(1), pq.reshape(1), x, r)
        else:
            alpha = rz / pq if pq != 0 else 0.0
            np.multiply(p, alpha, out=self._tmp)
            x += self._tmp
            np.multiply(q, alpha, out=self._tmp)
            r -= self._tmp

    def cg_update_p(self, p, z, rz_new, rz_old):
        """beta = rz_new/rz_old (0 if rz_old == 0); ``p <- z + beta p``."""
        if self.gpu:
            self._k["cg_p"](z, rz_new.reshape(1), rz_old.reshape(1), p)
        else:
            beta = rz_new / rz_old if rz_old != 0 else 0.0
            p *= beta
            p += z
