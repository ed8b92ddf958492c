"""Multigrid with the vertex-patch smoother on Cartesian Q_k (seed 000 §2.1).

* :class:`FastDiagSolver` -- exact solve of a whole level by fast
  diagonalisation of the global 1D matrices (the Cartesian level matrix is
  itself a Kronecker sum); used on the coarsest level (Algorithm 2.1, line 3).
* :func:`patch_levels` -- the hierarchy as :class:`adaptmg.multilevel.Level`
  objects (finest first): matrix-free operators, patch smoothers (on the
  coarsest level the fast-diagonalisation solve as an exact "smoother"), and
  the Kronecker interpolation / restriction as ``P`` / ``R`` operators.
* :class:`PatchMultigrid` -- runs these levels with
  :class:`adaptmg.multilevel.MultilevelSolver` (Algorithm 2.1: one pre- and
  one post-smoothing sweep, by default both with the colours in the same order
  as seed 000's code does, exact coarse solve) and adds what that solver has
  not: full multigrid (Algorithm 2.2) and the stopping rules below.  GMRES is
  :func:`adaptmg.linalg.fgmres` preconditioned by one V-cycle.
* :func:`seed_table_iterations` -- one entry of seed 000's Tables 1-3: FMG on
  the tables' right-hand side (the vector of ones, as the seed's code sets it),
  steps of the while loop of Algorithm 2.2 to a relative residual of 1e-9.

Options that reproduce the seed's setting (differences found against the
seed's text and its published code; evidence in patch/NOTES.md):

* ``post`` -- "forward" (default; seed code) or "reverse" (symmetric V-cycle).
* ``min_cycles`` of :meth:`PatchMultigrid.solve` -- 1 (default): Algorithm 2.2
  sets ``delta <- delta_0 = ||b||`` before its while loop, so at least one
  V-cycle follows the FMG start; 0 checks the residual of the start first.
* ``variant`` -- "paper" (default, Algorithm 2.1 as printed:
  ``x <- x + P x_c``) or "seed-code": the V-cycle of the seed code version with
  the FMG solver, whose coarse correction also adds the fine residual,
  ``x <- x + (b - A x) + P x_c`` (``prolongate_and_add`` into the residual
  vector, then ``x += t``).  In 3D the level matrices scale like h, so the
  extra term is negligible; in 2D it is not, and it is what the published
  Table 1 counts contain (2D Q1: 8-9 steps instead of 5).
* ``smoother`` -- "patch" (default) or "point_gs": multicolour point
  Gauss-Seidel (:class:`adaptmg.multilevel.GaussSeidel`, forward sweeps) on
  the level matrices assembled as CSR (Kronecker sums of the 1D matrices), for
  Table 3's comparison row; small levels only.

Precision (§4.2), as everywhere in adaptmg: the cycle runs in a
``MultilevelSolver`` of ``dtype=float32`` while residuals and Krylov vectors
stay float64.  ``method="gmres"`` runs float64 flexible GMRES with the float32
V-cycle as its (right) preconditioner; ``method="fmg"`` is the memory-lean
one: the FMG start in float32, then iterative refinement
``x <- x + V32(0, float32(b - A x))`` with the residual in float64 (three
float64 vectors on the finest level).  The float32 levels are float32 copies of
the float64 ones (:func:`_cast_levels`; ``MultilevelSolver`` casts assembled
matrices itself but uses matrix-free operators as they are).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ..backend import get_backend, is_device_array
from ..linalg import ConvergenceWarning
from ..multilevel import Level, MultilevelSolver
from .operator import LaplaceOperator, _check_space, check_dtype, contract
from .smoother import PatchSmoother, check_post
from .space import CartesianSpace
from .tensor import eigenvalue_sums, fast_diag_factors, interval_matrices
from .transfer import prolongation, restriction

__all__ = ["FastDiagSolver", "PatchMultigrid", "PatchLevel", "patch_levels", "seed_table_iterations",
           "SeedCodeSmoother", "VARIANTS", "SMOOTHERS"]


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
        S, lam = [], []
        for n in space.cells:                                  # x first
            Mg, Ag = interval_matrices(space.k, n)
            s, l_ = fast_diag_factors(Ag.toarray(), Mg.toarray())
            S.append(s)
            lam.append(l_)
        self._S = [xp.asarray(s, dtype=self.dtype) for s in S]
        self._Dinv = xp.asarray(1.0 / eigenvalue_sums(lam, space.coeffs), dtype=self.dtype)
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

    def to(self, backend=None, dtype=None):
        """The same solver on ``backend`` in ``dtype`` (self when both are unchanged)."""
        be = self.backend if backend is None else get_backend(backend)
        dt = self.dtype if dtype is None else check_dtype(dtype)
        if be == self.backend and dt == self.dtype:
            return self
        return FastDiagSolver(self.space, be, dt)

    def smooth(self, x, b, sweeps=1, **kw):
        """Exact 'smoother': ``x <- A^{-1} b`` (for a driver's coarse level)."""
        x[...] = self.solve(b)
        return x

    def smooth_adjoint(self, x, b, sweeps=1, **kw):
        return self.smooth(x, b, sweeps)


# Kept for ``from adaptmg.patch import PatchLevel``: the levels are the shared Level now.
PatchLevel = Level

VARIANTS = ("paper", "seed-code")
SMOOTHERS = ("patch", "point_gs")


class SeedCodeSmoother:
    """The level smoother of seed 000's code version with the FMG solver, including
    its coarse correction ``x <- x + t + P x_c`` with ``t = b - A S(x)``.

    In that code (``MultigridSolver::v_cycle``) the residual ``t`` receives
    ``prolongate_and_add(t, x_c)`` and then ``x += t``, so the fine residual is
    added to the iterate together with the coarse correction.  Here: ``smooth``
    (pre-smoothing) keeps ``t = b - A x`` after the sweep, ``smooth_adjoint``
    (post-smoothing, called after ``x += P x_c``) first adds ``t``.  Costs one
    extra operator application per level and cycle; for reproducing the seed's
    2D counts only (``variant="seed-code"``)."""

    def __init__(self, smoother, A):
        self.smoother = smoother
        self.A = A
        self._t = None

    def __repr__(self):
        return f"SeedCodeSmoother({self.smoother!r})"

    def smooth(self, x, b, sweeps=1):
        self.smoother.smooth(x, b, sweeps)
        self._t = b - self.A @ x
        return x

    def smooth_adjoint(self, x, b, sweeps=1):
        if self._t is None:
            raise RuntimeError("SeedCodeSmoother: post-smoothing without a pre-smoothing step")
        x += self._t
        self._t = None
        return self.smoother.smooth_adjoint(x, b, sweeps)

    def to(self, backend=None, dtype=None):
        return SeedCodeSmoother(self.smoother.to(backend, dtype), self.A.to(backend, dtype))


class _ForwardPost:
    """A smoother whose post-smoothing repeats the pre-smoothing sweep (seed 000's
    ``post="forward"``) for smoothers whose ``smooth_adjoint`` is the adjoint."""

    def __init__(self, smoother):
        self.smoother = smoother

    def __repr__(self):
        return f"_ForwardPost({self.smoother!r})"

    def smooth(self, x, b, sweeps=1):
        return self.smoother.smooth(x, b, sweeps)

    smooth_adjoint = smooth

    def to(self, backend=None, dtype=None):
        return _ForwardPost(self.smoother.to(backend, dtype))


def _point_gs(space, backend, dtype, post):
    """Forward multicolour point Gauss-Seidel on the assembled level matrix."""
    from ..multilevel.gauss_seidel import GaussSeidel
    A = LaplaceOperator(space, "cpu", np.float64).tocsr(max_rows=400000)
    gs = GaussSeidel(A, sweep="forward", backend=backend, dtype=dtype)
    return _ForwardPost(gs) if post == "forward" else gs


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


# The cycle of Algorithm 2.1 in MultilevelSolver's terms: one sweep before and one
# after the coarse correction (post-smoothing = the smoother's smooth_adjoint: the
# colours forward again or reversed, see ``post``), the coarsest level solved by one
# application of its exact "smoother".
_CYCLE = dict(coarse="smoother", coarse_sweeps=1, presmooth=1, postsmooth=1)


def _default_coarse_level(space):
    lvl = 0
    while lvl < space.level and min(b << lvl for b in space.base) < 2:
        lvl += 1
    return lvl


def _check_coarse_level(space, coarse_level):
    lmin = _default_coarse_level(space) if coarse_level is None else coarse_level
    if isinstance(lmin, bool) or not isinstance(lmin, (int, np.integer)):
        raise TypeError(f"coarse_level must be an int, got {type(lmin).__name__}")
    if not 0 <= lmin <= space.level:
        raise ValueError(f"coarse_level must be in 0..{space.level}, got {lmin}")
    return int(lmin)


def _build_levels(spaces, backend, dtype, post="forward", variant="paper", smoother="patch"):
    """Levels of ``spaces`` (coarse -> fine) in ``dtype``, coarsest first."""
    levels = []
    for i, s in enumerate(spaces):
        meta = {"space": s, "kind": "patch", "level": s.level, "cells": int(np.prod(s.cells))}
        A = LaplaceOperator(s, backend, dtype)
        if i == 0:
            levels.append(Level(A, smoother=FastDiagSolver(s, backend, dtype), meta=meta))
            continue
        if smoother == "patch":
            S = PatchSmoother(s, backend, dtype, post)
        else:
            S = _point_gs(s, backend, dtype, post)
        if variant == "seed-code":
            S = SeedCodeSmoother(S, A)
        c = spaces[i - 1]
        levels.append(Level(A, P=prolongation(c, backend, dtype), R=restriction(c, backend, dtype),
                            smoother=S, meta=meta))
    return levels


def _cast_levels(levels, backend, dtype):
    """The same levels in ``dtype`` (every patch object's ``to``).

    What ``MultilevelSolver(levels, dtype=...)`` does for assembled matrices; for
    matrix-free operators it has no cast, so the patch path casts here."""
    return [Level(lev.A.to(backend, dtype),
                  P=None if lev.P is None else lev.P.to(backend, dtype),
                  R=None if lev.R is None else lev.R.to(backend, dtype),
                  smoother=lev.smoother.to(backend, dtype), meta=lev.meta)
            for lev in levels]


def patch_levels(space, backend="cpu", dtype=np.float64, coarse_level=None, post="forward",
                 variant="paper", smoother="patch"):
    """The patch hierarchy as :class:`adaptmg.multilevel.Level` objects, finest first.

    ``levels[i].A`` is the matrix-free operator, ``levels[i].P`` prolongates
    from level i+1 (coarser) to i, ``levels[i].R`` restricts, and
    ``levels[i].smoother.smooth(x, b, sweeps)`` is the vertex-patch smoother
    (``smooth_adjoint``: the post-smoothing sweep, see ``post``); on the coarsest
    level the exact fast-diagonalisation solve.  ``MultilevelSolver(patch_levels(V),
    coarse="smoother", coarse_sweeps=1, presmooth=1, postsmooth=1)`` runs
    :class:`PatchMultigrid`'s cycle.  ``post``, ``variant``, ``smoother``: as in
    :class:`PatchMultigrid`."""
    space = _check_space(space)
    lmin = _check_coarse_level(space, coarse_level)
    spaces = [space.with_level(l) for l in range(lmin, space.level + 1)]
    return _build_levels(spaces, get_backend(backend), check_dtype(dtype), check_post(post),
                         _check_choice("variant", variant, VARIANTS),
                         _check_choice("smoother", smoother, SMOOTHERS))[::-1]


class _Cycles:
    """The V-cycles of one precision: a MultilevelSolver on the whole hierarchy and its
    preconditioner; FMG runs the same solver's cycle with a coarser level on top
    (:meth:`~adaptmg.multilevel.MultilevelSolver.cycle` with ``level=``)."""

    def __init__(self, levels, backend, dtype):
        self.levels = levels                      # coarse -> fine
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self.ml = MultilevelSolver(levels, backend=backend, dtype=dtype, **_CYCLE)
        self._M = None

    def preconditioner(self):
        """``M r = V(0, r)`` (a LinearOperator; float64 in and out, the cycle in ``dtype``)."""
        if self._M is None:
            self._M = self.ml.aspreconditioner("V", dtype=np.float64, graph=False)
        return self._M

    def fmg_start(self, b):
        """Algorithm 2.2 lines 1-4: coarse solve, then prolongate + one V-cycle per level."""
        lv = self.levels
        bs = [b]
        for l in range(len(lv) - 1, 0, -1):
            bs.append(lv[l].R @ bs[-1])
        bs.reverse()
        x = lv[0].smoother.solve(bs[0])
        for l in range(1, len(lv)):
            x = lv[l].P @ x
            self.ml.cycle(bs[l], x, "V", level=l)
        return x


class PatchMultigrid:
    """Geometric multigrid on ``space`` and its coarser levels.

    Parameters
    ----------
    space : CartesianSpace (finest level)
    backend : "cpu" | "gpu" | "auto" | Backend
    dtype : float64 or float32 (precision of the cycle)
    coarse_level : level of the exact coarse solve (default: the first level
        with at least 2 cells per direction, where one vertex patch covers
        the whole domain; seed 000's code: minlevel = 1)
    post : "forward" (default, seed 000's code: post-smoothing with the colours
        in the pre-smoothing order) or "reverse" (adjoint sweep: symmetric
        V-cycle, use it as a CG preconditioner)
    variant : "paper" (default: Algorithm 2.1) or "seed-code" (the seed code's
        coarse correction ``x <- x + (b - A x) + P x_c``; reproduces its 2D counts)
    smoother : "patch" (default) or "point_gs" (forward multicolour point
        Gauss-Seidel on assembled level matrices; Table 3; small levels only)

    ``levels`` (coarse -> fine) are the :func:`patch_levels`; ``A``, ``S``,
    ``P``, ``R`` (index 0 = coarsest, ``None`` where a level has none) and
    ``coarse`` are their parts.  The cycles run in
    :class:`adaptmg.multilevel.MultilevelSolver` objects built on first use.
    """

    def __init__(self, space, backend="cpu", dtype=np.float64, coarse_level=None, post="forward",
                 variant="paper", smoother="patch"):
        self.space = _check_space(space)
        self.backend = get_backend(backend)
        self.dtype = check_dtype(dtype)
        self.post = check_post(post)
        self.variant = _check_choice("variant", variant, VARIANTS)
        self.smoother = _check_choice("smoother", smoother, SMOOTHERS)
        self.lmin = _check_coarse_level(space, coarse_level)
        self.spaces = [space.with_level(l) for l in range(self.lmin, space.level + 1)]
        self.levels = _build_levels(self.spaces, self.backend, self.dtype, self.post, self.variant,
                                    self.smoother)
        self.A = [lev.A for lev in self.levels]
        self.S = [None] + [lev.smoother for lev in self.levels[1:]]
        self.P = [lev.P for lev in self.levels]
        self.R = [lev.R for lev in self.levels]
        self.coarse = self.levels[0].smoother
        self._levels = {self.dtype: self.levels}  # dtype -> levels (light: no vectors)
        self._cycles = {}                         # dtype -> _Cycles: at most one, see _cycles_for
        self.stats = {}

    def __repr__(self):
        rows = [f"PatchMultigrid(dim={self.space.dim}, k={self.space.k}, backend={self.backend.name}, "
                f"dtype={self.dtype}, post={self.post!r}, variant={self.variant!r}, "
                f"smoother={self.smoother!r})"]
        for s in reversed(self.spaces):
            rows.append(f"  level {s.level:2d}: cells {s.cells}, {s.n_dofs} DoFs")
        return "\n".join(rows)

    def _cycles_for(self, dtype):
        """The cycles in ``dtype``.  A MultilevelSolver preallocates three vectors per
        level, so only the precision in use keeps one: switching builds the other
        (outside ``solve``'s timing) and drops the first, so the largest problems
        fit (memory figures in patch/NOTES.md)."""
        dtype = np.dtype(dtype)
        c = self._cycles.get(dtype)
        if c is None:
            self._cycles.clear()
            levels = self._levels.get(dtype)
            if levels is None:
                levels = self._levels[dtype] = _cast_levels(self.levels, self.backend, dtype)
            c = self._cycles[dtype] = _Cycles(levels, self.backend, dtype)
        return c

    @property
    def multilevel(self):
        """The :class:`adaptmg.multilevel.MultilevelSolver` of this hierarchy (its dtype)."""
        return self._cycles_for(self.dtype).ml

    # -- cycles ------------------------------------------------------------
    def _check_rhs(self, b, dtype=None):
        self.space.check_vector(b, "b")
        if self.backend.is_gpu != is_device_array(b):
            raise TypeError(f"b of type {type(b).__name__} is not on backend {self.backend.name!r}")
        if dtype is not None and b.dtype != dtype:
            raise TypeError(f"b has dtype {b.dtype}, expected {dtype}")

    def vcycle(self, b, x=None):
        """One V-cycle on the finest level: returns ``V(x, b)`` (x updated in
        place when given, else started from zero)."""
        self._check_rhs(b, self.dtype)
        if x is None:
            x = self.backend.xp.zeros_like(b)
        return self.multilevel.cycle(b, x, "V")

    def aspreconditioner(self):
        """``M(r) = V(0, r)`` as a LinearOperator (callable); casts to the cycle's
        dtype and back."""
        return self._cycles_for(self.dtype).preconditioner()

    def solve(self, b, *, rtol=1e-9, maxiter=50, method="fmg", precision="double",
              restart=10, x0=None, krylov="adaptmg", min_cycles=1):
        """Solve ``A x = b`` on the finest level to ``||b - A x|| <= rtol ||b||``.

        method : "fmg" (Algorithm 2.2; iterations = V-cycles after the FMG start,
                 the repetitions of its while loop)
                 or "gmres" (:func:`adaptmg.linalg.fgmres`, right-preconditioned by
                 one V-cycle; flexible, since a float32 V-cycle is a slightly
                 nonlinear preconditioner).
        precision : "double" (cycle in float64) or "mixed" (cycle in float32,
                 residuals and Krylov vectors in float64).
        maxiter : V-cycles after the FMG start, or GMRES iterations (rounded up to
                 whole restart cycles).
        restart : GMRES restart length; fgmres preallocates 2 (restart + 1)
                 vectors, so keep it small (the V-cycle needs <= 9 iterations).
        krylov : "adaptmg" only (kept for compatibility; the private GMRES of
                 ``adaptmg.patch.krylov`` was folded into :mod:`adaptmg.linalg`).
        min_cycles : "fmg" only: V-cycles done before the residual may stop the
                 loop.  1 (default) is Algorithm 2.2, whose while loop starts from
                 ``delta = delta_0 = ||b||`` and so always runs once; 0 stops right
                 after the FMG start when it already meets ``rtol``.
        Returns ``(x, info)``; info has iterations, residual history, converged,
        stagnated, time (seconds, device-synchronised).  FMG stops early, as
        ``stagnated``, when each of the last three cycles reduced the residual by less
        than 10 % (the rounding floor lies above ``rtol``: large 2-D levels of high
        degree reach 1e-9 of ||b|| only to a few 1e-9 in double precision); an FMG
        solve that misses ``rtol`` warns (:class:`~adaptmg.linalg.ConvergenceWarning`),
        as ``fgmres`` does for ``method="gmres"``."""
        if method not in ("fmg", "gmres"):
            raise ValueError(f"method must be 'fmg' or 'gmres', got {method!r}")
        if krylov != "adaptmg":
            raise ValueError(f"krylov must be 'adaptmg' (adaptmg.linalg.fgmres; the private "
                             f"GMRES of adaptmg.patch.krylov is gone), got {krylov!r}")
        if precision not in ("double", "mixed"):
            raise ValueError(f"precision must be 'double' or 'mixed', got {precision!r}")
        if isinstance(min_cycles, bool) or not isinstance(min_cycles, (int, np.integer)) \
                or min_cycles < 0:
            raise ValueError(f"min_cycles must be a non-negative int, got {min_cycles!r}")
        if self.dtype != np.float64:
            raise TypeError("solve() needs a float64 hierarchy (use precision='mixed' for float32 cycles)")
        self._check_rhs(b, np.float64)
        xp = self.backend.xp
        cyc = self._cycles_for(np.float32 if precision == "mixed" else np.float64)
        if method == "gmres":                        # set-up outside the timed region
            M = cyc.preconditioner()
        A = self.A[-1]
        self.backend.synchronize()
        t0 = time.perf_counter()
        bnorm = float(xp.linalg.norm(b))
        hist = []
        stagnated = False
        if method == "gmres":
            from ..linalg import fgmres
            x, info = fgmres(A, b, x0=x0, rtol=rtol, restart=restart,
                             maxiter=max(1, -(-maxiter // restart)), M=M, callback=hist.append)
            it = len(hist)
            conv = info == 0
        else:
            if x0 is None:
                x = cyc.fmg_start(b.astype(cyc.dtype, copy=False)).astype(np.float64, copy=False)
            else:
                x = x0.astype(np.float64, copy=True)
            r = b - A.matvec(x)
            it, conv = 0, False
            while True:
                delta = float(xp.linalg.norm(r)) / bnorm
                hist.append(delta)
                if delta <= rtol and it >= min_cycles:
                    conv = True
                    break
                if it >= maxiter:
                    break
                if _stagnated(hist):
                    stagnated = True
                    break
                rr = r.astype(cyc.dtype, copy=False)
                c = xp.zeros_like(rr)
                cyc.ml.cycle(rr, c, "V")
                xp.add(x, c, out=x)                  # float32 correction, no float64 temporary
                del c, rr
                A.matvec(x, out=r)
                xp.subtract(b, r, out=r)
                it += 1
        self.backend.synchronize()
        info = {"iterations": it, "residuals": hist, "converged": conv,
                "time": time.perf_counter() - t0, "method": method, "precision": precision,
                "stagnated": stagnated}
        self.stats = info
        if method == "fmg" and not conv:            # fgmres warns by itself
            why = (f"the residual stagnated at {hist[-1]:.2e} of ||b|| (the rounding floor of "
                   f"this problem in {precision} precision lies above rtol)" if stagnated
                   else f"{it} V-cycles reached ||r|| / ||b|| = {hist[-1]:.2e}")
            warnings.warn(f"PatchMultigrid.solve(method='fmg') did not reach rtol={rtol:.1e}: {why}",
                          ConvergenceWarning, stacklevel=2)
        return x, info


#: FMG refinement cycles stop as stagnated when each of the last STAGNATION_CYCLES cycles
#: reduced the residual by less than the factor STAGNATION_FACTOR
STAGNATION_CYCLES = 3
STAGNATION_FACTOR = 0.9


def _stagnated(hist):
    """True when the last :data:`STAGNATION_CYCLES` entries of the residual history each
    fell by less than :data:`STAGNATION_FACTOR` (the rounding floor: further cycles only
    move the residual around it)."""
    m = STAGNATION_CYCLES
    if len(hist) <= m:
        return False
    return all(hist[-i] > STAGNATION_FACTOR * hist[-i - 1] for i in range(1, m + 1))


def seed_table_iterations(dim, k, level, backend="cpu", rtol=1e-9, maxiter=60, **options):
    """One entry of seed 000's Tables 1-3: ``(iterations, info)`` of FMG
    (Algorithm 2.2, at least one V-cycle) to ``||b - A x|| <= rtol ||b||`` for the
    tables' right-hand side.

    The tables say "f = 1"; the seed's code sets the right-hand side *vector* to
    ones (``rhs[maxlevel] = 1.``), not the load vector ``int phi_i`` (equal up to
    a factor for Q1, different for Q_k, k >= 2, whose Gauss-Lobatto weights
    differ between vertex, edge and interior nodes), so ``b`` is the vector of
    ones here.  ``options`` go to :class:`PatchMultigrid` (``post``, ``variant``,
    ``smoother``, ``coarse_level``).  The level is the number of refinements of
    the unit square/cube (2**level cells per direction)."""
    V = CartesianSpace(dim, k, level)
    mg = PatchMultigrid(V, backend, **options)
    b = mg.backend.xp.ones(V.n_dofs)
    x, info = mg.solve(b, rtol=rtol, maxiter=maxiter, method="fmg", min_cycles=1)
    return info["iterations"], info
