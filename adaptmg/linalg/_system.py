"""Argument checking, the prepared system and the reports shared by the Krylov solvers.

Every solver of :mod:`adaptmg.linalg` starts with :func:`prepare_system`, which
turns whatever the caller passed into one :class:`System`:

* the *working backend* is the one that holds ``b`` (NumPy when ``b`` is a
  NumPy array or a list, CuPy when it is a CuPy array), so the solution comes
  back as the same kind of array as ``b``;
* ``A`` and ``M`` become :class:`~._operators.Operator` objects (see
  :mod:`._operators`).  As in SciPy, when ``M`` is None and ``A`` has a
  ``psolve`` method, that method is the preconditioner;
* ``x0`` may be an array, None (zero) or the string ``'Mb'`` (SciPy: start from
  ``M b``);
* the tolerances follow SciPy: the solvers stop when
  ``||b - A x|| <= max(rtol * ||b||, atol)``; ``atol`` must be a non-negative
  real number (``None`` and the removed ``'legacy'`` raise ValueError, as in
  SciPy); ``inf`` is allowed for both (an immediate success);
* every argument is validated once, with an error that names the argument and
  the shapes or values involved.

:meth:`System.not_converged` and :meth:`System.breakdown` emit the
:class:`~adaptmg.linalg.ConvergenceWarning` of a solve that did not reach the
tolerance, attributed to the caller's line.
"""
from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import scipy.sparse as sp

from ..backend import Backend, backend_of, is_device_array
from ._vectorops import global_norm
from ._operators import NUMERIC_KINDS, Operator, as_operator, classify, is_cupyx_sparse, side_of

__all__ = ["System", "prepare_system", "check_positive_int", "check_tol", "check_atol",
           "callback_kind", "warn"]

_HERE = os.path.dirname(os.path.abspath(__file__))
CALLBACK_TYPES = ("x", "pr_norm", "legacy")


# --------------------------------------------------------------------------
# warnings attributed to the caller
# --------------------------------------------------------------------------
def warn(message: str, category=None) -> None:
    """``warnings.warn`` with the stack level of the first frame outside adaptmg.linalg."""
    if category is None:
        from . import ConvergenceWarning
        category = ConvergenceWarning
    level, f = 1, sys._getframe(0)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _HERE:
        f = f.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


