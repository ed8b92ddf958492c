r"""pyamg's own relaxation and coarse solvers inside adaptmg's cycle (for :func:`from_pyamg`).

Relaxation.  pyamg keeps the smoothers of level ``i`` as callables
``presmoother(A_i, x, b)`` / ``postsmoother(A_i, x, b)`` that update ``x`` in place
(:math:`x \leftarrow S(x, b)`, ``iterations`` sweeps each, C++ kernels on the host):
Gauss-Seidel in pyamg's lexicographic order, Kaczmarz (``gauss_seidel_nr/ne``),
Schwarz, C/F Jacobi, Krylov smoothers, with pyamg's handling of zero diagonals
and singular blocks.  :class:`PyamgRelaxation` runs exactly these callables on
the host level matrix: pre-smoothing calls ``presmoother``, post-smoothing
(``smooth_adjoint``, what :class:`~adaptmg.multilevel.MultilevelSolver` calls after
the coarse correction) ``postsmoother``.  It is the CPU's smoother of
``from_pyamg(..., relax="auto")``: the cycle is then pyamg's cycle, operation for
operation.  NumPy arrays only (a GPU hierarchy maps pyamg's smoothers to adaptmg's).

Coarse solvers.  pyamg's ``ml.coarse_solver`` is made by
``pyamg.multilevel.coarse_grid_solver(name_or_callable, kwargs)``;
:func:`read_coarse_solver` reads the name and ``kwargs`` back.  The direct ones
are linear operators :math:`x_0 = C b_0` that :func:`coarse_operator` forms as a
dense matrix exactly as pyamg applies them (so the cycle applies :math:`C` as one
GEMV, on the host or the device):

==========  ==========================================================================
pinv/pinv2  :math:`C = A_0^+` (``scipy.linalg.pinv(A_0, **kwargs)``, pyamg's call)
lu          :math:`C = A_0^{-1}` by ``lu_factor``/``lu_solve`` (``kwargs`` passed on)
cholesky    :math:`C = A_0^{-1}` by ``cho_factor``/``cho_solve``
splu        :math:`C = M (M^T A_0 M)^{-1} M^T`, :math:`M` the identity's columns of the
            non-empty columns of :math:`A_0` (pyamg drops empty rows/columns)
None        :math:`C = 0` (no coarse correction)
==========  ==========================================================================

and ``nnz(A_0) = 0`` gives :math:`C = 0` as in pyamg.  The iterative ones (Krylov
methods, relaxation, a user's callable) are not linear operators of a fixed
matrix: on the CPU :func:`from_pyamg` calls pyamg's ``coarse_solver`` itself
(:class:`HostCoarseSolver`); on the GPU :class:`DeviceCoarseSolver` runs adaptmg's
counterpart on the device: ``cg``/``gmres``/``bicgstab``/``minres`` of
:mod:`adaptmg.linalg` with pyamg's ``tol`` (relative residual) and ``maxiter``,
``jacobi`` as ``iterations`` Jacobi sweeps from zero with pyamg's weight
:math:`\omega / \rho(D^{-1} A_0)` (pyamg's own estimate of :math:`\rho`), and
``gauss_seidel`` as multicolour sweeps (colour order, not pyamg's: a
:class:`CoarseSolverWarning` says so); anything else is replaced by :math:`A_0^+` with
a :class:`CoarseSolverWarning` naming it.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

__all__ = ["PyamgRelaxation", "HostCoarseSolver", "DeviceCoarseSolver", "CoarseSolverWarning", "read_coarse_solver",
           "coarse_operator", "closure_values", "DIRECT_COARSE"]

#: pyamg coarse solvers that are one fixed linear operator (formed densely here)
DIRECT_COARSE = ("pinv", "pinv2", "lu", "cholesky", "splu", None)


class CoarseSolverWarning(UserWarning):
    """pyamg's coarse solver has no equivalent on this backend; the message names it and
    what runs instead."""


def closure_values(fn):
    """``{free variable: value}`` of a closure (pyamg's smoothers and coarse solvers keep
    their parameters there); empty cells are left out."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    out = {}
    for k, c in zip(code.co_freevars, cells):
        try:
            out[k] = c.cell_contents
        except ValueError:          # empty cell
            pass
    return out


