"""Adaptive quad/hex meshes with hanging nodes and global coarsening.

Modules: :mod:`~adaptmg.mesh.mesh` (:class:`Mesh`), :mod:`~adaptmg.mesh._tree` (the refinement
forest), :mod:`~adaptmg.mesh.tags` (named boundaries and regions: physical groups of mesh
files, names in place of ids), :mod:`~adaptmg.mesh.reference` (reference cell tables).
"""
from .mesh import Mesh, check_cells, jacobian_determinants

__all__ = ["Mesh", "check_cells", "jacobian_determinants"]
