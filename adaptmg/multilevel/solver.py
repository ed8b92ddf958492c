"""Mesh-independent geometric multigrid: levels, V/W/F cycles, solver, preconditioner.

This module implements Algorithm 1 of seed 001 (§2.2) on a hierarchy of
matrices that is given from outside (the mesh hierarchy and transfer operators
live in :mod:`adaptmg.mesh` / :mod:`adaptmg.multilevel.transfer`)::

    GMG(l, x_l, b_l):
      l = 0 :  return A_0^{-1} b_0                      (coarse solve)
      x'   = S_l(x_l, b_l)                              (pre-smoothing)
      d    = R_l (b_l - A_l x')                         (restriction, R_l = P_l^T)
      y    = GMG(l-1, 0, d)                             (coarse correction;
                                                         twice for W, F then V for F)
      x''  = x' + P_l y                                 (prolongation)
      return S_l(x'', b_l)                              (post-smoothing)

Level ordering: ``levels[0]`` is the **coarsest** level, ``levels[-1]`` the
finest, as in the paper (``l = 0..L``).  ``levels[l].P`` prolongates from level
``l-1`` to level ``l`` (shape ``n_l x n_{l-1}``); ``levels[0].P`` is ``None``.
A list given fine -> coarse (``levels[0].P`` set, ``levels[-1].P`` None) is
reversed automatically.

Device discipline.  Everything a cycle touches is allocated at setup: per
level ``x``, ``b`` (not on the finest level: there the caller's arrays are used), ``r``
vectors, SpMV plans (:func:`adaptmg.device.kernels.make_spmv`,
cuSPARSE with cached descriptors on the GPU), the smoother's scratch and the
dense coarse inverse.  A cycle then launches only SpMVs into preallocated
outputs (``r = b - A x`` is one copy + one SpMV with ``alpha=-1, beta=1``;
prolongation is one SpMV with ``beta=1``), fused element-wise kernels and one
GEMV on the coarsest level.  No host<->device copies, no reductions, no
branching on device values inside a cycle.  :meth:`MultilevelSolver.solve`
reads one residual norm per iteration (outside the cycle).  Because of this
discipline the preconditioner of :meth:`MultilevelSolver.aspreconditioner`
can record a whole cycle in a CUDA graph and replay it with one launch
(:mod:`adaptmg.device.cudagraph`).
"""
from __future__ import annotations

import numpy as np

from ..backend import get_backend, is_device_sparse, is_sparse
from ..device import kernels as K
from ..linalg import ConvergenceWarning
from . import coarse as _coarse
from . import fusion as _fusion
from .amli import amli_correction
from .level import Level
from .level import host_csr as _host_csr
from .preconditioner import BufferedCycle, make_preconditioner
from .smoothers import describe_level_smoothers, level_smoothers, make_smoother, smoother_setup_kwargs
from .solve_driver import CYCLES, SolveDriver, _check_cycle

__all__ = ["Level", "MultilevelSolver", "ConvergenceWarning", "CYCLES"]


_is_device_sparse = is_device_sparse
_is_sparse = is_sparse


def coarse_visits(kind, l):
    """The coarse-level cycles that one ``kind`` cycle on level ``l`` runs on level ``l - 1``,
    as ``(kind, zero initial guess)``: V once; W twice (W, then W from the first's result);
    F an F-cycle, then a V-cycle.  Level 0 is solved directly, so only once."""
    again = l - 1 > 0
    if kind == "AMLI":
        if again:
            raise ValueError("the AMLI cycle's coarse correction is not a fixed schedule of "
                             "coarse cycles (adaptmg.multilevel.amli.amli_correction)")
        return (("AMLI", True),)
    if kind == "V":
        return (("V", True),)
    if kind == "W":
        return (("W", True), ("W", False)) if again else (("W", True),)
    return (("F", True), ("V", False)) if again else (("F", True),)


class _Dev:
    """Device-side data of one level (built by MultilevelSolver)."""
    __slots__ = ("A", "Aplan", "P", "Pplan", "R", "Rplan", "smoother", "own",
                 "x", "b", "r", "n", "fused", "RA", "AP", "tfused", "S", "sfused", "want_t", "want_s")

    def restricted_residual(self, out):
        """``out <- R b - (R A) x`` in one launch (the ``tfused`` restriction; a block
        level of :mod:`.block` has its own)."""
        K.csr_restricted_residual(self.R, self.RA, self.b, self.x, out)


