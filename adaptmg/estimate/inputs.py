r"""User data as the estimators read it: solution vectors and coefficients.

A solution is a full nodal vector of shape ``(space.num_dofs,)`` (NumPy or CuPy),
reshaped to ``(num_nodes, components)``.  A coefficient such as f, k, b or c is a
constant, a per-cell array ``(num_cells,) + tail`` or a callable ``v(x)`` of points
``x`` of shape ``(n, m, d)``; :func:`coefficient_at` evaluates it at the quadrature
points of ``n`` cells, and :func:`coefficient_gradient` approximates the gradient of a
callable coefficient by central differences,
:math:`\partial_a k(x) \approx (k(x + h e_a) - k(x - h e_a)) / 2h`.
Cells are processed in chunks of :data:`CHUNK` to bound the memory of the point arrays.

The evaluation helpers take the array module ``xp`` (``numpy``, the default, or ``cupy``).
On the device a callable gets CuPy point arrays; one that raises :class:`TypeError` on
them (a NumPy-only function, e.g. one that calls ``np.asarray`` or writes into a NumPy
array) is evaluated on the host instead and its result copied back
(:func:`adaptmg.backend.call_points`).
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..backend import call_points
from ..fe.space import Space

CHUNK = 20000


def to_host(a):
    """A NumPy array of ``a`` (copied from the GPU for a CuPy array); None stays None."""
    return None if a is None else np.asarray(backend.to_host(a))


def check_space(space, name="space"):
    if not isinstance(space, Space):
        raise TypeError(f"{name} must be an adaptmg Space, got {type(space).__name__}")


def nodal_values(space, u, name="u", backend=None):
    """Full nodal vector (num_dofs,) -> (num_nodes, c) array: a NumPy array, or with a GPU
    ``backend`` (an :class:`adaptmg.backend.Backend`) an array on that device (no copy
    when ``u`` is already there)."""
    if backend is not None and backend.is_gpu:
        if u is not None:
            u = backend.asarray(u)
        xp = backend.xp
    else:
        u = to_host(u)
        xp = np
    if u is None or u.ndim != 1 or u.shape[0] != space.num_dofs:
        raise ValueError(f"{name} must be a full nodal vector of shape ({space.num_dofs},) "
                         f"(e.g. Constraints.expand(x)), got {None if u is None else u.shape}")
    if not bool(xp.isfinite(u).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return xp.asarray(u, dtype=float).reshape(space.num_nodes, space.components)


def check_coefficient(name, v, num_cells, tail=()):
    """Reject a coefficient that is not None, a callable, or a finite array of shape
    ``tail`` or ``(num_cells,) + tail``."""
    if v is None or callable(v):
        return
    a = to_host(v)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a number, array or callable, got {type(v).__name__}")
    if a.shape != tuple(tail) and a.shape != (num_cells,) + tuple(tail):
        raise ValueError(f"{name} must have shape {tuple(tail) or '()'} or ({num_cells},){tuple(tail) if tail else ''}, "
                         f"got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or Inf")


def coefficient_at(name, v, cells, x, tail=(), xp=np):
    """Evaluate a coefficient (constant, per-cell array, callable v(x)) at points x (n, m, d);
    ``xp`` the array module of ``x`` and ``cells`` (a per-cell array ``v`` must be on the
    same device, a callable: :func:`adaptmg.backend.call_points`)."""
    n, m = x.shape[:2]
    want = (n, m) + tuple(tail)
    if v is None:
        return xp.zeros(want)
    if callable(v):
        val = call_points(v, x, xp=xp)
        if val.shape != want:
            try:
                val = xp.broadcast_to(val, want)
            except ValueError:
                raise ValueError(f"{name}(x) must return shape {want} for x of shape {x.shape}, "
                                 f"got {val.shape}") from None
        return val
    a = xp.asarray(v, dtype=float)
    if a.shape == tuple(tail):
        return xp.broadcast_to(a, want)
    if a.ndim >= 1 and a.shape[1:] == tuple(tail):
        return xp.broadcast_to(a[cells][:, None], want)
    raise ValueError(f"{name} must be a constant of shape {tuple(tail) or '()'}, a per-cell array "
                     f"(num_cells,){' + ' + str(tuple(tail)) if tail else ''} or a callable; got shape {a.shape}")


def coefficient_gradient(k, x, h, xp=np):
    """Gradient of a callable coefficient k at points x (n, m, d) by central differences
    with step ``h`` (n,) per cell (``xp`` the array module of x and h, see :func:`adaptmg.backend.call_points`)."""
    d = x.shape[-1]
    g = xp.empty(x.shape)
    for a in range(d):                    # loop over the d directions only
        e = np.zeros(d)
        e[a] = 1.0
        step = h[:, None, None] * (e if xp is np else xp.asarray(e))
        g[..., a] = (call_points(k, x + step, xp=xp) - call_points(k, x - step, xp=xp)) / (2 * h[:, None])
    return g


def chunks(n, size=CHUNK):
    """Slices covering range(n) in pieces of at most ``size``."""
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))
