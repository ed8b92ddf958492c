r"""The pressure Poisson problem of the Navier-Stokes scheme: GMRES + a fused multigrid V-cycle.

Step 2 of Algorithm 4 (:mod:`.scheme`) solves :math:`L^p q = b` with the pressure
stiffness :math:`L^p` and Neumann boundary conditions.

Neumann problem and its null space.  :math:`L^p` is singular with kernel the
constants, and symmetric, so :math:`L^p q = b` is solvable iff
:math:`\mathbf 1^T b = 0`; the solution is fixed by :math:`\int q = (m^p)^T q = 0`.
We (i) project the rhs onto :math:`\mathbf 1^\perp` (exact up to round-off,
since :math:`\mathbf 1^T D u = -\int_{\partial\Omega} u_h\cdot n = 0`), (ii) run
GMRES right-preconditioned by a V-cycle whose input is projected onto
:math:`\mathbf 1^\perp` and whose coarse problem is solved *exactly* with the
regularised matrix :math:`L^p_0 + \gamma\mathbf 1\mathbf 1^T` (for
:math:`\mathbf 1^T b_0 = 0` its solution solves :math:`L^p_0x = b_0` with
:math:`\mathbf 1^T x = 0`; the restriction keeps :math:`\mathbf 1^T b = 0` because
prolongation reproduces constants), and (iii) shift :math:`q` to zero mean with
the lumped mass after the solve.  The pressure update keeps :math:`\int p = 0`
because :math:`(m^p)^T (M^p_l)^{-1} D u = \mathbf 1^T D u = 0`.  Pinning one DoF
would also work but makes the operator anisotropic at one node; the
coarse-smoother variant does not solve the coarse problem.

:class:`_NeumannPoisson` is that solver (flexible GMRES, :func:`adaptmg.linalg.fgmres`);
its preconditioner is :class:`_FusedVCycle`, the V-cycle as a fixed sequence of
one-launch kernels on :class:`adaptmg.device.multicsr.MultiCSR` matrices (one CUDA-graph
launch on the GPU), with the adaptmg :class:`~adaptmg.multilevel.MultilevelSolver` cycle
as the reference and fallback.
"""
from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from adaptmg import assemble
from adaptmg.device.kernels import make_spmv
from adaptmg.device.multicsr import MultiCSR, sym_gemv
from adaptmg.linalg import fgmres
from adaptmg.multilevel import Level, MultilevelSolver
from adaptmg.multilevel.hierarchy import multigrid

from . import kernels as NK

__all__ = ["pressure_hierarchy"]


def pressure_hierarchy(space_p):
    """Host multigrid hierarchy of the Neumann pressure stiffness (levels coarse -> fine, finest matrix)."""
    ml0 = multigrid(space_p, assemble.stiffness, dirichlet=None, coarse="smoother",
                    backend="cpu", smoother="jacobi")
    return list(ml0.levels), sp.csr_matrix(ml0.A)


