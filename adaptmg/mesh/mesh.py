"""Immutable adaptive quadrilateral / hexahedral meshes with hanging nodes.

A :class:`Mesh` is the set of active (leaf) cells of a refinement forest
(:mod:`adaptmg.mesh._tree`).  ``refine`` returns a new mesh; the forest keeps
the refinement tree (parent, children and level of every cell) so that global
coarsening can take refinements back.

Conventions
-----------
* ``cells`` lists the 2^d vertices of each active cell in *lexicographic* order:
  vertex ``v`` is the image of the reference corner
  ``(v & 1, (v >> 1) & 1, (v >> 2) & 1)`` of [0,1]^d under the multilinear map
  ``x(xi) = sum_v X_v N_v(xi)``.  (VTK order is converted on input/output.)
* Neighbouring active cells -- cells that share at least one point, across a
  face, an edge or a vertex -- differ by at most one level ("2:1 rule").  So an
  edge or face carries at most one hanging node, and the parents of a hanging
  node are never hanging themselves.
* A hanging node is a vertex of an active cell that lies inside an edge (weights
  1/2, 1/2) or a face (4 x 1/4) of a coarser active cell.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from ..backend import CPU, call_points, get_backend, in_host_memory
from . import reference as ref
from . import tags
from . import _boundary, _hanging, _incidence, _parents, _touch
from ._boundary import select_where   # noqa: F401  (adaptmg.fe.space imports it from here)
from ._box import box_forest
from ._hanging import hanging_in_forest
from ._numbering import number_nodes
from ._tree import Forest
from ._xp import tuned, xp_of

__all__ = ["Mesh"]


def _as_index(marked, n: int, what: str = "marked", be=CPU) -> np.ndarray:
    """Turn a boolean mask over ``n`` items or an index array into sorted unique indices, on
    the backend ``be`` (``marked`` is moved there)."""
    a, xp = be.asarray(marked), be.xp
    if a.dtype == bool:
        if a.shape != (n,):
            raise ValueError(f"{what}: boolean mask must have shape ({n},) (one entry per active cell), got {a.shape}")
        return xp.flatnonzero(a)
    if a.size == 0:
        return xp.zeros(0, dtype=np.int64)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what}: expected a boolean mask of length {n} or an integer index array, "
                         f"got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{what}: index array must be 1-D, got shape {a.shape}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= n:
        raise ValueError(f"{what}: indices must lie in [0, {n}), got range [{lo}, {hi}]")
    mark = xp.zeros(n, dtype=bool)              # sorted and distinct, in O(n) (no sort or hash)
    mark[a] = True
    return xp.flatnonzero(mark)


def _sorted(a: np.ndarray) -> np.ndarray:
    """``np.sort(a)`` for a 1-D array, skipping the sort when ``a`` is already non-decreasing
    (e.g. the children of a uniform refinement, numbered after their parents in order): the
    check is one comparison pass, a sort of sorted data costs many."""
    if a.size < 2 or bool((a[1:] >= a[:-1]).all()):
        return a
    return xp_of(a).sort(a)


def jacobian_determinants(X, dim: int, xi: np.ndarray):
    """det J of the multilinear maps of cells with vertex coordinates X (nc, 2^d, d) at points xi
    (nq, d, host): the shape derivatives at xi on the host, the product and the determinants
    with X's array module."""
    cor = ref.corners(dim)
    # dN_v/dxi_k = prod_{i != k} (cor_vi ? xi_i : 1 - xi_i) * (2 cor_vk - 1)
    f = np.where(cor[None, :, :] == 1, xi[:, None, :], 1.0 - xi[:, None, :])      # (nq, nv, d)
    dN = np.empty((xi.shape[0], 2 ** dim, dim))
    for k in range(dim):
        others = np.prod(np.delete(f, k, axis=2), axis=2) if dim > 1 else 1.0
        dN[:, :, k] = others * (2 * cor[None, :, k] - 1)
    xp = xp_of(X)
    J = xp.einsum("cvi,qvk->cqik", X, xp.asarray(dN))
    return xp.linalg.det(J)


