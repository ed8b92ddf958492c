r"""Element-wise kernels of the Navier-Stokes pressure-correction scheme, with NumPy twins.

Every GPU kernel comes from a memoised factory (keyed by the CuPy module of the
arrays) and is named ``adaptmg_ns_*``; each has a NumPy twin with the same
semantics, used on the CPU and as the reference in the tests.  The functions
dispatch on the array type of their output argument and write into preallocated
arrays (nothing is allocated per call on the GPU).  Velocities are stored
component-major, ``U`` of shape ``(d, n)`` with ``U[c, i]`` the component c at
velocity node i (the layout of :class:`adaptmg.device.multicsr.MultiCSR`).

``products(U, W)`` -- eq. (14) of seed 001, the node-wise products of the
interpolated nonlinearity :math:`\mathcal I_h(u\otimes u)`:

.. math:: W[c, k, i] = u_{i,k}\, u_{i,c}, \qquad c, k < d,\ i < n .

(The paper stores the 6 distinct products of the symmetric tensor; we store
all :math:`d^2` so that :meth:`MultiCSR.conv <adaptmg.device.multicsr.MultiCSR.conv>`
can run one uniform loop.)

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
"""
from __future__ import annotations

import functools

import numpy as np

from adaptmg.backend import backend_of

__all__ = ["products", "axpy_field", "pressure_rhs", "shift", "shift_copy", "pressure_update",
           "KERNEL_NAMES"]

_SPECS = {
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

KERNEL_NAMES = tuple(f"adaptmg_ns_{k}" for k in _SPECS)


@functools.lru_cache(maxsize=None)
def _kernel(cp, name):
    """Build (once per CuPy module) the ``ElementwiseKernel`` called ``adaptmg_ns_<name>``."""
    inp, out, op = _SPECS[name]
    return cp.ElementwiseKernel(inp, out, op, f"adaptmg_ns_{name}")


def _is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


def products(U, W):
    r"""``W[c, k, i] = U[k, i] * U[c, i]`` (eq. 14), one element-wise launch.

    ``U``: (d, n) velocity (component-major); ``W``: (d, d, n) output (same dtype, C-contiguous).
    """
    d, n = U.shape
    if tuple(W.shape) != (d, d, n):
        raise ValueError(f"W must have shape {(d, d, n)}, got {tuple(W.shape)}")
    if W.dtype != U.dtype:
        raise TypeError(f"W must have dtype {U.dtype}, got {W.dtype}")
    if not W.flags.c_contiguous:
        raise ValueError("W must be C-contiguous")
    if _is_numpy(U):
        np.multiply(U[:, None, :], U[None, :, :], out=W)
        return W
    return _kernel(backend_of(U).xp, "products")(U, np.int32(n), np.int32(d), W)


def axpy_field(U, S, F):
    """``U += S * F`` element-wise (explicit lumped-mass update)."""
    if _is_numpy(U):
        U += S * F
        return U
    return _kernel(backend_of(U).xp, "axpy_field")(S, F, U)


def pressure_rhs(Du, total, inv_dt, inv_n, b):
    """``b = (Du - total[0] * inv_n) * inv_dt`` (``total``: 1-element array with sum(Du)).

    With ``inv_n = 1/len(Du)`` this is ``Du / dt`` projected onto zero sum.
    """
    if _is_numpy(b):
        np.subtract(Du, float(total[0]) * inv_n, out=b)
        b *= inv_dt
        return b
    t = b.dtype.type
    return _kernel(backend_of(b).xp, "pressure_rhs")(Du, total, t(inv_dt), t(inv_n), b)


def shift(x, s, scale):
    """``x -= s[0] * scale`` (``s``: 1-element array, e.g. a device dot product)."""
    if _is_numpy(x):
        x -= float(s[0]) * scale
        return x
    return _kernel(backend_of(x).xp, "shift")(s, x.dtype.type(scale), x)


def shift_copy(v, s, scale, x):
    """``x = v - s[0] * scale`` (copy and shift in one launch)."""
    if _is_numpy(x):
        np.subtract(v, float(s[0]) * scale, out=x)
        return x
    return _kernel(backend_of(x).xp, "shift_copy")(v, s, x.dtype.type(scale), x)


def pressure_update(Q, Du, minv, nu, P, PQ):
    """``P <- P + Q + nu * minv * Du``; ``PQ <- P + Q`` (new P), one launch."""
    if _is_numpy(P):
        P += Q
        P += nu * (minv * Du)
        np.add(P, Q, out=PQ)
        return P, PQ
    return _kernel(backend_of(P).xp, "pressure_update")(Q, Du, minv, P.dtype.type(nu), P, PQ)