class _FusedVCycle:
    r"""The V-cycle of the pressure multigrid as a fixed sequence of one-launch kernels.

    Same mathematics as :class:`~adaptmg.multilevel.MultilevelSolver` with Chebyshev
    smoothing and a direct coarse solve (zero initial guess on every level):
    ``presmooth`` sweeps of degree-``degree`` Chebyshev steps
    (:meth:`adaptmg.device.multicsr.MultiCSR.chebyshev`, one launch each, ping-pong
    buffers), residual, restriction ``R r``, recursion, prolongation
    ``x += P x_c``, post-smoothing; coarse level :math:`x_0 = (L_0 + \gamma 11^T)^{-1} b_0`
    (:func:`adaptmg.device.multicsr.sym_gemv`).  Every kernel works on buffers allocated
    here, so on the GPU the whole cycle (about 55 launches for the default V(2,2)
    degree-6 cycle on 3 levels) is captured
    once in a CUDA graph and replayed with one launch: on this small problem a cycle
    of the adaptmg MultilevelSolver costs mostly Python and launch overhead
    (``scripts/bench_navier_stokes.py`` has the measurements).  Falls back to
    launching the kernels one by one when capture is not available; on the CPU the
    NumPy twins run.

    ``tpr > 1`` (GPU): ``tpr`` threads per row (32 for the dense coarse solve) with a
    shuffle reduction -- the levels are small and each one-thread row is a chain of
    dependent loads.  Used only if, at setup, the cycle reproduces the one-thread
    cycle to 1e-12 on a random vector (else ``subwarp_error`` says why).  The pressure
    solver uses ``tpr=4``, the choice of :func:`adaptmg.device.kernels.threads_per_row`
    for 3-D Q1 rows.
    """

    def __init__(self, levels, Ainv, smoothers, presmooth, postsmooth, backend, graph=True, tpr=1):
        be = backend
        xp = be.xp
        self.be = be
        if presmooth < 1:
            raise ValueError("the fused V-cycle needs presmooth >= 1")
        self.ops = []
        self.levels = []
        for l, lev in enumerate(levels):
            L = dict(n=lev.n, b=xp.zeros(lev.n))
            if l == 0:
                L["Ainv"] = be.asarray(np.ascontiguousarray(Ainv))
                L["x"] = xp.zeros(lev.n)
            else:
                sm = smoothers[l]
                b_, a_ = float(sm.lmax), float(sm.lower) * float(sm.lmax)
                theta, delta = 0.5 * (b_ + a_), 0.5 * (b_ - a_)
                sigma = theta / delta
                coef = [(0.0, 1.0 / theta)]
                rho_old = 1.0 / sigma
                for _ in range(1, int(sm.degree)):
                    rho = 1.0 / (2.0 * sigma - rho_old)
                    coef.append((rho * rho_old, 2.0 * rho / delta))
                    rho_old = rho
                A = sp.csr_matrix(lev.A)
                L.update(coef=coef, A=MultiCSR.from_matrices([A]).to(be),
                         P=MultiCSR.from_matrices([sp.csr_matrix(lev.P)]).to(be),
                         R=MultiCSR.from_matrices([sp.csr_matrix(lev.R)]).to(be),
                         dinv=be.asarray(1.0 / A.diagonal()), d=xp.zeros(lev.n), r=xp.zeros(lev.n),
                         zero=xp.zeros(lev.n), xa=xp.zeros(lev.n), xb=xp.zeros(lev.n))
            self.levels.append(L)
        self.b = self.levels[-1]["b"]
        self.tpr = 1
        self.ops = []
        self.x = self._build(len(levels) - 1, presmooth, postsmooth, 1)
        self.graph = None
        self.mode = "eager" if be.is_gpu else "numpy"
        if be.is_gpu and tpr != 1:
            self._try_subwarp(int(tpr), presmooth, postsmooth)
        if be.is_gpu and graph:
            self._capture()

    def _try_subwarp(self, t, pre, post):
        """Switch to the ``t``-threads-per-row kernels if they reproduce the one-thread cycle."""
        xp = self.be.xp
        simple_ops, simple_x = self.ops, self.x
        try:
            self.ops = []
            fast_x = self._build(len(self.levels) - 1, pre, post, t)
            fast_ops = self.ops
            v = self.be.asarray(np.random.default_rng(2).standard_normal(self.b.size))
            self.b[...] = v
            for op in simple_ops:
                op()
            ref = simple_x.copy()
            self.b[...] = v
            for op in fast_ops:
                op()
            err = float(xp.abs(fast_x - ref).max()) / max(float(xp.abs(ref).max()), 1e-300)
            if not err <= 1e-12:
                raise RuntimeError(f"sub-warp cycle differs from the one-thread cycle (relative {err:.2e})")
            self.ops, self.x, self.tpr = fast_ops, fast_x, t
        except Exception as exc:  # pragma: no cover - device dependent
            self.ops, self.x = simple_ops, simple_x
            self.subwarp_error = repr(exc)

    def _smooth_ops(self, L, cur, sweeps, t):
        for s_ in range(sweeps):
            for c1, c2 in L["coef"]:
                out = L["xb"] if cur is L["xa"] else L["xa"]
                self.ops.append(lambda L=L, x=cur, o=out, c1=c1, c2=c2:
                                L["A"].chebyshev(x, L["b"], L["dinv"], L["d"], c1, c2, o, tpr=t))
                cur = out
        return cur

    def _build(self, l, pre, post, t):
        L = self.levels[l]
        if l == 0:
            tg = 32 if t > 1 else 1
            self.ops.append(lambda L=L: sym_gemv(L["Ainv"], L["b"], L["x"], tpr=tg))
            return L["x"]
        C = self.levels[l - 1]
        cur = self._smooth_ops(L, L["zero"], pre, t)
        self.ops.append(lambda L=L, x=cur: L["A"].residual(x, L["b"], L["r"], tpr=t))
        self.ops.append(lambda L=L, C=C: L["R"].spmv(L["r"], C["b"], tpr=t))
        xc = self._build(l - 1, pre, post, t)
        self.ops.append(lambda L=L, x=cur, xc=xc: L["P"].spmv(xc, x, 1.0, 1.0, tpr=t))
        return self._smooth_ops(L, cur, post, t)

    def _eager(self):
        for op in self.ops:
            op()

    def _capture(self):
        from adaptmg.device.cudagraph import capture
        graph, why = capture(self.be, self._eager, [self.b], self.x, rtol=1e-12)
        if graph is None:  # pragma: no cover - depends on the CuPy/CUDA build
            self.capture_error = why
            return
        self.graph = graph
        self.mode = "cuda-graph"

    def __call__(self):
        """One V-cycle on the right-hand side in ``self.b``; the result is ``self.x``."""
        if self.graph is not None:
            self.graph.launch()
        else:
            self._eager()
        return self.x