def check_cells(X: np.ndarray, dim: int, what: str = "mesh") -> None:
    """Raise ValueError if some cell's Jacobian is non-positive at a corner or the centre."""
    pts = np.vstack([ref.corners(dim).astype(float), np.full((1, dim), 0.5)])
    det = jacobian_determinants(X, dim, pts)
    xp = xp_of(det)
    bad = xp.flatnonzero((det <= 0).any(axis=1) | ~xp.isfinite(det).all(axis=1))
    if bad.size:
        raise ValueError(f"{what}: {bad.size} cell(s) have a non-positive Jacobian determinant "
                         f"(first: cell {int(bad[0])}, det {float(det[bad[0]].min()):.3g}); check the vertex order "
                         "(adaptmg uses lexicographic order; VTK order is converted by from_meshio) "
                         "and that no cell is degenerate or inverted")


class Mesh:
    """An adaptive quad (2D) or hex (3D) mesh: the active cells of a refinement forest.

    Build one with :meth:`box` or :meth:`from_meshio`; :meth:`refine` returns a
    refined mesh, :meth:`hierarchy` the global-coarsening multigrid hierarchy.
    """

    def __init__(self, forest: Forest, active: np.ndarray):
        # active: the forest ids of the active cells, sorted and distinct (every constructor
        # and refinement keeps them so; the node numbering and _active_cell_nodes rely on it)
        self._forest = forest
        self._active = forest.backend.asarray(active, dtype=np.int64)

    @property
    def backend(self):
        """The backend (:class:`adaptmg.backend.Backend`) whose arrays hold this mesh: the
        CPU for meshes built on the host, the GPU after ``to("gpu")`` or ``box(...,
        backend="gpu")``.  The mesh's arrays are of its ``backend.xp``."""
        return self._forest.backend

    def to(self, backend) -> "Mesh":
        """This mesh with its refinement forest on ``backend`` ("cpu", "gpu" or a
        :class:`~adaptmg.backend.Backend`): a copy of the forest's tables (one transfer
        each), or ``self`` when it is there already."""
        be = get_backend(backend)
        if be.name == self.backend.name:
            return self
        return Mesh(self._forest.to(be), be.asarray(self._active))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def box(cls, lower: Sequence[float], upper: Sequence[float], cells: Sequence[int],
            map: Callable[[np.ndarray], np.ndarray] | None = None, backend="cpu") -> "Mesh":
        """Structured mesh of the box [lower, upper] with ``cells[i]`` cells along axis i.

        Quads for ``len(cells) == 2``, hexahedra for 3.  Boundary id of the face
        ``x_i = lower_i`` is ``2 i``, of ``x_i = upper_i`` is ``2 i + 1``.
        ``map`` (optional) maps the node coordinates (n, d) -> (n, d), e.g. for
        graded meshes; see :meth:`map`.  ``backend`` ("cpu" or "gpu"): where the mesh's
        arrays live (:meth:`to`); built there (:mod:`._box`), ``map`` called there.
        """
        lower = np.asarray(lower, dtype=float)
        upper = np.asarray(upper, dtype=float)
        n = np.asarray(cells)
        if lower.ndim != 1 or lower.shape != upper.shape or n.shape != lower.shape:
            raise ValueError(f"box: lower, upper and cells must have the same length 2 or 3, "
                             f"got {lower.shape}, {upper.shape}, {n.shape}")
        dim = lower.size
        if dim not in (2, 3):
            raise ValueError(f"box: only 2D (quads) and 3D (hexahedra) are supported, got dimension {dim}")
        if not np.issubdtype(n.dtype, np.integer) or (n < 1).any():
            raise ValueError(f"box: cells must be positive integers, got {list(np.asarray(cells))}")
        if not (upper > lower).all() or not np.isfinite(lower).all() or not np.isfinite(upper).all():
            raise ValueError(f"box: need finite lower < upper in every direction, got {lower} and {upper}")
        F = box_forest(lower, upper, n, get_backend(backend))
        mesh = cls(F, F.backend.xp.arange(F.num_cells))
        return mesh.map(map) if map is not None else mesh

    @classmethod
    def from_cells(cls, points: np.ndarray, cells: np.ndarray, boundary_ids: np.ndarray | None = None, *,
                   regions=None, boundary_names=None, region_names=None) -> "Mesh":
        """Mesh from points (n, d) and cells (nc, 2^d) in lexicographic vertex order.

        Boundary faces (faces that belong to one cell only) get the boundary id
        0 unless ``boundary_ids`` (nc, 2d) gives one per cell face.  ``regions``
        (nc,) gives each cell a region id (default 0, inherited by refinement);
        ``boundary_names`` / ``region_names`` (dict name -> id) name them.
        """
        points = np.asarray(points, dtype=float)
        cells = np.asarray(cells)
        if points.ndim != 2 or points.shape[1] not in (2, 3):
            raise ValueError(f"points must have shape (n, 2) or (n, 3), got {points.shape}")
        dim = points.shape[1]
        if cells.ndim != 2 or cells.shape[1] != 2 ** dim:
            raise ValueError(f"cells must have shape (nc, {2 ** dim}) for dimension {dim}, got {cells.shape}")
        if not np.issubdtype(cells.dtype, np.integer):
            raise ValueError(f"cells must hold integer node indices, got dtype {cells.dtype}")
        if cells.size and (cells.min() < 0 or cells.max() >= points.shape[0]):
            raise ValueError(f"cells reference nodes outside [0, {points.shape[0]})")
        if not np.isfinite(points).all():
            raise ValueError("points contain NaN or Inf")
        if cells.shape[0] == 0:
            raise ValueError("a mesh needs at least one cell")
        check_cells(points[cells], dim, "from_cells")
        fv = ref.face_vertices(dim)
        faces = np.sort(cells[:, fv], axis=2).reshape(-1, fv.shape[1])      # (nc*2d, nfv)
        _, inv, counts = np.unique(faces, axis=0, return_inverse=True, return_counts=True)
        on_boundary = (counts[inv.ravel()] == 1).reshape(cells.shape[0], 2 * dim)
        if boundary_ids is None:
            bface = np.where(on_boundary, 0, -1)
        else:
            boundary_ids = np.asarray(boundary_ids)
            if boundary_ids.shape != on_boundary.shape:
                raise ValueError(f"boundary_ids must have shape {on_boundary.shape}, got {boundary_ids.shape}")
            bface = np.where(on_boundary, boundary_ids, -1)
        if regions is not None:
            regions = np.asarray(regions)
            if regions.shape != (cells.shape[0],) or regions.dtype.kind not in "iu" or \
                    (regions.size and regions.min() < 0):
                raise ValueError(f"regions must be non-negative integers of shape ({cells.shape[0]},), "
                                 f"got {regions.dtype} {regions.shape}")
        used = np.unique(cells)
        if used.size != points.shape[0]:       # drop unused points
            cells = np.searchsorted(used, cells)
            points = points[used]
        return cls(Forest.from_coarse(points, cells, bface, regions,
                                      tags.check_names(boundary_names, "boundary"),
                                      tags.check_names(region_names, "region")),
                   np.arange(cells.shape[0]))

    @classmethod
    def from_meshio(cls, m) -> "Mesh":
        """Mesh from a :class:`meshio.Mesh` holding only quad (2D) or hexahedron (3D) cells.

        Cells of other types raise ValueError, except lower-dimensional ones (skipped), of
        which the boundary facets (lines in 2-D, quads in 3-D) carry physical groups (``gmsh:physical`` cell data and the
        names of ``field_data``, or cell sets; :mod:`adaptmg.mesh.tags`) become the
        boundary ids and names, those of the cells the regions.  VTK vertex order is
        converted to adaptmg's lexicographic order; for 2D meshes given with 3-D
        points, the z coordinate must be constant and is dropped.
        """
        blocks = getattr(m, "cells", None)
        if blocks is None or not hasattr(m, "points"):
            raise TypeError(f"from_meshio expects a meshio.Mesh, got {type(m).__name__}")
        types = sorted({b.type for b in blocks})
        dim = 3 if "hexahedron" in types else 2
        perm = np.array([0, 1, 3, 2, 4, 5, 7, 6][:2 ** dim])
        ct = "quad" if dim == 2 else "hexahedron"
        if ct not in types or set(types) - {ct, *tags.LOWER_TYPES[dim]}:
            raise ValueError(f"from_meshio: only meshes made of 'quad' or of 'hexahedron' cells (and lower-"
                             f"dimensional ones: vertices, lines, boundary faces) are supported, got cell "
                             f"types {types}")
        keep = [i for i, b in enumerate(blocks) if b.type == ct]
        cells = np.concatenate([np.asarray(blocks[i].data) for i in keep])[:, perm]
        points = np.asarray(m.points, dtype=float)
        if dim == 2 and points.shape[1] == 3:
            if np.ptp(points[:, 2]) > 1e-12 * max(1.0, np.abs(points).max()):
                raise ValueError("from_meshio: quad mesh with non-planar points (z not constant); "
                                 "only planar 2-D quad meshes are supported")
            points = points[:, :2]
        if points.shape[1] != dim:
            raise ValueError(f"from_meshio: {ct} cells need {dim}-D points, got shape {points.shape}")
        facets, fids, region, bnames, rnames = tags.physical_groups(m, dim, keep)
        bids, unmatched = tags.facet_face_ids(cells, facets, fids)
        tags.warn_unmatched(unmatched, "from_meshio")
        return cls.from_cells(points, cells, bids, regions=region, boundary_names=bnames, region_names=rnames)

    # ------------------------------------------------------------------ basic properties
    @property
    def dim(self) -> int:
        return self._forest.dim

    @property
    def num_cells(self) -> int:
        return self._active.size

    @functools.cached_property
    def _node_numbering(self):
        """(forest ids of the mesh nodes, forest id -> mesh node index or -1): the numbering of
        :func:`._numbering.number_nodes` (coarse vertices first, then the refinement's nodes in
        the order in which the active cells first touch them)."""
        ids, pos, c = number_nodes(self._forest, self._active_cell_nodes())
        self.__dict__["cells"] = c        # the cells, numbered on the way (see there)
        return ids, pos

    def _active_cell_nodes(self) -> np.ndarray:
        """(num_cells, 2^dim) forest node ids of the active cells: a view when the active
        cells are one range of forest ids (a uniform refinement), else a gathered copy."""
        a = self._active
        cn = self._forest.cell_nodes
        rng = self.__dict__.get("_active_range", False)
        if rng is False:                                 # two reads, once per mesh
            rng = None
            if a.size:
                a0, a1 = int(a[0]), int(a[-1])
                if a1 - a0 == a.size - 1:                # sorted and distinct: one range
                    rng = (a0, a1)
            self.__dict__["_active_range"] = rng
        if rng is not None:
            return cn[rng[0]:rng[1] + 1]
        return xp_of(cn).take(cn, a, axis=0)

    @property
    def node_ids(self) -> np.ndarray:
        """Forest ids of the mesh nodes, in mesh node order (for matching nodes between meshes
        of one hierarchy; not sorted: see ``_node_numbering``)."""
        return self._node_numbering[0]

    @property
    def num_nodes(self) -> int:
        """Number of vertices of active cells, hanging nodes included."""
        return self.node_ids.size

    @functools.cached_property
    def points(self) -> np.ndarray:
        """(num_nodes, dim) node coordinates."""
        p = self._forest.X.take(self.node_ids, axis=0)     # take: rows gathered ~8x faster than [ ]
        if not self.backend.is_gpu:                         # (CuPy arrays have no such flag)
            p.flags.writeable = False
        return p

    @functools.cached_property
    def cells(self) -> np.ndarray:
        """(num_cells, 2^dim) node indices of the active cells, lexicographic vertex order."""
        self._node_numbering                               # numbers the nodes and the cells
        return self.__dict__["cells"]

    @functools.cached_property
    def levels(self) -> np.ndarray:
        """Refinement level of each active cell (0 = coarse mesh)."""
        return self._forest.cell_level[self._active].astype(np.int64)

    @property
    def cell_ids(self) -> np.ndarray:
        """Forest ids of the active cells."""
        return self._active

    @functools.cached_property
    def parents(self) -> np.ndarray:
        """Forest id of each active cell's parent (-1 for coarse cells)."""
        return self._forest.cell_parent[self._active]

    @functools.cached_property
    def boundary_ids(self) -> np.ndarray:
        """(num_cells, 2 dim) boundary id of each cell face (face 2i+s: x_i side s), -1 inside."""
        return self.backend.xp.take(self._forest.cell_bface, self._active, axis=0)

    @functools.cached_property
    def regions(self) -> np.ndarray:
        """(num_cells,) region id of each cell (a cell physical group on import; default 0),
        inherited from the coarse cell it was refined from."""
        reg, xp = self._forest.cell_region, self.backend.xp
        return xp.zeros(self.num_cells, dtype=np.int64) if reg is None else xp.take(reg, self._active).astype(np.int64)

    @property
    def boundary_names(self) -> dict:
        """Names of boundary ids (name -> id), e.g. the Gmsh physical groups of the boundary."""
        return dict(self._forest.boundary_names)

    @property
    def region_names(self) -> dict:
        """Names of region ids (name -> id)."""
        return dict(self._forest.region_names)

    def with_names(self, boundary_names=None, region_names=None) -> "Mesh":
        """This mesh with other name tables (dict name -> id; None keeps the current one)."""
        F = self._forest
        b = F.boundary_names if boundary_names is None else tags.check_names(boundary_names, "boundary")
        r = F.region_names if region_names is None else tags.check_names(region_names, "region")
        return Mesh(F.with_names(b, r), self._active)

    def resolve_boundary(self, ids) -> np.ndarray | None:
        """Boundary ids of ``ids``: an id, a name of :attr:`boundary_names` or a list of both."""
        return tags.resolve(ids, self.boundary_names, "boundary")

    def region_cells(self, ids) -> np.ndarray:
        """Indices of the cells whose region is in ``ids`` (ids or names of :attr:`region_names`)."""
        be = self.backend
        return be.xp.flatnonzero(be.xp.isin(self.regions, be.asarray(tags.resolve(ids, self.region_names, "region"))))

    def __repr__(self) -> str:
        kind = "quad" if self.dim == 2 else "hex"
        lv = self.levels
        return (f"Mesh({kind}, cells={self.num_cells}, nodes={self.num_nodes}, "
                f"hanging={self.num_hanging_nodes}, levels={int(lv.min())}..{int(lv.max())})")

    # ------------------------------------------------------------------ connectivity
    @functools.cached_property
    def incidence(self):
        """(num_cells, num_nodes) 0/1 CSR of the mesh's backend: node j is a vertex of cell i
        (:func:`._incidence.incidence`: int32 values on the host, float64 on the device)."""
        return _incidence.incidence(self.cells, self.num_nodes, self.backend)

    @functools.cached_property
    def _hanging_forest(self):
        """The hanging nodes in the forest's node ids, found without the mesh's node numbering
        (so :func:`adaptmg.multigrid` can run it beside the numbering):
        :func:`._hanging.hanging_in_forest`."""
        return hanging_in_forest(self._forest, self._active_cell_nodes(), self.levels)

    @functools.cached_property
    def _hanging(self):
        """(nodes, parents (nh, 4) -1 padded, owner cell, (node, cell) pairs) of the hanging nodes
        in the mesh's node numbering, nodes ascending: :attr:`_hanging_forest` mapped through
        the numbering (O(hanging nodes))."""
        return _hanging.number_hanging(self._hanging_forest, self._node_numbering[1])

    #: how many arrays :meth:`_hanging_arrays` gives
    HANGING_ARRAYS = 5

    def _hanging_arrays(self):
        """:attr:`_hanging` as a flat list ``[nodes, parents, owner cells, pair nodes, pair
        cells]`` (found now if not yet): what :meth:`_adopt_hanging` takes."""
        nodes, parents, owner, (pn, pc) = self._hanging
        return [nodes, parents, owner, pn, pc]

    def _adopt_hanging(self, arrays):
        """Take :meth:`_hanging_arrays` of an identical mesh -- another rank's copy of a
        replicated mesh, the same cells and node numbering -- as this mesh's hanging nodes,
        without searching for them (:func:`adaptmg.distributed.serial_levels.hand_over`)."""
        nodes, parents, owner, pn, pc = arrays
        self.__dict__["_hanging"] = (nodes, parents, owner, (pn, pc))

    @property
    def hanging_nodes(self) -> np.ndarray:
        """Indices of the hanging nodes."""
        return self._hanging[0]

    @property
    def num_hanging_nodes(self) -> int:
        return self._hanging[0].size

    @property
    def hanging_parents(self) -> np.ndarray:
        """(num_hanging, 4) parent nodes of each hanging node, -1 padded (2 on edges, 4 on faces)."""
        return self._hanging[1]

    @property
    def hanging_weights(self) -> np.ndarray:
        """(num_hanging, 4) Q1 interpolation weights matching :attr:`hanging_parents`."""
        return _hanging.hanging_weights(self._hanging[1])

    @property
    def hanging_owner(self) -> np.ndarray:
        """One active cell whose edge/face contains each hanging node (the coarse side)."""
        return self._hanging[2]

    @functools.cached_property
    def is_hanging(self) -> np.ndarray:
        m = self.backend.xp.zeros(self.num_nodes, dtype=bool)
        m[self.hanging_nodes] = True
        return m

    @functools.cached_property
    def touch_graph(self):
        """(num_cells, num_cells) 0/1 CSR of the mesh's backend: cells that share at least one point.

        Two active cells touch iff they share a vertex or a vertex of one hangs
        on an edge/face of the other (exact on 2:1-balanced meshes).
        """
        return _incidence.touch_graph(self.incidence, self._hanging[3], self.backend)

    def touch_max(self, values: np.ndarray) -> np.ndarray:
        """For each active cell, the maximum of ``values`` over the cells touching it (itself included).

        Computed through the shared vertices in O(num_cells) (:func:`._touch.touch_max_vertices`:
        on these meshes the hanging-node links of :attr:`touch_graph` add no pair, so the
        refinement closure and global coarsening need no hanging nodes); equals
        ``max(values[j] for j touching i)`` of :attr:`touch_graph` (tested on random meshes).
        """
        # through the forest's node ids (a bijection onto the mesh's nodes): the same result
        # without numbering the mesh -- global coarsening and the 2:1 closure of refine()
        # then number none of the meshes they pass through
        return _touch.touch_max_vertices(self._active_cell_nodes(), self._forest.num_nodes, values)

    # ------------------------------------------------------------------ geometry
    def map(self, f: Callable[[np.ndarray], np.ndarray]) -> "Mesh":
        """Mesh with every node x moved to f(x) (f vectorised: (n, d) -> (n, d)).

        The map is applied to all nodes of the refinement forest, so a mesh refined
        later places its new nodes by multilinear interpolation of the mapped cells.  On the
        device ``f`` gets CuPy arrays (:func:`adaptmg.backend.call_points`).
        """
        if not callable(f):
            raise TypeError(f"map expects a callable f(points) -> points, got {type(f).__name__}")
        xp = self.backend.xp
        X = call_points(f, self._forest.X.copy(), xp=xp)
        if X.shape != self._forest.X.shape:
            raise ValueError(f"map: f must return an array of shape {self._forest.X.shape}, got {X.shape}")
        if not bool(xp.isfinite(X).all()):
            raise ValueError("map: f returned NaN or Inf")
        check_cells(X[self._forest.cell_nodes[self._active]], self.dim, "map")
        return Mesh(self._forest.with_points(X), self._active)

    def cell_vertices(self) -> np.ndarray:
        """(num_cells, 2^d, d) vertex coordinates of the active cells."""
        return self.points[self.cells]

    def volumes(self) -> np.ndarray:
        """Cell volumes (areas in 2D), integrated exactly for multilinear cells."""
        g = np.array([0.5 - 0.5 / np.sqrt(3), 0.5 + 0.5 / np.sqrt(3)])
        xi = np.stack(np.meshgrid(*([g] * self.dim), indexing="ij"), -1).reshape(-1, self.dim)
        det = jacobian_determinants(self.cell_vertices(), self.dim, xi)
        return det.sum(1) / xi.shape[0]

    def boundary_faces(self, ids=None):
        """(cells, local faces, boundary ids) of the boundary faces, optionally only those with ``ids``
        (ids or names, :meth:`resolve_boundary`).  On the device, before :attr:`boundary_ids` is
        needed, read from the forest's table at the active cells (no gather of every cell's
        ids first)."""
        ids = self.resolve_boundary(ids)
        if "boundary_ids" in self.__dict__ or in_host_memory(self._active):
            return _boundary.boundary_faces(self.boundary_ids, ids)
        return _boundary.boundary_faces(self._forest.cell_bface, ids, rows=self._active)

    def boundary_nodes(self, ids=None, where: Callable | None = None) -> np.ndarray:
        """Sorted indices of nodes on boundary faces (with boundary id in ``ids``) where ``where(x)`` holds."""
        c, f, _ = self.boundary_faces(ids)
        return select_where(_boundary.boundary_nodes(self.cells, c, f, self.dim), lambda: self.points, where)

    # ------------------------------------------------------------------ refinement
    def refine(self, marked=None) -> "Mesh":
        """Refine the marked active cells (bool mask or index array; None = all) into 2^d children.

        The marked set is closed so that the result obeys the 2:1 rule: whenever
        a cell of level l is refined, every touching active cell of level < l is
        refined too (repeatedly).  Returns a new mesh; ``self`` is unchanged.
        """
        if marked is None:
            idx = self.backend.xp.arange(self.num_cells)
        else:
            idx = _as_index(marked, self.num_cells, be=self.backend)
        if idx.size == 0:
            return self
        idx = self._close(idx)
        return self._refine_exact(idx)

    def _close(self, idx: np.ndarray) -> np.ndarray:
        """Smallest superset of ``idx`` whose refinement keeps the 2:1 rule.

        Repeats: a cell must be refined if it touches a marked cell of a higher level.  The
        maximum over the touching marked cells of the marked set after a round is that of
        the set before it or that of the cells the round added, and the cells the first
        forces are marked already: so each round needs only the cells just added as sources
        (fewer scattered values; the same set).
        """
        if idx.size == self.num_cells:
            return idx
        lv, xp = self.levels, self.backend.xp
        marked = xp.zeros(self.num_cells, dtype=bool)
        marked[idx] = True
        # a marked cell of the lowest level forces no cell (it touches none of a lower
        # level): without marked cells above it (e.g. a local refinement of a uniform
        # mesh) the set is closed already, and no touch_max pass over the cells is needed
        low = lv.min()
        src = marked
        while bool((src & (lv > low)).any()):           # (no boolean gather: one read, not two)
            need = self.touch_max(xp.where(src, lv, -1)) > lv
            src = need & ~marked
            if not bool(src.any()):
                break
            marked |= src
        return xp.flatnonzero(marked)

    def _refine_exact(self, idx: np.ndarray) -> "Mesh":
        F, xp = self._forest, self.backend.xp
        tree_ids = self._active[idx]
        fresh = tree_ids[F.cell_child0[tree_ids] < 0]
        F2 = F.split(fresh)
        nv = 2 ** self.dim
        if fresh.size == tree_ids.size:
            # all split just now: split numbers their children consecutively after the old
            # cells, in order, so the children are this range (sorted, above every old cell)
            kids = xp.arange(F.num_cells, F2.num_cells, dtype=np.int64)
            if idx.size == self.num_cells:       # nothing kept (uniform refinement)
                return Mesh(F2, kids)
        else:
            kids = (F2.cell_child0[tree_ids][:, None] + xp.arange(nv)).ravel()
        keep = xp.ones(self.num_cells, dtype=bool)
        keep[idx] = False
        active = _sorted(xp.concatenate([self._active[keep], kids]))
        return Mesh(F2, active)

    def parent_of(self, coarse: "Mesh"):
        """For each cell of ``self`` (a refinement of ``coarse`` by at most one level per cell):
        (index of the containing coarse cell, child index or -1 if the cell is a coarse cell
        itself); new int64 arrays, the last answer per mesh kept (:mod:`._parents`)."""
        return _parents.parent_of(self, coarse)

    # ------------------------------------------------------------------ global coarsening
    def coarsen_once(self) -> "Mesh":
        """Take back every refinement whose 2^d children are all active (seed 001 §2.2),
        except those whose removal would break the 2:1 rule.

        The children of a cell are 2^d consecutive forest ids and the active ids are sorted,
        so a family is complete iff a first child stands at a position ``i`` of the active
        cells with ``active[i + 2^d - 1] = active[i] + 2^d - 1``: families are found as
        position windows of this mesh (O(cells)), not by counting children over the whole
        forest (O(forest) a level: a hierarchy of an adaptive loop's mesh, 20+ levels over
        a forest of every cell ever made, paid that per level)."""
        F, nv, xp = self._forest, 2 ** self.dim, self.backend.xp
        act = self._active
        n = act.size
        if n < nv:
            return self
        par = self.parents
        has = par >= 0
        c0 = xp.where(has, F.cell_child0.take(xp.maximum(par, 0)), -1)
        w = n - nv + 1
        start = xp.flatnonzero(has[:w] & (act[:w] == c0[:w]) & (act[nv - 1:] == act[:w] + (nv - 1)))
        if start.size == 0:
            return self
        if start.size * nv == n:
            # every cell goes back one level: level differences, hence the 2:1 rule, are kept
            return Mesh(F, _sorted(par.take(start)))

        def members(starts):                      # positions of the families' children
            m = xp.zeros(n, dtype=bool)
            # one scatter of every child (never of one entry: CuPy compiles a kernel of its own
            # for a single-entry scatter, which a fresh process would wait for)
            m[(starts[:, None] + xp.arange(nv)).ravel()] = True
            return m

        lv = self.levels
        while True:
            cell_in = members(start)
            # a family is blocked if any of its children (level l) touches a cell of new level
            # >= l + 1: by the 2:1 rule only a cell of level l + 1 that stays, so the maximum
            # runs over the staying cells (few: touch_max's sparse path), and only over those
            # finer than the coarsest child in a family -- none, e.g., when a local refinement
            # of a uniform mesh is taken back: then no touch_max pass at all
            src = ~cell_in
            src &= lv > int(xp.where(cell_in, lv, np.iinfo(lv.dtype).max).min())    # no boolean gather
            if not bool(src.any()):
                break
            mx = self.touch_max(xp.where(src, lv, -1))
            bad = xp.flatnonzero(cell_in & (mx >= lv + 1))
            if bad.size == 0:
                break
            blocked = xp.zeros(n, dtype=bool)
            blocked[bad - (act.take(bad) - c0.take(bad))] = True      # their families' starts
            start = start[~blocked.take(start)]
            if start.size == 0:
                return self
        fam = xp.sort(par.take(start))
        # two sorted runs: on the host the stable sort (timsort) merges them in linear time
        act = xp.concatenate([act[~cell_in], fam])
        return Mesh(F, np.sort(act, kind="stable") if tuned(act) else xp.sort(act))

    def hierarchy(self, max_levels: int | None = None, min_cells: int = 1) -> list["Mesh"]:
        """Global-coarsening hierarchy [Omega_0, ..., Omega_L = self], coarse to fine.

        Each step takes back as many refinements as possible (:meth:`coarsen_once`);
        stops at the coarse mesh, after ``max_levels`` meshes, or when a mesh
        has at most ``min_cells`` cells.  The coarse meshes made keep their own coarsening
        (meshes do not change), so a later hierarchy of one of them reuses the meshes below
        it; ``self`` keeps nothing.
        """
        if max_levels is not None and (not isinstance(max_levels, (int, np.integer)) or max_levels < 1):
            raise ValueError(f"hierarchy: max_levels must be a positive integer or None, got {max_levels!r}")
        if not isinstance(min_cells, (int, np.integer)) or min_cells < 1:
            raise ValueError(f"hierarchy: min_cells must be a positive integer, got {min_cells!r}")
        out = [self]
        while max_levels is None or len(out) < max_levels:
            if out[-1].num_cells <= min_cells:
                break
            # a coarse mesh made here keeps its own coarsening: the hierarchy of a mesh of this
            # one (the distributed set-up's serial levels below the local ones, two H200 at
            # 21M DoFs a rank: 2.8 ms) is not made again; the caller's mesh keeps none
            c = out[-1].__dict__.get("_coarsened")
            if c is None:
                c = out[-1].coarsen_once()
                if out[-1] is not self:
                    out[-1]._coarsened = c
            if c.num_cells == out[-1].num_cells:
                break
            out.append(c)
        return out[::-1]
