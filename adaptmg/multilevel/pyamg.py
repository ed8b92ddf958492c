r"""Run a pyamg hierarchy with adaptmg's multigrid cycles (on the GPU where present).

pyamg builds algebraic hierarchies (smoothed aggregation, Ruge-Stueben, ...) on
the host: per level a matrix :math:`A_l`, a prolongation :math:`P_l` and a
restriction :math:`R_l` (``levels[0]`` is pyamg's *finest* level).  Its cycles
run on the CPU.  :func:`from_pyamg` copies exactly these matrices into an
:class:`adaptmg.multilevel.MultilevelSolver` (levels reordered coarse -> fine,
``R`` stored explicitly, never applied as ``P^T``), so the same hierarchy is
cycled with adaptmg's fused CSR kernels, on the GPU when ``backend`` says so::

    ml = pyamg.smoothed_aggregation_solver(A)
    mg = adaptmg.from_pyamg(ml)                         # GPU if available
    x, info = adaptmg.linalg.cg(A_gpu, b_gpu, rtol=1e-8, M=mg.aspreconditioner())

The cycle is pyamg's (seed 001, Algorithm 1): pre-smoothing, residual,
restriction ``b_c = R_l r``, coarse correction, ``x += P_l x_c``,
post-smoothing; the coarsest level is solved with a dense inverse (pyamg's
default coarse solver ``'pinv'`` is the same operator for a non-singular
``A_0``).

Smoothers.  Gauss-Seidel (pyamg's default) is sequential and does not map to
the GPU; adaptmg uses its own parallel smoothers of the form
``x <- x + omega S (b - A x)``:

* ``smoother="jacobi"`` (default).  ``omega=None`` picks, per level,
  (1) pyamg's own weight when that level's pyamg pre-smoother is weighted
  Jacobi (then the adaptmg cycle is *the same operator* as pyamg's cycle, and
  so are the Krylov iteration counts), else (2) ``omega = 4 / (3 rho)`` with
  ``rho`` the spectral radius of :math:`D^{-1} A_l` that pyamg cached on the
  matrix (``A.rho_D_inv``) or a 20-step Lanczos estimate.  The number of sweeps
  (``presmooth``/``postsmooth``) likewise defaults to pyamg's ``iterations``
  of a Jacobi smoother, else 1 (pyamg's default).
* ``"chebyshev"`` / ``"block_jacobi"``: adaptmg's smoothers with
  ``smoother_kwargs``.

GPU memory: the hierarchy is moved once at setup; an allocation failure becomes
a :class:`MemoryError` naming the hierarchy size and what to do
(:func:`adaptmg.errors.gpu_memory_guard`).
"""
from __future__ import annotations

import functools
import numbers

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend
from ..errors import gpu_memory_guard
from .solver import Level, MultilevelSolver
from .smoothers import Jacobi, estimate_lambda_max, make_smoother

__all__ = ["from_pyamg"]

_SMOOTHERS = ("jacobi", "chebyshev", "block_jacobi")


def _csr(M, what):
    if not sp.issparse(M):
        raise TypeError(f"from_pyamg: {what} must be a SciPy sparse matrix, got {type(M).__name__}")
    M = sp.csr_matrix(M)            # BSR (pyamg's aggregation levels) -> CSR
    M.sum_duplicates()
    M.sort_indices()
    if M.dtype.kind not in "f":
        if M.dtype.kind in "iub":
            M = M.astype(np.float64)
        else:
            raise TypeError(f"from_pyamg: {what} must be real floating point, got dtype {M.dtype}")
    if not np.isfinite(M.data).all():
        raise ValueError(f"from_pyamg: {what} (shape {M.shape}) contains NaN or Inf")
    return M


