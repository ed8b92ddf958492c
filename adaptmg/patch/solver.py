"""Multigrid with the vertex-patch smoother on Cartesian Q_k (seed 000 §2.1).

* :class:`FastDiagSolver` -- exact solve of a whole level by fast
  diagonalisation of the global 1D matrices (the Cartesian level matrix is
  itself a Kronecker sum); used on the coarsest level (Algorithm 2.1, line 3).
* :class:`PatchMultigrid` -- the level hierarchy (matrix-free operators,
  patch smoothers, Kronecker interpolation), the V-cycle (Algorithm 2.1, one
  pre-smoothing and one post-smoothing sweep with the colors reversed), full
  multigrid (Algorithm 2.2) and GMRES preconditioned by the V-cycle, in double
  or in mixed precision (V-cycle in float32 inside float64 iterations, §4.2).
* :func:`patch_levels` -- the same hierarchy as a list of Level-compatible
  objects (finest first) for :mod:`adaptmg.multigrid`.

Mixed precision comes in two forms: ``method="gmres"`` runs float64 GMRES
(right preconditioned) with a float32 V-cycle; ``method="fmg"`` is the
memory-lean one: the FMG start in float32, then iterative refinement
``x <- x + V32(0, float32(b - A x))`` with the residual in float64.  It keeps
three float64 vectors (x, b, r) on the finest level and float32 vectors for
the cycle, which is what makes 10^9 unknowns fit on one 80 GB GPU.
"""
from __future__ import annotations

import time

import numpy as np

from ..backend import get_backend
from .operator import LaplaceOperator, _check_space, check_dtype, contract
from .smoother import PatchSmoother
from .tensor import fast_diag_factors, interval_matrices
from .transfer import prolongation, restriction

__all__ = ["FastDiagSolver", "PatchMultigrid", "PatchLevel", "patch_levels"]


class FastDiagSolver:
    """Exact ``A^{-1} b`` on a whole (small) level:
    ``A = sum_d c_d (Mg x .. x Ag(d) x .. x Mg)`` with the assembled 1D
    interior matrices, so ``A^{-1} = (x_d S_d) diag(sum_d c_d lam_d)^{-1}
    (x_d S_d)^T`` with ``Ag_d S_d = Mg_d S_d diag(lam_d)``.  Dense 1D
    eigenvectors: meant for coarse levels (N_d up to a few hundred)."""

    def __init__(self, space, backend="cpu", dtype=np.float64):
        self.space = _check_space(space)
        self.backend = get_backend(backend)
        self.dtype = check_dtype(dtype)
        if max(space.n1d) > 2000:
            raise ValueError(f"{space} is too large for the dense fast-diagonalisation solver")
        xp = self.backend.xp
        d = space.dim
        S, lam = [], []
        for n in space.cells:                                  # x first
            Mg, Ag = interval_matrices(space.k, n)
            s, l_ = fast_diag_factors(Ag.toarray(), Mg.toarray())
            S.append(s)
            lam.append(l_)
        D = np.zeros(space.shape)
        for ax in range(d):
            sh = [1] * d
            sh[ax] = space.shape[ax]
            D = D + space.coeffs[d - 1 - ax] * lam[d - 1 - ax].reshape(sh)
        self._S = [xp.asarray(s, dtype=self.dtype) for s in S]
        self._Dinv = xp.asarray(1.0 / D, dtype=self.dtype)
        self.shape = (space.n_dofs, space.n_dofs)

    def solve(self, b):
        d = self.space.dim
        T = b.reshape(self.space.shape)
        for a in range(1, d + 1):
            T = contract(self._S[a - 1].T, T, a)
        T = T * self._Dinv
        for a in range(1, d + 1):
            T = contract(self._S[a - 1], T, a)
        return T.reshape(-1)

    __call__ = solve

    def __matmul__(self, b):
        return self.solve(b)

    def smooth(self, x, b, sweeps=1, **kw):
        """Exact 'smoother': ``x <- A^{-1} b`` (for a driver's coarse level)."""
        x[...] = self.solve(b)
        return x

    def smooth_adjoint(self, x, b, sweeps=1, **kw):
        return self.smooth(x, b, sweeps)


class PatchLevel:
    """Level-compatible record: ``A``, ``P`` (from the next coarser level),
    ``R``, ``smoother``, ``meta`` (a dict)."""

    def __init__(self, A, P=None, R=None, smoother=None, meta=None):
        self.A, self.P, self.R, self.smoother = A, P, R, smoother
        self.meta = dict(meta or {})

    def __repr__(self):
        return f"PatchLevel(n={self.A.shape[0]}, meta={self.meta})"


