r"""The solve driver of :class:`~adaptmg.multilevel.MultilevelSolver`: ``ml.solve``.

``solve(b)`` runs the multigrid cycle as a stationary iteration (``accel=None``:
:math:`x_{k+1} = x_k + B (b - A x_k)` with :math:`B` one cycle) or as the preconditioner
of one of :mod:`adaptmg.linalg`'s Krylov methods (``accel="cg"`` -- on the GPU a CUDA-graph
CG for small problems --, ``"gmres"``, ``"fgmres"``, ...), or of a Krylov function given by
name or as a callable (:mod:`.accel`); a block of right-hand sides ``(n, k)`` goes to
:mod:`.block`.  ``info == 0`` only after the true residual :math:`\|b - A x\|` was
checked; a solve that misses the tolerance warns (:class:`ConvergenceWarning`).
The cycle itself, the levels and their set-up live in :mod:`.solver`.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..backend import CPU
from ..device import kernels as K
from ..linalg import ConvergenceWarning
from . import fusion as _fusion
from .accel import resolve_accel, solve_with_function

__all__ = ["SolveDriver", "CYCLES"]

CYCLES = ("V", "W", "F", "AMLI")


def _check_cycle(cycle):
    if not isinstance(cycle, str) or cycle.upper() not in CYCLES:
        raise ValueError(f"unknown cycle {cycle!r}; choose one of {CYCLES}")
    return cycle.upper()



class SolveDriver:
    """``solve`` and its stationary / Krylov drivers, mixed into MultilevelSolver (which
    provides the levels, the cycle ``_run``, the preconditioners and ``_A_outer``)."""

    # ---------------------------------------------------------------- solve
    def solve(self, b, x0=None, *, rtol=1e-8, atol=0.0, maxiter=100, accel=None,
              cycle="V", callback=None, residuals=None, restart=None):
        """Solve ``A x = b`` to ``||b - A x|| <= max(rtol ||b||, atol)``.

        ``accel=None``: stationary multigrid iteration in correction form
        ``x <- x + B (b - A x)`` (``B`` one cycle from zero), residual in the
        fine matrix's precision (mixed-precision iterative refinement for a
        float32 hierarchy).  ``accel="cg" | "gmres" | "fgmres"``: Krylov
        solver of :mod:`adaptmg.linalg` preconditioned by one cycle (the
        preconditioner, a CUDA graph on the GPU, is built on the first solve with
        that cycle and reused: see :meth:`reset_preconditioners`).  On the GPU,
        ``accel="cg"`` without ``callback``/``residuals`` records the whole CG
        iteration, cycle included, as one CUDA graph with the stopping test on the
        device (:class:`adaptmg.linalg.graph_cg.GraphCG`; same iterates as
        :func:`adaptmg.linalg.cg` up to round-off) when the fine matrix has at most
        :attr:`graph_cg_max_nnz` entries (from the second solve above
        :attr:`graph_cg_record_rows` rows), so a solve is not bound by Python and launch
        overhead.

        ``residuals``: a list that receives the residual norms (initial one
        first), as in pyamg (``accel="gmres"``: the preconditioned ones ``||M r_k||``, as
        pyamg's gmres; ``maxiter`` counts inner iterations for every ``accel``).
        ``callback(xk)`` is called after each iteration.  ``accel`` may also be another
        solver name of the backend's ``sparse.linalg`` or a function with SciPy's or
        pyamg's signature (:mod:`adaptmg.multilevel.accel`); ``cycle="AMLI"`` is pyamg's
        AMLI cycle (:mod:`adaptmg.multilevel.amli`; with FGMRES or alone, not CG).
        Complex hierarchies solve complex systems.
        ``self.last_iterations`` holds the iterations of the last solve (Krylov: inner
        iterations; no callback needed, so the GPU keeps its CUDA-graph CG).
        Returns ``x`` (same array kind as ``b``).  Warns with
        :class:`ConvergenceWarning` when the tolerance is not reached.

        ``accel="gmres"`` follows pyamg's ``ml.solve``: no restart unless ``restart=m``
        is given, ``maxiter`` counts inner iterations (the Krylov basis then holds up to
        ``maxiter + 1`` vectors: ``restart`` bounds that memory).  The monitored residual
        is pyamg's ``||M r||`` iteration for iteration; the solve stops when the true
        residual passes (pyamg stops on ``||M r|| <= rtol ||M b||``).

        Many right-hand sides: ``b`` of shape ``(n, k)`` is solved as a block (one cycle,
        one SpMM per level for all columns; :mod:`adaptmg.multilevel.block`), with
        ``accel`` None, "cg" or "gmres" (:mod:`adaptmg.linalg.block_krylov`) and the
        stopping rule per column; ``x`` has shape ``(n, k)``, ``self.last_iterations`` and
        ``self.last_info`` hold one entry per column (``info`` 0: converged, > 0: not,
        < 0: breakdown), ``residuals`` receives arrays of the ``k`` column norms.
        """
        if not np.isscalar(rtol) or not np.isfinite(rtol) or rtol < 0:
            raise ValueError(f"rtol must be a non-negative number, got {rtol!r}")
        if not np.isscalar(atol) or not np.isfinite(atol) or atol < 0:
            raise ValueError(f"atol must be a non-negative number, got {atol!r}")
        if not isinstance(maxiter, (int, np.integer)) or maxiter < 0:
            raise ValueError(f"maxiter must be a non-negative integer, got {maxiter!r}")
        if restart is not None and accel != "gmres":
            raise ValueError(f"restart={restart!r} applies to accel='gmres' only, got accel={accel!r}")
        kind = _check_cycle(cycle)
        _fusion.note_use(self)          # the second solve builds the deferred fused products
        be, xp = self.backend, self.backend.xp
        n = self._dev[-1].n
        host_in = be.is_gpu and isinstance(b, np.ndarray)
        # a Krylov function by name: SciPy's for host arrays (a NumPy b on a GPU hierarchy is
        # solved with host vectors, see accel.solve_with_function), else the backend's
        accel = resolve_accel(accel, CPU if host_in else be)
        bshape = getattr(b, "shape", None)
        if bshape is not None and len(bshape) == 2 and bshape[0] == n and bshape[1] > 1:
            from .block import solve_block
            return solve_block(self, b, x0, rtol, atol, maxiter, accel, kind, callback,
                               residuals, restart)
        if bshape is None or tuple(bshape) not in ((n,), (n, 1)):
            raise ValueError(f"b must have shape ({n},), ({n}, 1) or ({n}, k), got {bshape}")
        odt = self.outer_dtype
        if np.dtype(getattr(b, "dtype", odt)).kind == "c" and odt.kind != "c":
            raise TypeError(f"b is complex ({b.dtype}) but the hierarchy is real ({odt}): "
                            "solve the real and imaginary parts separately or build a complex "
                            "hierarchy")
        b = be.asarray(b).reshape(n).astype(odt, copy=False)
        bnorm = float(xp.linalg.norm(b))          # one sync; NaN/Inf in b make it non-finite
        if not np.isfinite(bnorm) and not bool(xp.isfinite(b).all()):
            raise ValueError("b contains NaN or Inf")
        if x0 is None:
            x = xp.zeros(n, odt)
        else:
            if tuple(getattr(x0, "shape", ())) not in ((n,), (n, 1)):
                raise ValueError(f"x0 must have shape ({n},), got {getattr(x0, 'shape', None)}")
            x = be.asarray(x0).reshape(n).astype(odt, copy=True)
            if not bool(xp.isfinite(x).all()):
                raise ValueError("x0 contains NaN or Inf")
        self.last_iterations = 0
        if callable(accel):
            x = solve_with_function(self, accel, b, x, x0 is not None, rtol, atol, maxiter,
                                    kind, callback, residuals, host_in)
        elif accel is not None:
            x = self._solve_krylov(b, x, x0 is not None, bnorm, rtol, atol, maxiter, accel,
                                   kind, callback, residuals, restart)
        else:
            x = self._solve_stationary(b, x, bnorm, rtol, atol, maxiter, kind, callback, residuals)
        return be.xp.asnumpy(x) if host_in else x

    def _residual(self, b, x, r):
        return self._A_outer_plan.residual(x, b, r)

    def _solve_stationary(self, b, x, bnorm, rtol, atol, maxiter, kind, callback, residuals):
        xp = self.backend.xp
        n = self._dev[-1].n
        r = xp.empty_like(b)
        same = self.outer_dtype == self.dtype
        e = xp.empty(n, self.dtype)
        bl = r if same else xp.empty(n, self.dtype)
        tol = max(rtol * bnorm, atol)
        res = float(xp.linalg.norm(self._residual(b, x, r)))
        if residuals is not None:
            residuals.append(res)
        it = 0
        while not res <= tol and it < maxiter and np.isfinite(res):
            if not same:
                xp.copyto(bl, r, casting="unsafe")
            self._run(bl, e, kind, True)
            if same:
                x += e
            else:
                K.add_cast(x, e)
            res = float(xp.linalg.norm(self._residual(b, x, r)))
            it += 1
            self.last_iterations = it
            if residuals is not None:
                residuals.append(res)
            if callback is not None:
                callback(x)
        if not res <= tol:
            warnings.warn(ConvergenceWarning(
                f"multigrid ({kind}-cycle) did not reach the tolerance {tol:.3e} in "
                f"{it} iterations: residual {res:.3e}"), stacklevel=3)
        return x

    #: largest fine matrix (stored entries) solved by :class:`~adaptmg.linalg.graph_cg.GraphCG`
    #: in ``solve``: above it the device time of an iteration hides the host's launches, and
    #: the host-driven CG with cuSPARSE's SpMV is faster.  H100, Q1 Poisson, ``ml.solve`` to
    #: 1e-8, medians of 15 taken in turn: 3-D 274,625 rows (7.1M entries) 4.23 -> 2.40 ms
    #: with the graph, 2-D 263,169 (2.4M) 5.29 -> 1.68 ms, 2-D 1,050,625 (9.4M) 5.05 -> 4.09
    #: ms, but 3-D 2,146,689 (57M) 11.87 -> 12.96 ms; a first solve, which records the
    #: graph, costs 0-5 ms more.  (Until these measurements the limit was 100,000 rows.)
    graph_cg_max_nnz = 16_000_000
    #: fine matrices with more rows than this record the CUDA-graph CG on their second
    #: solve, not their first: the recording costs 0-5 ms at 0.26-1M rows, which repeated
    #: solves win back in one or two, while a one-shot solve (the adaptive loop builds a
    #: hierarchy per solve: its GPU solve phase went 0.19 -> 0.26 s recording on the first)
    #: stays host-driven
    graph_cg_record_rows = 100_000

    def _graph_cg(self, kind):
        """The cached :class:`~adaptmg.linalg.graph_cg.GraphCG` of this cycle kind, or None
        where it does not apply (CPU, matrix-free or foreign-smoother levels, a float32
        hierarchy in a float64 solve, a CSR matrix with int64 indices, capture refused) or
        not yet (the first solve of a large one, see :attr:`graph_cg_record_rows`)."""
        key = ("graph_cg", kind)
        if key in self._preconditioners:
            return self._preconditioners[key]
        A = self._A_outer
        g = None
        if (self.backend.is_gpu and self.outer_dtype == self.dtype and kind != "AMLI"
                and self._capturable()
                and A.nnz <= self.graph_cg_max_nnz
                and getattr(A, "format", None) == "csr" and A.indices.dtype == np.int32
                and A.indptr.dtype == np.int32):
            seen = ("graph_cg_solves", kind)
            if A.shape[0] > self.graph_cg_record_rows and not self._preconditioners.get(seen):
                self._preconditioners[seen] = True      # the first solve: host-driven
                return None
            from ..linalg.graph_cg import GraphCG
            # the cycle's own graph serves z_0 = M r_0; the CG graph records the cycle inline
            cyc = self._solve_buffered_cycle(kind)
            g = GraphCG(self.backend, A, cyc)
            if g.graph is None:
                self.graph_error = g.graph_error
                g = None
        self._preconditioners[key] = g
        return g

    def _solve_krylov(self, b, x, have_x0, bnorm, rtol, atol, maxiter, accel, kind, callback,
                      residuals, restart=None):
        from .. import linalg
        xp = self.backend.xp
        tol = max(rtol * bnorm, atol)
        if accel == "cg" and callback is None and residuals is None:
            g = self._graph_cg(kind)
            if g is not None:
                # every iteration one CUDA graph, the stopping test on the device
                x, state, its = g.solve(b, x, tol, maxiter, x_zero=not have_x0, bnorm=bnorm)
                self.last_iterations = its
                if state == 0:
                    return x
                maxiter -= its           # breakdown, drift or maxiter: linalg.cg goes on / reports
                have_x0 = True
        f = getattr(linalg, accel)
        M = self._cached_preconditioner(kind)
        A = self._A_outer
        r = xp.empty_like(b)
        # gmres (left-preconditioned) monitors ||M r_k||: its residuals are those, as pyamg's
        pre = accel == "gmres"
        if residuals is not None:
            r0 = self._residual(b, x, r)
            residuals.append(float(xp.linalg.norm(M.matvec(r0) if pre else r0)))
        n = self._dev[-1].n

        def cb(arg):
            self.last_iterations += 1
            if residuals is not None:
                if np.ndim(arg) == 1 and getattr(arg, "shape", (0,))[0] == n:
                    residuals.append(float(xp.linalg.norm(self._residual(b, arg, r))))
                else:
                    # (f)gmres report ||.|| / ||b||: absolute norms as the others'
                    residuals.append(float(arg) * (bnorm if accel in ("gmres", "fgmres") else 1.0))
            if callback is not None:
                callback(arg)

        # gmres: per-inner-iteration callback with the preconditioned relative residual;
        # as pyamg's ml.solve, maxiter counts inner iterations and there is no restart
        # unless one is asked for (SciPy's 'legacy' count with restart = maxiter)
        kw = {}
        if accel == "gmres":
            kw = {"callback_type": "legacy", "restart": max(int(maxiter), 1)
                  if restart is None else restart}
        if maxiter > 0:
            # no x0 when it is zero: the solver then takes r_0 = b without a product
            x, info = f(A, b, x0=x if have_x0 else None, rtol=rtol, atol=atol, maxiter=maxiter,
                        M=M, callback=cb, **kw)
        else:
            info = 1
        if info == 0 and residuals is None:
            return x           # adaptmg.linalg returns info == 0 only after the true residual passed
        res = float(xp.linalg.norm(self._residual(b, x, r)))
        if residuals is not None and not pre and (not residuals or residuals[-1] != res):
            residuals.append(res)
        if info != 0 or not res <= tol * (1 + 1e-8):
            warnings.warn(ConvergenceWarning(
                f"multigrid-preconditioned {accel} did not reach the tolerance {tol:.3e} "
                f"(info={info}, residual {res:.3e})"), stacklevel=3)
        return x
