"""Fused vector updates of the Krylov solvers, with a NumPy twin.

Each update is written once with a NumPy version (``out=`` arguments into one
preallocated work vector) and a CuPy ``ElementwiseKernel`` (one launch).
Scalars that were computed on the device (inner products) stay there: the
kernels read them from device memory, so that no host synchronisation is
needed; scalars already on the host (after the solver's one transfer per
iteration) are passed as kernel arguments.  The block products of the Arnoldi
process are ``h = conj(V_k) w`` (:meth:`VectorOps.mdot`, two launches for any
``k``, written into a slice of a preallocated device column) and
``w <- w - V_k^T h`` (:meth:`VectorOps.block_sub`, one launch).

Distributed vectors (hook for :mod:`adaptmg.distributed`).  Every reduction of the
solvers is an inner product of :class:`VectorOps` (:meth:`~VectorOps.dot`,
:meth:`~VectorOps.mdot`) or a 2-norm (:func:`global_norm`); everything else is
element-wise or works on reduced scalars.  Inside ``with global_reductions(allreduce):``
each of them is completed by ``allreduce(partial)``, which sums an array of partial
sums over all ranks (e.g. one MPI ``Allreduce``) and returns an array of the same kind
and shape.  A device ``allreduce`` that returns a device array without synchronising
(NCCL, :func:`adaptmg.distributed.comm.allreduce_sum`) keeps the inner products on the
device: the solvers' only host copies are then those of :meth:`VectorOps.host` and of
the norms (:func:`global_norm`), all through :func:`adaptmg.backend.to_host`.  Vectors then hold each rank's owned entries and the solvers run unchanged
on them (give ``maxiter`` explicitly: its default depends on the local length).  The
hook is a context variable: scoped to the block and to the calling thread.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import numpy as np

from ..backend import Backend, to_host

__all__ = ["VectorOps", "global_reductions", "global_norm"]

_ALLREDUCE = contextvars.ContextVar("adaptmg_linalg_allreduce", default=None)


@contextlib.contextmanager
def global_reductions(allreduce):
    """Within the block, complete every Krylov reduction with ``allreduce(partial) -> sum``
    (see the module docstring); outside it reductions are local (the default)."""
    if not callable(allreduce):
        raise TypeError(f"allreduce must be a callable array -> array, got {type(allreduce).__name__}")
    token = _ALLREDUCE.set(allreduce)
    try:
        yield
    finally:
        _ALLREDUCE.reset(token)


def global_norm(xp, v) -> float:
    """``||v||_2`` as a host float, over all ranks inside :func:`global_reductions`."""
    f = _ALLREDUCE.get()
    if f is None:
        return float(to_host(xp.linalg.norm(v)))
    ss = f(xp.asarray(xp.vdot(v, v).real).reshape(1))
    return math.sqrt(max(float(to_host(ss)[0]), 0.0))      # the one (counted) host copy


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
        # w <- w - (a/b) v, a and b device scalars (0 if b == 0): BiCGSTAB's alpha and omega
        "sub_ratio": ek("raw T a, raw T b, T v", "T w",
                        "w -= ((b[0] != T(0)) ? a[0] / b[0] : T(0)) * v;",
                        "adaptmg_krylov_sub_ratio"),
        # w <- w - (a / den) v, a a device scalar, den a host scalar: MINRES' alpha / beta
        "sub_over": ek("raw T a, T den, T v", "T w", "w -= (a[0] / den) * v",
                       "adaptmg_krylov_sub_over"),
        # the updates below take host scalars (known after the iteration's one transfer)
        "axpy2": ek("T a, T p, T c, T s", "T x", "x += a * p + c * s",
                    "adaptmg_krylov_axpy2"),
        "bicg_p": ek("T beta, T omega, T r, T v", "T p", "p = r + beta * (p - omega * v)",
                     "adaptmg_krylov_bicg_p"),
        "lanczos_y": ek("T sigma, T c, T v, T r1", "T y", "y = y - sigma * v - c * r1",
                        "adaptmg_krylov_lanczos_y"),
        "minres_wx": ek("T oldeps, T delta, T denom, T phi, T v, T w2", "T w1, T x",
                        "w1 = (v - oldeps * w1 - delta * w2) * denom; x += phi * w1;",
                        "adaptmg_krylov_minres_wx"),
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
        self.dtype = dtype
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
        """conj(a) . b, a device scalar on the GPU (summed over ranks in :func:`global_reductions`)."""
        d = self.xp.vdot(a, b)
        f = _ALLREDUCE.get()
        return d if f is None else f(self.xp.asarray(d).reshape(1))[0]

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
        f = _ALLREDUCE.get()
        if f is None:
            return self._mdot_local(V, w, out, acc)
        self._mdot_local(V, w, out, None)         # partial sums, reduced, then accumulated
        out[...] = f(out)
        if acc is not None:
            acc += out

    def _mdot_local(self, V, w, out, acc):
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

    # ---- BiCGSTAB and MINRES (host scalars are cast to the working dtype, so that
    # ---- the NumPy and the CuPy versions compute with the same precision)
    def _scalar(self, a):
        return self.dtype.type(a)

    def sub_ratio(self, w, a, b, v):
        """``w -= (a / b) v`` (nothing if ``b == 0``); a, b device scalars on the GPU."""
        if self.gpu:
            self._k["sub_ratio"](a.reshape(1), b.reshape(1), v, w)
        else:
            c = a / b if b != 0 else 0.0
            np.multiply(v, self._scalar(c), out=self._tmp)
            np.subtract(w, self._tmp, out=w)

    def sub_over(self, w, a, den, v):
        """``w -= (a / den) v``; ``a`` a device scalar on the GPU, ``den`` a nonzero host scalar."""
        if self.gpu:
            self._k["sub_over"](a.reshape(1), self._scalar(den), v, w)
        else:
            np.multiply(v, self._scalar(a / den), out=self._tmp)
            np.subtract(w, self._tmp, out=w)

    def axpy2(self, x, a, p, c, s):
        """``x += a p + c s`` with host scalars a, c."""
        a, c = self._scalar(a), self._scalar(c)
        if self.gpu:
            self._k["axpy2"](a, p, c, s, x)
        else:
            np.multiply(p, a, out=self._tmp)
            x += self._tmp
            np.multiply(s, c, out=self._tmp)
            x += self._tmp

    def bicgstab_p(self, p, r, v, beta, omega):
        """``p <- r + beta (p - omega v)`` with host scalars."""
        beta, omega = self._scalar(beta), self._scalar(omega)
        if self.gpu:
            self._k["bicg_p"](beta, omega, r, v, p)
        else:
            np.multiply(v, omega, out=self._tmp)
            p -= self._tmp
            p *= beta
            p += r

    def lanczos_y(self, y, v, r1, sigma, c):
        """``y <- y - sigma v - c r1`` with host scalars (MINRES' three-term recurrence)."""
        sigma, c = self._scalar(sigma), self._scalar(c)
        if self.gpu:
            self._k["lanczos_y"](sigma, c, v, r1, y)
        else:
            if sigma != 0:
                np.multiply(v, sigma, out=self._tmp)
                y -= self._tmp
            if c != 0:
                np.multiply(r1, c, out=self._tmp)
                y -= self._tmp

    def minres_wx(self, w1, x, v, w2, oldeps, delta, denom, phi):
        """``w1 <- (v - oldeps w1 - delta w2) denom``, then ``x += phi w1`` (host scalars)."""
        oldeps, delta = self._scalar(oldeps), self._scalar(delta)
        denom, phi = self._scalar(denom), self._scalar(phi)
        if self.gpu:
            self._k["minres_wx"](oldeps, delta, denom, phi, v, w2, w1, x)
        else:
            w1 *= -oldeps
            np.multiply(w2, delta, out=self._tmp)
            w1 -= self._tmp
            w1 += v
            w1 *= denom
            np.multiply(w1, phi, out=self._tmp)
            x += self._tmp
