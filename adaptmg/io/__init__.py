r"""Mesh and solution files through meshio (VTU, XDMF, Gmsh, Abaqus, ...).

Modules
-------
:mod:`~adaptmg.io.formats`
    :func:`write` and :func:`read` for any format meshio knows (format from the suffix).
:mod:`~adaptmg.io.convert`
    adaptmg ``Mesh`` <-> ``meshio.Mesh``: VTK vertex order (:func:`vtk_permutation`),
    point/cell fields to write (``host_mesh``: a mesh on the GPU as host copies of the
    arrays a file holds), checks of a mesh read back.
:mod:`~adaptmg.io.vtu_raw`
    the uncompressed VTU writer of ``write(..., compression=None)`` (raw appended data,
    plain buffer writes; what the adaptive loop writes).
:mod:`~adaptmg.io.xdmf`
    adaptmg's own XDMF writer and reader (inline XML, exact float64),
    :class:`TimeSeriesWriter`, :func:`read_time_series`.
:mod:`~adaptmg.io.groups`
    boundary ids, regions and names in the files :func:`write` writes (Gmsh physical
    groups, VTK ``FieldData``, an XDMF ``Information`` element).
:mod:`~adaptmg.io.sandbox`
    untrusted files: size limits (:data:`DEFAULT_LIMITS`), prechecks, meshio's
    readers in a child process with a timeout.

What a file holds
-----------------
:func:`write` stores the active cells of a mesh (points, cells) plus, unless
``mesh_data=False``, three arrays that describe the adaptive mesh
(:data:`RESERVED` names):

* point data ``hanging`` (int32 0/1): the node is a hanging node;
* cell data ``level`` (int32): refinement level of the cell;
* cell data ``boundary_ids`` (int32, ``(num_cells, 2 dim)``): boundary id of
  face ``2 axis + side``, ``-1`` inside the domain;
* cell data ``region`` (int32): region id of the cell;

and the boundary / region names.  Gmsh files hold the ids as physical groups
instead (boundary lines / quads and the cells) and the names as
``$PhysicalNames`` (:mod:`~adaptmg.io.groups`).  Reading any file, boundary
elements with physical groups or in element sets name the boundary faces they
cover and the cells' groups become regions (:mod:`adaptmg.mesh.tags`).

User fields are point data (one value or one vector per mesh node) or cell
data (one value or vector per cell).  A solution vector of a
:class:`~adaptmg.Space` with ``c`` components (DoF ``= node * c + comp``) is
written as an ``(num_nodes, c)`` array, i.e. a vector field for ``c > 1``.

A mesh read back is a **new coarse mesh** (no refinement tree): all cells have
level 0 and a former hanging node is an ordinary vertex of the fine cells.
Points, cells (same order; Gmsh 4.1: the nodes renumbered by entity, the cells
grouped by region), boundary ids (interior non-conforming faces stay interior
because the stored ``-1`` is used), regions, names and all data are preserved exactly;
the refinement history and the hanging-node constraints are not (the stored
``hanging``/``level`` arrays tell which nodes and cells they were).
"""
from __future__ import annotations

from .convert import CELL_TYPE, PERM, RESERVED, vtk_permutation
from .formats import read, write
from .sandbox import DEFAULT_LIMITS
from .xdmf import TimeSeriesWriter, read_time_series

__all__ = ["read", "write", "TimeSeriesWriter", "read_time_series", "vtk_permutation",
           "RESERVED", "DEFAULT_LIMITS"]
