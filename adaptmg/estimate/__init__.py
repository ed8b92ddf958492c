"""A posteriori error estimation and the adaptive loop solve -> estimate -> mark -> refine.

The modules, in the order data flows through them:

* :mod:`.inputs` -- user data: full nodal solution vectors and coefficients (constant,
  per cell or callable), checked and evaluated at points;
* :mod:`.evaluation` -- u_h, its gradient and Hessian at reference points of cells;
* :mod:`.faces` -- interior faces of a mesh with hanging nodes (:func:`face_pairs`),
  Gauss points, normals and diameters of faces;
* :mod:`.residual` -- residual (Kelly-type) indicators: :func:`residual_indicators`
  (scalar diffusion-convection-reaction), :func:`elasticity_indicators`,
  :func:`cell_diameters`;
* :mod:`.dwr` -- goal-oriented dual weighted residual indicators (:func:`dwr_indicators`,
  Q2 dual solve with the geometric multigrid);
* :mod:`.marking` -- :func:`doerfler`, :func:`fixed_fraction`, :func:`mark`;
* :mod:`.adaptive` -- :class:`AdaptiveProblem`, :func:`adaptive_loop`, :func:`write_vtu`
  (through :func:`adaptmg.io.write`), :func:`fitted_slope`.
"""
from .residual import cell_diameters, elasticity_indicators, residual_indicators
from .faces import face_pairs
from .dwr import dwr_indicators
from .marking import doerfler, fixed_fraction, mark
from .adaptive import AdaptiveProblem, adaptive_loop, fitted_slope, write_vtu

__all__ = ["residual_indicators", "elasticity_indicators", "dwr_indicators", "doerfler",
           "fixed_fraction", "mark", "adaptive_loop", "AdaptiveProblem", "write_vtu",
           "cell_diameters", "fitted_slope", "face_pairs"]