def read_coarse_solver(ml):
    """``(solver, kwargs)`` of pyamg's ``ml.coarse_solver``: ``solver`` a name (``'pinv'``),
    ``None`` or the user's callable, as given to ``coarse_grid_solver``.  Raises
    ``TypeError`` for a coarse solver that ``coarse_grid_solver`` did not make."""
    cs = getattr(ml, "coarse_solver", None)
    cls = type(cs)
    name_fn = getattr(getattr(cls, "name", None), "__func__", None)
    info = closure_values(name_fn) if name_fn is not None else {}
    if cs is None or "solver" not in info:
        raise TypeError("from_pyamg: ml.coarse_solver was not made by pyamg.multilevel."
                        f"coarse_grid_solver (got {type(cs).__name__})")
    inner = closure_values(getattr(cls, "__call__", None)).get("solve")
    kwargs = dict(closure_values(inner).get("kwargs", {}) or {})
    return info["solver"], kwargs


def coarse_label(solver, kwargs):
    name = solver if isinstance(solver, str) or solver is None else \
        getattr(solver, "__name__", type(solver).__name__)
    return f"{name!r}" + (f" {kwargs}" if kwargs else "")


def coarse_operator(solver, kwargs, A0):
    """The dense host matrix :math:`C` with ``x_0 = C b_0`` of pyamg's direct coarse solver
    ``solver`` (one of :data:`DIRECT_COARSE`) on the host matrix ``A0``, formed as pyamg
    applies it (table in the module docstring).  Raises ``ValueError`` where the factorisation
    fails or gives a non-finite operator (a singular ``A0`` with ``'lu'``, say)."""
    if solver not in DIRECT_COARSE:
        raise ValueError(f"coarse_operator: {solver!r} is not one of {DIRECT_COARSE}")
    A0 = sp.csr_matrix(A0)
    n = A0.shape[0]
    dt = np.promote_types(A0.dtype, np.float64)
    if solver is None or A0.nnz == 0:
        return np.zeros((n, n), dt)
    Ad = A0.toarray().astype(dt)
    eye = np.eye(n, dtype=dt)
    try:
        if solver in ("pinv", "pinv2"):
            C = sla.pinv(Ad, **kwargs)
        elif solver == "lu":
            C = sla.lu_solve(sla.lu_factor(Ad, **kwargs), eye)
        elif solver == "cholesky":
            C = sla.cho_solve(sla.cho_factor(Ad, **kwargs), eye)
        else:                                            # splu on the non-empty columns
            Acsc = A0.tocsc().astype(dt)
            Acsc.eliminate_zeros()
            keep = np.flatnonzero(np.diff(Acsc.indptr))
            sub = Acsc[keep][:, keep].tocsc()
            C = np.zeros((n, n), dt)
            C[np.ix_(keep, keep)] = spla.splu(sub, **kwargs).solve(eye[np.ix_(keep, keep)])
    except (np.linalg.LinAlgError, RuntimeError, ValueError) as exc:
        raise ValueError(f"from_pyamg: pyamg's coarse solver {solver!r} fails on the coarse "
                         f"matrix ({n} x {n}): {exc}") from None
    if not np.all(np.isfinite(C)):
        raise ValueError(f"from_pyamg: pyamg's coarse solver {solver!r} gives a non-finite "
                         f"operator on the coarse matrix ({n} x {n}; singular?)")
    return np.ascontiguousarray(C)


class HostCoarseSolver:
    """pyamg's ``ml.coarse_solver`` called on the host: ``x_0 = coarse_solver(A_0, b_0)``
    (its iterative solvers, relaxation or a user's callable, exactly as pyamg runs them).
    NumPy arrays only."""

    def __init__(self, fn, A0, label):
        self.fn, self.A0, self.label = fn, A0, label

    def __call__(self, b, x):
        x[...] = np.asarray(self.fn(self.A0, b)).reshape(x.shape)
        return x

    def __repr__(self):
        return f"pyamg {self.label} (host)"


#: pyamg's Krylov coarse solvers that :mod:`adaptmg.linalg` has
KRYLOV_COARSE = ("cg", "gmres", "bicgstab", "minres")


