"""Fused element-wise kernels of the solver, each with a NumPy *twin*.

Every GPU kernel is a memoised CuPy ``ElementwiseKernel`` named ``adaptmg_<name>``;
its NumPy twin has the same semantics and serves the CPU and the tests as the
reference.  The per-operation functions dispatch on the type of their first
array argument (NumPy -> twin, CuPy -> kernel), so the solver code is written once.

Why fused kernels?  A multigrid cycle on the GPU is dominated by launch
overhead and by temporaries when written with plain array expressions: the
Jacobi update ``x += omega * dinv * (b - Ax)`` is four launches and three
temporary vectors in CuPy, one launch and no temporary here.

Operations (all update their *output* argument in place; nothing is allocated)

=========================  ==================================================
``axpby(a, x, b, y)``      ``y <- a x + b y``
``jacobi_update``          ``x <- x + omega * dinv * r``
``jacobi_residual_update`` ``x <- x + omega * dinv * (b - Ax)``
``jacobi_zero``            ``x <- omega * dinv * b``  (first sweep from x = 0)
``chebyshev_start``        ``d <- c * dinv * (b - Ax);  x <- x + d``
``chebyshev_start_zero``   ``d <- c * dinv * b;  x <- d``
``chebyshev_update``       ``d <- c1 d + c2 dinv (b - Ax);  x <- x + d``
``add_cast``               ``y <- y + x`` with x of another float dtype
``indexed_jacobi_update``  ``x[idx] <- x[idx] + omega * s * (b[idx] - Ax)``
                           (``s``, ``Ax`` of the length of ``idx``; ``idx`` without
                           repeats: the C/F half-sweeps of :mod:`.cf_jacobi`)
=========================  ==================================================

All of them are importable from :mod:`adaptmg.device.kernels` too.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend, in_host_memory

__all__ = [
    "get_kernel", "axpby", "jacobi_update", "jacobi_residual_update",
    "jacobi_zero", "chebyshev_start", "chebyshev_start_zero",
    "chebyshev_update", "add_cast", "indexed_jacobi_update", "KERNEL_NAMES",
]


# --------------------------------------------------------------------------
# CuPy kernel factories (memoised; built on first use)
# --------------------------------------------------------------------------
_KERNEL_SPECS = {
    # name: (in_params, out_params, operation)
    "axpby": ("T a, T x, T b", "T y", "y = a * x + b * y"),
    "jacobi_update": ("T dinv, T r, T omega", "T x", "x += omega * dinv * r"),
    "jacobi_residual_update": ("T dinv, T b, T Ax, T omega", "T x",
                               "x += omega * dinv * (b - Ax)"),
    "jacobi_zero": ("T dinv, T b, T omega", "T x", "x = omega * dinv * b"),
    "chebyshev_start": ("T dinv, T b, T Ax, T c", "T x, T d",
                        "T t = c * dinv * (b - Ax); d = t; x += t"),
    "chebyshev_start_zero": ("T dinv, T b, T c", "T x, T d",
                             "T t = c * dinv * b; d = t; x = t"),
    "chebyshev_update": ("T dinv, T b, T Ax, T c1, T c2", "T x, T d",
                         "T t = c1 * d + c2 * dinv * (b - Ax); d = t; x += t"),
    "add_cast": ("S x", "T y", "y += (T)x"),
    # one thread per listed row; x and b indexed by the row (raw), s and Ax by the thread
    "indexed_jacobi_update": ("I row, T s, raw T b, T Ax, T omega", "raw T x",
                              "x[row] += omega * s * (b[row] - Ax)"),
    # spectral stiffness at the quadrature points: flux = G grad (G symmetric, 6 / 3 entries)
    "geo_flux3": ("T g0, T g1, T g2, T G00, T G11, T G22, T G01, T G02, T G12", "T f0, T f1, T f2",
                  "f0 = G00 * g0 + G01 * g1 + G02 * g2; f1 = G01 * g0 + G11 * g1 + G12 * g2; "
                  "f2 = G02 * g0 + G12 * g1 + G22 * g2"),
    "geo_flux2": ("T g0, T g1, T G00, T G11, T G01", "T f0, T f1",
                  "f0 = G00 * g0 + G01 * g1; f1 = G01 * g0 + G11 * g1"),
}

KERNEL_NAMES = tuple(_KERNEL_SPECS)


@functools.lru_cache(maxsize=None)
def _cupy_kernel(name: str):
    """Build (once) the CuPy ``ElementwiseKernel`` called ``adaptmg_<name>``."""
    xp = get_backend("gpu").xp
    in_params, out_params, op = _KERNEL_SPECS[name]
    return xp.ElementwiseKernel(in_params, out_params, op, f"adaptmg_{name}")


# --------------------------------------------------------------------------
# NumPy twins (same semantics; in place; reference implementation)
# --------------------------------------------------------------------------
def _np_axpby(a, x, b, y):
    if b == 0:
        np.multiply(x, a, out=y)
    else:
        if b != 1:
            y *= b
        y += a * x if a != 1 else x
    return y


def _np_jacobi_update(dinv, r, omega, x):
    x += omega * (dinv * r)
    return x


def _np_jacobi_residual_update(dinv, b, Ax, omega, x):
    x += omega * (dinv * (b - Ax))
    return x


def _np_jacobi_zero(dinv, b, omega, x):
    np.multiply(dinv, b, out=x)
    x *= omega
    return x


def _np_chebyshev_start(dinv, b, Ax, c, x, d):
    np.subtract(b, Ax, out=d)
    d *= dinv
    d *= c
    x += d
    return x, d


def _np_chebyshev_start_zero(dinv, b, c, x, d):
    np.multiply(dinv, b, out=d)
    d *= c
    x[...] = d
    return x, d


def _np_chebyshev_update(dinv, b, Ax, c1, c2, x, d):
    t = dinv * (b - Ax)
    t *= c2
    d *= c1
    d += t
    x += d
    return x, d


def _np_add_cast(x, y):
    y += x.astype(y.dtype, copy=False)
    return y


def _np_indexed_jacobi_update(idx, s, b, Ax, omega, x):
    x[idx] += omega * (s * (b[idx] - Ax))
    return x


def _np_geo_flux3(g0, g1, g2, G00, G11, G22, G01, G02, G12, f0, f1, f2):
    for f, (a, b, c) in ((f0, (G00, G01, G02)), (f1, (G01, G11, G12)), (f2, (G02, G12, G22))):
        np.multiply(a, g0, out=f)
        f += b * g1
        f += c * g2
    return f0, f1, f2


def _np_geo_flux2(g0, g1, G00, G11, G01, f0, f1):
    np.multiply(G00, g0, out=f0)
    f0 += G01 * g1
    np.multiply(G01, g0, out=f1)
    f1 += G11 * g1
    return f0, f1


_NUMPY_TWINS = {
    "axpby": lambda a, x, b, y: _np_axpby(a, x, b, y),
    "jacobi_update": _np_jacobi_update,
    "jacobi_residual_update": _np_jacobi_residual_update,
    "jacobi_zero": _np_jacobi_zero,
    "chebyshev_start": _np_chebyshev_start,
    "chebyshev_start_zero": _np_chebyshev_start_zero,
    "chebyshev_update": _np_chebyshev_update,
    "add_cast": _np_add_cast,
    "indexed_jacobi_update": _np_indexed_jacobi_update,
    "geo_flux3": _np_geo_flux3,
    "geo_flux2": _np_geo_flux2,
}


def get_kernel(name: str, backend="cpu"):
    """The callable for kernel ``name`` on ``backend`` ("cpu" twin or "gpu" kernel).

    Both take the arguments in the kernel's parameter order (inputs, then
    outputs), e.g. ``get_kernel("jacobi_update", be)(dinv, r, omega, x)``.
    The GPU callable is a ``cupy.ElementwiseKernel`` named ``adaptmg_<name>``.
    """
    if name not in _KERNEL_SPECS:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_NAMES)}")
    be = get_backend(backend)
    if be.is_gpu:
        return _cupy_kernel(name)
    return _NUMPY_TWINS[name]


def _scalar(v, like):
    """Host scalar of the array's dtype (CuPy ElementwiseKernel needs matching T)."""
    return like.dtype.type(v)


