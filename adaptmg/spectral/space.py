"""Nodal Q_k on Gauss-Lobatto-Legendre points on any quad/hex :class:`adaptmg.Mesh`.

Local nodes of a cell are numbered lexicographically, x fastest: node
``a = a_0 + (k+1) a_1 + (k+1)^2 a_2`` sits at the reference point ``(t_a0, t_a1, t_a2)``
of [0, 1]^d, so cell arrays reshape to ``(cells, k+1, k+1, k+1)`` with axes (z, y, x).

Global numbering (vectorised over cells; the loops run over the <= 27 entities of the
reference cell): every local node lies inside one entity -- vertex, edge, face or the
cell interior -- and is numbered from that entity's global vertex ids in a canonical
frame, so both cells that share an entity agree whatever their orientations:

* vertex: its mesh node id;
* edge (vertices g0, g1): edge id from the sorted pair, position counted from min(g0, g1);
* face: origin = the vertex with the smallest id, first axis towards the smaller of its
  two face neighbours; the face id comes from (origin, first, second neighbour);
* interior: the cell and its local index.

Geometry is isoparametric: node coordinates ``x = mapping(F_K(t))`` with ``F_K`` the
multilinear map of the cell vertices (``mapping`` optional, applied to the global GLL
points, so shared nodes coincide), Jacobians ``J_ij = dx_i/dxi_j`` from the
differentiation matrix at the quadrature points.  A non-positive ``det J`` anywhere
raises ValueError (inverted or tangled cells)."""
from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp

from ..backend import csr_from_arrays
from ..mesh import Mesh
from ..mesh import reference as ref
from .basis import check_spectral_degree, gll_points, local_indices
from .hanging import hanging_matrix

__all__ = ["SpectralSpace", "contract", "reference_gradient", "local_indices", "row_ids"]


def contract(u, A, axis: int, dim: int):
    """Apply the 1D matrix ``A`` (m, n) along tensor axis ``axis`` (0 = x, the last array
    axis) of cell arrays ``u`` (cells, n..., n) -- one batched matmul, any ``xp``."""
    if axis == 0:
        return u @ A.T
    if axis == 1:
        return A @ u
    nc, nz = u.shape[0], u.shape[1]
    return (A @ u.reshape(nc, nz, -1)).reshape((nc, A.shape[0]) + u.shape[2:])


def reference_gradient(u, B, DB, dim: int):
    """Reference gradient at the quadrature points, ``[du/dxi_0, ..., du/dxi_{d-1}]``
    (sum factorisation: ``DB`` along the derivative's axis, ``B`` along the others;
    ``B`` None means collocated, the identity)."""
    if B is None:
        return [contract(u, DB, ax, dim) for ax in range(dim)]
    if dim == 2:
        ux = contract(u, B, 0, 2)
        return [contract(contract(u, DB, 0, 2), B, 1, 2), contract(ux, DB, 1, 2)]
    ux = contract(u, B, 0, 3)
    uxy = contract(ux, B, 1, 3)
    return [contract(contract(contract(u, DB, 0, 3), B, 1, 3), B, 2, 3),
            contract(contract(ux, DB, 1, 3), B, 2, 3),
            contract(uxy, DB, 2, 3)]


def interpolate(u, B, dim: int):
    """Values at the quadrature points (``B`` None: collocated, ``u`` itself)."""
    if B is None:
        return u
    for ax in range(dim):
        u = contract(u, B, ax, dim)
    return u


def _multilinear(X, t, dim):
    """Multilinear map of vertex coordinates X (nc, 2^d, d) at the tensor points t^d
    (lexicographic, x fastest): (nc, len(t)^d, d) -- one GEMM ``(nc d, 2^d) @ N^T``, a view
    of its (nc, d, nq) result."""
    cor = ref.corners(dim)
    grid = t[local_indices(len(t) - 1, dim)]
    N = np.prod(np.where(cor[None, :, :] == 1, grid[:, None, :], 1.0 - grid[:, None, :]), axis=2)
    nc, nv, d = X.shape
    Y = np.ascontiguousarray(X.transpose(0, 2, 1)).reshape(nc * d, nv) @ N.T
    return Y.reshape(nc, d, -1).transpose(0, 2, 1)


