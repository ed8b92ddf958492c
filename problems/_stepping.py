r"""One implicit time step, shared by the time-dependent problems (transport-diffusion, elasticity).

* :func:`time_steps` -- the validated number of steps from ``dt``, ``T`` or ``steps``;
* :class:`SpMVOperator` -- the system matrix as a GMRES operator whose products go
  through one cached :func:`adaptmg.device.kernels.make_spmv` plan;
* :func:`constrain_combine` -- ``out = z * r + s * g``, the last step of the constrained
  right-hand side :math:`f = Z H^T(\dots) + s\,g` (``z`` the 0/1 free-DoF mask as floats,
  ``s`` the Dirichlet row scale, ``g`` the Dirichlet lifting), one fused kernel
  ``adaptmg_constrain_combine`` (memoised factory keyed by the CuPy module of the arrays)
  with its NumPy twin;
* :func:`gmres_step` -- the (right-preconditioned) GMRES solve of one step from the previous
  step's solution, to the tolerance of :func:`step_tolerances`;
* :class:`StepGMRES` -- the same solve with the matrix and the V-cycle fixed for all steps:
  on the GPU every FGMRES iteration is one CUDA-graph launch.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from adaptmg.backend import backend_of
from adaptmg.device.kernels import make_spmv
from adaptmg.linalg import ConvergenceWarning, fgmres

__all__ = ["time_steps", "SpMVOperator", "constrain_combine", "gmres_step", "step_tolerances",
           "StepGMRES", "KERNEL_NAMES"]

KERNEL_NAMES = ("adaptmg_constrain_combine",)


def time_steps(dt, T, steps, tol) -> int:
    """Validated number of time steps: ``steps`` if given, else T / dt (which must be a multiple)."""
    if not (np.isscalar(dt) and dt > 0):
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    if steps is None:
        if not (np.isscalar(T) and T > 0):
            raise ValueError(f"T must be a positive number, got {T!r}")
        steps = int(round(T / dt))
        if abs(steps * dt - T) > 1e-9 * max(1.0, T):
            raise ValueError(f"T={T} is not a multiple of dt={dt}")
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if tol not in ("rhs", "residual"):
        raise ValueError(f"tol must be 'rhs' or 'residual', got {tol!r}")
    return int(steps)


class SpMVOperator:
    """``A`` as an operator for :mod:`adaptmg.linalg` whose ``matvec`` goes through a cached
    :func:`adaptmg.device.kernels.make_spmv` plan (cuSPARSE descriptors created once, not per call).

    ``matvec(v)`` returns a new array ``A v`` (from the memory pool on the GPU).
    """

    def __init__(self, A):
        self.A = A
        self.shape = tuple(A.shape)
        self.dtype = np.dtype(A.dtype)
        self._plan = make_spmv(A)
        self._xp = backend_of(A).xp

    def matvec(self, v):
        y = self._xp.empty(self.shape[0], self.dtype)
        return self._plan(v, y, 1.0, 0.0)

    def __matmul__(self, v):
        return self.matvec(v)


@functools.lru_cache(maxsize=None)
def _combine_kernel(cp):
    """Build (once per CuPy module) the ``ElementwiseKernel`` ``adaptmg_constrain_combine``."""
    return cp.ElementwiseKernel("T z, T r, T s, T g", "T out", "out = z * r + s * g",
                                "adaptmg_constrain_combine")


def constrain_combine(z, r, s, g, out):
    """``out <- z * r + s * g`` (z: 0/1 free mask as floats, s: Dirichlet row scale), in place."""
    arrs = (z, r, g, out)
    if any(a.shape != z.shape for a in arrs[1:]):
        raise ValueError(f"constrain_combine: all arrays must have shape {z.shape}, "
                         f"got {[a.shape for a in arrs]}")
    if isinstance(z, np.ndarray):
        np.multiply(z, r, out=out)
        out += float(s) * g
    else:
        _combine_kernel(backend_of(z).xp)(z, r, z.dtype.type(s), g, out)
    return out


def gmres_step(K, rhs, x, M, *, rtol, maxiter, tol="rhs", xp, orthogonalization="cgs2"):
    """One GMRES(maxiter) solve of K x = rhs from the previous step's x, right-preconditioned by M.

    Runs :func:`adaptmg.linalg.fgmres` (one restart cycle of ``maxiter`` inner iterations,
    the callback counting them): with the fixed preconditioner M its iterates are those of
    right-preconditioned GMRES, the residual it monitors is the true one, and keeping
    ``z_j = M v_j`` saves the V-cycle of the final update (at the price of ``maxiter``
    more vectors).

    ``tol="rhs"``: stop at ||rhs - K x|| <= rtol ||rhs|| (a step that is already
    converged costs no iteration).  ``tol="residual"``: reduce this step's initial
    residual by ``rtol`` (Gascoigne style: every step works); at round-off level the
    final true-residual check may fail, which is reported through ``info`` only.
    ``orthogonalization``: "cgs2" (default here: a constant number of kernel launches
    per GMRES step, where MGS launches one per basis vector) or "mgs".
    Returns (x, info, iterations).
    """
    count = [0]

    def cb(_rk):
        count[0] += 1

    kw = step_tolerances(K, rhs, x, rtol, tol, xp)

    def solve():
        return fgmres(K, rhs, x0=x, restart=maxiter, maxiter=1, M=M, callback=cb,
                      orthogonalization=orthogonalization, **kw)
    if tol == "residual":       # reported through info only (see above)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            x, info = solve()
    else:
        x, info = solve()
    return x, info, count[0]


def step_tolerances(K, rhs, x, rtol, tol, xp):
    """The ``rtol``/``atol`` keywords of one step's solve from ``x``: ``tol="rhs"`` -- ``rtol``
    (||rhs - K x|| <= rtol ||rhs||); ``tol="residual"`` -- ``atol = rtol ||rhs - K x||``."""
    if tol == "rhs":
        return dict(rtol=rtol)
    if tol == "residual":
        return dict(rtol=0.0, atol=rtol * float(xp.linalg.norm(rhs - K.matvec(x))))
    raise ValueError(f"tol must be 'rhs' or 'residual', got {tol!r}")


class StepGMRES:
    """:func:`gmres_step` for a whole time loop: ``K`` (a :class:`SpMVOperator`) and the
    preconditioner, one V-cycle of the multigrid solver ``ml``, fixed; ``step(rhs, x0)``
    returns ``(x, info, iterations)`` and leaves ``x0`` as it is.

    On the GPU (``graph=True``, ``ml`` and ``K`` of one dtype, ``maxiter <= 256``) the
    solve is :class:`adaptmg.linalg.graph_fgmres.GraphFGMRES`: the same method as
    :func:`gmres_step` (FGMRES(``maxiter``), one restart cycle, CGS2, the same stopping test
    on the true residual) with each inner iteration -- the V-cycle, the SpMV, both
    Gram-Schmidt passes, the Givens rotation and the test -- replayed as one CUDA graph
    (recorded when the iteration count first reaches it), so that a step costs a few host
    round trips instead of ~1 ms of Python per step and per iteration.  A step that does
    not end converged is solved again by :func:`gmres_step` from the same ``x0``, which
    reports it (``info != 0`` and a :class:`~adaptmg.linalg.ConvergenceWarning`); if a
    graph is refused (``self.graph_error`` says why) every step takes that path.
    Elsewhere every step is :func:`gmres_step` with ``ml.aspreconditioner("V")``.
    """

    def __init__(self, K, ml, *, rtol, maxiter, tol="rhs", xp, graph=True):
        if tol not in ("rhs", "residual"):
            raise ValueError(f"tol must be 'rhs' or 'residual', got {tol!r}")
        self.K, self.ml, self.xp = K, ml, xp
        self.rtol, self.maxiter, self.tol = rtol, int(maxiter), tol
        self._M = None
        self.krylov = None
        self.graph_error = None
        be = ml.backend
        A = K.A
        if (graph and be.is_gpu and np.dtype(ml.dtype) == K.dtype and 1 <= self.maxiter <= 256
                and getattr(A, "format", None) == "csr" and A.indices.dtype == np.int32):
            from adaptmg.linalg.graph_fgmres import GraphFGMRES
            cyc = ml.buffered_cycle("V", graph=False)        # recorded inside the FGMRES graphs

            def precond(v, z):
                xp.copyto(cyc.b, v)
                cyc.run_eager(out=z)
            self.krylov = GraphFGMRES(be, A, precond, restart=self.maxiter)

    @property
    def M(self):
        """``ml.aspreconditioner("V")`` (built on first use: the graph path does not need it)."""
        if self._M is None:
            self._M = self.ml.aspreconditioner("V")
        return self._M

    @property
    def mode(self):
        """``"cuda-graph"`` (GraphFGMRES) or ``"host"`` (:func:`gmres_step`)."""
        return "cuda-graph" if self.krylov is not None else "host"

    def step(self, rhs, x0):
        """Solve ``K x = rhs`` from ``x0`` (not modified); returns ``(x, info, iterations)``."""
        if self.krylov is not None:
            kw = step_tolerances(self.K, rhs, x0, self.rtol, self.tol, self.xp)
            out = self.krylov.solve(rhs, x0.copy(), maxiter=1, **kw)
            if out is None:                       # a graph was refused: the host path from now on
                self.graph_error = self.krylov.graph_error
                self.krylov = None
            elif out[1] == 0:
                return out[0], 0, out[2]
        return gmres_step(self.K, rhs, x0, self.M, rtol=self.rtol, maxiter=self.maxiter,
                          tol=self.tol, xp=self.xp)