# --------------------------------------------------------------------------
# scalar arguments
# --------------------------------------------------------------------------
def check_tol(value, name: str) -> float:
    """A non-negative real number (``inf`` allowed); TypeError / ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not value >= 0:            # negative or NaN
        raise ValueError(f"{name} must be a finite non-negative number or inf, got {value!r}")
    return value


def check_atol(value, solver: str) -> float:
    """``atol`` as SciPy validates it: None, ``'legacy'`` and negative values are a ValueError."""
    if value is None or isinstance(value, (str, bytes)):
        raise ValueError(f"adaptmg.linalg.{solver} called with invalid atol={value!r}: atol "
                         f"must be a real, non-negative number (SciPy removed None and "
                         f"'legacy')")
    return check_tol(value, "atol")


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as int; TypeError if it is not an integer, ValueError if < 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} "
                        f"{value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def callback_kind(solver: str, callback, callback_type, default: Optional[str]):
    """The effective ``callback_type`` of (f)gmres: None when there is no callback.

    ``default=None`` is SciPy's gmres: no ``callback_type`` with a callback warns
    (DeprecationWarning) and means ``'legacy'``.
    """
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    if callback is not None and callback_type is None and default is None:
        warn(f"adaptmg.linalg.{solver} called without specifying `callback_type`. The "
             f"default value 'legacy' (as in SciPy; maxiter counts inner iterations) may "
             f"change in a future release. For compatibility, specify a value for "
             f"`callback_type` explicitly, e.g., ``{solver}(..., callback_type='pr_norm')``,"
             f" or to retain the old behavior ``{solver}(..., callback_type='legacy')``",
             DeprecationWarning)
    if callback_type is None:
        callback_type = default or "legacy"
    if not isinstance(callback_type, str) or callback_type not in CALLBACK_TYPES:
        raise ValueError(f"Unknown callback_type: {callback_type!r} (expected one of "
                         f"{CALLBACK_TYPES})")
    return callback_type if callback is not None else None


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
    if not (isinstance(v, np.ndarray) or (is_device_array(v) and hasattr(v, "ndim"))):
        if sp.issparse(v) or is_cupyx_sparse(v):
            raise TypeError(f"{name} must be a dense vector, got a sparse {type(v).__name__}")
        try:
            v = np.asarray(v)
        except (TypeError, ValueError) as exc:  # ragged lists etc.
            raise TypeError(f"{name} must be an array of numbers, got {type(v).__name__}") from exc
    if v.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{name} must have a numeric dtype, got dtype {v.dtype}")
    return v


# --------------------------------------------------------------------------
# the prepared system
# --------------------------------------------------------------------------
@dataclass
class System:
    """Everything a solver needs, validated and on one backend."""

    name: str         # the solver, for messages
    backend: Backend
    A: Operator
    M: Optional[Operator]
    b: Any            # 1-D, working dtype; may alias the caller's b (never written)
    x: Any            # 1-D, working dtype; a fresh copy of x0 (or zeros, or M b)
    x0_given: bool    # False: x is zero
    n: int
    dtype: np.dtype
    bnrm2: float      # ||b||
    tol: float        # max(rtol * ||b||, atol)
    rtol: float
    atol: float
    maxiter: int
    callback: Optional[Callable]

    @property
    def xp(self):
        return self.backend.xp

    def norm(self, v) -> float:
        """||v||_2 as a host float (one synchronisation on the GPU)."""
        return global_norm(self.xp, v)

    def residual(self, x, out=None):
        """``out <- b - A x`` (allocates ``out`` if not given)."""
        Ax = self.A(x)
        if out is None:
            return self.b - Ax
        return self.xp.subtract(self.b, Ax, out=out)

    def start(self):
        """Initial residual of the iteration, or None when ``self.x`` already solves the system.

        Returns ``(r, ||r||)`` with r = b - A x0 (``b`` itself, without a product
        with A, when there is no x0), or None when no iteration is needed: b = 0
        (x is set to the exact solution 0, whatever x0 was, as in SciPy), or x0
        already meets the tolerance.
        """
        if not self.x0_given:
            if self.bnrm2 == 0.0 or self.bnrm2 <= self.tol:
                return None
            return self.b.copy(), self.bnrm2
        r = self.xp.empty_like(self.x)
        self.residual(self.x, out=r)
        with np.errstate(invalid="ignore"):     # r + 0 x0 = r, but carries a NaN/Inf of
            r += 0 * self.x                     # x0 into ||r|| (even where A does not see it)
        rnorm = self.norm(r)
        # a non-finite x0 shows in ||r||: only then look at x0 itself
        if not math.isfinite(rnorm) and not bool(self.xp.isfinite(self.x).all()):
            raise ValueError("x0 contains NaN or Inf")
        if self.bnrm2 == 0.0:
            self.x[...] = 0
            return None
        if rnorm <= self.tol:
            return None
        return r, rnorm

    def relres(self, rnorm=None) -> float:
        """||b - A x|| / ||b|| of the current iterate (computed when ``rnorm`` is None)."""
        if rnorm is None:
            rnorm = self.norm(self.residual(self.x))
        return rnorm / self.bnrm2

    def not_converged(self, info, after, rnorm=None):
        """Warn that ``maxiter`` was exhausted; returns ``(x, info)``."""
        warn(f"{self.name} did not converge: relative residual {self.relres(rnorm):.3e} "
             f"after {after} (rtol={self.rtol:g}, atol={self.atol:g})")
        return self.x, info

    def breakdown(self, where, why, rnorm=None, info=-1):
        """Warn that the method cannot continue; returns ``(x, info)`` (info < 0)."""
        rel = self.relres(rnorm)
        warn(f"{self.name} broke down {where}: {why}; relative residual {rel:.3e}")
        return self.x, info


def _working_dtype(*dtypes) -> np.dtype:
    dtype = np.result_type(*[d for d in dtypes if d is not None])
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    if dtype == np.float16:
        return np.dtype(np.float32)
    return dtype


def prepare_system(name, A, b, x0, *, rtol, atol, maxiter, M, callback,
                   maxiter_per_unknown=10) -> System:
    """Validate the arguments of a solver once and normalise them (see module doc)."""
    kind_A = classify(A, "A")
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
    rtol = check_tol(rtol, "rtol")
    atol = check_atol(atol, name)
    maxiter = None if maxiter is None else check_positive_int(maxiter, "maxiter")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    if isinstance(x0, str):
        if x0 != "Mb":
            raise ValueError(f"x0 must be an array, None or 'Mb' (start from M b), got {x0!r}")
    elif x0 is not None:
        x0 = _as_array(x0, "x0")
    dtype = _working_dtype(kind_A[2], b.dtype,
                           None if x0 is None or isinstance(x0, str) else x0.dtype)
    xp = backend.xp
    bw = _as_vector(b, n, "b", backend, dtype)

    Aop = as_operator(A, n, dtype, backend, "A", classified=kind_A)
    if M is None and callable(getattr(A, "psolve", None)):
        # SciPy's convention: a LinearOperator may carry its preconditioner as psolve
        Mop = as_operator(A.psolve, n, dtype, backend, "A.psolve", side=side_of(A))
    else:
        Mop = None if M is None else as_operator(M, n, dtype, backend, "M")

    if isinstance(x0, str):                   # 'Mb'
        x = bw.copy() if Mop is None else Mop(bw.copy())
        if Mop is not None and not Mop.fresh:
            x = x.copy()
    else:
        x = xp.zeros(n, dtype=dtype)
        if x0 is not None:
            x[...] = _as_vector(x0, n, "x0", backend, dtype)   # a copy: x0 is never written
        # (a non-finite x0 is reported by System.start, which sees it in ||b - A x0||)
    bnrm2 = global_norm(xp, bw)
    # one synchronisation for ||b|| and the NaN/Inf test: only a non-finite norm
    # (NaN/Inf in b, or an overflow of a finite b) needs the element-wise look
    if not math.isfinite(bnrm2) and not bool(xp.isfinite(bw).all()):
        raise ValueError("b contains NaN or Inf")
    tol = max(rtol * bnrm2 if bnrm2 > 0 else 0.0, atol)
    return System(name=name, backend=backend, A=Aop, M=Mop, b=bw, x=x,
                  x0_given=x0 is not None, n=n, dtype=np.dtype(dtype), bnrm2=bnrm2,
                  tol=tol, rtol=rtol, atol=atol,
                  maxiter=maxiter_per_unknown * n if maxiter is None else maxiter,
                  callback=callback)
