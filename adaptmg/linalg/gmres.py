"""Restarted GMRES (SciPy's, left-preconditioned) and flexible GMRES on NumPy or CuPy vectors.

The public functions check the arguments with SciPy's rules and run the cycles
of :mod:`adaptmg.linalg._arnoldi` (which holds the math and the GPU layout):

* :func:`gmres` is a drop-in replacement for :func:`scipy.sparse.linalg.gmres`:
  left preconditioning (the monitor and the callback's ``'pr_norm'`` value are the
  preconditioned residual), SciPy's inner-tolerance control, ``callback_type``
  with SciPy's default (``'legacy'``: with a callback and no ``callback_type``
  a DeprecationWarning is emitted and ``maxiter`` counts inner iterations).
* :func:`fgmres` (not in SciPy) is right-preconditioned flexible GMRES for
  preconditioners that vary from one application to the next; the monitor is
  the true residual; ``callback_type`` defaults to ``'pr_norm'`` (no warning,
  ``maxiter`` counts restart cycles).
"""
from __future__ import annotations

from ._arnoldi import arnoldi_solve
from ._system import callback_kind, check_positive_int, prepare_system

__all__ = ["gmres", "fgmres"]

_ORTHOGONALIZATIONS = ("mgs", "cgs2")

_PARAMETERS = """
    Parameters
    ----------
    A : sparse or dense matrix, LinearOperator, object with ``matvec`` or ``@``, or callable
        The ``n x n`` system matrix.
    b : ndarray, shape (n,) or (n, 1)
        Right-hand side (NumPy or CuPy; the solve runs where ``b`` lives).
    x0 : ndarray or 'Mb', optional
        Starting guess (default zero; ``'Mb'``: ``M b``).  It is copied, never modified.
    rtol, atol : float
        Stop when ``||b - A x|| <= max(rtol * ||b||, atol)`` (``inf`` allowed;
        ``atol`` None or ``'legacy'`` raise ValueError, as in SciPy).
    restart : int, optional
        Number of inner iterations between restarts (default 20, at most n).
    maxiter : int, optional
        Maximum number of restart cycles (default ``10 n``); with
        ``callback_type='legacy'`` (and a callback) the maximum number of inner
        iterations, as in SciPy.
    M : same kinds as ``A``, optional
        Preconditioner approximating ``A^{-1}`` (default: ``A.psolve`` if ``A`` has
        one, else none).  MONITOR
    callback : callable, optional
        Called as selected by ``callback_type``.
    callback_type : {'x', 'pr_norm', 'legacy'}, optional
        ``'x'``: ``callback(xk)`` once per restart cycle with the current iterate;
        ``'pr_norm'``: ``callback(rk)`` once per inner iteration with the monitored
        residual divided by ``||b||`` (a float); ``'legacy'``: like ``'pr_norm'``
        but ``maxiter`` counts inner iterations.  DEFAULT  No effect without a
        callback.
    orthogonalization : {"mgs", "cgs2"}, keyword-only
        Gram-Schmidt variant of the Arnoldi process (not in SciPy): ``"mgs"``
        (default) modified Gram-Schmidt, ``"cgs2"`` classical Gram-Schmidt applied
        twice as block operations -- same iterates up to round-off, a constant
        number of device launches per iteration (faster on the GPU when the
        iterations are launch-bound).

    Returns
    -------
    x : ndarray, shape (n,)
        Same kind of array as ``b``.
    info : int
        0: converged, checked with the true residual ``b - A x``; >0: not converged
        after ``maxiter`` restart cycles (or inner iterations, ``'legacy'``); the value
        is ``maxiter``, as in SciPy, and a :class:`ConvergenceWarning` is emitted;
        <0: breakdown (singular operator or preconditioner, non-finite values), also
        with a warning.
"""


def gmres(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=None, maxiter=None, M=None,
          callback=None, callback_type=None, orthogonalization="mgs"):
    return _gmres("gmres", False, A, b, x0, rtol, atol, restart, maxiter, M, callback,
                  callback_type, orthogonalization)


def fgmres(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=None, maxiter=None, M=None,
           callback=None, callback_type="pr_norm", orthogonalization="mgs"):
    return _gmres("fgmres", True, A, b, x0, rtol, atol, restart, maxiter, M, callback,
                  callback_type, orthogonalization)


gmres.__doc__ = """Solve ``A x = b`` with restarted, left-preconditioned GMRES(m), as SciPy does.

    Same arguments, defaults, iterates (up to round-off) and ``info`` as
    :func:`scipy.sparse.linalg.gmres`; Arnoldi with modified (or,
    ``orthogonalization="cgs2"``, twice-applied classical) Gram-Schmidt on the
    device, Givens rotations on the host (see :mod:`adaptmg.linalg._arnoldi`).
    ``M`` must be a fixed linear operator; for a preconditioner that varies from
    one application to the next use :func:`fgmres`.
""" + _PARAMETERS.replace(
    "MONITOR", "Applied on the left (SciPy): the\n        monitored residual is "
    "``||M (b - A x)||``; convergence is still decided on\n        ``||b - A x||``.").replace(
    "DEFAULT", "Default (SciPy's): ``'legacy'``; a callback given\n        without "
    "``callback_type`` emits a DeprecationWarning.")

fgmres.__doc__ = """Solve ``A x = b`` with restarted flexible GMRES(m) (Saad 1993).

    Right preconditioning: the preconditioned vectors ``z_j = M(v_j)`` are stored
    and ``x = x_0 + Z_m y``, so ``M`` may be nonlinear or change between calls
    (a multigrid cycle, an inner Krylov solve).  Costs one more ``(restart, n)``
    array of memory.  Not in SciPy; its arguments mean what they mean for
    :func:`gmres`, except the default ``callback_type='pr_norm'``.
""" + _PARAMETERS.replace(
    "MONITOR", "Applied on the right: the monitored\n        residual is the true "
    "one, ``||b - A x||`` (up to rounding).").replace(
    "DEFAULT", "Default: ``'pr_norm'`` (no warning).")


def _gmres(name, flexible, A, b, x0, rtol, atol, restart, maxiter, M, callback,
           callback_type, orthogonalization):
    if not isinstance(orthogonalization, str):
        raise TypeError(f"orthogonalization must be one of {_ORTHOGONALIZATIONS}, got "
                        f"{type(orthogonalization).__name__} {orthogonalization!r}")
    if orthogonalization not in _ORTHOGONALIZATIONS:
        raise ValueError(f"orthogonalization must be one of {_ORTHOGONALIZATIONS}, got "
                         f"{orthogonalization!r}")
    callback_type = callback_kind(name, callback, callback_type,
                                  default="pr_norm" if flexible else None)
    s = prepare_system(name, A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
                       callback=callback)
    m = 20 if restart is None else check_positive_int(restart, "restart")
    return arnoldi_solve(s, flexible=flexible, restart=m,
                         cgs2=orthogonalization == "cgs2", callback_type=callback_type)