def _pyamg_jacobi(smoother):
    """(omega, iterations) if ``smoother`` is pyamg's weighted Jacobi partial, else None."""
    if isinstance(smoother, functools.partial):
        fn = getattr(smoother.func, "__name__", "")
        kw = smoother.keywords or {}
        if fn == "jacobi" and "omega" in kw:
            return float(kw["omega"]), int(kw.get("iterations", 1))
    return None


def _rho(A):
    """Spectral radius of D^{-1} A: pyamg's cached value or a Lanczos estimate."""
    rho = getattr(A, "rho_D_inv", None)
    if rho is not None and np.isfinite(rho) and rho > 0:
        return float(rho)
    return float(estimate_lambda_max(A)) * 1.05


def _check_sweeps(name, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"from_pyamg: {name} must be a non-negative integer or None, got {v!r}")
    return int(v)


def from_pyamg(ml, backend="auto", smoother="jacobi", *, omega=None, presmooth=None,
               postsmooth=None, smoother_kwargs=None, dtype=np.float64, coarse="direct",
               max_direct=20000, coarse_sweeps=10):
    """Turn a pyamg ``MultilevelSolver`` into an adaptmg :class:`MultilevelSolver`.

    Parameters
    ----------
    ml : pyamg.multilevel.MultilevelSolver
        Any pyamg hierarchy: ``ml.levels[i].A`` for every level and
        ``.P``/``.R`` on all but pyamg's coarsest level.  BSR levels are
        converted to CSR.  ``R`` is used as given (pyamg stores it explicitly).
    backend : "auto" | "cpu" | "gpu"
        Where the cycles run ("auto": the GPU when CuPy sees a device).
    smoother : "jacobi" | "chebyshev" | "block_jacobi"
        adaptmg smoother on every level (see the module docstring).
    omega : float, optional
        Jacobi weight on every level; default per level: pyamg's Jacobi weight
        when pyamg uses Jacobi there, else ``4 / (3 rho(D^{-1} A_l))``.
    presmooth, postsmooth : int, optional
        Sweeps per level (default: pyamg's Jacobi ``iterations``, else 1).
    smoother_kwargs : dict, optional
        Extra arguments of the Chebyshev / block-Jacobi smoother.
    dtype : numpy float dtype
        Precision of the adaptmg hierarchy (float32 for mixed precision).
    coarse, max_direct, coarse_sweeps :
        Coarse solver of :class:`MultilevelSolver` (dense inverse by default).

    Returns
    -------
    MultilevelSolver
        ``.aspreconditioner()`` is a LinearOperator on the chosen backend that
        the :mod:`adaptmg.linalg` solvers (and SciPy / cupyx) accept as ``M``;
        ``.solve(b, accel="cg")`` solves directly.
    """
    levels_in = getattr(ml, "levels", None)
    if levels_in is None or not hasattr(ml, "aspreconditioner"):
        raise TypeError("from_pyamg: ml must be a pyamg MultilevelSolver (with .levels), "
                        f"got {type(ml).__name__}")
    levels_in = list(levels_in)
    if not levels_in:
        raise ValueError("from_pyamg: ml has no levels")
    if not isinstance(smoother, str) or smoother.lower().replace("-", "_") not in _SMOOTHERS:
        raise ValueError(f"from_pyamg: smoother must be one of {_SMOOTHERS}, got {smoother!r}")
    smoother = smoother.lower().replace("-", "_")
    if omega is not None:
        if isinstance(omega, bool) or not isinstance(omega, numbers.Real) or not np.isfinite(omega) \
                or omega <= 0:
            raise ValueError(f"from_pyamg: omega must be a positive number or None, got {omega!r}")
        if smoother != "jacobi":
            raise ValueError(f"from_pyamg: omega applies to smoother='jacobi', not {smoother!r} "
                             "(use smoother_kwargs)")
    presmooth = _check_sweeps("presmooth", presmooth)
    postsmooth = _check_sweeps("postsmooth", postsmooth)
    if smoother_kwargs is not None and not isinstance(smoother_kwargs, dict):
        raise TypeError(f"from_pyamg: smoother_kwargs must be a dict, got {type(smoother_kwargs).__name__}")
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"from_pyamg: dtype must be float32 or float64, got {dtype}")
    be = get_backend(backend)

    # ---- host matrices, pyamg order (fine -> coarse)
    As, Ps, Rs, infos = [], [], [], []
    L = len(levels_in)
    for i, lev in enumerate(levels_in):
        A = getattr(lev, "A", None)
        if A is None:
            raise ValueError(f"from_pyamg: ml.levels[{i}] has no matrix A")
        Ah = _csr(A, f"ml.levels[{i}].A")
        if Ah.shape[0] != Ah.shape[1]:
            raise ValueError(f"from_pyamg: ml.levels[{i}].A must be square, got shape {Ah.shape}")
        if hasattr(A, "rho_D_inv"):
            Ah.rho_D_inv = A.rho_D_inv
        As.append(Ah)
        infos.append(_pyamg_jacobi(getattr(lev, "presmoother", None)))
        if i < L - 1:
            if getattr(lev, "P", None) is None:
                raise ValueError(f"from_pyamg: ml.levels[{i}] (not the coarsest) has no P")
            P = _csr(lev.P, f"ml.levels[{i}].P")
            R = getattr(lev, "R", None)
            R = P.T.tocsr() if R is None else _csr(R, f"ml.levels[{i}].R")
            Ps.append(P)
            Rs.append(R)
    for i in range(L - 1):
        n, nc = As[i].shape[0], As[i + 1].shape[0]
        if Ps[i].shape != (n, nc):
            raise ValueError(f"from_pyamg: ml.levels[{i}].P has shape {Ps[i].shape}, expected "
                             f"{(n, nc)} (level {i} has {n} rows, level {i + 1} has {nc})")
        if Rs[i].shape != (nc, n):
            raise ValueError(f"from_pyamg: ml.levels[{i}].R has shape {Rs[i].shape}, expected {(nc, n)}")

    # ---- sweeps: pyamg's Jacobi iterations where known
    jac = [t for t in infos if t is not None]
    nsweep = jac[0][1] if jac else 1
    pre = nsweep if presmooth is None else presmooth
    post = nsweep if postsmooth is None else postsmooth

    nbytes = sum(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes for M in As + Ps + Rs)
    what = (f"moving a {L}-level pyamg hierarchy ({As[0].shape[0]} rows on the finest level, "
            f"{sum(M.nnz for M in As)} nonzeros in all A_l) to the {be.name}")
    with gpu_memory_guard(what, nbytes * dtype.itemsize / 8):
        levels = []
        skw = dict(smoother_kwargs or {})
        for i in range(L - 1, -1, -1):           # adaptmg: coarse -> fine
            A = be.asmatrix(As[i], dtype=dtype)
            if i < L - 1:
                P = be.asmatrix(Ps[i], dtype=dtype)
                R = be.asmatrix(Rs[i], dtype=dtype)
            else:
                P = R = None
            sm = None
            if i < L - 1 or coarse == "smoother":
                if smoother == "jacobi":
                    if omega is not None:
                        w = float(omega)
                    elif infos[i] is not None:
                        w = infos[i][0]
                    else:
                        w = 4.0 / (3.0 * _rho(As[i]))
                    sm = Jacobi(A, omega=w, backend=be, dtype=dtype)
                else:
                    sm = make_smoother(smoother, A, backend=be, dtype=dtype, **skw)
            meta = {"pyamg_level": i, "nnz": int(As[i].nnz)}
            levels.append(Level(A, P, R, smoother=sm, meta=meta))
        out = MultilevelSolver(levels, coarse=coarse, coarse_sweeps=coarse_sweeps, presmooth=pre,
                               postsmooth=post, backend=be, dtype=dtype, smoother=smoother,
                               smoother_kwargs=skw, max_direct=max_direct)
    return out
