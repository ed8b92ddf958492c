"""Vectorised assembly of finite element operators to SciPy CSR (see :mod:`.forms`)."""
from .forms import convection, load, lumped_mass, mass, scalar_form, stiffness
from .vector_forms import derivative_matrices, elasticity
from .boundary import boundary_load
from .mixed import divergence_iso, gradient_iso
from ..fe.sparsity import Pattern, clear_cache, componentwise, get_pattern

__all__ = ["mass", "lumped_mass", "stiffness", "convection", "scalar_form", "elasticity", "derivative_matrices",
           "gradient_iso", "divergence_iso", "load", "boundary_load", "Pattern", "get_pattern", "componentwise",
           "clear_cache"]