def _default_coarse_level(space):
    lvl = 0
    while lvl < space.level and min(b << lvl for b in space.base) < 2:
        lvl += 1
    return lvl


class PatchMultigrid:
    """Geometric multigrid on ``space`` and its coarser levels.

    Parameters
    ----------
    space : CartesianSpace (finest level)
    backend : "cpu" | "gpu" | "auto" | Backend
    dtype : float64 or float32 (precision of the cycle)
    coarse_level : level of the exact coarse solve (default: the first level
        with at least 2 cells per direction, where one vertex patch covers
        the whole domain)
    """

    def __init__(self, space, backend="cpu", dtype=np.float64, coarse_level=None):
        self.space = _check_space(space)
        self.backend = get_backend(backend)
        self.dtype = check_dtype(dtype)
        lmin = _default_coarse_level(space) if coarse_level is None else coarse_level
        if isinstance(lmin, bool) or not isinstance(lmin, (int, np.integer)):
            raise TypeError(f"coarse_level must be an int, got {type(lmin).__name__}")
        if not 0 <= lmin <= space.level:
            raise ValueError(f"coarse_level must be in 0..{space.level}, got {lmin}")
        self.lmin = int(lmin)
        be, dt = self.backend, self.dtype
        self.spaces = [space.with_level(l) for l in range(self.lmin, space.level + 1)]
        self.A = [LaplaceOperator(s, be, dt) for s in self.spaces]
        self.S = [None] + [PatchSmoother(s, be, dt) for s in self.spaces[1:]]
        self.P = [None] + [prolongation(s, be, dt) for s in self.spaces[:-1]]
        self.R = [None] + [restriction(s, be, dt) for s in self.spaces[:-1]]
        self.coarse = FastDiagSolver(self.spaces[0], be, dt)
        self._mixed = None
        self.stats = {}

    def __repr__(self):
        rows = [f"PatchMultigrid(dim={self.space.dim}, k={self.space.k}, backend={self.backend.name}, "
                f"dtype={self.dtype})"]
        for s in reversed(self.spaces):
            rows.append(f"  level {s.level:2d}: cells {s.cells}, {s.n_dofs} DoFs")
        return "\n".join(rows)

    # -- cycles ------------------------------------------------------------
    def _check_rhs(self, b, dtype=None):
        self.space.check_vector(b, "b")
        if self.backend.is_gpu != type(b).__module__.startswith("cupy"):
            raise TypeError(f"b of type {type(b).__name__} is not on backend {self.backend.name!r}")
        if dtype is not None and b.dtype != dtype:
            raise TypeError(f"b has dtype {b.dtype}, expected {dtype}")

    def _vcycle(self, i, x, b):
        if i == 0:
            x[...] = self.coarse.solve(b)
            return x
        A, S = self.A[i], self.S[i]
        S.smooth(x, b, 1)
        r = A.matvec(x)
        self.backend.xp.subtract(b, r, out=r)
        rc = self.R[i] @ r
        xc = self.backend.xp.zeros_like(rc)
        self._vcycle(i - 1, xc, rc)
        x += self.P[i] @ xc
        S.smooth(x, b, 1, reverse=True)
        return x

    def vcycle(self, b, x=None):
        """One V-cycle on the finest level: returns ``V(x, b)`` (x updated in
        place when given, else started from zero)."""
        self._check_rhs(b, self.dtype)
        if x is None:
            x = self.backend.xp.zeros_like(b)
        return self._vcycle(len(self.spaces) - 1, x, b)

    def aspreconditioner(self):
        """``M(r) = V(0, r)`` as a callable; casts to the cycle's dtype and back."""
        def M(r):
            rr = r.astype(self.dtype, copy=False)
            z = self._vcycle(len(self.spaces) - 1, self.backend.xp.zeros_like(rr), rr)
            return z.astype(r.dtype, copy=False)
        return M

    def _fmg_start(self, b):
        """Algorithm 2.2 lines 1-4: coarse solve, then prolongate + V-cycle per level."""
        bs = [b]
        for i in range(len(self.spaces) - 1, 0, -1):
            bs.append(self.R[i] @ bs[-1])
        bs.reverse()
        x = self.coarse.solve(bs[0])
        for i in range(1, len(self.spaces)):
            x = self.P[i] @ x
            self._vcycle(i, x, bs[i])
        return x

    def _mixed_mg(self):
        if self.dtype == np.float32:
            return self
        if self._mixed is None:
            self._mixed = PatchMultigrid(self.space, self.backend, np.float32, self.lmin)
        return self._mixed

    def solve(self, b, *, rtol=1e-9, maxiter=50, method="fmg", precision="double",
              restart=10, x0=None, krylov="adaptmg"):
        """Solve ``A x = b`` on the finest level to ``||b - A x|| <= rtol ||b||``.

        method : "fmg" (Algorithm 2.2; iterations = V-cycles after the FMG start)
                 or "gmres" (right-preconditioned by one V-cycle).
        precision : "double" (cycle in float64) or "mixed" (cycle in float32,
                 residuals and Krylov vectors in float64).
        krylov : "adaptmg" (:func:`adaptmg.linalg.fgmres`) or "private"
                 (:func:`adaptmg.patch.krylov.gmres`, flexible too); maxiter counts
                 inner iterations for both.  adaptmg.linalg preallocates
                 2 (restart + 1) vectors: keep ``restart`` small (default 10;
                 the V-cycle needs <= 9 iterations).
        Returns ``(x, info)``; info has iterations, residual history, converged,
        time (seconds, device-synchronised)."""
        if method not in ("fmg", "gmres"):
            raise ValueError(f"method must be 'fmg' or 'gmres', got {method!r}")
        if krylov not in ("adaptmg", "private"):
            raise ValueError(f"krylov must be 'adaptmg' or 'private', got {krylov!r}")
        if precision not in ("double", "mixed"):
            raise ValueError(f"precision must be 'double' or 'mixed', got {precision!r}")
        if self.dtype != np.float64:
            raise TypeError("solve() needs a float64 hierarchy (use precision='mixed' for float32 cycles)")
        self._check_rhs(b, np.float64)
        xp = self.backend.xp
        mg = self._mixed_mg() if precision == "mixed" else self
        A = self.A[-1]
        self.backend.synchronize()
        t0 = time.perf_counter()
        bnorm = float(xp.linalg.norm(b))
        hist = []
        if method == "gmres":
            if krylov == "adaptmg":
                # the project's Krylov solvers; flexible GMRES, since a float32
                # V-cycle is a (slightly) nonlinear preconditioner
                from ..linalg import fgmres
                x, info = fgmres(A, b, x0=x0, rtol=rtol, restart=restart,
                                 maxiter=max(1, -(-maxiter // restart)), M=mg.aspreconditioner(),
                                 callback=lambda rel: hist.append(rel))
            else:
                from .krylov import gmres
                x, info = gmres(A, b, x0=x0, rtol=rtol, restart=restart, maxiter=maxiter,
                                M=mg.aspreconditioner(),
                                callback=lambda rn: hist.append(rn / bnorm))
            it = len(hist)
            conv = info == 0
        else:
            if x0 is None:
                x = mg._fmg_start(b.astype(mg.dtype, copy=False)).astype(np.float64, copy=False)
            else:
                x = x0.astype(np.float64, copy=True)
            r = b - A.matvec(x)
            it, conv = 0, False
            while True:
                delta = float(xp.linalg.norm(r)) / bnorm
                hist.append(delta)
                if delta <= rtol:
                    conv = True
                    break
                if it >= maxiter:
                    break
                rr = r.astype(mg.dtype, copy=False)
                c = mg._vcycle(len(mg.spaces) - 1, xp.zeros_like(rr), rr)
                xp.add(x, c, out=x)                  # float32 correction, no float64 temporary
                del c, rr
                A.matvec(x, out=r)
                xp.subtract(b, r, out=r)
                it += 1
        self.backend.synchronize()
        info = {"iterations": it, "residuals": hist, "converged": conv,
                "time": time.perf_counter() - t0, "method": method, "precision": precision}
        self.stats = info
        return x, info


def patch_levels(space, backend="cpu", dtype=np.float64, coarse_level=None):
    """The patch hierarchy as Level-compatible objects, finest first.

    ``levels[i].A`` is the matrix-free operator, ``levels[i].P`` prolongates
    from level i+1 (coarser) to i, ``levels[i].R`` restricts, and
    ``levels[i].smoother.smooth(x, b, sweeps)`` is the vertex-patch smoother
    (on the coarsest level the exact fast-diagonalisation solve).  Uses
    ``adaptmg.multilevel.Level`` when that module is importable."""
    mg = PatchMultigrid(space, backend, dtype, coarse_level)
    try:
        from ..multilevel import Level as _Level      # the shared driver, when present
    except Exception:                                # pragma: no cover - driver absent
        _Level = PatchLevel
    levels = []
    for i in range(len(mg.spaces) - 1, -1, -1):       # finest first
        sm = mg.S[i] if i > 0 else mg.coarse
        meta = {"space": mg.spaces[i], "kind": "patch", "level": mg.spaces[i].level,
                "cells": int(np.prod(mg.spaces[i].cells))}
        levels.append(_Level(mg.A[i], P=mg.P[i], R=mg.R[i], smoother=sm, meta=meta))
    return levels
