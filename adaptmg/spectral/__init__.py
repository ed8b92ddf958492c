"""Spectral elements on unstructured and curved hex/quad meshes (seeds 004 and 002):
nodal Q_k (k = 1..8) on Gauss-Lobatto-Legendre points of any :class:`adaptmg.Mesh`,
matrix-free mass / stiffness / Helmholtz operators by sum factorisation (geometric
factors stored or computed on the fly, float64 or float32, NumPy or CuPy).

Quick start::

    import adaptmg
    from adaptmg.spectral import SpectralSpace, SpectralOperator
    V = SpectralSpace(adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], [4, 4, 4]), degree=3)
    K = SpectralOperator(V)                    # Poisson stiffness, y = K @ x
"""
from .operators import SpectralOperator
from .schwarz import CoarseQ1, FineSchwarz, TwoScale
from .solve import SpectralProblem, SpectralSolution, poisson
from .space import SpectralSpace

__all__ = ["SpectralSpace", "SpectralOperator", "SpectralProblem", "SpectralSolution", "poisson",
           "FineSchwarz", "CoarseQ1", "TwoScale"]
