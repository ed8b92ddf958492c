"""Matrix-free tensor-product path: Cartesian Q_k (k = 1..8 in 3D, 1..10 in 2D),
sum-factorised Laplace operator, colored multiplicative vertex-patch smoother
with fast diagonalisation, Kronecker interpolation; the levels run in
:class:`adaptmg.multilevel.MultilevelSolver` (V-cycle), with full multigrid and
:func:`adaptmg.linalg.fgmres` on top, in double or mixed precision, on NumPy or
CuPy (seed 000).

Quick start::

    from adaptmg.patch import CartesianSpace, PatchMultigrid
    V = CartesianSpace(dim=3, k=3, level=4)
    mg = PatchMultigrid(V, backend="cpu")
    b, _ = V.sine_problem()
    x, info = mg.solve(b, rtol=1e-9)                 # full multigrid
    x, info = mg.solve(b, method="gmres", precision="mixed")
"""
from .operator import LaplaceOperator
from .smoother import PatchSmoother, patch_colors
from .solver import FastDiagSolver, PatchLevel, PatchMultigrid, patch_levels
from .space import CartesianSpace
from .transfer import prolongation, restriction

__all__ = ["CartesianSpace", "LaplaceOperator", "PatchSmoother", "patch_colors",
           "FastDiagSolver", "PatchMultigrid", "PatchLevel", "patch_levels",
           "prolongation", "restriction"]
