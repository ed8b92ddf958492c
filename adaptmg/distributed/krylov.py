r"""Krylov solvers on distributed vectors.

:func:`krylov` runs the *unchanged* solvers of :mod:`adaptmg.linalg` (``cg``, ``gmres``,
``fgmres``, ...) on the owned entries inside
:func:`adaptmg.linalg._vectorops.global_reductions`, which completes every inner product
and norm with one ``Allreduce``: ``adaptmg/linalg/_system.py`` computes its norms with
:func:`~adaptmg.linalg._vectorops.global_norm` (``System.norm`` and ``||b||`` in
``prepare_system``), which :func:`linalg_is_distributed` checks.  Should that ever not
hold, local ``xp.linalg.norm`` calls would make ranks disagree on when to stop, so
:func:`krylov` then falls back to :func:`cg` below for ``"cg"`` (other methods raise).

:func:`cg` is :mod:`adaptmg.linalg.cg`'s algorithm (same recurrence, stopping test and
true-residual check) written directly on distributed vectors:

.. math::  \alpha_k = \frac{(r_k, z_k)}{(p_k, A p_k)},\quad
           x_{k+1} = x_k + \alpha_k p_k,\quad r_{k+1} = r_k - \alpha_k A p_k,\quad
           z_{k+1} = M r_{k+1},\quad p_{k+1} = z_{k+1} + \frac{(r_{k+1}, z_{k+1})}{(r_k, z_k)} p_k,

with two ``Allreduce`` per iteration: ``(p, A p)``, then ``(r, r)`` and ``(r, z)``
together (one reduction group).  Every rank takes the same decisions because it
compares the same reduced numbers.

Both work on NumPy or CuPy vectors (the array module of ``b``): on the device the local
dots run with CuPy and their partial sums go through one host ``Allreduce``
(:func:`.csr.dots`); the vector updates are the fused kernels of
:mod:`adaptmg.device.kernels` with the reduced scalars as host arguments.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import CPU, backend_of, is_device_array, to_host
from ..device import kernels as K
from ..linalg._vectorops import VectorOps
from .csr import dots, norm

__all__ = ["cg", "krylov", "linalg_is_distributed", "allreduce_sum"]

_METHODS = ("cg", "gmres", "fgmres", "bicgstab", "minres")


def linalg_is_distributed() -> bool:
    """True when :mod:`adaptmg.linalg` computes all its norms through the reduction hook."""
    from ..linalg import _system, _vectorops
    return getattr(_system, "global_norm", None) is _vectorops.global_norm


def allreduce_sum(comm):
    """``partial -> sum over ranks`` (one ``Allreduce`` on a NumPy array), for the hook; a
    CuPy partial is copied to the host, reduced there and returned as a CuPy array."""
    def f(a):
        dev = is_device_array(a)
        h = np.ascontiguousarray(to_host(a) if dev else a)
        out = np.empty_like(h)
        comm.Allreduce(h, out)
        return backend_of(a).xp.asarray(out) if dev else out
    return f


def krylov(comm, method, A, b, *, M=None, rtol=1e-8, maxiter=200, callback=None):
    """Solve ``A x = b`` (distributed, from ``x0 = 0``) with ``adaptmg.linalg.<method>`` under
    the reduction hook; returns ``(x, info, iterations, residual norms)`` like :func:`cg`
    (iterations: callback calls -- per iteration for cg, per inner iteration for (f)gmres)."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if not linalg_is_distributed():
        if method == "cg":
            return cg(comm, A, b, M=M, rtol=rtol, maxiter=maxiter, callback=callback)
        raise NotImplementedError(
            f"distributed {method} needs adaptmg/linalg/_system.py to compute its norms with "
            "_vectorops.global_norm (see adaptmg.distributed.krylov); only 'cg' is available")
    from .. import linalg
    from ..linalg._vectorops import global_reductions
    its = [0]
    res = []

    def cb(arg):
        its[0] += 1
        res.append(float(arg) if np.ndim(arg) == 0 else float("nan"))
        if callback is not None:
            callback(its[0], arg)

    kw = {"callback_type": "pr_norm"} if method in ("gmres", "fgmres") else {}
    with global_reductions(allreduce_sum(comm)):
        x, info = getattr(linalg, method)(A, b, x0=backend_of(b).xp.zeros_like(b), rtol=rtol, atol=0.0,
                                          maxiter=maxiter, M=M, callback=cb, **kw)
    return x, info, its[0], res


