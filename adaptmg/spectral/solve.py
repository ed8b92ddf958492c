"""One-call spectral-element solvers: ``poisson`` (-div grad u = f) and the
implicit Helmholtz step of the heat equation, by :func:`adaptmg.linalg.cg` on the
matrix-free operator with seed 004's preconditioners.

Dirichlet conditions are imposed by lifting and masking: with ``Z`` the 0/1 diagonal
of the free DoFs and ``u_g`` the Dirichlet data on the fixed DoFs, CG solves

    (Z A Z + I - Z) x = Z (b - A u_g),     u = x + u_g,

so the fixed rows are the identity and the Krylov vectors vanish there.  On a 2:1 mesh
with hanging nodes (``space.H``, :mod:`adaptmg.spectral.hanging`) the hanging DoFs join
the masked ones and A becomes ``H^T A H`` (``u = H (x + u_g)``, ``b -> H^T b``)."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import call_points, get_backend, to_host
from ..linalg import ConvergenceWarning, cg, refine
from .basis import quadrature_rule
from .operators import SpectralOperator
from .schwarz import CoarseQ1, FineSchwarz, TwoScale
from .space import SpectralSpace, array_nbytes, interpolate, retype_csr

__all__ = ["poisson", "SpectralProblem", "SpectralSolution", "PRECONDITIONERS"]

PRECONDITIONERS = ("two-scale", "fine", "pmg", "jacobi", "none")


def _values(fn, x, name, xp=np):
    """``fn(x)`` for points x (..., d) as an array of shape x.shape[:-1]."""
    if not callable(fn):
        raise TypeError(f"{name} must be a callable of points x[..., d], got {type(fn).__name__}")
    v = call_points(fn, x, xp=xp)
    if v.ndim == 0:
        v = xp.full(x.shape[:-1], float(v))
    if v.shape != x.shape[:-1]:
        raise ValueError(f"{name}(x) must return one value a point, shape {x.shape[:-1]}; "
                         f"got {v.shape} for points of shape {x.shape}")
    return v


class SpectralProblem:
    """``c_m M + c_k K`` on a :class:`SpectralSpace` with Dirichlet DoFs, its masked
    operator and one of the preconditioners ``PRECONDITIONERS``."""

    def __init__(self, space, *, mass=0.0, stiffness=1.0, dirichlet="all", preconditioner="two-scale",
                 dtype=np.float64, backend="auto", geometry="stored", coarse_kwargs=None, quadrature="gll",
                 concurrent="auto"):
        if preconditioner not in PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {PRECONDITIONERS}, got {preconditioner!r}")
        self.space, self.backend = space, get_backend(backend)
        xp = self.xp = self.backend.xp
        self.dtype = np.dtype(dtype)
        self.op = SpectralOperator(space, mass=mass, stiffness=stiffness, geometry=geometry,
                                   dtype=dtype, backend=self.backend, quadrature=quadrature)
        hang = space.hanging_dofs
        self.fixed = np.setdiff1d(space.boundary_dofs(dirichlet), hang)   # hanging values follow H
        if mass == 0.0 and self.fixed.size == 0:
            raise ValueError("the pure Neumann Poisson problem is singular: give Dirichlet boundary ids")
        free = np.ones(space.num_dofs)
        free[self.fixed] = 0.0
        free[hang] = 0.0
        self.masked = np.union1d(self.fixed, hang)          # the DoFs with identity rows
        self._H = None if space.H is None else \
            (self.backend.asmatrix(space.H, dtype=dtype), self.backend.asmatrix(space.H.T.tocsr(), dtype=dtype))
        self.free = xp.asarray(free, dtype=dtype)
        self._free_mask = self.free > 0
        self.shape = self.op.shape
        self.mass, self.stiffness, self.dirichlet = mass, stiffness, dirichlet
        kw = dict(mass=mass, stiffness=stiffness, dtype=dtype, backend=self.backend)
        self.preconditioner, self._coarse_kwargs = preconditioner, dict(coarse_kwargs or {})
        self._inner, self.last_outer_steps = {}, 0     # inner problems of mixed-precision solves
        if preconditioner == "jacobi":
            diag = self.op.diagonal()
            if space.H is not None:                 # diag(H^T A H) without A's off-diagonal terms
                diag = self.backend.asmatrix(space.H.multiply(space.H).T.tocsr(), dtype=dtype) @ diag
            self.M = _Scale(self.free / xp.where(self.free > 0, diag, 1))
        elif preconditioner == "none":
            self.M = None
        elif preconditioner == "pmg":
            from .pmg import PMultigrid
            self.M = PMultigrid(self, dirichlet, **(coarse_kwargs or {}))
        else:
            fine = FineSchwarz(space, self.masked, **kw)      # patches without hanging DoFs
            self.M = fine if preconditioner == "fine" else \
                TwoScale(fine, CoarseQ1(space, dirichlet, self.fixed, **kw, **(coarse_kwargs or {})),
                         concurrent=concurrent)

    def astype(self, dtype):
        """This problem in ``dtype`` (float64/float32) from its arrays: the operator's factors
        and P^f's data rounded, index arrays and CSR structures shared, P^c's Q1 hierarchy
        (small) and a p-multigrid preconditioner built again in ``dtype``."""
        import copy
        be = self.backend
        out = copy.copy(self)
        out._inner = {}
        out.dtype = dtype = np.dtype(dtype)
        out.op = self.op.astype(dtype)
        out._H = None if self._H is None else tuple(retype_csr(A, dtype, be) for A in self._H)
        out.free = self.free.astype(dtype)
        if self.preconditioner == "pmg":
            from .pmg import PMultigrid
            out.M = PMultigrid(out, self.dirichlet, **self._coarse_kwargs)
        elif self.M is not None:
            out.M = self.M.astype(dtype)
        return out

    def _arrays(self, preconditioner=True):
        """The arrays this problem holds on its backend (operator, masks, and with
        ``preconditioner`` the preconditioner's)."""
        items = [self.op.G if self.op.geometry == "stored" else self.op.X,
                 getattr(self.op, "wdet", None), self.op.cell_dofs, self.op.scatter_matrix, self.free]
        items += [] if self._H is None else list(self._H)
        items.append(self.space._on_backend.get((self.backend.name, "points")))   # the space's copy
        M = self.M if preconditioner else None
        if isinstance(M, TwoScale):
            items += M.fine.arrays() + M.coarse.arrays()
        elif isinstance(M, FineSchwarz):
            items += M.arrays()
        elif isinstance(M, _Scale):
            items.append(M.d)
        elif hasattr(M, "arrays"):                      # PMultigrid
            items += M.arrays()
        return items

    def nbytes(self, work_vectors=6):
        """Bytes this problem holds on its backend -- operator (factors, gather index, scatter
        matrix), preconditioner (p-multigrid: every level), the masks -- plus ``work_vectors`` vectors of the DoFs
        (PCG: x, r, z, p, A p and the right-hand side); arrays shared between parts once.
        With inner problems of mixed-precision solves (:meth:`inner`): theirs too, shared
        index structures once, and the refinement's vectors (x, r, b here; six there)."""
        items = self._arrays()
        vectors = (3 if self._inner else work_vectors) * self.dtype.itemsize
        for low in self._inner.values():
            items += low._arrays()
            vectors += 6 * low.dtype.itemsize
        return array_nbytes(*items) + self.shape[0] * vectors

    def expand(self, x):
        """``H x``: the continuous function of the values at regular DoFs (x itself when the
        mesh has no hanging nodes)."""
        return x if self._H is None else self._H[0] @ x

    def restrict(self, y):
        """``H^T y``: an assembled (dual) vector folded onto the regular DoFs."""
        return y if self._H is None else self._H[1] @ y

    def matvec(self, x):
        """``(Z H^T A H Z + I - Z) x`` (Z 0/1: the free rows of ``H^T A H Z x``, x on the
        masked ones; one select instead of four element-wise products and sums)."""
        y = self.restrict(self.op.matvec(self.expand(self.free * x)))
        return self.xp.where(self._free_mask, y, x)

    __matmul__ = matvec

    def inner(self, dtype):
        """The problem in ``dtype`` that mixed-precision solves of this one use inside
        (:meth:`astype`, made on the first call and kept: see :meth:`solve`)."""
        dtype = np.dtype(dtype)
        if dtype not in self._inner:
            self._inner[dtype] = self.astype(dtype)
        return self._inner[dtype]

    def solve(self, b, x0=None, *, rtol=1e-8, maxiter=None, inner_dtype=None, inner_rtol=1e-3):
        """CG on the masked system to ``||b - A x|| <= rtol ||b||``; returns
        ``(x, iterations, info)`` (``info > 0`` with a ConvergenceWarning when ``maxiter``
        CG iterations did not reach ``rtol``).

        ``inner_dtype`` (e.g. ``np.float32`` for a float64 problem): mixed-precision iterative
        refinement (:func:`adaptmg.linalg.refine`): the residual ``b - A x`` with this
        problem's operator and x in its dtype, the corrections by PCG of :meth:`inner`'s
        problem (operator and preconditioner in ``inner_dtype``) to ``inner_rtol`` relative
        to each residual.  For tolerances below the attainable accuracy of a float32 residual
        (rounding in the operator apply, growing with the DoFs: about 2e-6 at 1.4e7 DoFs of
        degree 6).  ``iterations``: the inner CG iterations of all steps, ``maxiter`` bounds
        them; :attr:`last_outer_steps` the outer steps.  Memory: this problem (its float64
        factors are kept) plus the inner one (float32 factors, index structures shared):
        about 1.5x the float64 problem's bytes (:meth:`nbytes` counts both).  Time: an inner
        iteration costs a float32 one, an outer step one float64 operator apply and a few
        vector updates, and each outer step starts a new Krylov space (a few more iterations
        than one uninterrupted PCG)."""
        if inner_dtype is None or np.dtype(inner_dtype) == self.dtype:
            its = [0]

            def count(_):
                its[0] += 1
            x, info = cg(self.matvec, b, x0, rtol=rtol, maxiter=maxiter, M=self.M, callback=count)
            self.last_outer_steps = 1
            return x, its[0], info
        inner_dtype = np.dtype(inner_dtype)
        if inner_dtype.kind != "f" or inner_dtype.itemsize >= self.dtype.itemsize:
            raise ValueError(f"inner_dtype must be a float type below the problem's {self.dtype}, "
                             f"got {inner_dtype}")
        low = self.inner(inner_dtype)
        if getattr(b, "dtype", self.dtype) != self.dtype:     # the residual in this problem's dtype
            b = b.astype(self.dtype)

        def solve_low(r, tau, budget):
            with warnings.catch_warnings():              # refine reports a failure itself
                warnings.simplefilter("ignore", ConvergenceWarning)
                d, n, _ = low.solve(r.astype(inner_dtype), rtol=tau, maxiter=budget)
            return d, n
        x, info, its, self.last_outer_steps = refine(self.matvec, b, x0, inner=solve_low, rtol=rtol,
                                                     inner_rtol=inner_rtol, maxiter=maxiter)
        return x, its, info


class _Scale:
    def __init__(self, d):
        self.d = d

    def astype(self, dtype):
        return _Scale(self.d.astype(dtype))

    def __call__(self, r):
        return self.d * r


@dataclass
class SpectralSolution:
    """``u`` (values at the GLL nodes, NumPy or CuPy), ``iterations``, ``num_dofs`` (the
    unknowns: hanging DoFs not counted), ``info``; ``seconds``: wall time of the set-up
    (space, operator, preconditioner) and of the solve (load vector, CG), device synchronised;
    ``nbytes``: what the problem held on its backend (:meth:`SpectralProblem.nbytes`);
    ``outer_steps``: the refinement steps of a mixed-precision solve (``inner_dtype``; then
    ``iterations`` counts the inner CG iterations), 1 otherwise."""
    u: Any
    iterations: int
    num_dofs: int
    info: int
    space: SpectralSpace
    seconds: dict = field(default_factory=dict)
    nbytes: int = 0
    outer_steps: int = 1

    def l2_error(self, exact) -> float:
        """``||u - exact||_L2`` by (k+3)-point Gauss quadrature on the isoparametric cells."""
        V = self.space
        d, k = V.dim, V.degree
        B, DB, w = _error_rule(k)
        nc = V.mesh.num_cells
        cs = (nc,) + (k + 1,) * d
        uq = interpolate(to_host(self.u)[V.cell_dofs].reshape(cs), B, d).reshape(nc, -1)
        X = V.cell_points.reshape(cs + (d,))
        xq = np.stack([interpolate(X[..., i], B, d).reshape(nc, -1) for i in range(d)], -1)
        from .operators import _tensor_weights, geometric_factors
        _, wdet = geometric_factors(V.jacobians(B, DB), _tensor_weights(w, d), np)
        e = uq - _values(exact, xq, "exact")
        return float(np.sqrt((wdet * e * e).sum()))


def _error_rule(k):
    from numpy.polynomial import legendre as L
    from ..patch.tensor import lagrange_eval
    q, w = L.leggauss(k + 3)
    s = 0.5 * (q + 1.0)
    return lagrange_eval(k, s), lagrange_eval(k, s, 1), 0.5 * w


def poisson(mesh, degree, f, *, g=None, mapping=None, preconditioner="two-scale", rtol=1e-8,
            backend="auto", dirichlet="all", dtype=np.float64, maxiter=None, geometry="stored",
            quadrature="gll", concurrent="auto", inner_dtype=None):
    """Solve ``-div grad u = f`` with ``u = g`` on the Dirichlet boundary (ids or "all")
    by spectral elements of degree ``degree`` on ``mesh`` (optionally curved by ``mapping``)
    and preconditioned CG.  ``mesh`` may also be a :class:`SpectralSpace` of that degree
    (built once, solved with several preconditioners; ``mapping`` is then the space's).  ``f``, ``g``: callables of points ``x[..., d]``.
    ``quadrature``: "gll" (collocated, seed 004) or "gauss" (k+2 points: exact on affine
    cells, so u in Q_k is reproduced).  Meshes with hanging nodes (2:1) are constrained by
    :mod:`adaptmg.spectral.hanging`.  ``inner_dtype=np.float32``: mixed-precision iterative
    refinement (:meth:`SpectralProblem.solve`; ``dtype`` float64 outside).  Returns a :class:`SpectralSolution`; ``info != 0``
    (with a warning from CG) when CG did not reach ``rtol``."""
    t0 = time.perf_counter()
    be = get_backend(backend)
    if isinstance(mesh, SpectralSpace):
        V = mesh
        if V.degree != degree or mapping is not None:
            raise ValueError(f"poisson: a SpectralSpace of degree {V.degree} was given with degree={degree}"
                             f"{' and a mapping (the space has its own)' if mapping is not None else ''}")
    else:
        V = SpectralSpace(mesh, degree, mapping=mapping, backend=be)
    prob = SpectralProblem(V, dirichlet=dirichlet, preconditioner=preconditioner, dtype=dtype,
                           backend=be, geometry=geometry, quadrature=quadrature, concurrent=concurrent)
    xp, op = prob.xp, prob.op
    prob.backend.synchronize()
    t1 = time.perf_counter()
    b = op.load(_values(f, op.quadrature_points(on_backend=True), "f", xp))
    ug = xp.zeros(V.num_dofs, dtype=prob.dtype)
    if g is not None and prob.fixed.size:
        pts = V.points[prob.fixed]
        ug[xp.asarray(prob.fixed)] = _values(g, xp.asarray(pts), "g", xp).astype(prob.dtype)
        b = b - op.matvec(prob.expand(ug))
    b = prob.free * prob.restrict(b)
    x, its, info = prob.solve(b, rtol=rtol, maxiter=maxiter, inner_dtype=inner_dtype)
    u = prob.expand(x + ug)
    prob.backend.synchronize()
    return SpectralSolution(u=u, iterations=its, num_dofs=V.num_dofs - V.hanging_dofs.size, info=info,
                            space=V, seconds=dict(setup=t1 - t0, solve=time.perf_counter() - t1),
                            nbytes=prob.nbytes(), outer_steps=prob.last_outer_steps)
