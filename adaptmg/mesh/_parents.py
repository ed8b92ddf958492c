"""Parent cells between two meshes of one refinement forest, remembered per level pair.

For the active cells of ``fine`` (a refinement of ``coarse`` by at most one level per cell):
the index of the coarse cell containing each, and its child index in it (-1 where the cell
is a coarse cell itself).  A level pair of a hierarchy is asked several times (the
distributed set-up's cell ranks and transfer rows, the prolongation), so the last answer per
fine mesh is kept while both meshes live (compact: int32 / int8, 5 bytes a cell); every
call returns new int64 arrays, on the meshes' backend (NumPy or CuPy: one body against
``xp``, the per-cell lookup :func:`~adaptmg.device.cell_kernels.parent_positions`).
"""
from __future__ import annotations

import weakref

import numpy as np

from ..device.cell_kernels import parent_positions
from ._xp import xp_of

#: fine mesh -> (weak reference to the coarse mesh, coarse index, child index)
_MEMO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def parent_of(fine, coarse):
    """``(cidx, child)`` of :meth:`adaptmg.mesh.Mesh.parent_of`."""
    hit = _MEMO.get(fine)
    if hit is not None and hit[0]() is coarse:
        return hit[1].astype(np.int64), hit[2].astype(np.int64)
    F, act = fine._forest, fine._active
    xp = xp_of(act)
    if fine.backend.name != coarse.backend.name:
        raise ValueError(f"parent_of: the meshes live on different backends ({fine.backend.name} "
                         f"and {coarse.backend.name}); move one with Mesh.to")
    if coarse._forest is not F and (
            coarse._forest.num_cells > F.num_cells or not bool(xp.array_equal(
            coarse._forest.cell_nodes, F.cell_nodes[:coarse._forest.num_cells]))):
        raise ValueError("parent_of: meshes do not come from the same refinement history")
    # forest cell id -> index among the coarse active cells (-1: not active there), int32
    # where the forest fits: half the bytes of the fill and of the gathers below
    it = np.int32 if F.num_cells < np.iinfo(np.int32).max else np.int64
    loc = xp.full(F.num_cells, -1, dtype=it)
    loc[coarse._active] = xp.arange(coarse._active.size, dtype=it)
    compact = np.int32 if coarse.num_cells <= np.iinfo(np.int32).max else np.int64
    cidx, child, cidx_c, child_c, ok = parent_positions(act, loc, F.cell_parent, F.cell_child0, compact)
    if not ok:
        raise ValueError("parent_of: some cells are refined more than once relative to the coarse mesh")
    _MEMO[fine] = (weakref.ref(coarse), cidx_c, child_c)
    return cidx, child
