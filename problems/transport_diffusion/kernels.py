r"""Exact solution, source and the fused right-hand-side kernel of the transport-diffusion problem.

Exact solution (seed 001 §5.1) :math:`\theta(t,x,y) = \exp(-(m_x^2 + m_y^2)/4)` with
:math:`m_z = c(t) - z`, :math:`c(t) = 1/2 + \cos(\pi t/2)/4`, for
:math:`\partial_t\theta - \lambda\Delta\theta + b\cdot\nabla\theta = f`,
:math:`b = (0, -1)`.  With :math:`\dot c = -(\pi/8)\sin(\pi t/2)`,
:math:`\partial_x\theta = \theta m_x/2`, :math:`\Delta\theta = \theta((m_x^2+m_y^2)/4 - 1)`:

.. math::

    f = \theta\,\Big[-\tfrac{\dot c}{2}(m_x + m_y)
        - \lambda\big(\tfrac{m_x^2+m_y^2}{4} - 1\big) + b_x\tfrac{m_x}{2} + b_y\tfrac{m_y}{2}\Big].

:func:`td_exact` and :func:`td_source` evaluate these on points (NumPy or CuPy arrays).
:func:`td_step_data` evaluates, for all nodes at once and in one launch,
``w = u_old + dt * f(t, x)`` (the vector the mass matrix multiplies in the
backward-Euler right-hand side) and ``g = mask * theta(t, x)`` (the Dirichlet
lifting, zero off the boundary); :func:`td_step_data_at` does the same with the time
``[t, c'(t)]`` (:func:`td_time`) in an array, which the GPU kernel
``adaptmg_td_step_data_at`` reads from device memory.  The kernel comes from a memoised
factory (keyed by the CuPy module of the arrays); its NumPy twin runs on the CPU and is
the reference in the tests.
"""
from __future__ import annotations

import functools

import numpy as np

from adaptmg.backend import backend_of

__all__ = ["td_exact", "td_source", "td_step_data", "td_step_data_at", "td_time", "KERNEL_NAMES"]

_TD_PREAMBLE = """
    T c = (T)0.5 + (T)0.25 * cos(h * t);           /* h = pi/2 */
    T mx = c - x, my = c - y;
    T q = mx * mx + my * my;
    T th = exp((T)-0.25 * q);
"""

_SPECS = {
    # (t, c'(t)) read from device memory: a CUDA graph replays one launch for every step
    "td_step_data_at": (
        "T x, T y, T uold, T mask, raw T tc, T lam, T bx, T by, T dt", "T w, T g",
        "const T h = (T)1.5707963267948966; const T t = tc[0]; const T cdot = tc[1];"
        + _TD_PREAMBLE + """
        T f = th * ((T)-0.5 * cdot * (mx + my) - lam * ((T)0.25 * q - (T)1)
                    + (T)0.5 * (bx * mx + by * my));
        w = uold + dt * f;
        g = mask * th;
        """),
}

KERNEL_NAMES = tuple(f"adaptmg_{k}" for k in _SPECS)


@functools.lru_cache(maxsize=None)
def _kernel(cp, name: str):
    """Build (once per CuPy module) the ``ElementwiseKernel`` called ``adaptmg_<name>``."""
    inp, outp, op = _SPECS[name]
    return cp.ElementwiseKernel(inp, outp, op, f"adaptmg_{name}")


def _is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


# --------------------------------------------------------------- exact data
def _td_c(t):
    return 0.5 + 0.25 * np.cos(0.5 * np.pi * t), -0.125 * np.pi * np.sin(0.5 * np.pi * t)


def td_exact(t: float, X) -> np.ndarray:
    """theta_ex(t, x) for points X of shape (..., 2) (NumPy or CuPy)."""
    c, _ = _td_c(float(t))
    mx, my = c - X[..., 0], c - X[..., 1]
    xp = np if _is_numpy(X) else backend_of(X).xp
    return xp.exp(-0.25 * (mx * mx + my * my))


def td_source(t: float, X, lam: float, b=(0.0, -1.0)) -> np.ndarray:
    """f(t, x) = d_t theta - lam Laplace theta + b . grad theta for points X (..., 2)."""
    c, cd = _td_c(float(t))
    mx, my = c - X[..., 0], c - X[..., 1]
    q = mx * mx + my * my
    xp = np if _is_numpy(X) else backend_of(X).xp
    th = xp.exp(-0.25 * q)
    return th * (-0.5 * cd * (mx + my) - lam * (0.25 * q - 1.0) + 0.5 * (b[0] * mx + b[1] * my))


# ----------------------------------------------------------------- twin
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


# ---------------------------------------------------------------- public
def td_time(t: float) -> np.ndarray:
    """``[t, c'(t)]``: what :func:`td_step_data_at` reads (float64)."""
    return np.array([float(t), _td_c(float(t))[1]])


def td_step_data(x, y, uold, mask, t, lam, b, dt, w, g):
    """``w <- uold + dt f(t, .)`` and ``g <- mask * theta(t, .)`` at the nodes (x, y), in place
    (:func:`td_step_data_at` with ``td_time(t)`` moved to the arrays' backend)."""
    tc = td_time(t)
    if not _is_numpy(x):
        tc = backend_of(x).xp.asarray(tc, dtype=x.dtype)
    return td_step_data_at(x, y, uold, mask, tc, lam, b, dt, w, g)


def td_step_data_at(x, y, uold, mask, tc, lam, b, dt, w, g):
    """:func:`td_step_data` at the time held by ``tc = td_time(t)`` (a (2,) array on the
    backend of ``x``): the GPU kernel reads it from device memory, so that one recorded
    launch serves every time step."""
    arrs = (x, y, uold, mask, w, g)
    if any(a.shape != x.shape for a in arrs[1:]):
        raise ValueError(f"td_step_data: all arrays must have shape {x.shape}, "
                         f"got {[a.shape for a in arrs]}")
    if tc.shape != (2,):
        raise ValueError(f"td_step_data_at: tc must have shape (2,) ([t, c'(t)]), got {tc.shape}")
    args = (float(lam), float(b[0]), float(b[1]), float(dt))
    if _is_numpy(x):
        _np_td_step_data(x, y, uold, mask, float(tc[0]), float(tc[1]), *args, w, g)
    else:
        dt_ = x.dtype.type
        _kernel(backend_of(x).xp, "td_step_data_at")(x, y, uold, mask, tc, *map(dt_, args), w, g)
    return w, g
