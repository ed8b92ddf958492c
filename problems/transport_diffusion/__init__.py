"""Transport-diffusion on the unit square (seed 001 §5.1, Table 1).

* :mod:`.scheme` -- the problem and its discretisation (its docstring has the math):
  mesh, system matrix, backward-Euler steps with GMRES + multigrid, :func:`run`;
* :mod:`.kernels` -- the exact solution, the source and the fused right-hand-side
  kernel with its NumPy twin;
* :mod:`.rhs` -- a step's right-hand side in fixed buffers (one CUDA graph on the GPU).
"""
from .kernels import td_exact, td_source, td_step_data
from .scheme import B, COLUMNS, LAMBDA, exact, make_mesh, run, source, system_matrix

__all__ = ["LAMBDA", "B", "exact", "source", "make_mesh", "system_matrix", "run", "COLUMNS",
           "td_exact", "td_source", "td_step_data"]
