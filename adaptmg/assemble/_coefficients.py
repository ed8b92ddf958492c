r"""Coefficients of the forms on a chunk of cells, on the host or on the device.

A coefficient :math:`c` (:math:`\rho`, :math:`\kappa`, :math:`b`, ...) is needed at the
quadrature points :math:`x_{T,q} = x_T(\hat x_q)` of the cells of a chunk (n cells, nq
points; a trailing shape ``tail``, e.g. ``(dim,)`` for a velocity):

* a constant: :math:`c(x_{T,q}) = c`;
* a per-cell array of shape ``(num_cells,) + tail``: :math:`c(x_{T,q}) = c_T`;
* a per-node array of shape ``(num_nodes,) + tail`` (values at the space's DoF nodes, hanging
  nodes included), interpolated in the space: :math:`c(x_{T,q}) = \sum_j c_{n(T,j)}\,
  \hat\phi_j(\hat x_q)` with :math:`n(T,j)` the cell's DoF nodes (an array whose length is
  both is read per cell);
* a callable ``c(x)``, ``x`` of shape (..., dim), returning (...) + tail, evaluated once per
  chunk on all its points.

Where the values live follows the geometry's arrays (the mesh's backend): a host geometry
(a mesh on the CPU) reads host values -- a CuPy array coefficient is copied down once per
form call; a device geometry (a mesh on the GPU) reads device values -- a NumPy array
coefficient is copied up once per form call, a callable gets CuPy point arrays
(:func:`adaptmg.backend.call_points`: a callable that only takes NumPy arrays is called on
host copies, with a copy each way per chunk).  Shapes and finiteness are checked on the
array's own backend (one O(1) read per check).
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, call_points, is_device_array, to_host

__all__ = ["coefficient", "is_zero", "check_finite"]


def check_finite(name, a):
    """ValueError when the (host or device) array ``a`` holds NaN or inf."""
    xp = backend_of(a).xp
    if not bool(xp.isfinite(a).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf); shape {tuple(a.shape)}")


def _as_array(name, coef):
    """``coef`` as a float64 host array, or the CuPy array itself (TypeError for other input)."""
    if isinstance(coef, (str, bytes)) or coef is None:
        raise TypeError(f"{name} must be a number, an array or a callable, got {type(coef).__name__}")
    if is_device_array(coef):
        return coef.astype(np.float64, copy=False)
    try:
        return np.asarray(coef, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, an array or a callable, got {type(coef).__name__}") from exc


def is_zero(coef):
    """True for a non-callable coefficient (host or device) whose values are all zero."""
    if coef is None or callable(coef):
        return False
    a = _as_array("coefficient", coef)
    return not bool(backend_of(a).xp.any(a))


class _Where:
    """An array kept on the host and, on first request, on the device (one copy per form call)."""

    def __init__(self, a):
        self._on = {is_device_array(a): a}

    def like(self, g):
        """The array on the backend of the geometry ``g`` (its ``detJ``)."""
        be = backend_of(g.detJ)
        a = self._on.get(be.is_gpu)
        if a is None:
            src = next(iter(self._on.values()))
            a = be.asarray(src) if be.is_gpu else np.asarray(to_host(src))
            self._on[be.is_gpu] = a
        return a


def coefficient(name, coef, num_cells, dim, tail=(), nodal=None):
    """``(ev, const)``: ``ev(sl, g)`` the coefficient on the chunk ``sl`` of cells with geometry
    ``g`` (host :class:`~adaptmg.fe.geometry.CellGeometry` or the device geometry of
    :mod:`.on_device`), an array broadcastable to (n, nq) + ``tail`` on ``g``'s backend (a
    Python float for a scalar constant); ``const``: a constant.  ``ev.pointwise`` is True when
    the value varies inside a cell (callables, per-node arrays: no affine one-point path).
    ``nodal = (cell_dofs, num_nodes, phi)`` (phi (nq, nloc) the reference values at the
    quadrature points) admits per-node arrays."""
    tail = tuple(tail)
    if callable(coef):
        def ev(sl, g):
            x = g.x
            if is_device_array(x):
                val = call_points(coef, x, xp=backend_of(x).xp, dtype=np.float64)
            else:
                val = np.asarray(coef(x), dtype=np.float64)
            want = tuple(x.shape[:2]) + tail
            if tuple(val.shape) != want:
                raise ValueError(f"{name}(x) must return shape (...){'+' + str(tail) if tail else ''} for "
                                 f"points x of shape {tuple(x.shape)}, i.e. {want}; got {tuple(val.shape)}")
            check_finite(f"{name}(x)", val)
            return val
        ev.pointwise = True
        return ev, False
    arr = _as_array(name, coef)
    shape = tuple(arr.shape)
    if shape == tail:
        check_finite(name, arr)
        if not tail:                   # a Python float: also multiplies device factors
            val = float(arr)

            def ev(sl, g):
                return val
        else:
            held = _Where(arr)

            def ev(sl, g):
                return held.like(g).reshape((1, 1) + tail)
        ev.pointwise = False
        return ev, True
    if shape == (num_cells,) + tail:
        check_finite(name, arr)
        held = _Where(arr)

        def ev(sl, g):
            return held.like(g)[sl].reshape((-1, 1) + tail)
        ev.pointwise = False
        return ev, False
    if nodal is not None and shape == (int(nodal[1]),) + tail:
        check_finite(name, arr)
        held, dofs, phi = _Where(arr), _Where(nodal[0]), _Where(nodal[2])

        def ev(sl, g):
            vals = held.like(g)[dofs.like(g)[sl].astype(np.int64)]            # (n, nloc) + tail
            xp = backend_of(g.detJ).xp
            return xp.einsum("cjt,qj->cqt" if tail else "cj,qj->cq", vals, phi.like(g))
        ev.pointwise = True
        return ev, False
    const_shape = tail if tail else "()"
    nodes = f", a per-node array of shape {(int(nodal[1]),) + tail}" if nodal is not None else ""
    raise ValueError(f"{name} must be a constant of shape {const_shape}, a per-cell array of shape "
                     f"{(num_cells,) + tail}{nodes} or a callable; got an array of shape {shape}")
