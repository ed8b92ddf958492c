"""Spectral elements on unstructured and curved hex/quad meshes (seeds 004 and 002):
nodal Q_k (k = 1..8) on Gauss-Lobatto-Legendre points of any :class:`adaptmg.Mesh`
(imported, distorted, any vertex valence, curved by a ``mapping``; adaptive 2:1 meshes
with hanging nodes through the constraint matrix of :mod:`adaptmg.spectral.hanging`),
matrix-free mass / stiffness / Helmholtz operators by sum factorisation (geometric
factors stored or computed on the fly, float64 or float32, NumPy or CuPy), seed 004's
two-scale additive Schwarz preconditioner and p-multigrid onto the Q1 hierarchy.

Quick start::

    import numpy as np, adaptmg
    from adaptmg.spectral import poisson
    from adaptmg.spectral.meshes import ogrid_cylinder
    u = lambda x: np.sin(x[..., 0]) * np.exp(x[..., 2])          # -Laplace u = 0
    s = poisson(ogrid_cylinder(8), 4, lambda x: 0 * x[..., 0], g=u, preconditioner="two-scale")
    print(s.iterations, s.num_dofs, s.l2_error(u))

Lower level: ``SpectralSpace(mesh, k)``, ``SpectralOperator(space, mass=.., stiffness=..)``
(``y = op @ x``), ``SpectralProblem`` (Dirichlet masking + preconditioner, ``solve``).
"""
from .operators import SpectralOperator
from .pmg import PMultigrid
from .schwarz import CoarseQ1, FineSchwarz, TwoScale
from .solve import SpectralProblem, SpectralSolution, poisson
from .space import SpectralSpace

__all__ = ["SpectralSpace", "SpectralOperator", "SpectralProblem", "SpectralSolution", "poisson",
           "FineSchwarz", "CoarseQ1", "TwoScale", "PMultigrid"]
