"""Preconditioned conjugate gradients on NumPy or CuPy vectors.

For a Hermitian positive definite ``A`` and preconditioner ``M ~ A^{-1}``
(also Hermitian positive definite) the iteration is, with ``r_0 = b - A x_0``,
``z_0 = M r_0``, ``p_0 = z_0``::

    alpha_k = (r_k, z_k) / (p_k, A p_k)
    x_{k+1} = x_k + alpha_k p_k
    r_{k+1} = r_k - alpha_k A p_k
    z_{k+1} = M r_{k+1}
    beta_k  = (r_{k+1}, z_{k+1}) / (r_k, z_k)
    p_{k+1} = z_{k+1} + beta_k p_k

``x_k`` minimises the A-norm of the error over ``x_0 + K_k(MA, M r_0)``.

One iteration costs one product with ``A``, one application of ``M``, three
inner products (``(p, A p)``, ``(r, r)``, ``(r, z)``) and two fused vector
updates (one kernel each on the GPU).  On the GPU the scalars ``alpha`` and
``beta`` never leave the device; the only host synchronisation per iteration
brings back ``||r_{k+1}||^2`` (for the stopping test) together with the two
denominators (for breakdown detection), in one transfer.

The recurrence residual ``r_k`` drifts from ``b - A x_k`` in floating point.
When it passes the stopping test the true residual is recomputed; if that
one fails, it replaces ``r_k`` and the iteration restarts from it.

SciPy's semantics (:func:`scipy.sparse.linalg.cg`): ``maxiter`` counts
iterations (default ``10 n``), ``callback(xk)`` is called after each one,
``x0='Mb'`` starts from ``M b``, ``A.psolve`` is the preconditioner when ``M`` is
None.  Unlike SciPy, a (numerical) breakdown is detected and reported
(``info < 0``), and ``info == 0`` is only returned after the true residual
passed the test (SciPy tests its recurrence residual only).
"""
from __future__ import annotations

import math

from ._system import prepare_system
from ._vectorops import VectorOps

__all__ = ["cg"]


def cg(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, callback=None):
    """Solve ``A x = b`` with preconditioned conjugate gradients.

    Parameters
    ----------
    A : sparse or dense matrix, LinearOperator, object with ``matvec`` or ``@``, or callable
        The Hermitian positive definite ``n x n`` system matrix.
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
        Hermitian positive definite preconditioner approximating ``A^{-1}``
        (default: ``A.psolve`` if ``A`` has one, else none).
    callback : callable, optional
        Called as ``callback(xk)`` after each iteration with the current iterate
        (the solver's own array: copy it to keep it).

    Returns
    -------
    x : ndarray, shape (n,)
        Same kind of array as ``b``.
    info : int
        0: converged (checked with the true residual); >0: ``maxiter`` iterations
        done without converging (a :class:`ConvergenceWarning` is emitted);
        <0: breakdown (``(p, A p) == 0`` or ``(r, M r) == 0`` or non-finite values).
    """
    s = prepare_system("cg", A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
                       callback=callback)
    xp, x, tol = s.xp, s.x, s.tol
    started = s.start()
    if started is None:
        return x, 0
    r, rnorm = started
    ops = VectorOps(s.backend, s.n, s.dtype)
    p = xp.empty_like(x)

    def precondition(res):
        return res if s.M is None else s.M(res)

    z = precondition(r)
    rz = ops.dot(r, z)
    xp.copyto(p, z)
    for k in range(1, s.maxiter + 1):
        q = s.A(p)
        pq = ops.dot(p, q)
        ops.cg_update_xr(x, r, p, q, rz, pq)
        rr, pq_h, rz_h = ops.host(ops.dot(r, r), pq, rz)       # the one sync
        rnorm = math.sqrt(max(rr.real, 0.0)) if _finite(rr) else float("nan")
        if s.callback is not None:
            s.callback(x)
        if not _finite(rnorm):
            return s.breakdown(f"at iteration {k}", "the residual became NaN or Inf",
                               rnorm=rnorm)
        restart = False
        if rnorm <= tol:
            s.residual(x, out=r)                              # the true residual
            rnorm = s.norm(r)
            if rnorm <= tol:
                return x, 0
            restart = True                                    # recurrence drifted
        elif pq_h == 0:
            return s.breakdown(f"at iteration {k}",
                               "(p, A p) == 0: A is singular or not definite")
        elif rz_h == 0:
            return s.breakdown(f"at iteration {k}",
                               "(r, M r) == 0: M is singular or not definite")
        z = precondition(r)
        rz_new = ops.dot(r, z)
        if restart:
            xp.copyto(p, z)
        else:
            ops.cg_update_p(p, z, rz_new, rz)
        rz = rz_new

    return s.not_converged(s.maxiter, f"{s.maxiter} iterations")


def _finite(v) -> bool:
    return v == v and abs(v) != float("inf")