class MultilevelSolver(SolveDriver):
    """Geometric multigrid on a given hierarchy of levels (coarse -> fine).

    Parameters
    ----------
    levels : list of :class:`Level`
        ``levels[0]`` coarsest, ``levels[-1]`` finest (a fine -> coarse list is
        reversed automatically).
    coarse : "direct", "smoother", a :class:`~adaptmg.multilevel.coarse.CoarseOperator` or a
        function ``coarse(b0, x0)`` (writes ``x0``; e.g. pyamg's coarse solvers, see
        :func:`~adaptmg.multilevel.pyamg.from_pyamg`)
        "direct": dense inverse of the coarsest matrix computed in float64
        (LAPACK on the CPU, cuSOLVER on the GPU; symmetrised when ``A_0`` is
        symmetric) and applied as one GEMV; refused above ``max_direct`` rows.  "smoother":
        ``coarse_sweeps`` sweeps of the coarsest level's smoother (seed 001,
        §4.1.4).  Or an object with ``cycle(b, x, kind, zero)`` and ``depth``: it
        solves on ``levels[0]`` itself (e.g. rank 0 running a serial hierarchy's cycle under
        the distributed levels, :mod:`adaptmg.distributed.hierarchy`), ``depth`` levels
        below it counted by the cycle schedule (:func:`coarse_visits`).
    presmooth, postsmooth : int
        Sweeps before / after the coarse correction.  Post-smoothing calls
        ``smoother.smooth_adjoint`` when the smoother has one, else ``smooth``
        (Jacobi, block Jacobi and Chebyshev are A-self-adjoint, so equal
        pre/post counts give a symmetric cycle).
    backend : "auto" | "cpu" | "gpu" | Backend
    dtype : float or complex dtype of all level data (float32 for mixed precision; the
        fine matrix is also kept in its own precision for ``solve``).
    smoother, smoother_kwargs : default smoother for levels without one, or a sequence (finest
        level first, the last for all coarser levels; :func:`~.smoothers.level_smoothers`).
    coarse_max_rows : int, optional
        Drop all levels coarser than the finest level with at most this many
        rows (keeps the coarse problem small but not tiny).  On the GPU a
        direct coarse problem of ~1000-4000 rows is a good choice: smaller
        levels cost launches, not bandwidth.
    fuse_below : int or "auto"
        Levels with fewer rows than this (CSR matrices with int32 indices)
        use one-launch fused kernels for the residual ``b - A x`` and for
        Jacobi sweeps (:func:`adaptmg.device.kernels.csr_residual`,
        :func:`~adaptmg.kernels.csr_jacobi_sweep`): on the GPU small levels
        are bound by launch overhead, not bandwidth, so fewer launches win.
        "auto" (default): every CSR level on the GPU, none on the CPU.
        Measured on an H100 (``scripts/bench_vcycle.py``), V(2,2)-Jacobi in
        fine-SpMV units: 2-D Q1 1.05M DoFs 15.2 (cuSPARSE + fused update
        everywhere) -> 10.2 (all levels fused); 3-D Q1 2.05M DoFs 7.6 -> 6.0
        (with 4 threads per row, :func:`adaptmg.device.kernels.threads_per_row`).
    fuse_transfers_below : int or "auto"
        Fused levels (see ``fuse_below``) with fewer rows than this also fuse the
        transfers into their neighbours, with the products ``R A`` and ``A P`` built
        once (CSR in float64, then cast; on the second solve, see
        ``defer_fused_products``): the restricted residual
        ``R (b - A x) = R b - (R A) x`` is one launch over the coarse rows
        (:func:`~adaptmg.device.kernels.csr_restricted_residual`; no fine residual
        pass), and with a Jacobi smoother the correction ``x + P e`` and the first
        post-smoothing sweep are one launch
        (:func:`~adaptmg.device.kernels.csr_correct_jacobi`).  Two launches fewer per
        level; the fused kernels read ``R A`` / ``A P`` instead and walk three rows per
        output row, so the choice pays on small, launch-bound levels only.  "auto"
        (default): 40000 on the GPU, 0 on the CPU.  Measured on an H100 (device time
        of one CUDA-graph CG iteration, Q1 Poisson, the "graph" column of
        ``scripts/bench_solve_latency.py``): 2-D 16,641 DoFs 53 -> 47 us, 3-D 35,937
        68.5 -> 66 us; fusing the 2-D 66,049-row level too made that size slower (81 -> 85
        us); at 1M-2M DoFs a cycle changes by under 3 %.
    fuse_presmooth_below : int or "auto"
        Fused levels (Jacobi smoother, ``presmooth`` 1 or 2) with fewer rows than this run
        the pre-smoothing from zero and the restriction of its residual as one launch:
        ``x = G b`` (``G b`` the sweeps from zero) and ``b_c = S b`` with ``S = R (I - A
        G)`` built once (float64, then cast; on the second solve, see
        ``defer_fused_products``;
        :func:`~adaptmg.device.kernels.csr_smooth_restrict`): one launch instead of two
        (three without fused transfers).  Later visits of a level in W/F-cycles start
        from a non-zero guess and take the usual path.  ``S`` has 49 entries per coarse
        row in 2-D Q1 and up to 343 in 3-D, so the launch saved pays on small levels
        only.  "auto" (default): on the GPU the levels below 40000 rows whose ``S`` has
        at most 2^19 entries; none on the CPU.  Measured on an H100 (device time of one
        CUDA-graph CG iteration, Q1 Poisson, A/B in one process): 2-D 16,641 DoFs 43.3
        -> 36.8 us, 66,049 72.3 -> 66.2 us, 3-D 35,937 66.8 -> 63.0 us (fusing its
        35,937-row level too, whose ``S`` has 1.1M entries: 65.6 us).
    defer_fused_products : bool
        True (default): the products that the fused transfers and pre-smoothing read (``R
        A``, ``A P``, ``S``: SpGEMMs) are built on the second :meth:`solve`, or at once by
        :meth:`aspreconditioner`, :meth:`buffered_cycle` and :meth:`build_fused_products`
        (:meth:`cycle` never builds them), so a hierarchy solved
        once runs the unfused cycle (the same operator up to round-off) and does not pay for
        them (:mod:`~adaptmg.multilevel.fusion`).  False: built at set-up.
    """

    def __init__(self, levels, *, coarse="direct", coarse_sweeps=10, presmooth=2,
                 postsmooth=2, backend="auto", dtype=np.float64, smoother="jacobi",
                 smoother_kwargs=None, max_direct=20000, coarse_max_rows=None,
                 fuse_below="auto", fuse_transfers_below="auto", fuse_presmooth_below="auto",
                 defer_fused_products=True):
        levels = list(levels)
        if not levels:
            raise ValueError("MultilevelSolver needs at least one level")
        for i, lev in enumerate(levels):
            if not isinstance(lev, Level):
                raise TypeError(f"levels[{i}] must be a Level, got {type(lev).__name__}")
        if len(levels) > 1 and levels[0].P is not None and levels[-1].P is None:
            levels = levels[::-1]
        if levels[0].P is not None:
            raise ValueError("the coarsest level (levels[0]) must have P=None; "
                             f"got P of shape {levels[0].P.shape}")
        for l in range(1, len(levels)):
            P = levels[l].P
            if P is None:
                raise ValueError(f"level {l} (of {len(levels)}, coarse -> fine) has no P")
            if tuple(P.shape) != (levels[l].n, levels[l - 1].n):
                raise ValueError(f"level {l}: P has shape {tuple(P.shape)} but must map level "
                                 f"{l - 1} ({levels[l - 1].n} DoFs) to level {l} "
                                 f"({levels[l].n} DoFs), i.e. shape {(levels[l].n, levels[l - 1].n)}")
        if coarse_max_rows is not None:
            keep = [l for l, lev in enumerate(levels) if lev.n <= coarse_max_rows]
            if keep and keep[-1] > 0:
                levels = levels[keep[-1]:]
                lev0 = levels[0]
                levels[0] = Level(lev0.A, None, None, lev0.smoother, lev0.meta)
        coarse_cycle = callable(getattr(coarse, "cycle", None))
        if not coarse_cycle and not (isinstance(coarse, str) and coarse in ("direct", "smoother")) and not (
                isinstance(coarse, _coarse.CoarseOperator) or callable(coarse)):
            raise ValueError("coarse must be 'direct', 'smoother', a CoarseOperator, a function "
                             f"coarse(b0, x0) or an object with cycle(b, x, kind, zero), got {coarse!r}")
        for name, v in (("presmooth", presmooth), ("postsmooth", postsmooth),
                        ("coarse_sweeps", coarse_sweeps)):
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        dtype = np.dtype(dtype)
        if dtype.kind not in "fc":
            raise TypeError("dtype must be a float or complex type (float32/float64/complex64/"
                            f"complex128), got {dtype}")
        self.levels = levels
        self.coarse = coarse
        # levels below levels[0] that a coarse-cycle object runs (0: levels[0] is the bottom)
        self._coarse_depth = int(getattr(coarse, "depth", 0)) if coarse_cycle else 0
        self._coarse_cycle = coarse if coarse_cycle else None
        self.coarse_sweeps = int(coarse_sweeps)
        self.presmooth = int(presmooth)
        self.postsmooth = int(postsmooth)
        self.backend = get_backend(backend)
        self.dtype = dtype
        self.max_direct = int(max_direct)
        self.fuse_below = fuse_below
        self.fuse_transfers_below = fuse_transfers_below
        self.fuse_presmooth_below = fuse_presmooth_below
        # the products of the fused transfers / pre-smoothing: built on the second solve (fusion.py)
        self._fused_products = not defer_fused_products
        self._used = False
        self.graph_error = None          # why the last aspreconditioner(graph=...) capture was refused
        self._deferred = None            # the last _run(defer_last=True)'s deferred sweep
        self._defer_level = None
        self.last_iterations = None      # iterations of the last solve()
        self.last_info = None            # per-column info of the last block solve()
        self._preconditioners = {}       # cycle kind -> preconditioner reused by solve()
        self._level_smoothers = level_smoothers(smoother, smoother_kwargs)   # finest first
        self._smoother_spec, self._smoother_kwargs = self._level_smoothers[0]
        fineA = levels[-1].A
        fdt = np.dtype(getattr(fineA, "dtype", np.float64))
        self.outer_dtype = np.promote_types(fdt, dtype) if fdt.kind in "fc" else dtype
        self._setup()

    # ------------------------------------------------------------------ setup
    def _move_matrix(self, M):
        be = self.backend
        if _is_sparse(M):
            if _is_device_sparse(M) and be.is_gpu:
                return be.asmatrix(M, dtype=self.dtype)
            # the device transfer copies anyway: no host copy of a canonical CSR matrix
            return be.asmatrix(_host_csr(M, copy=not be.is_gpu), dtype=self.dtype)
        return M  # matrix-free operator: used as is

    def _setup(self):
        be, xp, dt = self.backend, self.backend.xp, self.dtype
        self._dev = []
        for l, lev in enumerate(self.levels):
            d = _Dev()
            d.n = lev.n
            d.A = self._move_matrix(lev.A)
            d.Aplan = K.make_spmv(d.A)
            if lev.P is not None:
                d.P = self._move_matrix(lev.P)
                d.R = self._move_matrix(lev.R)
                d.Pplan, d.Rplan = K.make_spmv(d.P), K.make_spmv(d.R)
            else:
                d.P = d.R = d.Pplan = d.Rplan = None
            need_smoother = l > 0 or self.coarse == "smoother"
            sm = lev.smoother
            if sm is None or isinstance(sm, str):
                if need_smoother:
                    specs = self._level_smoothers
                    spec, kw = ((sm, self._smoother_kwargs) if isinstance(sm, str) else
                                specs[min(len(self.levels) - 1 - l, len(specs) - 1)])
                    # built on the level's backend matrix, so the smoother shares it
                    # (no second device copy of A)
                    src = d.A if _is_sparse(d.A) else lev.A
                    sm = make_smoother(spec, src, backend=be, dtype=dt, **kw)
            if sm is None:
                pass
            elif getattr(sm, "_adaptmg_smoother", False) and hasattr(sm, "to"):
                sm = sm.to(be, dt)
            elif not hasattr(sm, "smooth"):
                raise TypeError(f"level {l}: smoother must have a .smooth(x, b, sweeps) "
                                f"method, got {type(sm).__name__}")
            d.smoother = sm
            d.own = bool(getattr(sm, "_adaptmg_smoother", False))
            d.fused = d.tfused = d.sfused = d.want_t = d.want_s = False
            d.RA = d.AP = d.S = None
            # the finest level's x and b are always the caller's arrays (swapped in by _run)
            fine = l == len(self.levels) - 1
            d.x = None if fine else xp.zeros(lev.n, dt)
            d.b = None if fine else xp.zeros(lev.n, dt)
            d.r = xp.zeros(lev.n, dt)
            self._dev.append(d)
        self.set_fuse_below(self.fuse_below)
        # coarse solver
        self._coarse_inv = self._coarse_fn = None
        if isinstance(self.coarse, _coarse.CoarseOperator):
            self._coarse_inv = self.coarse.on(be, dt, self.levels[0].n)
        elif callable(self.coarse) and self._coarse_cycle is None:
            self._coarse_fn = self.coarse
        elif self.coarse == "direct":
            self._coarse_inv = _coarse.dense_inverse(self.levels[0].A, be, dt, self.max_direct)
        # outer (possibly higher precision) fine operator for solve()
        fine = self.levels[-1].A
        if self.outer_dtype != self.dtype and _is_sparse(fine):
            self._A_outer = be.asmatrix(_host_csr(fine), dtype=self.outer_dtype)
            self._A_outer_plan = K.make_spmv(self._A_outer)
        else:
            self._A_outer = self._dev[-1].A
            self._A_outer_plan = self._dev[-1].Aplan
            if self.outer_dtype != self.dtype:
                self.outer_dtype = self.dtype

    def set_fuse_below(self, rows):
        """Use the one-launch fused residual / Jacobi kernels on levels with fewer than ``rows`` rows
        (``"auto"``: all levels on the GPU, none on the CPU).

        Only CSR levels with int32 indices qualify; the flag of our own Jacobi smoothers is
        switched with it, also where ``A`` has one-pass kernels of its own (``A.fused_kernels``:
        a distributed ``DistCSR``, whose ``jacobi_sweep`` the smoother then calls).
        """
        _fusion.set_fuse_below(self, rows)

    #: rows below which ``fuse_transfers_below="auto"`` fuses the transfers on the GPU
    FUSE_TRANSFERS_AUTO = _fusion.FUSE_TRANSFERS_AUTO

    def set_fuse_transfers_below(self, rows):
        """Fuse the transfers into their neighbouring kernels on fused levels with fewer than
        ``rows`` rows (``"auto"``: :attr:`FUSE_TRANSFERS_AUTO` on the GPU, none on the CPU;
        see the class docstring).  ``R A`` (and ``A P`` for a Jacobi smoother) of the
        levels that start fusing are built now, or on the second solve while deferred
        (``defer_fused_products``)."""
        _fusion.set_fuse_transfers_below(self, rows)

    #: ``fuse_presmooth_below="auto"`` on the GPU: levels with fewer rows than this whose
    #: ``S`` has at most :attr:`FUSE_PRESMOOTH_MAX_NNZ` entries
    FUSE_PRESMOOTH_AUTO = _fusion.FUSE_PRESMOOTH_AUTO
    FUSE_PRESMOOTH_MAX_NNZ = _fusion.FUSE_PRESMOOTH_MAX_NNZ

    def set_fuse_presmooth_below(self, rows):
        """Run the pre-smoothing from zero and the restriction of its residual as one launch
        on fused levels with fewer than ``rows`` rows (``"auto"``: on the GPU the levels
        below :attr:`FUSE_PRESMOOTH_AUTO` rows whose ``S`` has at most
        :attr:`FUSE_PRESMOOTH_MAX_NNZ` entries, none on the CPU; see the class
        docstring).  Needs a Jacobi smoother and ``presmooth`` 1 or 2; ``S = R (I - A G)``
        (:func:`~adaptmg.device.kernels.smooth_restrict_matrix`) of the levels that start
        fusing is built now, or on the second solve while deferred."""
        _fusion.set_fuse_presmooth_below(self, rows)

    def build_fused_products(self):
        """Build the products that the fused transfer and pre-smoothing kernels read
        (:mod:`~adaptmg.multilevel.fusion`) now instead of on the second solve."""
        _fusion.build_fused_products(self)

    def _product(self, X, Y):
        """The backend CSR matrix ``X Y``, formed in float64 where both live
        (:func:`~adaptmg.device.kernels.csr_product64`), then moved."""
        return self._move_matrix(K.csr_product64(X, Y))

    # --------------------------------------------------------------- cycles
    def _smooth(self, d, sweeps, zero, post, defer=False):
        sm = d.smoother
        if d.own:
            adjoint = post and hasattr(sm, "smooth_adjoint")
            if defer and not adjoint and getattr(sm, "defers_last_sweep", False):
                self._keep_deferred(d, sm.smooth(d.x, d.b, sweeps, work=d.r, zero_initial=zero,
                                                 defer_last=True))
            else:
                f = sm.smooth_adjoint if adjoint else sm.smooth
                f(d.x, d.b, sweeps, work=d.r, zero_initial=zero)
            return
        if zero:
            d.x.fill(0)
        if sweeps:
            (sm.smooth_adjoint if post and hasattr(sm, "smooth_adjoint") else sm.smooth)(d.x, d.b, sweeps)

    def _coarse_solve(self, zero, kind="V"):
        d = self._dev[0]
        if self._coarse_cycle is not None:
            self._coarse_cycle.cycle(d.b, d.x, kind, zero)
        elif self._coarse_inv is not None and d.x.ndim == 2:      # a block (block.py)
            d.x[...] = self._coarse_inv @ d.b
        elif self._coarse_inv is not None:
            K.dense_matvec(self._coarse_inv, d.b, d.x)
        elif self._coarse_fn is not None:
            self._coarse_fn(d.b, d.x)
        else:
            self._smooth(d, self.coarse_sweeps, zero, post=False)

    def _level_cycle(self, l, kind, zero):
        if l == 0:
            self._coarse_solve(zero, kind)
            return
        d, c = self._dev[l], self._dev[l - 1]
        if zero and d.sfused:                  # x = G b and b_c = R (b - A x) in one launch
            sm = d.smoother
            K.csr_smooth_restrict(sm.A, sm.dinv, sm.omega, self.presmooth, d.S, d.b, d.x, c.b)
        else:
            self._pre_and_restrict(d, c, zero)
        if kind == "AMLI" and l > 1:
            amli_correction(self, l)
        else:
            for k, z in coarse_visits(kind, l + self._coarse_depth):
                self._level_cycle(l - 1, k, z)
        defer = l == self._defer_level
        if d.tfused and d.AP is not None and self.postsmooth > 0:
            # x += P x_c and the first post-sweep in one launch
            src = d.smoother.smooth_corrected(d.x, d.b, self.postsmooth, d.AP, d.P, c.x, d.r,
                                              defer_last=defer)
            if defer:
                self._keep_deferred(d, src)
            return
        d.Pplan(c.x, d.x, 1.0, 1.0)            # x += P x_c
        self._smooth(d, self.postsmooth, False, post=True, defer=defer)

    def _pre_and_restrict(self, d, c, zero):
        """Pre-smoothing on level ``d`` and ``c.b = R (b - A x)``; a smoother that ``forms_residual``
        (split Gauss-Seidel, from its stored half-products) leaves ``r`` itself."""
        own_r = d.own and not d.tfused and getattr(d.smoother, "forms_residual", False)
        if own_r:
            d.smoother.smooth(d.x, d.b, self.presmooth, zero_initial=zero, residual=d.r)
        else:
            self._smooth(d, self.presmooth, zero, post=False)
        if d.tfused:                           # b_c = R b - (R A) x in one launch
            return d.restricted_residual(c.b)
        if d.fused and not own_r:              # r = b - A x: one fused CSR kernel, or the plan's
            K.csr_residual(d.A, d.x, d.b, d.r)
        elif not own_r:                        # residual (copy + SpMV, or the operator's one pass)
            d.Aplan.residual(d.x, d.b, d.r)
        d.Rplan(d.r, c.b, 1.0, 0.0)            # b_c = R r

    def _keep_deferred(self, d, src):
        """Note the top level's last post-sweep ``x <- src + omega D^{-1} (b - A src)`` that
        the smoother left to the caller (``src`` is not ``x``), see :meth:`_run`."""
        if src is not d.x:
            self._deferred = (d.smoother, src)

    def _run(self, b, x, kind, zero, level=-1, defer_last=False):
        """One cycle with ``level`` (default the finest) as the top, on the user arrays b, x
        (already validated).

        ``defer_last=True``: if the top level's last post-smoothing step is a fused Jacobi
        sweep that writes ``x`` (:meth:`Jacobi.smooth` with ``defer_last``), it is not
        launched; ``self._deferred`` is then ``(smoother, src)`` and the caller must run
        ``x <- src + omega D^{-1} (b - A src)`` itself (GraphCG fuses it with its inner
        product); otherwise ``self._deferred`` is None and the cycle is complete."""
        level = level % len(self._dev)
        d = self._dev[level]
        keep_x, keep_b = d.x, d.b
        d.x, d.b = x, b
        self._deferred = None
        self._defer_level = level if defer_last else None
        try:
            self._level_cycle(level, kind, zero)
        finally:
            d.x, d.b = keep_x, keep_b
            self._defer_level = None
        return x

    def _check_vec(self, v, name, dtype=None, level=-1):
        n = self._dev[level].n
        xp = self.backend.xp
        if not isinstance(v, xp.ndarray):
            raise TypeError(f"{name} must be a {xp.__name__} array on the {self.backend.name} "
                            f"backend, got {type(v).__module__}.{type(v).__name__}")
        if v.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {v.shape}")
        dt = self.dtype if dtype is None else dtype
        if v.dtype != dt:
            raise TypeError(f"{name} must have dtype {dt}, got {v.dtype}")
        if not v.flags.c_contiguous:
            raise ValueError(f"{name} must be contiguous")

    def cycle(self, b, x, cycle="V", level=None):
        """One multigrid cycle (``"V"``, ``"W"`` or ``"F"``) on ``A x = b``, updating ``x`` in place.

        ``b`` and ``x`` must be 1-D contiguous arrays of the solver's dtype on
        its backend.  ``level`` (index into ``levels``, 0 = coarsest; default the
        finest): run the cycle on ``A_level x = b`` with the levels below it, e.g. the
        per-level cycles of full multigrid, without a second solver.  Returns ``x``.
        Never builds the deferred fused-kernel products (no set-up work, no synchronisation
        inside a cycle, so a cycle can be captured in a CUDA graph): a loop of cycles takes
        them after :meth:`build_fused_products`.
        """
        kind = _check_cycle(cycle)
        L = len(self._dev)
        if level is None:
            level = L - 1
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not 0 <= level < L:
            raise ValueError(f"level must be an integer in [0, {L - 1}], got {level!r}")
        self._check_vec(b, "b", level=level)
        self._check_vec(x, "x", level=level)
        return self._run(b, x, kind, False, level)

    # --------------------------------------------------------- preconditioner
    def aspreconditioner(self, cycle="V", dtype=None, graph="auto"):
        """A LinearOperator ``M ~ A^{-1}``: one cycle from a zero initial guess.

        SciPy ``LinearOperator`` on the CPU, cupyx ``LinearOperator`` on the
        GPU.  Vectors of another float dtype are cast in and out (a float32
        hierarchy inside a float64 Krylov solver); ``(n, 1)`` inputs are
        accepted; the result is a new array of the input's dtype and array kind.
        ``dtype`` of the operator defaults to the solver's ``outer_dtype``.

        ``graph``: on the GPU, record the cycle once in a CUDA graph and replay it
        with one launch per application (:mod:`adaptmg.device.cudagraph`; the input is
        copied into a fixed buffer first).  "auto" (default): on the GPU when every
        level is an assembled sparse matrix with adaptmg's own smoother; ``True``:
        also for matrix-free levels; ``False``: launch kernel by kernel.  If the
        capture is refused (allocation or synchronisation inside the cycle, or a
        replay that differs from the eager cycle) the operator launches eagerly and
        ``self.graph_error`` says why.  The graph freezes the cycle as it is now:
        after changing a smoother (e.g. its ``omega``) build a new preconditioner.
        """
        kind = _check_cycle(cycle)
        self.build_fused_products()           # an operator kept and applied many times
        return make_preconditioner(self, kind, dtype, graph)

    def buffered_cycle(self, cycle="V", graph="auto"):
        """One cycle from ``x = 0`` on fixed buffers, as a CUDA graph on the GPU.

        Returns a :class:`~adaptmg.multilevel.preconditioner.BufferedCycle`: fill
        ``cyc.b`` in place, call ``cyc()``, read ``cyc.x``.  For solvers that prepare the
        cycle's input with their own kernels (no copy in, no allocation out).
        """
        kind = _check_cycle(cycle)
        self.build_fused_products()
        return BufferedCycle(self, kind, graph)

    def _cached_preconditioner(self, kind):
        M = self._preconditioners.get(kind)
        if M is None:
            # (not aspreconditioner: a solve builds deferred products on its second call only)
            M = self._preconditioners[kind] = make_preconditioner(self, kind, None, "auto")
        return M

    def _solve_buffered_cycle(self, kind):
        """:meth:`buffered_cycle` for :meth:`solve` (which builds deferred products itself)."""
        return BufferedCycle(self, kind, "auto")

    def reset_preconditioners(self):
        """Forget the preconditioners that :meth:`solve` built and reuses.

        A preconditioner recorded as a CUDA graph freezes the smoothers as they were
        (e.g. their ``omega``); call this after changing a smoother in place.
        """
        self._preconditioners = {}

    def _capturable(self):
        """True when every level is an assembled sparse matrix with an adaptmg smoother (real
        dtype, the coarse solve a dense operator)."""
        if self._coarse_fn is not None or self.dtype.kind != "f":
            return False
        for d in self._dev:
            if not _is_sparse(d.A):
                return False
            sm = d.smoother
            if sm is not None and not getattr(sm, "_adaptmg_smoother", False):
                return False
        return True

    # ------------------------------------------------------------ reporting
    def operator_complexity(self):
        """``sum_l nnz(A_l) / nnz(A_L)`` (NaN if a level's nnz is unknown)."""
        nnz = [lev.nnz for lev in self.levels]
        if any(v is None for v in nnz) or not nnz[-1]:
            return float("nan")
        return float(sum(nnz)) / float(nnz[-1])

    def grid_complexity(self):
        """``sum_l n_l / n_L``."""
        return float(sum(lev.n for lev in self.levels)) / float(self.levels[-1].n)

    def __repr__(self):
        L = len(self.levels)
        sm = describe_level_smoothers([d.smoother for d in self._dev[:0:-1]] or [self._dev[0].smoother])
        coarse = (f"direct (dense inverse, {self.levels[0].n} rows)"
                  if isinstance(self.coarse, str) and self.coarse == "direct" else
                  f"smoother x {self.coarse_sweeps}" if isinstance(self.coarse, str) else
                  repr(self.coarse))
        lines = [
            f"MultilevelSolver (adaptmg, backend={self.backend.name}, dtype={self.dtype.name})",
            f"Number of levels:    {L}",
            f"Operator complexity: {self.operator_complexity():.3f}",
            f"Grid complexity:     {self.grid_complexity():.3f}",
            f"Cycle smoothing:     pre {self.presmooth} / post {self.postsmooth}, smoother {sm}",
            f"Coarse solver:       {coarse}",
            "  level  kind          cells        DoFs         nnz   hanging",
        ]
        tot = sum(v for v in (lev.nnz for lev in self.levels) if v is not None) or 1
        for l in range(L - 1, -1, -1):
            lev = self.levels[l]
            cells = lev.meta.get("cells", "-")
            hang = lev.meta.get("hanging", lev.meta.get("hanging_nodes", "-"))
            nnz = lev.nnz
            pct = f" [{100.0 * nnz / tot:5.2f}%]" if nnz is not None else ""
            kind = str(lev.meta.get("kind", "-"))
            lines.append(f"  {l:5d}  {kind:<10} {str(cells):>9} {lev.n:>11d} {str(nnz if nnz is not None else '-'):>11}"
                         f" {str(hang):>9}{pct}")
        return "\n".join(lines)

    # ---------------------------------------------------------- convenience
    @classmethod
    def from_matrices(cls, As, Ps, *, smoother="jacobi", block_size=1, galerkin=False,
                      smoother_kwargs=None, metas=None, **kwargs):
        """Build a solver from matrices ordered coarse -> fine.

        ``As[l]`` is the level-``l`` operator (``As[0]`` coarsest); ``Ps[l-1]``
        prolongates level ``l-1`` to level ``l`` (``len(Ps) == len(As) - 1``).
        With ``galerkin=True`` only the finest matrix is used (``As`` may be a
        single matrix) and ``A_{l-1} = R_l A_l P_l`` is computed on the host.
        ``smoother``: "jacobi", "block_jacobi" (with ``block_size``), "chebyshev", a factory
        ``f(A)``, an object with ``.smooth``, or a sequence of names (finest level first).
        """
        Ps = list(Ps)
        if galerkin:
            Afine = As if (_is_sparse(As) or not isinstance(As, (list, tuple))) else As[-1]
            Afine = _host_csr(Afine)
            As = [Afine]
            for P in reversed(Ps):
                P = _host_csr(P)
                if P.shape[0] != As[0].shape[0]:
                    raise ValueError(f"galerkin: P has {P.shape[0]} rows but the finer matrix "
                                     f"has {As[0].shape[0]}")
                Ac = (P.T.tocsr() @ As[0] @ P).tocsr()
                Ac.sum_duplicates()
                As.insert(0, Ac)
        As = list(As)
        if len(Ps) != len(As) - 1:
            raise ValueError(f"need len(Ps) == len(As) - 1, got {len(Ps)} and {len(As)}")
        if metas is not None and len(metas) != len(As):
            raise ValueError(f"metas must have {len(As)} entries, got {len(metas)}")
        skw = smoother_setup_kwargs(smoother, smoother_kwargs, block_size=block_size)
        levels = []
        for l, A in enumerate(As):
            P = Ps[l - 1] if l > 0 else None
            if P is not None:
                P = _host_csr(P)
            levels.append(Level(A, P=P, meta=(metas[l] if metas is not None else None)))
        return cls(levels, smoother=smoother, smoother_kwargs=skw, **kwargs)
