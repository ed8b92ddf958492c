"""Navier-Stokes driven cavity with the explicit pressure-correction scheme (seed 001 §5.3, Algorithm 4).

* :mod:`.scheme` -- the problem, the discretisation and Algorithm 4 (its docstring has the
  math): meshes, host assembly, :class:`NavierStokes` (device state and one time step),
  :func:`run`, diagnostics and the Ghia et al. reference data;
* :mod:`.pressure` -- the Neumann pressure Poisson solver of Step 2: flexible GMRES
  preconditioned by a multigrid V-cycle fused into one CUDA-graph launch;
* :mod:`.kernels` -- the scheme's element-wise device kernels (eq. 14 products, momentum
  and pressure updates) with their NumPy twins.

The multi-matrix products (convection, viscous term, pressure gradient, divergence) use
the generic :class:`adaptmg.device.multicsr.MultiCSR`.
"""
from .scheme import (GHIA_RE100_U, GHIA_RE100_V, PHASES, NavierStokes, assemble_host, centreline,
                     corrected_velocity, graded_map, make_meshes, run, timing_table)

__all__ = ["PHASES", "graded_map", "make_meshes", "assemble_host", "NavierStokes", "run",
           "corrected_velocity", "centreline", "GHIA_RE100_U", "GHIA_RE100_V", "timing_table"]
