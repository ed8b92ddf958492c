"""Boundary faces and nodes of a mesh, and the selection of nodes by a user predicate.

A cell face ``2 i + s`` (the side ``x_i = s`` of the reference cell) is a boundary face when
the cell's boundary id there is ``>= 0``; the boundary nodes are the vertices of those faces
(:func:`adaptmg.mesh.reference.face_vertices`).  Gathers, a sort (``unique``) and a
membership test of the arrays' module: the same code and integers on the host and the
device.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..backend import backend_of, call_points, in_host_memory
from ..device.cell_kernels import cells_on_boundary
from . import reference as ref


def boundary_faces(b, ids=None, rows=None):
    """(cells, local faces, boundary ids) of the faces with a boundary id ``b`` (nc, 2d) >= 0,
    row-major (= ``nonzero(b >= 0)``), only those whose id is in ``ids`` (an int array) if
    given.  ``rows``: the cells are these rows of ``b`` (a forest's table and a mesh's active
    cells; cell ``i`` is row ``rows[i]``).  On the device the faces are searched only in the
    cells that have one (:func:`~adaptmg.device.cell_kernels.cells_on_boundary`): the same
    arrays."""
    be = backend_of(b)
    keep_rows = None
    if not in_host_memory(b):
        keep_rows = be.xp.flatnonzero(cells_on_boundary(b, rows))
        b = b.take(keep_rows if rows is None else rows.take(keep_rows), axis=0)
    elif rows is not None:
        b = b.take(rows, axis=0)
    flat = b.reshape(-1)
    at = be.xp.flatnonzero(flat >= 0)
    c, f = be.xp.divmod(at, b.shape[1])
    bid = flat.take(at)
    if keep_rows is not None:
        c = keep_rows.take(c)
    if ids is not None:
        keep = be.xp.isin(bid, be.asarray(ids))
        c, f, bid = c[keep], f[keep], bid[keep]
    return c, f, bid


def boundary_nodes(cells, c, f, dim: int):
    """Sorted distinct vertices of the faces ``f`` (local face numbers) of the cells ``c`` of
    ``cells`` (nc, 2^d) node ids."""
    be = backend_of(cells)
    xp = be.xp
    fv = be.asarray(ref.face_vertices(dim))
    return xp.unique(xp.take(cells, c, axis=0)[xp.arange(c.size)[:, None], fv[f]])


def select_where(nodes, points, where: Callable | None):
    """``nodes`` whose points satisfy the predicate ``where(x)`` (vectorised over (n, d)); all if None.
    ``points``: the (num_nodes, d) coordinates, or a function returning them (not called when
    ``where`` is None: the coordinates of every node are a gather over the whole mesh).  On
    the device ``where`` gets CuPy points (one that refuses them is called on host copies:
    :func:`adaptmg.backend.call_points`) and must return a bool array there."""
    if where is None:
        return nodes
    if not callable(where):
        raise TypeError(f"where must be a callable where(x) -> bool array, got {type(where).__name__}")
    if callable(points):
        points = points()
    keep = call_points(where, points[nodes], xp=backend_of(nodes).xp, dtype=None)
    if keep.shape != nodes.shape or keep.dtype != np.bool_:
        raise ValueError(f"where(x) must return a boolean array of shape {nodes.shape}, "
                         f"got {keep.dtype} {keep.shape}")
    return nodes[keep]
