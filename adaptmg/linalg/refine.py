"""Mixed-precision iterative refinement around an inner (low-precision) solver.

A solver whose vectors and operator are float32 cannot push the residual of
``A x = b`` below its attainable accuracy, about ``eps32 * ||A|| ||x||`` (the rounding of
one operator apply; it grows with the number of unknowns).  Iterative refinement keeps
the residual in the working precision of ``A`` and ``b`` (float64) and only the
corrections in low precision::

    r_0 = b - A x_0
    repeat:  solve  A_low d_j = r_j / ||r_j||  to  ||r_j/||r_j|| - A_low d_j|| <= tau_j   (inner)
             x_{j+1} = x_j + ||r_j|| d_j                                              (float64)
             r_{j+1} = b - A x_{j+1}                                                   (float64)
    until ||r_j|| <= max(rtol ||b||, atol)

Each outer step reduces the true residual by about ``tau_j`` plus the inner solver's
own rounding floor, so any inner tolerance well above that floor converges; the floor
only has to stay below 1, not below ``rtol``.  The inner right-hand side is scaled to
unit norm, so a tiny residual cannot underflow in float32.  The inner tolerance of a
step is ``tau_j = max(inner_rtol, 0.5 * tol / ||r_j||)``: the last step solves only as
far as the outer test needs, with a factor 2 to spare.

Cost: one product with ``A`` (float64) and three float64 vectors (x, r, b) besides the
inner solver's; the inner Krylov space is rebuilt every outer step, so the inner
iterations add up to somewhat more than one uninterrupted solve's (with ``inner_rtol``
1e-3 about one extra start per three decades of reduction).
"""
from __future__ import annotations

import math

from ._system import check_tol, prepare_system, warn

__all__ = ["refine"]

#: the outer loop stops, as stagnated, after this many steps in a row that did not
#: reduce the residual by at least STALL_FACTOR
STALL_STEPS = 2
STALL_FACTOR = 0.9


def refine(A, b, x0=None, *, inner, rtol=1e-5, atol=0.0, inner_rtol=1e-3, maxiter=None,
           callback=None):
    """Solve ``A x = b`` to ``||b - A x|| <= max(rtol ||b||, atol)`` by iterative refinement.

    Parameters
    ----------
    A : any operator :func:`adaptmg.linalg.cg` takes (matrix, LinearOperator, ``matvec``,
        callable): the working-precision operator of the residual ``b - A x``.
    b, x0 : NumPy or CuPy vectors (x0 is copied; default zero).
    inner : callable ``inner(r, tau, maxiter) -> (d, iterations)``: an approximate solve of
        ``A d = r`` to ``||r - A d|| <= tau ||r||`` in at most ``maxiter`` iterations, in
        any (lower) precision; ``r`` comes in the working precision with ``||r|| = 1``.
        It should not warn when it stops at ``maxiter``: the outer loop reports.
    inner_rtol : the inner tolerance (0 < inner_rtol < 1), above the inner solver's
        attainable accuracy (float32 PCG: about 1e-6 .. 1e-5 at 1e7 unknowns).
    maxiter : the inner iterations of all steps together (default ``10 n``).
    callback : ``callback(xk)`` after each outer step.

    Returns
    -------
    x, info, iterations, steps : the solution (same kind of array as ``b``), 0 when the
        true residual met the tolerance, > 0 (the inner iterations done) when ``maxiter``
        ran out or the residual stagnated (with a :class:`ConvergenceWarning`), < 0 when
        the residual became NaN/Inf; the inner iterations of all steps, the outer steps.
    """
    if not callable(inner):
        raise TypeError(f"inner must be a callable inner(r, tau, maxiter) -> (d, iterations), "
                        f"got {type(inner).__name__}")
    inner_rtol = check_tol(inner_rtol, "inner_rtol")
    if not 0.0 < inner_rtol < 1.0:
        raise ValueError(f"inner_rtol must lie in (0, 1), got {inner_rtol!r}")
    s = prepare_system("refine", A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=None,
                       callback=callback)
    x, tol = s.x, s.tol
    started = s.start()
    if started is None:
        return x, 0, 0, 0
    r, rnorm = started
    its = steps = stalled = 0
    while True:
        tau = max(inner_rtol, 0.5 * tol / rnorm)
        d, n = inner(r / rnorm, tau, s.maxiter - its)
        its, steps = its + int(n), steps + 1
        d = d.astype(s.dtype, copy=True)
        d *= rnorm
        x += d
        del d
        s.residual(x, out=r)
        last, rnorm = rnorm, s.norm(r)
        if s.callback is not None:
            s.callback(x)
        if not math.isfinite(rnorm):
            x, info = s.breakdown(f"in outer step {steps}", "the residual became NaN or Inf",
                                  rnorm=rnorm)
            return x, info, its, steps
        if rnorm <= tol:
            return x, 0, its, steps
        stalled = stalled + 1 if rnorm > STALL_FACTOR * last else 0
        if stalled >= STALL_STEPS or its >= s.maxiter:
            why = (f"{steps} outer steps ({its} inner iterations); the last {stalled} reduced "
                   f"the residual by less than {STALL_FACTOR:g} each (the inner solver's "
                   f"attainable accuracy lies above inner_rtol={inner_rtol:g}, or it is no "
                   f"solver of A)" if stalled >= STALL_STEPS
                   else f"{its} inner iterations (maxiter) in {steps} outer steps")
            x, _ = s.not_converged(max(its, 1), why, rnorm=rnorm)
            return x, max(its, 1), its, steps
