"""Krylov solvers with SciPy's signatures and semantics that run on NumPy or CuPy arrays.

``cg``, ``gmres``, ``bicgstab`` and ``minres`` are drop-in replacements for
their :mod:`scipy.sparse.linalg` namesakes (same arguments, defaults, meaning of
``maxiter`` and of the callback's argument, ``x0='Mb'``, ``atol`` validation,
``gmres``' ``callback_type`` with SciPy's default and DeprecationWarning);
SciPy's own test suite runs against them (``tests/linalg/test_scipy_cases.py``).
``refine`` (not in SciPy) is mixed-precision iterative refinement: the residual
in the precision of ``A`` and ``b``, the corrections by an inner solver of lower
precision (e.g. a float32 ``cg``), for tolerances below float32's attainable accuracy.
``fgmres`` is flexible GMRES (not in SciPy) with ``gmres``' arguments::

    x, info = gmres(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=None,
                    maxiter=None, M=None, callback=None, callback_type=None)

* ``A`` and ``M`` may be SciPy or cupyx sparse matrices, dense NumPy/CuPy
  arrays, SciPy or cupyx ``LinearOperator`` objects, any object with a
  ``matvec`` method or ``@``, or a plain callable ``x -> y``.  ``M``
  approximates ``A^{-1}`` (SciPy's convention); without ``M``, a ``psolve``
  method of ``A`` is used, as in SciPy.
* The work happens on the backend that holds ``b``; the solution is an array of
  the same kind as ``b`` (NumPy in, NumPy out; CuPy in, CuPy out).
* Stopping test: ``||b - A x|| <= max(rtol * ||b||, atol)`` (``minres``:
  ``rtol * ||b||``).  ``info == 0`` is returned only after this was checked with
  the *true* residual ``b - A x`` recomputed from the returned ``x`` (SciPy
  trusts its recurrences).  ``info > 0``: not converged, ``maxiter``; a
  :class:`ConvergenceWarning` is emitted too.  ``info < 0``: breakdown (the
  method cannot continue, e.g. a singular operator); a warning says why.
  Illegal input raises ``TypeError``/``ValueError`` instead (``atol=None`` or
  ``'legacy'``: ValueError, as in SciPy).

Callbacks: ``cg``, ``bicgstab``, ``minres`` call ``callback(xk)`` once per
iteration; ``gmres``/``fgmres`` as selected by ``callback_type`` (``'x'``: the
iterate once per restart cycle; ``'pr_norm'``: the monitored residual over
``||b||`` once per inner iteration; ``'legacy'``, gmres' default: the same, and
``maxiter`` counts inner iterations).
"""


class ConvergenceWarning(UserWarning):
    """A Krylov solver stopped without reaching the requested tolerance."""


# The solver modules import ConvergenceWarning from this package, so it must be
# defined before they are imported.
from .bicgstab import bicgstab  # noqa: E402
from .cg import cg  # noqa: E402
from .gmres import fgmres, gmres  # noqa: E402
from .minres import minres  # noqa: E402
from .refine import refine  # noqa: E402

__all__ = ["cg", "gmres", "fgmres", "bicgstab", "minres", "refine", "ConvergenceWarning"]