# --------------------------------------------------------------------------
# Per-operation functions (dispatch on the array type)
# --------------------------------------------------------------------------
def axpby(a, x, b, y):
    """``y <- a x + b y`` in place (a, b host scalars); ``y`` is not read when ``b == 0``
    (NaN or garbage there does not propagate), on both backends."""
    if in_host_memory(y):
        return _np_axpby(a, x, b, y)
    if b == 0:
        return get_backend("gpu").xp.multiply(x, _scalar(a, y), out=y)
    return _cupy_kernel("axpby")(_scalar(a, y), x, _scalar(b, y), y)


def jacobi_update(x, dinv, r, omega):
    """``x <- x + omega * dinv * r`` (damped point-Jacobi correction), in place."""
    if in_host_memory(x):
        return _np_jacobi_update(dinv, r, omega, x)
    return _cupy_kernel("jacobi_update")(dinv, r, _scalar(omega, x), x)


def jacobi_residual_update(x, dinv, b, Ax, omega):
    """``x <- x + omega * dinv * (b - Ax)`` with ``Ax`` precomputed, in place."""
    if in_host_memory(x):
        return _np_jacobi_residual_update(dinv, b, Ax, omega, x)
    return _cupy_kernel("jacobi_residual_update")(dinv, b, Ax, _scalar(omega, x), x)