def row_ids(keys) -> np.ndarray:
    """``np.unique(keys, axis=0, return_inverse=True)[1]`` for non-negative integer keys
    (m, c), c <= 4, without the structured-row sort: columns are packed pairwise into int64
    (``a * (max + 1) + b``, exact while (max + 1)^2 < 2^63), then one 1-D ``np.unique`` or
    a ``np.lexsort`` of the two packed columns.  Ids follow the rows' lexicographic order,
    as ``np.unique``'s do."""
    keys = np.asarray(keys, dtype=np.int64)
    m, c = keys.shape
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    base = int(keys.max()) + 1
    if c > 4 or base > 3_037_000_499:                 # (base)^2 would overflow int64
        return np.unique(keys, axis=0, return_inverse=True)[1].ravel()
    packed = [keys[:, i] * base + keys[:, i + 1] if i + 1 < c else keys[:, i] for i in range(0, c, 2)]
    if len(packed) == 1 or (len(packed) == 2 and c == 3 and base ** 3 < 2 ** 62):
        key = packed[0] if len(packed) == 1 else packed[0] * base + packed[1]
        return np.unique(key, return_inverse=True)[1].ravel()
    order = np.lexsort(packed[::-1])
    srt = [p[order] for p in packed]
    new = np.zeros(m, dtype=bool)
    new[1:] = np.logical_or.reduce([q[1:] != q[:-1] for q in srt])
    ids = np.empty(m, dtype=np.int64)
    ids[order] = np.cumsum(new)
    return ids


#: cell nodes one pass of the chunked geometry loops holds on the host / on the GPU (J is
#: d^2 numbers a node: 19 MB / 1.2 GB of float64 temporaries a chunk)
CHUNK_NODES = {"cpu": 1 << 18, "gpu": 1 << 24}


