"""Preconditioned BiCGSTAB (van der Vorst 1992) on NumPy or CuPy vectors, as SciPy runs it.

For a general (nonsymmetric) ``A`` and preconditioner ``M ~ A^{-1}`` applied on
the right, with ``r_0 = b - A x_0`` and the shadow residual ``rt = r_0``, an
iteration is::

    rho_k   = (rt, r_k)
    p_k     = r_k + beta_k (p_{k-1} - omega_{k-1} v_{k-1}),
              beta_k = (rho_k / rho_{k-1}) (alpha_{k-1} / omega_{k-1})   (p_0 = r_0)
    ph      = M p_k;   v_k = A ph;   alpha_k = rho_k / (rt, v_k)
    s       = r_k - alpha_k v_k                  (stop here if ||s|| is small:
                                                  x_{k+1} = x_k + alpha_k ph)
    sh      = M s;     t = A sh;     omega_k = (t, s) / (t, t)
    x_{k+1} = x_k + alpha_k ph + omega_k sh
    r_{k+1} = s - omega_k t

(SciPy's ``bicgstab``, same order of operations, same breakdown tests:
``|rho_k| < eps^2`` gives ``info = -10``, ``|omega_k| < eps^2`` or
``(rt, v_k) == 0`` give ``info = -11``; ``maxiter`` counts iterations, default
``10 n``; ``callback(xk)`` after each full iteration.)

One iteration costs two products with ``A``, two applications of ``M``, five
inner products and five fused vector updates.  On the GPU there are two host
synchronisations per iteration, one per half-step (one per ``A``/``M`` pair, as
in :mod:`.cg`): after the first half ``(rt, v)`` and ``||s||^2`` come back in one
transfer, after the second ``(t, s)``, ``(t, t)``, ``||r||^2`` and the next
``rho`` in another.  ``alpha`` and ``omega`` enter the residual updates as device
scalars (read by the kernels from device memory); the other updates take the
host copies.

As in all solvers of :mod:`adaptmg.linalg`, ``info == 0`` is returned only
after the true residual ``b - A x`` passed the test; when the recurrence
residual passed but the true one did not, the iteration restarts from the true
residual (new shadow residual).
"""
from __future__ import annotations

import math

import numpy as np

from ._system import prepare_system
from ._vectorops import VectorOps

__all__ = ["bicgstab"]