def jacobi_zero(x, dinv, b, omega):
    """``x <- omega * dinv * b``: one Jacobi sweep from a zero initial guess."""
    if in_host_memory(x):
        return _np_jacobi_zero(dinv, b, omega, x)
    return _cupy_kernel("jacobi_zero")(dinv, b, _scalar(omega, x), x)


def chebyshev_start(x, d, dinv, b, Ax, c):
    """``d <- c dinv (b - Ax); x <- x + d`` (first Chebyshev step)."""
    if in_host_memory(x):
        return _np_chebyshev_start(dinv, b, Ax, c, x, d)
    return _cupy_kernel("chebyshev_start")(dinv, b, Ax, _scalar(c, x), x, d)


def chebyshev_start_zero(x, d, dinv, b, c):
    """``d <- c dinv b; x <- d`` (first Chebyshev step from x = 0)."""
    if in_host_memory(x):
        return _np_chebyshev_start_zero(dinv, b, c, x, d)
    return _cupy_kernel("chebyshev_start_zero")(dinv, b, _scalar(c, x), x, d)


def chebyshev_update(x, d, dinv, b, Ax, c1, c2):
    """``d <- c1 d + c2 dinv (b - Ax); x <- x + d`` (three-term Chebyshev step)."""
    if in_host_memory(x):
        return _np_chebyshev_update(dinv, b, Ax, c1, c2, x, d)
    return _cupy_kernel("chebyshev_update")(dinv, b, Ax, _scalar(c1, x),
                                            _scalar(c2, x), x, d)


def add_cast(y, x):
    """``y <- y + x`` where ``x`` may have another float dtype (mixed precision)."""
    if in_host_memory(y):
        return _np_add_cast(x, y)
    return _cupy_kernel("add_cast")(x, y)


def indexed_jacobi_update(x, idx, s, b, Ax, omega):
    """``x[idx] <- x[idx] + omega * s * (b[idx] - Ax)`` in place: a damped Jacobi update of
    the rows ``idx`` only (``Ax`` = those rows of ``A x``, ``s`` their ``D^{-1}``); ``idx``
    must not repeat a row."""
    if in_host_memory(x):
        return _np_indexed_jacobi_update(idx, s, b, Ax, omega, x)
    return _cupy_kernel("indexed_jacobi_update")(idx, s, b, Ax, _scalar(omega, x), x)
