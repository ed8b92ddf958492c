"""Application problems of adaptmg, installed as ``adaptmg_problems`` (this folder is ``problems/``).

A problem is a module (or a package) of this package with a ``run`` function; the
``adaptmg`` command finds them (``adaptmg list``, ``adaptmg run <problem>``).  Each
problem owns its formulas and, where it has them, its device kernels:

* seed 001 §5: :mod:`.transport_diffusion` (package: ``scheme`` + ``kernels``),
  :mod:`.elasticity`, :mod:`.navier_stokes` (package: ``scheme`` + ``pressure`` + ``kernels``);
* adaptive test problems: :mod:`.lshape`, :mod:`.fichera`, :mod:`.interior_layer`,
  :mod:`.elasticity_corner`; the demo :mod:`.poisson`;
* shared helpers (not problems): :mod:`._stepping` (one implicit time step) and
  :mod:`._timing` (per-phase timers and tables).
"""