def bicgstab(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, callback=None):
    """Solve ``A x = b`` with the preconditioned BiConjugate Gradient STABilized method.

    Same arguments, defaults and ``info`` codes as :func:`scipy.sparse.linalg.bicgstab`.

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
    maxiter : int, optional
        Maximum number of iterations (default ``10 n``).
    M : same kinds as ``A``, optional
        Preconditioner approximating ``A^{-1}`` (default: ``A.psolve`` if ``A``
        has one, else none).
    callback : callable, optional
        Called as ``callback(xk)`` after each iteration with the current iterate
        (the solver's own array: copy it to keep it).

    Returns
    -------
    x : ndarray, shape (n,)
        Same kind of array as ``b``.
    info : int
        0: converged (checked with the true residual); >0: ``maxiter`` iterations
        done without converging (a :class:`ConvergenceWarning` is emitted); -10:
        ``rho`` breakdown, -11: ``omega`` breakdown (both with a warning).
    """
    s = prepare_system("bicgstab", A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
                       callback=callback)
    xp, x, tol = s.xp, s.x, s.tol
    started = s.start()
    if started is None:
        return x, 0
    r, rnorm = started
    ops = VectorOps(s.backend, s.n, s.dtype)
    tiny = float(np.finfo(s.dtype).eps) ** 2          # SciPy's rhotol and omegatol
    rt = r.copy()                                     # shadow residual
    p = xp.empty_like(x)
    v = xp.zeros_like(x)

    # results that must survive the next product with A or M get their own buffer
    # when the operator may return an alias (of its input or of an internal buffer)
    phb = xp.empty_like(x) if (s.M is not None and not s.M.fresh) else None
    shb = xp.empty_like(x) if (s.M is None or not s.M.fresh) else None
    vb = None if s.A.fresh else xp.empty_like(x)

    def kept(vec, buf):
        if buf is None:
            return vec
        xp.copyto(buf, vec)
        return buf

    rho_d = ops.dot(rt, r)
    rho, = ops.host(rho_d)
    first = True                                      # p_0 = r_0 (a "first spin")
    omega = alpha = rho_prev = 0.0
    for k in range(1, s.maxiter + 1):
        where = f"at iteration {k}"
        # -- the tests SciPy makes at the top of an iteration
        if rnorm <= tol:                              # the recurrence says converged
            s.residual(x, out=r)
            rnorm = s.norm(r)
            if rnorm <= tol:
                return x, 0
            xp.copyto(rt, r)                          # drifted: restart from the true residual
            rho_d = ops.dot(rt, r)
            rho, = ops.host(rho_d)
            first = True
        if abs(rho) < tiny:
            return s.breakdown(where, f"|rho| = |(rt, r)| = {abs(rho):.3e} < eps^2 (rho "
                               "breakdown)", info=-10)
        if first:
            xp.copyto(p, r)
            first = False
        else:
            if abs(omega) < tiny:
                return s.breakdown(where, f"|omega| = {abs(omega):.3e} < eps^2 (omega "
                                   "breakdown)", info=-11)
            ops.bicgstab_p(p, r, v, (rho / rho_prev) * (alpha / omega), omega)
        # -- first half: s = r - alpha v
        ph = p if s.M is None else kept(s.M(p), phb)     # p is not written before the next p
        v = kept(s.A(ph), vb)
        rv_d = ops.dot(rt, v)
        ops.sub_ratio(r, rho_d, rv_d, v)              # r now holds s
        rv, ss = ops.host(rv_d, ops.dot(r, r))        # synchronisation 1
        if rv == 0:
            return s.breakdown(where, "(rt, A M p) == 0 (omega breakdown)", info=-11)
        alpha = rho / rv
        snorm = math.sqrt(max(ss.real, 0.0)) if ss == ss else float("nan")
        if not math.isfinite(snorm) or not math.isfinite(abs(alpha)):
            return s.breakdown(where, "NaN or Inf in the iteration")
        if snorm <= tol:                              # SciPy's early exit
            ops.axpy2(x, alpha, ph, 0.0, ph)
            s.residual(x, out=r)
            rnorm = s.norm(r)
            if rnorm <= tol:
                return x, 0
            xp.copyto(rt, r)                          # drifted: restart
            rho_d = ops.dot(rt, r)
            rho, = ops.host(rho_d)
            first = True
            continue
        # -- second half: r = s - omega t
        sh = kept(r if s.M is None else s.M(r), shb)      # r is overwritten below
        t = s.A(sh)
        ts_d, tt_d = ops.dot(t, r), ops.dot(t, t)
        ops.sub_ratio(r, ts_d, tt_d, t)
        rho_prev = rho
        rho_d = ops.dot(rt, r)
        ts, tt, rr, rho = ops.host(ts_d, tt_d, ops.dot(r, r), rho_d)   # synchronisation 2
        omega = ts / tt if tt != 0 else 0.0
        ops.axpy2(x, alpha, ph, omega, sh)
        rnorm = math.sqrt(max(rr.real, 0.0)) if rr == rr else float("nan")
        if s.callback is not None:
            s.callback(x)
        if not math.isfinite(rnorm):
            return s.breakdown(where, "the residual became NaN or Inf", rnorm=rnorm)

    if rnorm <= tol:                                  # passed in the last iteration
        s.residual(x, out=r)
        rnorm = s.norm(r)
        if rnorm <= tol:
            return x, 0
    return s.not_converged(s.maxiter, f"{s.maxiter} iterations")