class _NeumannPoisson:
    r"""GMRES + V-cycle for the singular Neumann matrix L^p (see the module docstring).

    ``levels``: host :class:`~adaptmg.multilevel.Level` list (coarse -> fine); the
    finest level with at most ``coarse_rows`` rows becomes the coarse level,
    solved exactly with :math:`L_0 + \gamma 1 1^T`, :math:`\gamma = mean(diag L_0)/n_0`.
    Chebyshev smoothing: on the graded meshes of §5.3.1 point Jacobi with
    omega = 2/3 is not even convergent (cells with aspect ratio ~20 push
    :math:`\lambda_{max}(D^{-1}L)` above 3), Chebyshev estimates :math:`\lambda_{max}`.
    Default V(2,2) with degree-6 sweeps and 4 threads per row: it needs about half the
    Krylov iterations of V(1,1) with degree 4, and every iteration also pays a fixed
    Krylov overhead (launches and the scalar transfer), so the stronger cycle is the
    cheaper solve (measurements in ``scripts/bench_navier_stokes.py``).

    The Krylov method is flexible GMRES (:func:`adaptmg.linalg.fgmres`): with a fixed
    preconditioner its iterates equal GMRES's, and keeping ``z_j = M v_j`` turns the
    final update ``x += M (V y)`` -- one more V-cycle per solve -- into ``x += Z y``.
    """

    def __init__(self, levels, A, backend, *, coarse_rows=2000, smoother="chebyshev",
                 smoother_kwargs=None, presmooth=2, postsmooth=2, rtol=1e-6, restart=30,
                 maxiter=4, fused=True, graph=True, tpr=4):
        if smoother_kwargs is None and smoother == "chebyshev":
            smoother_kwargs = {"degree": 6}
        be = backend
        xp = be.xp
        l0 = max([l for l, lev in enumerate(levels) if lev.n <= coarse_rows] or [0])
        A0 = sp.csr_matrix(levels[l0].A).toarray()
        gamma = float(np.mean(np.diag(A0))) / A0.shape[0]
        A0 = sp.csr_matrix(A0 + gamma)                      # L_0 + gamma 1 1^T
        levels = [Level(A0, meta=levels[l0].meta)] + [
            Level(lev.A, lev.P, lev.R, None, lev.meta) for lev in levels[l0 + 1:]]
        self.ml = MultilevelSolver(levels, coarse="direct", backend=be, smoother=smoother,
                                   smoother_kwargs=smoother_kwargs, presmooth=presmooth,
                                   postsmooth=postsmooth)
        self.fused = None
        if fused and smoother == "chebyshev" and presmooth >= 1:
            Ainv = np.linalg.inv(A0.toarray())
            Ainv = 0.5 * (Ainv + Ainv.T)
            sms = [d.smoother for d in self.ml._dev]
            self.fused = _FusedVCycle(levels, Ainv, sms, presmooth, postsmooth, be, graph=graph, tpr=tpr)
        self.A = be.asmatrix(A)
        self._plan = make_spmv(self.A)
        n = A.shape[0]
        self.n = n
        self._Ax = xp.zeros(n)
        self._v = xp.zeros(n)
        self._z = xp.zeros(n)
        self._s = xp.zeros(1)
        self.rtol, self.restart, self.maxiter = rtol, restart, maxiter
        self.be = be
        self.iterations = []
        self.failures = 0

    def matvec(self, x):
        return self._plan(x, self._Ax)

    def precond(self, v):
        xp = self.be.xp
        # v <- v - mean(v) (one reduction + one element-wise launch, no host sync)
        if self.fused is not None:
            # the cycle reads its rhs from fused.b: b = v - mean(v), two launches, no host sync
            tot = xp.sum(v).reshape(1) if self.be.is_gpu else np.array([v.sum()])
            NK.shift_copy(v, tot, 1.0 / self.n, self.fused.b)
            return self.fused()
        self._v[...] = v
        self._s[0] = xp.sum(v) if self.be.is_gpu else np.sum(v)
        NK.shift(self._v, self._s, 1.0 / self.n)
        self.ml._run(self._v, self._z, "V", True)
        return self._z

    def solve(self, b, x0):
        its = [0]

        def cb(_):
            its[0] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, info = fgmres(self.matvec, b, x0=x0, rtol=self.rtol, restart=self.restart,
                             maxiter=self.maxiter, M=self.precond, callback=cb,
                             orthogonalization="cgs2")
        self.iterations.append(its[0])
        if info != 0:
            self.failures += 1
        return x, info