def cg(comm, A, b, *, M=None, rtol=1e-8, atol=0.0, maxiter=200, callback=None):
    """Solve ``A x = b`` (distributed) from ``x0 = 0``.

    ``A(x, y, alpha, beta)`` is a :class:`~.csr.DistCSR`; ``M(r)`` returns a new vector (the
    multigrid cycle).  Stops when ``||b - A x|| <= max(rtol ||b||, atol)`` (checked with
    the true residual).  ``callback(k, x)`` after each iteration.  Returns
    ``(x, info, iterations, residual norms)``: ``info`` 0 when converged, else ``maxiter``.
    """
    if not (np.isscalar(rtol) and rtol >= 0 and np.isscalar(atol) and atol >= 0):
        raise ValueError(f"rtol and atol must be non-negative numbers, got {rtol!r}, {atol!r}")
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 1:
        raise ValueError(f"maxiter must be a positive integer, got {maxiter!r}")
    be = backend_of(b)
    x = be.xp.zeros_like(b)
    # the fused updates of adaptmg.linalg.cg (host scalars; on the device K.axpby)
    ops = VectorOps(CPU, b.size, b.dtype) if not be.is_gpu else _DeviceUpdates()
    bnrm = norm(comm, b)
    tol = max(rtol * bnrm, atol)
    res = [bnrm]
    if bnrm == 0.0 or bnrm <= tol:
        return x, 0, 0, res
    r = b.copy()
    q = be.xp.empty_like(b)
    z = r.copy() if M is None else M(r)
    rz = dots(comm, [(r, z)])[0]
    p = z.copy()
    for k in range(1, maxiter + 1):
        A(p, q, 1.0, 0.0)
        pq = dots(comm, [(p, q)])[0]
        ops.cg_update_xr(x, r, p, q, rz, pq)       # alpha = rz / pq (0 if pq == 0)
        z = r.copy() if M is None else M(r)
        rr, rz_new = dots(comm, [(r, r), (r, z)])
        rnorm = math.sqrt(max(rr, 0.0))
        res.append(rnorm)
        if callback is not None:
            callback(k, x)
        if not math.isfinite(rnorm):
            return x, -1, k, res
        if rnorm <= tol:
            r[...] = b
            A(x, r, -1.0, 1.0)                       # the true residual
            rnorm = norm(comm, r)
            res[-1] = rnorm
            if rnorm <= tol:
                return x, 0, k, res
            z = r.copy() if M is None else M(r)      # recurrence drifted: restart from it
            rz = dots(comm, [(r, z)])[0]
            p[...] = z
            continue
        ops.cg_update_p(p, z, rz_new, rz)         # p <- z + (rz_new / rz) p
        rz = rz_new
    return x, maxiter, maxiter, res


class _DeviceUpdates:
    """The two CG updates of :class:`~adaptmg.linalg._vectorops.VectorOps` on CuPy vectors with
    host scalars (the reduced ones), one fused kernel each (:func:`adaptmg.device.kernels.axpby`)."""

    @staticmethod
    def cg_update_xr(x, r, p, q, rz, pq):
        """alpha = rz/pq (0 if pq == 0); ``x += alpha p``; ``r -= alpha q``."""
        alpha = rz / pq if pq != 0 else 0.0
        K.axpby(alpha, p, 1.0, x)
        K.axpby(-alpha, q, 1.0, r)

    @staticmethod
    def cg_update_p(p, z, rz_new, rz_old):
        """beta = rz_new/rz_old (0 if rz_old == 0); ``p <- z + beta p``."""
        beta = rz_new / rz_old if rz_old != 0 else 0.0
        K.axpby(1.0, z, beta, p)