def cell_chunks(num_cells, nodes_per_cell, backend_name="cpu"):
    """Slices of at most ``CHUNK_NODES`` cell nodes covering ``range(num_cells)`` (the
    geometry is computed a chunk at a time: bounded temporaries, O(cells / chunk) passes)."""
    step = max(1, CHUNK_NODES.get(backend_name, CHUNK_NODES["cpu"]) // max(1, nodes_per_cell))
    return [slice(s, min(s + step, num_cells)) for s in range(0, num_cells, step)]


def jacobian_components(X, B, DB, xp):
    """``J[i][j] = dx_i/dxi_j`` (a d x d list of (cells, nq) arrays) at the quadrature points
    of (B, DB) from the node coordinates ``X`` (cells, n^d, d) of some cells."""
    nc, nn, d = X.shape
    n = DB.shape[1]
    B = None if B is None else xp.asarray(B, dtype=X.dtype)
    DB = xp.asarray(DB, dtype=X.dtype)
    return [[g.reshape(nc, -1) for g in
             reference_gradient(xp.ascontiguousarray(X[:, :, i]).reshape((nc,) + (n,) * d), B, DB, d)]
            for i in range(d)]


def cofactors(J):
    """``(C, det)`` of J given by components ``J[i][j]`` (d = 2, 3): the cofactors
    ``C[i][j]`` (``J^{-1} = C^T / det``) and the determinant, closed form, element-wise."""
    if len(J) == 2:
        C = [[J[1][1], -J[1][0]], [-J[0][1], J[0][0]]]
        return C, J[0][0] * J[1][1] - J[0][1] * J[1][0]
    C = [[J[(i + 1) % 3][(j + 1) % 3] * J[(i + 2) % 3][(j + 2) % 3]
          - J[(i + 1) % 3][(j + 2) % 3] * J[(i + 2) % 3][(j + 1) % 3] for j in range(3)] for i in range(3)]
    return C, J[0][0] * C[0][0] + J[0][1] * C[0][1] + J[0][2] * C[0][2]


def retype_csr(A, dtype, backend):
    """CSR ``A`` (on ``backend``) with its values in ``dtype`` and its index arrays shared (no
    copy of the structure; ``A`` itself when the dtype already fits)."""
    if np.dtype(A.dtype) == np.dtype(dtype):
        return A
    return csr_from_arrays(backend.sparse, A.data.astype(dtype), A.indices, A.indptr, A.shape)


def array_nbytes(*items):
    """Bytes held by arrays and sparse matrices (CSR: data, indices, indptr); None skipped,
    an array shared by several items (``retype_csr``'s structure) counted once."""
    seen = {}
    for a in items:
        if a is None:
            continue
        for arr in ((a.data, a.indices, a.indptr) if hasattr(a, "indptr") else (a,)):
            ptr = getattr(arr.data, "ptr", None)                 # CuPy's device pointer
            ptr = arr.__array_interface__["data"][0] if ptr is None else ptr
            seen[(ptr, int(arr.nbytes))] = int(arr.nbytes)
    return sum(seen.values())


class SpectralSpace:
    """Continuous nodal Q_k (k = 1..8) on the GLL points of every cell of ``mesh``.

    Attributes: ``cell_dofs`` (cells, (k+1)^d), ``num_dofs``, ``points`` (num_dofs, d),
    ``cell_points`` (cells, (k+1)^d, d); on a 2:1 mesh with hanging nodes ``H`` (CSR, the
    constraint matrix: u = H x) and ``hanging_dofs`` (else None and empty)."""

    def __init__(self, mesh: Mesh, degree: int, mapping=None, backend=None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"SpectralSpace expects an adaptmg Mesh, got {type(mesh).__name__}")
        self.degree = k = check_spectral_degree(degree)
        if mapping is not None and not callable(mapping):
            raise TypeError(f"mapping must be a callable x -> x of points (..., d), got {type(mapping).__name__}")
        self.mesh, self.dim, self.mapping = mesh, mesh.dim, mapping
        self._on_backend = {}
        self.n1 = k + 1
        self.cell_dofs, self.num_dofs = self._number()
        # hanging nodes (2:1 adaptive meshes): u = H x, see adaptmg.spectral.hanging
        self.H, self.hanging_dofs = None, np.zeros(0, dtype=np.int64)
        if mesh.num_hanging_nodes:
            self.H, self.hanging_dofs = hanging_matrix(self)
        cells = np.asarray(mesh.cells)
        xc = _multilinear(mesh.points[cells], gll_points(k), self.dim)       # (nc, n^d, d)
        pts = np.empty((self.num_dofs, self.dim))
        pts[self.cell_dofs.ravel()] = xc.reshape(-1, self.dim)
        if mapping is not None:
            mapped = np.asarray(mapping(pts.copy()), dtype=float)
            if mapped.shape != pts.shape:
                raise ValueError(f"mapping must return an array of shape {pts.shape}, got {mapped.shape}")
            if not np.isfinite(mapped).all():
                raise ValueError("mapping returned NaN or Inf")
            pts = mapped if self.H is None else self.H @ mapped    # fine sides follow the coarse trace
        pts.setflags(write=False)
        self.points = pts
        self._check_jacobians(backend)

    # ------------------------------------------------------------------ numbering
    def _number(self):
        mesh, d, k = self.mesh, self.dim, self.degree
        cells = np.asarray(mesh.cells, dtype=np.int64)
        nc, n = cells.shape[0], k + 1
        nv = int(cells.max()) + 1
        local = local_indices(k, d)
        dofs = np.empty((n ** d, nc), dtype=np.int64)            # transposed: rows written whole
        kind = np.where((local == 0) | (local == k), -1, 1)       # -1: at a side, 1: free axis
        offset = nv
        groups = {1: [], 2: []}
        # entities of the reference cell: fixed axes (with side) and free axes
        for pattern in itertools.product((0, 1, 2), repeat=d):    # 0/1: side, 2: free
            free = [ax for ax in range(d) if pattern[ax] == 2]
            sel = np.ones(len(local), bool)
            for ax in range(d):
                sel &= (kind[:, ax] == 1) if pattern[ax] == 2 else (local[:, ax] == pattern[ax] * k)
            idx = np.flatnonzero(sel)
            if idx.size == 0:
                continue
            if len(free) == 0:
                v = sum(pattern[ax] << ax for ax in range(d))
                dofs[idx] = cells[:, v][None, :]
            elif len(free) == d:
                groups["interior"] = idx                  # numbered last
            else:
                groups[len(free)].append((pattern, free, idx))
        # edges then faces: canonical keys, one np.unique per entity dimension
        for m in (1, 2):
            items = groups[m]
            if not items:
                continue
            keys, pos = [], []
            for pattern, free, idx in items:
                G = {}
                for bits in itertools.product((0, 1), repeat=m):
                    v = sum((pattern[ax] if ax not in free else bits[free.index(ax)]) << ax for ax in range(d))
                    G[bits] = cells[:, v]
                a = local[idx][:, free]                                  # (nl, m) positions 1..k-1
                if m == 1:
                    g0, g1 = G[(0,)], G[(1,)]
                    flip = g0 > g1
                    keys.append(np.stack([np.minimum(g0, g1), np.maximum(g0, g1)], 1))
                    p = np.where(flip[None, :], k - a[:, :1], a[:, :1]) - 1      # (nl, nc)
                    pos.append(p)
                else:
                    Gs = np.stack([G[(0, 0)], G[(1, 0)], G[(0, 1)], G[(1, 1)]], 1)   # bits (b0, b1)
                    o = np.argmin(Gs, axis=1)
                    o0, o1 = o & 1, o >> 1
                    r = np.arange(nc)
                    n0 = Gs[r, (1 - o0) + 2 * o1]                       # neighbour along free[0]
                    n1 = Gs[r, o0 + 2 * (1 - o1)]                       # neighbour along free[1]
                    p0 = np.where(o0[None, :] == 0, a[:, :1], k - a[:, :1])     # (nl, nc)
                    p1 = np.where(o1[None, :] == 0, a[:, 1:2], k - a[:, 1:2])
                    swap = (n1 < n0)[None, :]
                    c0, c1 = np.where(swap, p1, p0), np.where(swap, p0, p1)
                    keys.append(np.stack([Gs[r, o], np.minimum(n0, n1), np.maximum(n0, n1)], 1))
                    pos.append((c0 - 1) * (k - 1) + (c1 - 1))
            inv = row_ids(np.concatenate(keys)).reshape(len(items), nc)
            ne = int(inv.max()) + 1
            per = (k - 1) ** m
            for j, (pattern, free, idx) in enumerate(items):
                dofs[idx] = offset + inv[j][None, :] * per + pos[j]
            offset += ne * per
        if "interior" in groups:
            idx = groups["interior"]
            dofs[idx] = offset + np.arange(nc)[None, :] * idx.size + np.arange(idx.size)[:, None]
            offset += nc * idx.size
        # compact: vertex ids of the mesh may leave gaps (unused points); the rank among
        # the used ids by a mark array (np.unique's inverse, without its sort)
        used = np.zeros(offset, dtype=bool)
        used[dofs.ravel()] = True
        if used.all():                                            # no gaps: the ids as they are
            dofs, count = np.ascontiguousarray(dofs.T), offset
        else:
            rank = np.cumsum(used) - 1
            dofs, count = rank[dofs.T], int(rank[-1] + 1)
        dofs.setflags(write=False)
        return dofs, count

    # ------------------------------------------------------------------ geometry
    @property
    def cell_points(self) -> np.ndarray:
        """(cells, (k+1)^d, d) node coordinates of every cell."""
        return self.points[self.cell_dofs]

    def jacobians(self, B=None, DB=None, xp=np, cells=slice(None)):
        """J[c, q, i, j] = dx_i/dxi_j at the quadrature points of (B, DB) (default: the GLL
        nodes) of the cells ``cells``, from the isoparametric interpolant of the node
        coordinates (a new array; the operators use :func:`jacobian_components` a chunk of
        cells at a time)."""
        from .basis import gll_derivative
        DB = gll_derivative(self.degree) if DB is None else DB
        X = xp.asarray(self.points)[xp.asarray(self.cell_dofs[cells])]
        J = jacobian_components(X, B, DB, xp)
        return xp.stack([xp.stack(row, -1) for row in J], -2)

    def on_backend(self, backend, what, build=None):
        """Backend copies of the space's dtype-independent arrays, made once per backend and
        shared by every operator and preconditioner on it: ``"cell_dofs"`` (int32, int64
        above 2^31 DoFs), ``"points"`` (float64), ``"gather"`` (:meth:`gather_matrix` as
        a float64 CSR on the backend); any other item is ``build()`` the first time (the fine
        scale's patch boxes and face neighbours, :class:`~adaptmg.spectral.schwarz.FineSchwarz`)."""
        key = (backend.name, what)
        if key not in self._on_backend:
            if what == "cell_dofs":
                val = backend.asarray(self.cell_dofs.astype(np.int64 if self.num_dofs > 2**31 - 1 else np.int32))
            elif what == "points":
                val = backend.asarray(self.points)
            elif what == "gather":
                val = self.gather_matrix(backend)
            elif build is not None:
                val = build()
            else:
                raise ValueError(f"on_backend: unknown item {what!r}")
            self._on_backend[key] = val
        return self._on_backend[key]

    def _check_jacobians(self, backend=None):
        """ValueError unless det J > 0 at every GLL node (a chunk of cells at a time, on
        ``backend``: the host by default)."""
        from ..backend import get_backend, to_host
        from .basis import gll_derivative
        be = get_backend(backend if backend is not None else "cpu")
        xp = be.xp
        pts, cd = self.on_backend(be, "points"), self.on_backend(be, "cell_dofs")
        D = gll_derivative(self.degree)
        mins = xp.empty(self.mesh.num_cells)
        for c in cell_chunks(self.mesh.num_cells, self.cell_dofs.shape[1], be.name):
            mins[c] = cofactors(jacobian_components(pts[cd[c]], None, D, xp))[1].min(axis=1)
        mins = to_host(mins)
        bad = np.flatnonzero(~(mins > 0))
        if bad.size:
            c = bad[0]
            raise ValueError(f"SpectralSpace: {bad.size} cell(s) have a non-positive Jacobian determinant "
                             f"at a GLL node (first: cell {c}, min det {mins[c]:.3g}); the cell is "
                             "inverted or tangled (check the vertex order and the mapping)")

    def cell_lengths(self) -> np.ndarray:
        """(cells, d) mean edge length of each cell along each reference axis (seed 004's
        h_x, h_y, h_z of the parallelepiped approximation)."""
        d = self.dim
        X = self.points[self.cell_dofs[:, self._vertex_local()]]  # (nc, 2^d, d)
        cor = ref.corners(d)
        h = np.empty((X.shape[0], d))
        for ax in range(d):                                        # the axes, not the mesh
            lo = np.flatnonzero(cor[:, ax] == 0)
            h[:, ax] = np.linalg.norm(X[:, lo + (1 << ax)] - X[:, lo], axis=2).mean(axis=1)
        return h

    def _vertex_local(self) -> np.ndarray:
        """Local node index of each cell vertex (lexicographic vertex order)."""
        cor = ref.corners(self.dim)
        return (cor * self.degree * self.n1 ** np.arange(self.dim)).sum(1)

    # ------------------------------------------------------------------ boundary
    def face_local_nodes(self) -> np.ndarray:
        """(2d, (k+1)^(d-1)) local nodes on face ``f = 2 axis + side``."""
        d, k, n = self.dim, self.degree, self.n1
        a = np.arange(n ** d)
        out = []
        for ax in range(d):
            c = (a // n ** ax) % n
            for side in (0, 1):
                out.append(np.flatnonzero(c == side * k))
        return np.array(out)

    def boundary_dofs(self, ids="all") -> np.ndarray:
        """Sorted DoFs on the boundary faces with boundary id in ``ids`` ("all": every
        boundary face; None: none)."""
        if ids is None:
            return np.zeros(0, dtype=np.int64)
        if isinstance(ids, str):
            if ids != "all":
                raise ValueError(f"dirichlet must be 'all', None or boundary ids, got {ids!r}")
            ids = None
        c, f, _ = self.mesh.boundary_faces(ids)
        return np.unique(self.cell_dofs[c[:, None], self.face_local_nodes()[f]])

    def interpolation(self, degree: int, cell_dofs, num_coarse: int, backend=None, row_mask=None,
                      col_mask=None):
        """CSR (num_dofs, num_coarse) on ``backend`` (default the host): the nodal Q_degree
        functions with DoFs ``cell_dofs`` (cells, (degree+1)^d) on the same cells, interpolated
        into this space's GLL nodes (tensor products of ``phi_p(t_q)``, read off the first cell
        holding each node: the first column of its row of :meth:`gather_matrix`).  Optional
        0/1 masks ``row_mask`` (num_dofs,) and ``col_mask`` (num_coarse,) on ``backend``
        give ``Z_f P Z_c`` directly (every row has the same (degree+1)^d entries before the
        zeros are dropped, so the CSR is written without a sort)."""
        from ..backend import get_backend
        from ..patch.tensor import lagrange_eval
        be = get_backend(backend if backend is not None else "cpu")
        xp = be.xp
        d, n = self.dim, self.cell_dofs.shape[1]
        I1 = lagrange_eval(degree, gll_points(self.degree)) if degree > 1 else \
            np.stack([1.0 - gll_points(self.degree), gll_points(self.degree)], 1)
        loc = np.ones((1, 1))
        for _ in range(d):                                           # x fastest: kron(z, y, x)
            loc = np.kron(I1, loc)
        loc[np.abs(loc) < 1e-14] = 0.0
        G = self.on_backend(be, "gather")
        first = G.indices[G.indptr[:-1]]                             # columns ascend in a row
        itype = np.int32 if max(num_coarse, self.num_dofs * loc.shape[1]) < 2**31 - 1 else np.int64
        cols = xp.asarray(np.asarray(cell_dofs, dtype=itype))[first // n]     # (num_dofs, nl)
        vals = xp.asarray(loc)[first % n]
        if row_mask is not None:
            vals *= xp.asarray(row_mask, dtype=vals.dtype)[:, None]
        if col_mask is not None:
            vals *= xp.asarray(col_mask, dtype=vals.dtype)[cols]
        indptr = xp.arange(0, vals.size + 1, vals.shape[1], dtype=itype)
        P = csr_from_arrays(be.sparse, vals.ravel(), cols.ravel(), indptr, (self.num_dofs, num_coarse))
        P.eliminate_zeros()
        if be.is_gpu:                       # as an uploaded SciPy matrix would be (to_device_sparse)
            P.sort_indices()
        return P

    def gather_matrix(self, backend=None):
        """CSR (num_dofs, cells * (k+1)^d) of ones: ``G @ y`` adds cell arrays into the
        global vector (the transpose of the gather ``u[cell_dofs]``), built on ``backend``
        (default the host); columns ascend within each row."""
        from ..backend import get_backend
        be = get_backend(backend if backend is not None else "cpu")
        xp = be.xp
        rows = self.on_backend(be, "cell_dofs").ravel()
        cols = xp.arange(rows.size, dtype=np.int64 if rows.size > 2**31 - 1 else np.int32)
        return be.sparse.coo_matrix((xp.ones(rows.size), (rows, cols)),
                                    shape=(self.num_dofs, rows.size)).tocsr()

    def __repr__(self):
        return (f"SpectralSpace(dim={self.dim}, k={self.degree}, cells={self.mesh.num_cells}, "
                f"dofs={self.num_dofs}{', curved' if self.mapping is not None else ''})")
