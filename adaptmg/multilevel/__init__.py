"""Multilevel solvers: the hierarchy, its transfers and smoothers, and the one cycle.

In the order data flows:

* :mod:`.transfer` -- prolongation ``P_l`` between nested spaces (constraints folded in).
* :mod:`.hierarchy` -- :func:`multigrid`: levels from a :class:`~adaptmg.Space` and an
  assembly function (global coarsening, constraints, Galerkin or re-assembled matrices).
* :mod:`.smoothers` -- the smoothers ``x <- x + omega S (b - A x)`` and their one name
  registry (:func:`make_smoother`); :mod:`.cf_jacobi`: Jacobi over the F and C points of a
  C/F splitting in turn (pyamg's AIR relaxation).
* :mod:`.solver` -- :class:`Level` and :class:`MultilevelSolver`: V/W/F/AMLI cycles
  (:mod:`.amli`), stationary and Krylov-accelerated solves (:mod:`.accel`: ``accel`` as
  a foreign name or a function), the preconditioner; real or complex.
* :mod:`.pyamg` -- :func:`from_pyamg`: run a pyamg hierarchy with adaptmg's cycles
  (:mod:`.pyamg_relax`: pyamg's own relaxation and coarse solvers inside the cycle).
* :mod:`.amg` -- :func:`~.amg.amg` (exported as :func:`adaptmg.amg`): smoothed aggregation
  from any sparse SPD matrix, set up on the device when the backend is the GPU (:mod:`.aggregation`: strength, aggregation, tentative
  prolongator; :mod:`.nullspace`: near-nullspace vectors); :func:`multigrid` appends such
  levels below a geometric hierarchy that runs out.

The package is named ``multilevel`` so that it never collides with the function
:func:`adaptmg.multigrid`.
"""
from .solver import CYCLES, Level, MultilevelSolver
from .hierarchy import GeometricMultigrid, default_threads, dirichlet_dofs, dirichlet_values, multigrid
from .smoothers import SMOOTHERS, make_smoother
from .pyamg import from_pyamg
from . import amg  # the module; the function is adaptmg.amg (no shadowing of the module name)
from .nullspace import constant_modes, near_nullspace, rigid_body_modes

__all__ = ["CYCLES", "Level", "MultilevelSolver", "multigrid", "dirichlet_dofs", "dirichlet_values", "default_threads",
           "SMOOTHERS", "make_smoother", "from_pyamg", "GeometricMultigrid", "constant_modes",
           "rigid_body_modes", "near_nullspace"]
