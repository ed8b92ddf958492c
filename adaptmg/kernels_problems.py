r"""Element-wise kernels of the application problems (``problems/``), with NumPy twins.

Same pattern as :mod:`adaptmg.device.kernels`: every GPU kernel comes from a memoised
factory and is named ``adaptmg_*``; each has a NumPy twin with the same
semantics that runs on the CPU and serves as the reference in the tests.  The
public functions dispatch on the array type of their first argument and write
into preallocated outputs.

Transport-diffusion (seed 001 §5.1)
-----------------------------------
Exact solution :math:`\theta(t,x,y) = \exp(-(m_x^2 + m_y^2)/4)` with
:math:`m_z = c(t) - z`, :math:`c(t) = 1/2 + \cos(\pi t/2)/4`, for
:math:`\partial_t\theta - \lambda\Delta\theta + b\cdot\nabla\theta = f`,
:math:`b = (0, -1)`.  With :math:`\dot c = -(\pi/8)\sin(\pi t/2)`,
:math:`\partial_x\theta = \theta m_x/2`, :math:`\Delta\theta = \theta((m_x^2+m_y^2)/4 - 1)`:

.. math::

    f = \theta\,\Big[-\tfrac{\dot c}{2}(m_x + m_y)
        - \lambda\big(\tfrac{m_x^2+m_y^2}{4} - 1\big) + b_x\tfrac{m_x}{2} + b_y\tfrac{m_y}{2}\Big].

``td_step_data`` evaluates, for all nodes at once and in one launch,
``w = u_old + dt * f(t, x)`` (the vector the mass matrix multiplies in the
backward-Euler right-hand side) and ``g = mask * theta(t, x)`` (the Dirichlet
lifting, zero off the boundary).

Constrained right-hand side
---------------------------
``constrain_combine(z, r, s, g, out)``: ``out = z * r + s * g`` -- the last step
of :math:`f = Z H^T(\dots) + s g` (``z`` 0/1 free-DoF mask as floats).
"""
from __future__ import annotations

import functools

import numpy as np

from .backend import get_backend

__all__ = ["td_exact", "td_source", "td_step_data", "constrain_combine", "KERNEL_NAMES"]

_TD_PREAMBLE = """
    T c = (T)0.5 + (T)0.25 * cos(h * t);           /* h = pi/2 */
    T mx = c - x, my = c - y;
    T q = mx * mx + my * my;
    T th = exp((T)-0.25 * q);
"""

_SPECS = {
    "td_step_data": (
        "T x, T y, T uold, T mask, T t, T cdot, T lam, T bx, T by, T dt", "T w, T g",
        "const T h = (T)1.5707963267948966;" + _TD_PREAMBLE + """
        T f = th * ((T)-0.5 * cdot * (mx + my) - lam * ((T)0.25 * q - (T)1)
                    + (T)0.5 * (bx * mx + by * my));
        w = uold + dt * f;
        g = mask * th;
        """),
    "constrain_combine": ("T z, T r, T s, T g", "T out", "out = z * r + s * g"),
}

KERNEL_NAMES = tuple(f"adaptmg_{k}" for k in _SPECS)


@functools.lru_cache(maxsize=None)
def _cupy_kernel(name: str):
    """Build (once) the CuPy ``ElementwiseKernel`` called ``adaptmg_<name>``."""
    xp = get_backend("gpu").xp
    inp, outp, op = _SPECS[name]
    return xp.ElementwiseKernel(inp, outp, op, f"adaptmg_{name}")


def _is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


# --------------------------------------------------------------- exact data
def _td_c(t):
    return 0.5 + 0.25 * np.cos(0.5 * np.pi * t), -0.125 * np.pi * np.sin(0.5 * np.pi * t)


def td_exact(t: float, X) -> np.ndarray:
    """theta_ex(t, x) for points X of shape (..., 2) (NumPy or CuPy)."""
    c, _ = _td_c(float(t))
    mx, my = c - X[..., 0], c - X[..., 1]
    xp = np if _is_numpy(X) else get_backend("gpu").xp
    return xp.exp(-0.25 * (mx * mx + my * my))


def td_source(t: float, X, lam: float, b=(0.0, -1.0)) -> np.ndarray:
    """f(t, x) = d_t theta - lam Laplace theta + b . grad theta for points X (..., 2)."""
    c, cd = _td_c(float(t))
    mx, my = c - X[..., 0], c - X[..., 1]
    q = mx * mx + my * my
    xp = np if _is_numpy(X) else get_backend("gpu").xp
    th = xp.exp(-0.25 * q)
    return th * (-0.5 * cd * (mx + my) - lam * (0.25 * q - 1.0) + 0.5 * (b[0] * mx + b[1] * my))


# ----------------------------------------------------------------- twins
def _np_td_step_data(x, y, uold, mask, t, cdot, lam, bx, by, dt, w, g):
    c = 0.5 + 0.25 * np.cos(0.5 * np.pi * t)
    mx = c - x
    my = c - y
    q = mx * mx + my * my
    th = np.exp(-0.25 * q)
    f = th * (-0.5 * cdot * (mx + my) - lam * (0.25 * q - 1.0) + 0.5 * (bx * mx + by * my))
    np.multiply(f, dt, out=w)
    w += uold
    np.multiply(mask, th, out=g)


def _np_constrain_combine(z, r, s, g, out):
    np.multiply(z, r, out=out)
    out += s * g


# ---------------------------------------------------------------- public
def _check_same(name, *arrs):
    n = arrs[0].shape
    for a in arrs[1:]:
        if a.shape != n:
            raise ValueError(f"{name}: all arrays must have shape {n}, got {[x.shape for x in arrs]}")


def td_step_data(x, y, uold, mask, t, lam, b, dt, w, g):
    """``w <- uold + dt f(t, .)`` and ``g <- mask * theta(t, .)`` at the nodes (x, y), in place."""
    _check_same("td_step_data", x, y, uold, mask, w, g)
    _, cd = _td_c(float(t))
    args = (float(t), float(cd), float(lam), float(b[0]), float(b[1]), float(dt))
    if _is_numpy(x):
        _np_td_step_data(x, y, uold, mask, *args, w, g)
    else:
        dt_ = x.dtype.type
        _cupy_kernel("td_step_data")(x, y, uold, mask, *map(dt_, args), w, g)
    return w, g


def constrain_combine(z, r, s, g, out):
    """``out <- z * r + s * g`` (z: 0/1 free mask as floats, s: Dirichlet row scale)."""
    _check_same("constrain_combine", z, r, g, out)
    if _is_numpy(z):
        _np_constrain_combine(z, r, float(s), g, out)
    else:
        _cupy_kernel("constrain_combine")(z, r, z.dtype.type(s), g, out)
    return out


class SpMVOperator:
    """``A`` as an operator for :mod:`adaptmg.linalg` whose ``matvec`` goes through a cached
    :func:`adaptmg.device.kernels.make_spmv` plan (cuSPARSE descriptors created once, not per call).

    ``matvec(v)`` returns a new array ``A v`` (from the memory pool on the GPU).
    """

    def __init__(self, A):
        from .device.kernels import make_spmv
        self.A = A
        self.shape = tuple(A.shape)
        self.dtype = np.dtype(A.dtype)
        self._plan = make_spmv(A)
        self._xp = np if isinstance(A.data, np.ndarray) else get_backend("gpu").xp

    def matvec(self, v):
        y = self._xp.empty(self.shape[0], self.dtype)
        return self._plan(v, y, 1.0, 0.0)

    def __matmul__(self, v):
        return self.matvec(v)
