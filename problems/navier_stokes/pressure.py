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
its preconditioner is the V-cycle of :class:`~adaptmg.multilevel.MultilevelSolver` on
fixed buffers (:meth:`~adaptmg.multilevel.MultilevelSolver.buffered_cycle`): on the GPU
every level's Chebyshev steps and residuals are one-launch CSR kernels and the whole
cycle is replayed as one CUDA graph.  Only the projection of its input is this module's.
"""
from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from adaptmg import assemble
from adaptmg.device.kernels import make_spmv
from adaptmg.linalg import fgmres
from adaptmg.linalg._vectorops import VectorOps
from adaptmg.linalg.graph_fgmres import GraphFGMRES
from adaptmg.multilevel import Level, MultilevelSolver
from adaptmg.multilevel.hierarchy import multigrid

from . import kernels as NK

__all__ = ["pressure_hierarchy"]


def pressure_hierarchy(space_p):
    """Host multigrid hierarchy of the Neumann pressure stiffness (levels coarse -> fine, finest matrix)."""
    ml0 = multigrid(space_p, assemble.stiffness, dirichlet=None, coarse="smoother",
                    backend="cpu", smoother="jacobi")
    return list(ml0.levels), sp.csr_matrix(ml0.A)


class _NeumannPoisson:
    r"""GMRES + V-cycle for the singular Neumann matrix L^p (see the module docstring).

    ``levels``: host :class:`~adaptmg.multilevel.Level` list (coarse -> fine); the
    finest level with at most ``coarse_rows`` rows becomes the coarse level,
    solved exactly with :math:`L_0 + \gamma 1 1^T`, :math:`\gamma = mean(diag L_0)/n_0`.
    Chebyshev smoothing: on the graded meshes of §5.3.1 point Jacobi with
    omega = 2/3 is not even convergent (cells with aspect ratio ~20 push
    :math:`\lambda_{max}(D^{-1}L)` above 3), Chebyshev estimates :math:`\lambda_{max}`.
    Default V(2,2) with degree-6 sweeps: it needs about half the Krylov iterations of
    V(1,1) with degree 4, and every iteration also pays a fixed Krylov overhead (launches
    and the scalar transfer), so the stronger cycle is the cheaper solve (measurements in
    ``scripts/bench_navier_stokes.py``).  ``fused=True`` (default) runs the CSR row
    kernels on every level (:meth:`~adaptmg.multilevel.MultilevelSolver.set_fuse_below`)
    and ``graph=True`` replays the cycle as one CUDA graph (GPU); ``False`` gives the
    plain SpMV + element-wise cycle, the reference of the tests.

    The Krylov method is flexible GMRES (:func:`adaptmg.linalg.fgmres`): with a fixed
    preconditioner its iterates equal GMRES's, and keeping ``z_j = M v_j`` turns the
    final update ``x += M (V y)`` -- one more V-cycle per solve -- into ``x += Z y``.
    """

    def __init__(self, levels, A, backend, *, coarse_rows=2000, smoother="chebyshev",
                 smoother_kwargs=None, presmooth=2, postsmooth=2, rtol=1e-6, restart=30,
                 maxiter=4, fused=True, graph=True):
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
                                   postsmooth=postsmooth, fuse_below="auto" if fused else 0)
        # the cycle reads its rhs from cycle.b, writes cycle.x: no copy in, no allocation out
        self.cycle = self.ml.buffered_cycle("V", graph="auto" if graph else False)
        self.A = be.asmatrix(A)
        self._plan = make_spmv(self.A)
        n = A.shape[0]
        self.n = n
        self._Ax = xp.zeros(n)
        self.rtol, self.restart, self.maxiter = rtol, restart, maxiter
        self.be = be
        self.iterations = []
        self.failures = 0
        # GPU: every FGMRES iteration (projection, cycle, SpMV, Gram-Schmidt, rotation) one graph
        self.krylov = None
        if be.is_gpu and graph and self.cycle.graph is not None:
            self._ones = xp.ones((1, n))
            self._tot = xp.zeros(1)
            self._ops = VectorOps(be, n, np.float64, rows=1)
            self.krylov = GraphFGMRES(be, self.A, self._precond_into, restart=restart)

    def _precond_into(self, v, z):
        """``z = V-cycle(v - mean(v))`` on fixed buffers (recorded into the FGMRES graphs)."""
        self._ops.mdot(self._ones, v, self._tot)
        NK.shift_copy(v, self._tot, 1.0 / self.n, self.cycle.b)
        self.cycle.run_eager(out=z)

    @property
    def mode(self):
        """How the V-cycle runs: "cuda-graph", "eager" (GPU, kernel by kernel) or "numpy"."""
        return self.cycle.mode

    def matvec(self, x):
        return self._plan(x, self._Ax)

    def precond(self, v):
        """One V-cycle on ``v - mean(v)`` (two launches for the projection, no host sync)."""
        xp = self.be.xp
        tot = xp.sum(v).reshape(1) if self.be.is_gpu else np.array([v.sum()])
        NK.shift_copy(v, tot, 1.0 / self.n, self.cycle.b)
        return self.cycle()

    def solve(self, b, x0):
        if self.krylov is not None:
            out = self.krylov.solve(b, x0.copy(), rtol=self.rtol, maxiter=self.maxiter)
            if out is not None:
                x, state, its = out
                self.iterations.append(its)
                if state != 0:
                    self.failures += 1
                return x, state
            self.krylov = None             # a graph was refused: the host-driven FGMRES
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
