"""Krylov acceleration of :meth:`MultilevelSolver.solve` by a name or a function.

``accel`` may be

* a name of :mod:`adaptmg.linalg` (``"cg"``, ``"gmres"``, ``"fgmres"``, ``"bicgstab"``,
  ``"minres"``): adaptmg's own solvers (``MultilevelSolver._solve_krylov``);
* another name of ``scipy.sparse.linalg`` (``cupyx.scipy.sparse.linalg`` on the GPU),
  e.g. ``"cgs"``: that function, called as below;
* a function, with pyamg's signature ``accel(A, b, x0=, tol=, maxiter=, M=, callback=,
  residuals=)`` (pyamg.krylov's solvers: recognised by a ``residuals`` parameter) or
  SciPy's ``accel(A, b, x0=, rtol=, atol=, maxiter=, M=, callback=)``; it returns
  ``(x, info)``.  For SciPy's signature the residual norms ``||b - A x_k||`` are
  collected by a callback (as pyamg does).

The function gets the fine matrix and the cycle as a preconditioner ``M``
(``LinearOperator``) of the kind of ``b``: a NumPy ``b`` handed to a GPU hierarchy
gives the function the host matrix and an ``M`` that runs the cycle on the device.
"""
from __future__ import annotations

import inspect
import warnings

import numpy as np

from ..backend import is_device_sparse, to_host
from ..linalg import ConvergenceWarning

__all__ = ["OWN_ACCELS", "resolve_accel", "solve_with_function"]

OWN_ACCELS = ("cg", "gmres", "fgmres", "bicgstab", "minres")


def resolve_accel(accel, backend):
    """``None``, one of :data:`OWN_ACCELS`, or a function (a foreign name resolved in the
    backend's ``sparse.linalg``).  Raises ``ValueError`` naming an unknown name."""
    if accel is None or callable(accel):
        return accel
    if isinstance(accel, str):
        if accel in OWN_ACCELS:
            return accel
        f = getattr(backend.linalg, accel, None)
        if callable(f) and not inspect.isclass(f):
            return f
    raise ValueError(f"unknown accel {accel!r}; choose one of {(None,) + OWN_ACCELS}, another "
                     f"solver of {backend.linalg.__name__}, or a function (SciPy's or "
                     "pyamg's signature)")


def _pyamg_style(f):
    try:
        return "residuals" in inspect.signature(f).parameters
    except (TypeError, ValueError):
        return False


def solve_with_function(ml, f, b, x, have_x0, rtol, atol, maxiter, kind, callback, residuals,
                        host):
    """``x`` from ``f`` (see the module docstring) preconditioned by one ``kind`` cycle of
    ``ml``; ``host``: hand ``f`` host arrays (the caller's ``b`` was NumPy on a GPU
    hierarchy).  Warns with :class:`ConvergenceWarning` when ``info != 0``."""
    be = ml.backend
    A, M = ml._A_outer, ml._cached_preconditioner(kind)
    if host:
        import scipy.sparse.linalg as spla
        dev_M = M
        A = to_host(A)
        M = spla.LinearOperator(A.shape, dtype=A.dtype,
                                matvec=lambda v: to_host(dev_M.matvec(be.asarray(v))))
        b, x = to_host(b), to_host(x)
    elif be.is_gpu and not is_device_sparse(A):
        # cupyx's solvers understand cupyx matrices and LinearOperators only
        A_op = A
        A = be.linalg.LinearOperator(A_op.shape, matvec=lambda v: A_op @ v, dtype=b.dtype)
    x0 = x if have_x0 else None
    if _pyamg_style(f):
        x, info = f(A, b, x0=x0, tol=rtol, maxiter=maxiter, M=M, callback=callback,
                    residuals=residuals)
    else:
        xp = np if host else be.xp

        def norm_res(v):
            return float(xp.linalg.norm(b - A @ v))
        cb = callback
        if residuals is not None:
            residuals[:] = [norm_res(x)]

            def cb(v):
                residuals.append(float(v) if np.isscalar(v) else norm_res(v))
                if callback is not None:
                    callback(v)
        x, info = f(A, b, x0=x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M, callback=cb)
    if info != 0:
        warnings.warn(ConvergenceWarning(
            f"multigrid-preconditioned {getattr(f, '__name__', f)} did not reach the "
            f"tolerance (info={info})"), stacklevel=4)
    return be.asarray(x) if host else x
