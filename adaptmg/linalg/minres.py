"""Preconditioned MINRES (Paige and Saunders 1975) on NumPy or CuPy vectors.

For a Hermitian (possibly indefinite) ``A`` and a Hermitian positive definite
``M ~ A^{-1}``, MINRES solves ``(A - shift I) x = b``: the preconditioned Lanczos
process builds the tridiagonal ``T_k`` with ``alpha_k = (v_k, y)``,
``beta_{k+1} = sqrt((r, M r))``, a QR factorisation of ``T_k`` by Givens rotations
is updated on the host, and ``x_k`` minimises ``||b - (A - shift I) x||_M`` over
the Krylov space.  The recurrences are SciPy's (``scipy.sparse.linalg.minres``,
a translation of the SOL MATLAB code), and so are the signature, ``maxiter``
(default ``5 n``), ``callback(xk)`` once per iteration, ``show`` and ``check``.

Stopping test (adaptmg's, not SciPy's ``||r|| <= rtol ||A|| ||x||``): the
relative residual ``||b - (A - shift I) x|| / ||b|| <= rtol``, as SciPy's
documentation words it.  The recurrence gives ``phibar = ||r_k||_M``; when it falls
below a target (initially ``rtol ||b|| beta_1 / ||r_0||``, i.e. the same relative
reduction in the ``M``-norm) the true residual is computed, and ``info == 0`` is
returned only when it passes; otherwise the target is scaled by the observed
ratio and the iteration goes on.  When the Lanczos process stops
(``beta_{k+1} = 0``: the Krylov space is invariant) with a true residual that
does not pass, either ``phibar`` is still above ``sqrt(eps) beta_1``: the system
is singular and ``b`` is not in the range, ``info = -1`` with a warning (SciPy
returns a least-squares solution with ``info = 0``); or the residual is at the
round-off level and the process restarts from the true residual (``maxiter``
bounds the whole).

GPU: one host synchronisation per iteration, which brings back
``alpha_k`` and ``beta_{k+1}^2`` in one transfer; ``alpha_k`` enters the
three-term recurrence as a device scalar, the rotation is done on the host and
its scalars enter the fused updates of ``w`` and ``x`` as kernel arguments.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._operators import shifted
from ._system import prepare_system
from ._vectorops import VectorOps

__all__ = ["minres"]


def minres(A, b, x0=None, *, rtol=1e-5, shift=0.0, maxiter=None, M=None, callback=None,
           show=False, check=False):
    """Solve ``(A - shift I) x = b`` with MINRES, for a Hermitian ``A``.

    Same arguments and defaults as :func:`scipy.sparse.linalg.minres`.

    Parameters
    ----------
    A : sparse or dense matrix, LinearOperator, object with ``matvec`` or ``@``, or callable
        The Hermitian ``n x n`` system matrix (may be indefinite).
    b : ndarray, shape (n,) or (n, 1)
        Right-hand side (NumPy or CuPy; the solve runs where ``b`` lives).
    x0 : ndarray or 'Mb', optional
        Starting guess (default zero; ``'Mb'``: ``M b``).  It is copied, never modified.
    rtol : float
        Stop when ``||b - (A - shift I) x|| <= rtol ||b||`` (``inf`` allowed).
    shift : float
        Solve ``(A - shift I) x = b``.
    maxiter : int, optional
        Maximum number of iterations (default ``5 n``).
    M : same kinds as ``A``, optional
        Hermitian positive definite preconditioner approximating ``A^{-1}``
        (default: ``A.psolve`` if ``A`` has one, else none).
    callback : callable, optional
        Called as ``callback(xk)`` after each iteration with the current iterate
        (the solver's own array: copy it to keep it).
    show : bool
        Print a summary and one line per iteration (as SciPy does).
    check : bool
        Check first that ``A`` and ``M`` are Hermitian (ValueError if not).

    Returns
    -------
    x : ndarray, shape (n,)
        Same kind of array as ``b``.
    info : int
        0: converged (checked with the true residual); >0: ``maxiter`` iterations
        done without converging (a :class:`ConvergenceWarning` is emitted); <0:
        breakdown (the Krylov space is invariant but ``x`` does not solve the
        system: singular ``A - shift I``, or NaN/Inf), also with a warning.

    Raises
    ------
    ValueError
        As SciPy: an indefinite preconditioner (``(r, M r) < 0``), or, with
        ``check=True``, a non-Hermitian ``A`` or ``M``.
    """
    if isinstance(shift, bool) or not isinstance(shift, numbers.Real):
        raise TypeError(f"shift must be a real number, got {type(shift).__name__}")
    s = prepare_system("minres", A, b, x0, rtol=rtol, atol=0.0, maxiter=maxiter, M=M,
                       callback=callback, maxiter_per_unknown=5)
    if shift != 0:
        s.A = shifted(s.A, shift)
    xp, x, n, tol = s.xp, s.x, s.n, s.tol
    eps = float(np.finfo(s.dtype).eps)
    if show:
        print("Enter minres.   Solution of symmetric Ax = b")
        print(f"Enter minres.   n      =  {n:3g}     shift  =  {float(shift):23.14e}")
        print(f"Enter minres.   itnlim =  {s.maxiter:3g}     rtol   =  {s.rtol:11.2e}")
        print()
    started = s.start()
    if started is None:
        return _exit(show, "the initial guess solves the system", 0, x, 0)
    r1, r0norm = started
    ops = VectorOps(s.backend, n, s.dtype)

    def precondition(vec):
        return vec if s.M is None else s.M(vec)

    def begin(r):
        """Start (or restart) the Lanczos process from the residual ``r``."""
        y = precondition(r)
        beta1 = ops.host(ops.dot(r, y))[0].real
        if beta1 < 0:
            raise ValueError("minres: indefinite preconditioner ((r, M r) < 0)")
        return y, beta1

    y, beta1 = begin(r1)
    if beta1 == 0:                                    # M r = 0 with r != 0
        return _exit(show, "breakdown", 0, *s.breakdown(
            "before the first iteration", "(r, M r) == 0: M is singular"))
    beta1 = math.sqrt(beta1)
    if check:
        _check_hermitian(s, ops, r1, y, eps)
    ptol = tol * beta1 / r0norm          # target for phibar = ||r||_M
    v = xp.empty_like(x)
    w, w2 = xp.zeros_like(x), xp.zeros_like(x)
    r2, spare = r1.copy(), xp.empty_like(x)           # three distinct buffers rotate
    lz = _Lanczos(beta1)
    if show:
        print()
        print("   Itn     x(1)     Compatible    LS       norm(A)  cond(A) gbar/|A|")
    for itn in range(1, s.maxiter + 1):
        where = f"at iteration {itn}"
        xp.multiply(y, 1.0 / lz.beta, out=v)
        ynew = s.A(v)                                 # (A - shift I) v
        if not s.A.fresh:
            xp.copyto(spare, ynew)
            ynew = spare
        if lz.oldb != 0:
            ops.lanczos_y(ynew, v, r1, 0.0, lz.beta / lz.oldb)
        alfa_d = ops.dot(v, ynew)
        ops.sub_over(ynew, alfa_d, lz.beta, r2)
        spare, r1, r2 = r1, r2, ynew                  # r1's buffer is free again
        y = precondition(r2)
        alfa, beta_sq = ops.host(alfa_d, ops.dot(r2, y))   # the one synchronisation
        alfa, beta_sq = alfa.real, beta_sq.real
        if not (math.isfinite(alfa) and math.isfinite(beta_sq)):
            return _exit(show, "breakdown", itn, *s.breakdown(
                where, "NaN or Inf in the Lanczos process"))
        if beta_sq < 0:
            raise ValueError("minres: (r, M r) < 0: A is not Hermitian or M is not "
                             "positive definite")
        oldeps, delta, phi, gamma = lz.step(alfa, math.sqrt(beta_sq), eps)
        if gamma > 10 * eps * lz.anorm:
            # w1 <- (v - oldeps w1 - delta w2) / gamma; x += phi w1 (w1's buffer: the oldest w)
            w1 = w2
            ops.minres_wx(w1, x, v, w, oldeps, delta, 1.0 / gamma, phi)
            w2, w = w, w1
        # else T_k is singular (and beta_{k+1} ~ 0: the space is invariant, checked below):
        # x_{k-1} already minimises the residual over K_k; SciPy's step by 1/eps would not
        if show:
            _show_line(s, itn, x, lz)
        if s.callback is not None:
            s.callback(x)
        invariant = lz.beta <= 10 * eps * max(lz.anorm, lz.beta1 if lz.itn == 1 else 0.0)
        if lz.phibar <= ptol or invariant:
            rnorm = s.norm(s.residual(x, out=spare))  # the true residual (spare is free)
            if rnorm <= tol:
                return _exit(show, "converged", itn, x, 0)
            if not math.isfinite(rnorm):
                return _exit(show, "breakdown", itn, *s.breakdown(
                    where, "the residual became NaN or Inf", rnorm=rnorm))
            if invariant and lz.phibar > math.sqrt(eps) * lz.beta1:
                return _exit(show, "breakdown", itn, *s.breakdown(
                    where, "the Krylov space is invariant but x does not solve the system "
                    "(A - shift I is singular and b is not in its range)", rnorm=rnorm))
            if invariant:                             # round-off level: restart from r
                r2, spare = spare, r2
                y, beta1 = begin(r2)
                if beta1 == 0:
                    return _exit(show, "breakdown", itn, *s.breakdown(
                        where, "(r, M r) == 0: M is singular", rnorm=rnorm))
                lz = _Lanczos(math.sqrt(beta1))
                w[...] = 0
                w2[...] = 0
            ptol = lz.phibar * tol / rnorm            # same ratio ||r|| / ||r||_M from here
    x, info = s.not_converged(s.maxiter, f"{s.maxiter} iterations")
    return _exit(show, "the iteration limit was reached", s.maxiter, x, info)


class _Lanczos:
    """The host scalars of MINRES: Lanczos coefficients and the QR update of T_k."""

    def __init__(self, beta1):
        self.beta1 = self.beta = self.phibar = beta1
        self.oldb = self.dbar = self.epsln = self.tnorm2 = self.gbar = self.root = 0.0
        self.cs, self.sn = -1.0, 0.0
        self.gmax, self.gmin = 0.0, float(np.finfo(np.float64).max)
        self.itn = 0

    @property
    def anorm(self):
        return math.sqrt(self.tnorm2)

    def step(self, alfa, beta, eps):
        """Take ``alpha_k`` and ``beta_{k+1}``; returns (oldeps, delta, phi, gamma)."""
        self.itn += 1
        self.oldb, self.beta = self.beta, beta
        self.tnorm2 += alfa ** 2 + self.oldb ** 2 + beta ** 2
        # apply the previous rotation, then compute and apply the next one
        oldeps = self.epsln
        delta = self.cs * self.dbar + self.sn * alfa
        self.gbar = self.sn * self.dbar - self.cs * alfa
        self.epsln = self.sn * beta
        self.dbar = -self.cs * beta
        self.root = math.hypot(self.gbar, self.dbar)
        gamma = math.hypot(self.gbar, beta)          # SciPy clamps it to >= eps
        self.cs, self.sn = self.gbar / max(gamma, eps), beta / max(gamma, eps)
        phi = self.cs * self.phibar
        self.phibar = self.sn * self.phibar
        self.gmax, self.gmin = max(self.gmax, gamma), min(self.gmin, max(gamma, eps))
        return oldeps, delta, phi, gamma


def _check_hermitian(s, ops, r1, y, eps):
    """SciPy's ``check=True``: ``(A y, A y) = (y, A A y)`` and ``(y, y) = (r, M y)``."""
    w = s.A(y)
    r2 = s.A(w)
    a, b_ = ops.host(ops.dot(w, w), ops.dot(y, r2))
    if abs(a - b_) > (abs(a) + eps) * eps ** (1.0 / 3.0):
        raise ValueError("non-symmetric matrix")
    if s.M is not None:
        r2 = s.M(y)
        a, b_ = ops.host(ops.dot(y, y), ops.dot(r1, r2))
        if abs(a - b_) > (abs(a) + eps) * eps ** (1.0 / 3.0):
            raise ValueError("non-symmetric preconditioner")


def _show_line(s, itn, x, lz):
    """One line of SciPy's ``show=True`` table (two extra synchronisations)."""
    anorm, xnorm = lz.anorm, s.norm(x)
    test1 = lz.phibar / (anorm * xnorm) if anorm > 0 and xnorm > 0 else float("inf")
    test2 = lz.root / anorm if anorm > 0 else float("inf")
    x1 = complex(x[0].item()).real
    print(f"{itn:6g} {x1:12.5e} {test1:10.3e} {test2:10.3e} {anorm:8.1e} "
          f"{lz.gmax / lz.gmin:8.1e} {lz.gbar / anorm if anorm else 0.0:8.1e}")


def _exit(show, why, itn, x, info):
    if show:
        print()
        print(f"Exit  minres.   info   =  {info:3g}               itn   ={itn:5g}")
        print(f"Exit  minres.   {why}")
    return x, info
