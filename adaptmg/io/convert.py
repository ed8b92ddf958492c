r"""adaptmg :class:`~adaptmg.Mesh` <-> ``meshio.Mesh``: vertex order, fields, checks of a mesh read back.

adaptmg numbers the vertices of a cell lexicographically (vertex ``v`` sits at
the reference corner ``(v & 1, (v >> 1) & 1, (v >> 2) & 1)``); VTK (and so
meshio) goes around each face.  The two orders differ by a permutation that is
its own inverse::

    quad  lexicographic [0, 1, 2, 3]  <->  VTK [0, 1, 3, 2]
    hex   lexicographic [0..7]        <->  VTK [0, 1, 3, 2, 4, 5, 7, 6]

so ``cells_vtk = cells_lex[:, perm]`` and ``cells_lex = cells_vtk[:, perm]``.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..mesh import Mesh, tags
from .groups import GMSH_FORMATS, field_data, gmsh_blocks
from .sandbox import file_error

PERM = {2: np.array([0, 1, 3, 2]), 3: np.array([0, 1, 3, 2, 4, 5, 7, 6])}
CELL_TYPE = {2: "quad", 3: "hexahedron"}
RESERVED = ("hanging", "level", "boundary_ids", "region")


def vtk_permutation(dim: int) -> np.ndarray:
    """Permutation between lexicographic and VTK vertex order (an involution)."""
    if dim not in PERM:
        raise ValueError(f"dim must be 2 or 3, got {dim!r}")
    return PERM[dim].copy()


def import_meshio():
    """The meshio module, or an ``ImportError`` that says how to install it."""
    try:
        import meshio
    except ImportError as exc:  # pragma: no cover - meshio is a dependency
        raise ImportError("adaptmg.io needs meshio (pip install meshio)") from exc
    return meshio


# ---------------------------------------------------------------------------- fields to write
def _host_array(a, name):
    a = to_host(a)
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be array-like, got {type(a).__name__}") from exc
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr


class HostSpace:
    """What :func:`collect_fields` needs of a :class:`~adaptmg.Space`: its sizes and, for
    degree > 1, the DoF nodes at each cell's vertices (``vertex_dofs``, (num_cells, 2^d),
    a host copy)."""

    def __init__(self, space, xp):
        self.degree, self.components = space.degree, space.components
        self.num_nodes, self.num_dofs = int(space.num_nodes), int(space.num_dofs)
        self.vertex_dofs = None
        if space.degree != 1:
            d, k = space.mesh.dim, space.degree
            cor = np.array([[(v >> i) & 1 for i in range(d)] for v in range(2 ** d)])
            lattice = (cor * k * (k + 1) ** np.arange(d)).sum(1)   # lexicographic over {0..k}^d
            self.vertex_dofs = to_host(xp.take(space.cell_dofs, xp.asarray(lattice), axis=1))


class HostMesh:
    """The arrays of a :class:`~adaptmg.Mesh` that a file holds, as NumPy arrays under the
    mesh's own attribute names (:data:`MESH_ARRAYS`, ``dim``, ``num_nodes``, ``num_cells``, the
    name tables) plus ``space`` (a :class:`HostSpace` or None).  Built by :func:`host_mesh`:
    copies of a device mesh's arrays, or a host mesh's own ones read when asked (so a writer
    computes nothing the file does not hold)."""

    def __init__(self, mesh, space, **arrays):
        self._mesh, self.space = (None if arrays else mesh), space    # no device mesh kept alive
        self.dim, self.num_nodes, self.num_cells = mesh.dim, mesh.num_nodes, mesh.num_cells
        self.boundary_names, self.region_names = mesh.boundary_names, mesh.region_names
        self.__dict__.update(arrays)

    def __getattr__(self, name):                 # a host mesh's arrays, on first use
        if name in MESH_ARRAYS:
            return getattr(self.__dict__["_mesh"], name)
        raise AttributeError(f"HostMesh has no attribute {name!r}")


MESH_ARRAYS = ("points", "cells", "levels", "hanging_nodes", "boundary_ids", "regions")


def host_mesh(mesh, space=None) -> HostMesh:
    """The :class:`HostMesh` of ``mesh`` (and ``space``, a Space on it, or None).

    A mesh on the GPU gives device -> host copies (:func:`adaptmg.backend.to_host`) of the
    arrays it already has, the integers the files hold as int32 (``level``,
    ``boundary_ids``, ``region``) narrowed on the device first -- no host numbering, no host
    ``Space``.  A host mesh copies nothing; a ``HostMesh`` is returned as it is."""
    if isinstance(mesh, HostMesh):
        if space is not None:
            raise ValueError("a HostMesh carries its space: pass space= to host_mesh, not beside it")
        return mesh
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be an adaptmg Mesh, got {type(mesh).__name__}")
    if space is not None:
        from ..fe import Space
        if not isinstance(space, Space):
            raise TypeError(f"space must be an adaptmg Space, got {type(space).__name__}")
        if space.mesh is not mesh:
            raise ValueError("space must be defined on the mesh being written (space.mesh is not mesh)")
    hs = None if space is None else HostSpace(space, mesh.backend.xp)
    if not mesh.backend.is_gpu:
        return HostMesh(mesh, hs)

    def narrow(a):                               # half the bytes through the bus
        return to_host(a.astype(np.int32) if a.dtype.itemsize > 4 else a)

    return HostMesh(mesh, hs, points=to_host(mesh.points), cells=to_host(mesh.cells),
                    levels=narrow(mesh.levels), hanging_nodes=to_host(mesh.hanging_nodes),
                    boundary_ids=narrow(mesh.boundary_ids), regions=narrow(mesh.regions))


def _point_array(name, value, mesh, space):
    """Normalise one point field to (num_nodes,) or (num_nodes, c) (``space``: a HostSpace)."""
    a = _host_array(value, f"point_data[{name!r}]")
    n = mesh.num_nodes
    if space is not None and a.ndim == 1 and a.shape[0] == space.num_dofs:
        c = space.components
        a = a.reshape(space.num_nodes, c)
        if space.vertex_dofs is not None:             # DoF node of each mesh vertex
            at = np.empty(n, dtype=np.int64)
            at[np.asarray(mesh.cells).ravel()] = space.vertex_dofs.ravel()
            a = a[at]
        return a[:, 0] if c == 1 else a
    if a.ndim == 1 and a.shape[0] == n:
        return a
    if a.ndim == 1 and a.shape[0] % n == 0 and a.shape[0] > 0:
        return a.reshape(n, a.shape[0] // n)          # DoF = node * c + comp
    if a.ndim == 2 and a.shape[0] == n:
        return a
    extra = f" or space.num_dofs = {space.num_dofs}" if space is not None else ""
    raise ValueError(f"point_data[{name!r}] must have shape ({n},), ({n}, c) or ({n}*c,){extra} "
                     f"for a mesh with {n} nodes, got {a.shape}")


def _cell_array(name, value, mesh):
    a = _host_array(value, f"cell_data[{name!r}]")
    nc = mesh.num_cells
    if a.ndim in (1, 2) and a.shape[0] == nc:
        return a
    raise ValueError(f"cell_data[{name!r}] must have shape ({nc},) or ({nc}, c) for a mesh with "
                     f"{nc} cells, got {a.shape}")


def collect_fields(mesh, point_data, cell_data, space, mesh_data):
    """Checked point and cell fields to write, as host arrays: ``(pd, cd)``.

    ``mesh``: a :class:`~adaptmg.Mesh` (host or device; ``space`` a Space on it) or a
    :class:`HostMesh` (``space`` None); checks both (:func:`host_mesh`).  With
    ``mesh_data`` adds the :data:`RESERVED` arrays ``hanging``, ``level``, ``boundary_ids``
    and ``region``.
    """
    mesh = host_mesh(mesh, space)
    space = mesh.space
    pd, cd = {}, {}
    for label, data, out, conv in (("point_data", point_data, pd, lambda k, v: _point_array(k, v, mesh, space)),
                                   ("cell_data", cell_data, cd, lambda k, v: _cell_array(k, v, mesh))):
        if data is None:
            continue
        if not isinstance(data, dict):
            raise TypeError(f"{label} must be a dict name -> array, got {type(data).__name__}")
        for k, v in data.items():
            if not isinstance(k, str) or not k or not re.fullmatch(r"[A-Za-z0-9_.:\- ]+", k):
                raise ValueError(f"{label}: field names must be non-empty strings of letters, digits, "
                                 f"'_', '.', ':', '-' or spaces, got {k!r}")
            if mesh_data and k in RESERVED:
                raise ValueError(f"{label}: the name {k!r} is reserved for the mesh data written by "
                                 f"adaptmg ({', '.join(RESERVED)}); rename it or pass mesh_data=False")
            if k in pd or k in cd:
                raise ValueError(f"{label}: the name {k!r} is used twice")
            out[k] = conv(k, v)
    if mesh_data:
        hang = np.zeros(mesh.num_nodes, dtype=np.int32)
        hang[np.asarray(mesh.hanging_nodes, dtype=np.int64)] = 1
        pd["hanging"] = hang
        cd["level"] = np.asarray(mesh.levels, dtype=np.int32)
        cd["boundary_ids"] = np.asarray(mesh.boundary_ids, dtype=np.int32)
        cd["region"] = np.asarray(mesh.regions, dtype=np.int32)
    return pd, cd


# ---------------------------------------------------------------------------- conversion
def to_meshio(mesh, pd, cd, pad3, fmt=None, groups=True):
    """``meshio.Mesh`` of the active cells (VTK order); ``pad3`` gives 2-D points a zero z.

    With ``groups`` a Gmsh ``fmt`` also gets the boundary faces as physical groups and the
    regions (:mod:`adaptmg.io.groups`), and every format the names as ``field_data``."""
    meshio = import_meshio()
    pts = np.asarray(mesh.points, dtype=np.float64)
    if pad3 and mesh.dim == 2:
        pts = np.hstack([pts, np.zeros((pts.shape[0], 1))])
    cells = np.ascontiguousarray(np.asarray(mesh.cells, dtype=np.int64)[:, PERM[mesh.dim]])
    fd = field_data(mesh) if groups else {}
    if groups and fmt in GMSH_FORMATS:
        cd = {k: v for k, v in cd.items() if k != "region"}         # the physical tags hold it
        blocks, cdb, nodes = gmsh_blocks(mesh, cells, cd, version41=fmt == "gmsh")
        if nodes is not None:
            perm, dim_tags = nodes
            pts = pts[perm]
            pd = {**{k: np.asarray(v)[perm] for k, v in pd.items()}, "gmsh:dim_tags": dim_tags}
        return meshio.Mesh(pts, blocks, point_data=pd, cell_data=cdb, field_data=fd)
    return meshio.Mesh(pts, [(CELL_TYPE[mesh.dim], cells)], point_data=pd,
                       cell_data={k: [v] for k, v in cd.items()}, field_data=fd)


def to_adaptmg(p: Path, m, lim):
    """Checked ``(Mesh, point_data, cell_data)`` from a ``meshio.Mesh`` read from file ``p``.

    Counts (limits ``lim``), cell types, index ranges, finiteness and the
    orientation of every cell are checked; a failure is a ``ValueError``
    naming ``p``.  Lower-dimensional cells are dropped with their data.
    """
    pts = np.asarray(m.points)
    if pts.ndim != 2 or pts.shape[1] not in (2, 3) or pts.dtype.kind not in "iuf":
        raise file_error(p, f"points must be a real (n, 2) or (n, 3) array, got shape {pts.shape}, "
                            f"dtype {pts.dtype}")
    if pts.shape[0] > lim["max_points"]:
        raise file_error(p, f"{pts.shape[0]} points, more than max_points={lim['max_points']}")
    if not np.isfinite(pts).all():
        raise file_error(p, "points contain NaN or Inf")
    types = [b.type for b in m.cells]
    if "hexahedron" in types:
        dim = 3
    elif "quad" in types:
        dim = 2
    else:
        raise file_error(p, f"no quad or hexahedron cells (cell types {sorted(set(types)) or 'none'}); "
                            "adaptmg meshes are made of quads (2D) or hexahedra (3D)")
    ct = CELL_TYPE[dim]
    other = sorted(set(types) - {ct} - tags.LOWER_TYPES[dim])
    if other:
        raise file_error(p, f"mixed meshes are not supported: besides {ct!r} cells the file has {other}")
    keep = [i for i, t in enumerate(types) if t == ct]
    blocks = [np.asarray(m.cells[i].data) for i in keep]
    ncells = sum(b.shape[0] for b in blocks)
    if ncells > lim["max_cells"]:
        raise file_error(p, f"{ncells} cells, more than max_cells={lim['max_cells']}")
    for b in blocks:
        if b.ndim != 2 or b.shape[1] != 2 ** dim or b.dtype.kind not in "iu":
            raise file_error(p, f"{ct} connectivity must be an integer (nc, {2 ** dim}) array, "
                                f"got shape {b.shape}, dtype {b.dtype}")
    cells = np.concatenate(blocks).astype(np.int64)[:, PERM[dim]]
    if cells.size and (cells.min() < 0 or cells.max() >= pts.shape[0]):
        raise file_error(p, f"cells refer to points outside [0, {pts.shape[0]}) "
                            f"(range [{cells.min()}, {cells.max()}])")
    pts = pts.astype(np.float64)
    if dim == 2 and pts.shape[1] == 3:
        if np.ptp(pts[:, 2]) > 1e-12 * max(1.0, float(np.abs(pts).max())):
            raise file_error(p, "quad mesh with non-planar points (z not constant)")
        pts = pts[:, :2]
    if pts.shape[1] != dim:
        raise file_error(p, f"{ct} cells need {dim}-D points, got shape {pts.shape}")
    used = np.zeros(pts.shape[0], bool)
    used[cells.ravel()] = True
    all_used = bool(used.all())

    # data of the kept blocks
    pdata = {}
    for k, v in (m.point_data or {}).items():
        a = np.asarray(v)
        if a.shape[:1] != (pts.shape[0],):
            raise file_error(p, f"point data {k!r} has shape {a.shape}, expected ({pts.shape[0]}, ...)")
        pdata[k] = a if all_used else a[used]
    cdata = {}
    for k, vs in (m.cell_data or {}).items():
        if len(vs) != len(types):
            raise file_error(p, f"cell data {k!r} has {len(vs)} blocks for {len(types)} cell blocks")
        parts = [np.asarray(vs[i]) for i in keep]
        for i, part in zip(keep, parts):
            if part.shape[:1] != (len(m.cells[i].data),):
                raise file_error(p, f"cell data {k!r} has shape {part.shape} for a block of "
                                    f"{len(m.cells[i].data)} cells")
        cdata[k] = np.concatenate(parts)
    try:
        facets, fids, region, bnames, rnames = tags.physical_groups(m, dim, keep)
    except (ValueError, TypeError) as exc:
        raise file_error(p, f"invalid physical groups / cell sets: {exc}") from None
    if facets.size and (facets.min() < 0 or facets.max() >= pts.shape[0]):
        raise file_error(p, f"boundary elements refer to points outside [0, {pts.shape[0]})")
    # adaptmg's own arrays (written by adaptmg.io.write) before the physical groups
    bids = cdata.get("boundary_ids")
    if bids is not None and (bids.ndim != 2 or bids.shape != (ncells, 2 * dim) or bids.dtype.kind not in "iu"):
        bids = None
    if bids is None and facets.size:
        # a file adaptmg wrote (it has ``hanging``) lists every boundary face: the faces it
        # leaves out are interior faces beside hanging nodes
        bids, unmatched = tags.facet_face_ids(cells, facets, fids, default=-1 if "hanging" in pdata else 0)
        tags.warn_unmatched(unmatched, str(p))
    reg = cdata.get("region")
    if reg is not None and reg.shape == (ncells,) and reg.dtype.kind in "iu" and (reg >= 0).all():
        region = reg
    if region is not None and region.size and region.min() < 0:
        region = None                          # not a region table
    try:
        mesh = Mesh.from_cells(pts, cells, boundary_ids=bids, regions=region, boundary_names=bnames,
                               region_names=rnames)
    except (ValueError, TypeError) as exc:
        raise file_error(p, f"invalid mesh: {exc}") from None
    return mesh, pdata, cdata
