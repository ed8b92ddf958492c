"""adaptmg: adaptive finite elements with geometric multigrid on CPU (NumPy/SciPy) and GPU (CuPy).

Typical use::

    import adaptmg
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine()
    space = adaptmg.Space(mesh, degree=1)
    ml = adaptmg.multigrid(space, adaptmg.assemble.stiffness, dirichlet="all")
    b = ml.constrain(adaptmg.assemble.load(space, lambda x: 1.0 + 0 * x[..., 0]))
    u = ml.expand(ml.solve(b, rtol=1e-8, accel="cg"))

A mesh file with named boundaries (Gmsh physical groups)::

    mesh = adaptmg.io.read("domain.msh")             # mesh.boundary_names == {"inlet": 7, ...}
    ml = adaptmg.multigrid(adaptmg.Space(mesh), adaptmg.assemble.stiffness,
                           dirichlet={"inlet": lambda x: x[:, 1], "wall": 0.0})
"""
from .backend import get_backend, gpu_available
from .mesh import Mesh
from .fe import Constraints, LagrangeQ, Space
from . import assemble, io, linalg
from .multilevel import Level, MultilevelSolver, dirichlet_dofs, from_pyamg, multigrid
from .multilevel.amg import amg

__version__ = "0.1.0"
__all__ = ["get_backend", "gpu_available", "Mesh", "Space", "Constraints", "LagrangeQ", "assemble", "io",
           "linalg", "Level", "MultilevelSolver", "multigrid", "dirichlet_dofs", "from_pyamg", "amg", "__version__"]
