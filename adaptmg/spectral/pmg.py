"""p-multigrid for the spectral operators: Q_k -> Q_k/2 -> ... -> Q1 -> the library's
Q1 hierarchy (geometric, then algebraic levels), as one :class:`MultilevelSolver`.

The p-levels are matrix-free :class:`adaptmg.multilevel.Level` objects: ``A_l`` the masked
operator ``Z A Z + I - Z`` of Q_{k_l}, ``P_l`` the nodal interpolation from Q_{k_{l-1}}
(tensor products of the coarse Lagrange basis at the fine GLL points, masked on the
Dirichlet DoFs), ``R_l = P_l^T`` stored, and the smoother the damped fine-scale Schwarz
step of seed 004,

    x <- x + omega P^f (b - A x),      omega = 1 / lambda_max(P^f A)  (power iteration),

so ``||I - omega P^f A||_A <= 1``.  Below the p-levels the Q1 levels of
:func:`adaptmg.multigrid` keep their coarse solve and are smoothed by
:data:`adaptmg.spectral.schwarz.Q1_SMOOTHER` (Chebyshev-Jacobi, as in the two-scale
preconditioner's coarse scale).  On a 2:1
mesh with hanging nodes every level is constrained (``H_l^T A_l H_l``) and the transfers
act between regular DoFs, ``Z_f P_l H_{l-1} Z_c`` (hanging DoFs masked on both sides)."""
from __future__ import annotations

import numpy as np

from ..multilevel import Level, MultilevelSolver
from ..multilevel.smoothers import power_lambda_max, smoother_setup_kwargs
from ..multilevel.start_vector import start_vector
from .schwarz import Q1_SMOOTHER, FineSchwarz, q1_constraints, q1_multigrid, space_transfer
from .space import SpectralSpace

__all__ = ["PMultigrid", "degree_ladder", "SchwarzSmoother"]


def degree_ladder(k: int) -> list:
    """Degrees of the p-levels, finest first: k, k // 2, ..., 1."""
    ks = [int(k)]
    while ks[-1] > 1:
        ks.append(max(1, ks[-1] // 2))
    return ks


class SchwarzSmoother:
    """Damped additive Schwarz ``x <- x + omega S (b - A x)`` with ``S`` = :class:`FineSchwarz`."""

    def __init__(self, A, S, xp, dtype):
        self.A, self.S, self.xp = A, S, xp
        v = start_vector(A.shape[0], 0, xp=xp).astype(dtype, copy=False) * A.free
        self.omega = 1.0 / power_lambda_max(lambda u: S(A @ u), v, xp.linalg.norm, 15, "SchwarzSmoother")

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        for s in range(sweeps):
            r = b if (zero_initial and s == 0) else b - self.A @ x
            x += self.omega * self.S(r)
        return x

    def __repr__(self):
        return f"SchwarzSmoother(omega={self.omega:.3g})"


class PMultigrid:
    """One V-cycle of the p-multigrid hierarchy below ``problem`` (a
    :class:`~adaptmg.spectral.SpectralProblem`) as a preconditioner ``r -> M r``."""

    def __init__(self, problem, dirichlet, presmooth=1, postsmooth=1, **multigrid_kwargs):
        be, dtype = problem.backend, problem.dtype
        V = problem.space
        mesh = V.mesh
        cm, ck = problem.mass, problem.stiffness
        from .solve import SpectralProblem
        ml, cfixed = q1_multigrid(mesh, dirichlet, mass=cm, stiffness=ck, dtype=dtype, backend=be,
                                  **multigrid_kwargs)
        ks = degree_ladder(V.degree)
        probs = [problem] + [SpectralProblem(SpectralSpace(mesh, kl, mapping=V.mapping), mass=cm,
                                             stiffness=ck, dirichlet=dirichlet, preconditioner="none",
                                             dtype=dtype, backend=be) for kl in ks[1:-1]]
        levels = []
        H1, hang1 = q1_constraints(mesh)
        for l, pr in enumerate(probs):                       # the p-levels, fine -> coarse
            if l + 1 < len(probs):
                c = probs[l + 1]
                P, R = space_transfer(pr.space, c.space.degree, c.space.cell_dofs, c.space.num_dofs,
                                      pr.masked, c.masked, be, dtype, coarse_H=c.space.H)
            else:
                P, R = space_transfer(pr.space, 1, mesh.cells, mesh.num_nodes, pr.masked,
                                      np.union1d(cfixed, hang1), be, dtype, coarse_H=H1)
            S = FineSchwarz(pr.space, pr.masked, mass=cm, stiffness=ck, dtype=dtype, backend=be)
            levels.append(Level(pr, P, R, smoother=SchwarzSmoother(pr, S, be.xp, dtype),
                                meta=dict(kind=f"Q{pr.space.degree}", cells=mesh.num_cells)))
        self.degrees = ks
        spec = multigrid_kwargs.get("smoother", Q1_SMOOTHER)        # the Q1 levels' smoother
        self.solver = MultilevelSolver(list(ml.levels) + levels[::-1], backend=be, dtype=dtype,
                                       presmooth=presmooth, postsmooth=postsmooth, smoother=spec,
                                       smoother_kwargs=smoother_setup_kwargs(
                                           spec, multigrid_kwargs.get("smoother_kwargs"), auto_omega=True))
        self.M = self.solver.aspreconditioner(graph=False)

    def arrays(self):
        """The arrays and CSR matrices the hierarchy holds on its backend: every level's
        operator (the Q1 matrices; a p-level's spectral operator and masks, the finest
        problem's excepted: its owner counts it), transfers, work vectors and Schwarz
        smoother (for :func:`~adaptmg.spectral.space.array_nbytes`)."""
        out = []
        for lev in self.solver._dev[:-1] + [None]:
            if lev is None:                                    # the finest p-level
                lev = self.solver._dev[-1]
                items = [lev.P, lev.R, lev.r]
            else:
                items = [lev.A, lev.P, lev.R, lev.RA, lev.AP, lev.x, lev.b, lev.r]
            for a in items:
                out += a._arrays(preconditioner=False) if hasattr(a, "_arrays") else [a]
            S = getattr(lev.smoother, "S", None)
            out += S.arrays() if isinstance(S, FineSchwarz) else []
        return [a for a in out if hasattr(a, "nbytes") or hasattr(a, "indptr")]

    def __call__(self, r):
        return self.M.matvec(r)