class DeviceCoarseSolver:
    """pyamg's iterative coarse solver ``name`` (with pyamg's ``kwargs``) done by adaptmg on
    the backend's arrays (module docstring); ``exact`` is False for Gauss-Seidel (colour
    order).  ``A0`` is pyamg's coarse matrix object (pyamg caches its ``rho`` estimate there,
    so Jacobi gets pyamg's weight).  ``supports(name)``: whether there is a counterpart."""

    @staticmethod
    def supports(name):
        return name in KRYLOV_COARSE or name in ("jacobi", "gauss_seidel")

    def __init__(self, name, kwargs, A0, backend, dtype, label):
        from .smoothers import make_smoother
        if not self.supports(name):
            raise ValueError(f"DeviceCoarseSolver: no counterpart of pyamg's {name!r}")
        self.name, self.label, self.exact = name, label, name != "gauss_seidel"
        A_pyamg, A0 = A0, sp.csr_matrix(A0)      # pyamg caches rho on its own matrix object
        self.A = backend.asmatrix(A0, dtype=dtype)
        kw = dict(kwargs)
        if name in KRYLOV_COARSE:
            from .. import linalg
            self.f = getattr(linalg, name)
            self.tol = float(kw.get("tol", 1e3 * np.finfo(dtype).eps))     # pyamg's set_tol
            self.maxiter = kw.get("maxiter")
            return
        self.iterations = int(kw.get("iterations", 10))          # coarse_grid_solver's default
        if name == "jacobi":
            from pyamg.relaxation.smoothing import rho_D_inv_A
            omega = float(kw.get("omega", 1.0))
            if kw.get("withrho", True):
                omega /= float(rho_D_inv_A(A_pyamg))     # the value pyamg uses (cached)
            self.sm = make_smoother("jacobi", self.A, backend=backend, dtype=dtype, omega=omega)
        else:
            self.sm = make_smoother("gauss_seidel", self.A, backend=backend, dtype=dtype,
                                    sweep=kw.get("sweep", "forward"), singular="pinv")

    def __call__(self, b, x):
        if self.name in KRYLOV_COARSE:
            import warnings
            with warnings.catch_warnings():       # pyamg's coarse solve does not warn either
                warnings.simplefilter("ignore")
                x[...] = self.f(self.A, b, rtol=self.tol, maxiter=self.maxiter)[0]
            return x
        x.fill(0)
        self.sm.smooth(x, b, self.iterations)
        return x

    def __repr__(self):
        return f"{self.label} by adaptmg's {self.name}" + ("" if self.exact else
                                                           " (multicolour order)")


class PyamgRelaxation:
    """pyamg's level smoothers ``pre(A, x, b)`` / ``post(A, x, b)`` as an adaptmg smoother
    (``smooth`` runs ``pre`` ``sweeps`` times, ``smooth_adjoint`` ``post``); ``A`` is pyamg's
    level matrix (CSR or BSR, as pyamg's callables expect it; vectors of another dtype are
    cast to its dtype for the sweeps).  Host (NumPy) only."""

    name = "pyamg"

    def __init__(self, A, pre, post, label):
        if not (callable(pre) and callable(post)):
            raise TypeError("PyamgRelaxation: pre and post must be pyamg's smoother callables")
        self.A, self.pre, self.post, self.label = A, pre, post, label
        self.n = int(A.shape[0])
        self.note = None

    def _run(self, fn, x, b, sweeps):
        if not (isinstance(x, np.ndarray) and isinstance(b, np.ndarray)):
            raise TypeError("PyamgRelaxation runs pyamg's host smoothers: x and b must be "
                            f"NumPy arrays, got {type(x).__name__} and {type(b).__name__}")
        if x.dtype == self.A.dtype and b.dtype == self.A.dtype:
            for _ in range(int(sweeps)):
                fn(self.A, x, b)
            return x
        # pyamg's kernels take one dtype: a float32 level of a float64 hierarchy relaxes in
        # float32, as in pyamg's own cycle
        xs, bs = x.astype(self.A.dtype), b.astype(self.A.dtype)
        for _ in range(int(sweeps)):
            fn(self.A, xs, bs)
        x[...] = xs
        return x

    def smooth(self, x, b, sweeps=1):
        return self._run(self.pre, x, b, sweeps)

    def smooth_adjoint(self, x, b, sweeps=1):
        return self._run(self.post, x, b, sweeps)

    def __repr__(self):
        return f"PyamgRelaxation({self.label})"
