"""The refinement forest shared by the meshes of one refinement history.

Every cell and node ever created is kept in flat arrays (a forest whose roots
are the cells of the coarse mesh).  A :class:`~adaptmg.mesh.Mesh` is a set of
*active* (leaf) cells of such a forest.  The forest is only ever extended by
copying, so a mesh that holds an older forest never changes.

The tables live on the forest's backend (NumPy or CuPy arrays): one body against ``xp``
builds them on either, with a NumPy-tuned variant at a few places on the host (see
:mod:`._xp`; the same integers and coordinates either way).

Nodes created by refinement remember what they are:

* kind 1, edge midpoint: 2 parents (the edge end points);
* kind 2, face centre of a hexahedron: 4 parents;
* kind ``d``, cell centre: 2^d parents.

Edge midpoints and face centres are looked up in registries keyed by their
parent nodes, so a neighbour that refines later reuses the node.  An edge is
keyed by its sorted end points; a quadrilateral face by its smallest vertex and
the vertex diagonally opposite to it (two distinct faces of a valid hexahedral
mesh never share a diagonal).
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ..backend import backend_of, stable_argsort, unique_first
from ..device.index_kernels import face_key_ends
from ..threads import InlineExecutor, default_threads
from . import reference as ref
from ._grow import grown
from ._xp import tuned, xp_of

MAX_NODES = 2 ** 31 - 1
# node ids in the forest's (nodes, 2^d) parent table: they are < MAX_NODES, and half of
# int64's bytes halves the traffic of its fills and copies.  The (cells, 2^d) vertex table
# stays intp: the node numbering scatters and gathers with it as indices, which NumPy would
# first cast to intp (a copy of every (cell, vertex) slot, measured slower overall)
NODE = np.int32
CELL = np.intp
#: splits of at least this many cells build the children's cell arrays (parent, first child,
#: level, region, boundary ids) on a worker thread while the calling thread creates the
#: nodes (see :meth:`Forest.split`)
SPLIT_THREAD_CELLS = 1 << 15


def pack(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Order-independent int64 key of two node ids (< 2^31)."""
    xp = xp_of(a, b)
    lo = xp.minimum(a, b).astype(np.int64)
    hi = xp.maximum(a, b).astype(np.int64)
    return (lo << 32) | hi


def lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[keys == query] for each query (keys sorted), -1 where absent."""
    xp = xp_of(keys, query)
    if keys.size == 0:
        return xp.full(query.shape, -1, dtype=np.int64)
    idx = xp.searchsorted(keys, query)
    idx = xp.minimum(idx, keys.size - 1)
    found = keys[idx] == query
    return xp.where(found, values[idx], -1)


def unique_pairs(lo: np.ndarray, hi: np.ndarray):
    """``np.unique(pack(lo, hi), return_index=True, return_inverse=True)`` for int64 node ids
    ``lo <= hi``: the sorted keys, the index of each key's first occurrence and the inverse.

    When ``(lo, hi, index)`` fit into 63 bits as bit fields (``hb`` bits for ``hi``, ``ib``
    for the index) the pairs and their indices are packed into one int64 and sorted by a
    plain (SIMD) sort instead of the stable argsort of np.unique (measured 1.6x faster for 1M
    edges); equal pairs then lie in index order, so the result is the same, element for
    element.  Bit fields rather than ``lo * base + hi``: the keys come back by shifts and
    masks instead of an integer division (~9 ms per 1M pairs on the H100's host).  The
    inverse (ranks of the keys) is int32 where ``n`` fits: a cumulative sum and a scatter of
    half the bytes (the split writes it into its int32 tables anyway).  On the device the
    same: CuPy's in-place sort of the packed keys (a radix sort); the scatter of the ranks
    has distinct indices.
    """
    xp = xp_of(lo, hi)
    n = lo.size
    hb = int(hi.max()).bit_length() if n else 1
    ib = max(n - 1, 1).bit_length()
    if n == 0 or int(lo.max()).bit_length() + hb + ib > 63:
        return unique_first(pack(lo, hi))
    it = np.int32 if n <= np.iinfo(np.int32).max else np.intp
    inv = xp.arange(n, dtype=it)             # the index bits; its memory is reused for inv
    s = lo.astype(np.int64)
    s <<= hb
    s |= hi
    s <<= ib
    s |= inv
    s.sort()
    perm = s & ((1 << ib) - 1)
    s >>= ib
    mask = xp.empty(n, dtype=bool)
    mask[0] = True
    xp.not_equal(s[1:], s[:-1], out=mask[1:])
    idx = xp.flatnonzero(mask)               # + take: much faster than boolean indexing twice
    ulo = s.take(idx)
    uhi = ulo & ((1 << hb) - 1)
    ulo >>= hb
    ulo <<= 32
    ulo |= uhi
    rank = xp.cumsum(mask, dtype=it)
    rank -= 1
    inv[perm] = rank
    return ulo, perm.take(idx), inv


def _check_nodes(n: int) -> None:
    if n > MAX_NODES:
        raise ValueError(f"refinement would create {n} nodes; at most {MAX_NODES} are supported")


def _mean_of(X: np.ndarray, cols, out: np.ndarray | None = None) -> np.ndarray:
    """``X[np.stack(cols, 1)].mean(axis=1)`` for the parent columns ``cols`` (same rounding:
    sequential sum, then division) without the (n, p, d) gather; into ``out`` (contiguous
    (n, d)) if given.  The same additions in the same order on the device."""
    xp = xp_of(X)
    if out is None:
        out = xp.take(X, cols[0], axis=0)
    elif tuned(X):
        np.take(X, cols[0], axis=0, out=out, mode="clip")
    else:
        out[...] = xp.take(X, cols[0], axis=0)
    for c in cols[1:]:
        out += xp.take(X, c, axis=0)
    out /= len(cols)
    return out


def merge_registry(keys, values, new_keys, new_values):
    """Merge sorted ``new_keys`` (none of them in the sorted ``keys``) into the registry.

    A stable argsort of the two concatenated sorted runs is NumPy's timsort for int64 keys,
    which finds the two runs and merges them in linear time: 3x faster than placing each
    new key by a binary search among the old ones (1M-cell refinement: 18.5 -> 5.8 ms here,
    the binary searches' cache misses cost 33 ms on the H100's host).  On the device: CuPy's
    (radix) argsort of the concatenation; the keys are distinct, so any sort gives the same
    order."""
    xp = xp_of(keys, new_keys)
    k = xp.concatenate([keys, new_keys])
    order = stable_argsort(k)
    return k.take(order), xp.concatenate([values, new_values]).take(order)


#: the forest's array fields (what :meth:`Forest.to` moves)
ARRAYS = ("X", "node_kind", "node_par", "cell_nodes", "cell_parent", "cell_child0", "cell_level",
          "cell_bface", "edge_keys", "edge_nodes", "face_keys", "face_nodes", "cell_region")


@dataclass(frozen=True)
class Forest:
    dim: int
    X: np.ndarray            # (nn, d) coordinates of all nodes
    node_kind: np.ndarray    # (nn,) int8: 0 coarse vertex, 1 edge mid, 2 face centre, d cell centre
    node_par: np.ndarray     # (nn, 2^d) NODE (int32) parents, -1 padded
    cell_nodes: np.ndarray   # (nc, 2^d) CELL (intp) lexicographic vertices
    cell_parent: np.ndarray  # (nc,) int64, -1 for roots
    cell_child0: np.ndarray  # (nc,) int64 first child (children contiguous), -1 if none
    cell_level: np.ndarray   # (nc,) int16
    cell_bface: np.ndarray   # (nc, 2d) int32 boundary id of each face, -1 interior
    edge_keys: np.ndarray
    edge_nodes: np.ndarray
    face_keys: np.ndarray
    face_nodes: np.ndarray
    # region (cell physical group) of each cell, inherited by the children (None: all 0, no
    # cost in refinement); the names of the boundary ids and of the regions as sorted
    # (name, id) pairs (kept by every copy)
    cell_region: np.ndarray | None = None    # (nc,) int32
    boundary_names: tuple = ()
    region_names: tuple = ()

    @property
    def num_nodes(self) -> int:
        return self.X.shape[0]

    @functools.cached_property
    def n_root(self) -> int:
        """The coarse mesh's vertices (kind 0): the forest's first nodes (refinement only
        appends nodes, so a comparison replaces a gather of node_kind); read once per forest
        (every level of a hierarchy shares it), not per numbering."""
        nk, nn = self.node_kind, self.num_nodes
        return nn if nn == 0 or bool(nk[-1] == 0) else int(self.backend.xp.argmax(nk != 0))

    @property
    def backend(self):
        """The backend holding the tables (:func:`adaptmg.backend.backend_of`)."""
        return backend_of(self.cell_nodes)

    @property
    def num_cells(self) -> int:
        return self.cell_nodes.shape[0]

    @staticmethod
    def from_coarse(points: np.ndarray, cells: np.ndarray, bface: np.ndarray, region=None,
                    boundary_names=(), region_names=()) -> "Forest":
        """The forest of the coarse mesh ``points`` (nn, d), ``cells`` (nc, 2^d), boundary ids
        ``bface`` (nc, 2d) and regions (nc,) or None: on the backend of ``points`` and
        ``cells`` (the other arrays are moved there)."""
        xp = xp_of(points, cells)
        dim = points.shape[1]
        nn, nc = points.shape[0], cells.shape[0]
        if nn > MAX_NODES:
            raise ValueError(f"a mesh of {nn} points: at most {MAX_NODES} are supported")
        nv = 2 ** dim
        e = xp.zeros(0, dtype=np.int64)
        if region is not None:
            region = xp.asarray(region)
        return Forest(dim=dim, X=xp.ascontiguousarray(xp.asarray(points), dtype=np.float64),
                      node_kind=xp.zeros(nn, dtype=np.int8),
                      node_par=xp.full((nn, nv), -1, dtype=NODE),
                      cell_nodes=xp.ascontiguousarray(xp.asarray(cells), dtype=CELL),
                      cell_parent=xp.full(nc, -1, dtype=np.int64),
                      cell_child0=xp.full(nc, -1, dtype=np.int64),
                      cell_level=xp.zeros(nc, dtype=np.int16),
                      cell_bface=xp.ascontiguousarray(xp.asarray(bface), dtype=np.int32),
                      edge_keys=e, edge_nodes=e, face_keys=e, face_nodes=e,
                      cell_region=(None if region is None or not bool(xp.any(region))
                                   else xp.ascontiguousarray(region, dtype=np.int32)),
                      boundary_names=tuple(boundary_names), region_names=tuple(region_names))

    def with_names(self, boundary_names, region_names) -> "Forest":
        return replace(self, boundary_names=tuple(boundary_names), region_names=tuple(region_names))

    def with_points(self, X: np.ndarray) -> "Forest":
        return replace(self, X=X)

    def to(self, be) -> "Forest":
        """This forest with every table on the backend ``be`` (copied where it moves; the
        forest itself when all tables are there already)."""
        moved = {f: be.asarray(getattr(self, f)) for f in ARRAYS if getattr(self, f) is not None}
        if all(moved[f] is getattr(self, f) for f in moved):
            return self
        return replace(self, **moved)

    def split(self, cells: np.ndarray) -> "Forest":
        """Return a forest in which every cell of ``cells`` (all without children) has 2^d children.

        On the forest's backend; on the device (and in the generic variant) in this thread."""
        cells = self.backend.asarray(cells, dtype=np.int64)
        m = cells.size
        if m == 0:
            return self
        # for large splits a worker thread (NumPy's copies and gathers release the GIL) builds
        # the children's cell arrays but their vertices (they depend on ``cells`` alone) while
        # this thread creates the nodes, then the node arrays while this thread writes the
        # children's vertices; the same arrays either way
        if m < SPLIT_THREAD_CELLS or default_threads() < 2 or not tuned(cells):
            return self._split(cells, InlineExecutor())
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="adaptmg-split") as pool:
            return self._split(cells, pool)

    def _split(self, cells: np.ndarray, pool) -> "Forest":
        """:meth:`split`, the independent parts on ``pool`` (an executor; inline: all in this
        thread)."""
        kids = pool.submit(self._child_cells, cells)
        xp = xp_of(cells)
        m = cells.size
        d = self.dim
        nv = 2 ** d
        lat = ref.lattice(d, 3)                      # (3^d, d)
        cor = ref.corners(d)
        CN = xp.take(self.cell_nodes, cells, axis=0)  # (m, nv)
        # node ids of the 3^d lattice points of each split cell; every column is written below
        # (corners here, then one column per new node), so no fill is needed.  As (m, 3, .., 3)
        # with axes p_{d-1}, .., p_0 the corners are the even points: one strided copy.
        L = xp.empty((m, 3 ** d), dtype=CELL)
        L.reshape((m,) + (3,) * d)[(slice(None),) + (slice(None, None, 2),) * d] = \
            CN.reshape((m,) + (2,) * d)

        new_par = []                                 # (k, parent columns) of the new nodes, in order
        n_next = self.num_nodes
        edge_keys, edge_nodes = self.edge_keys, self.edge_nodes
        face_keys, face_nodes = self.face_keys, self.face_nodes

        # an edge/face of a fresh cell of level l is registered only if a cell of level l that
        # shares it was split before (on a conforming coarse mesh, a cell of level k has the
        # dyadic level-k sub-edges/faces of its root, so cells of other levels never share
        # one exactly); without such a cell (e.g. a uniform refinement) every lookup would miss.
        # Levels are small: a table over them instead of np.unique/np.isin (two sorts)
        was_split = xp.zeros(int(self.cell_level.max()) + 1, dtype=bool)
        was_split[self.cell_level[self.cell_child0 >= 0]] = True
        may_exist = bool(was_split[self.cell_level[cells]].any())
        nodd = (lat == 1).sum(1)
        for k in range(1, d + 1):
            pos = np.flatnonzero(nodd == k)          # lattice points with k odd coordinates
            if k == d:                               # cell centre: always new, parents = all corners
                nodes = xp.arange(n_next, n_next + m, dtype=np.int64)
                n_next += m
                L[:, int(pos[0])] = nodes
                new_par.append((k, [CN[:, j] for j in range(nv)]))
                continue
            # parents: the corners of the entity, in lexicographic order over its odd axes
            pv = []
            for p in lat[pos]:
                mask = [cor[:, i] == p[i] // 2 for i in range(d) if p[i] != 1]
                pv.append(np.flatnonzero(np.all(mask, axis=0)))
            pv = np.array(pv)                        # (npos, 2^k)
            # parent j of every entity: one contiguous (m, npos) array each (cell-major order)
            C = [xp.take(CN, xp.asarray(pv[:, j]), axis=1) for j in range(2 ** k)]
            if k == 1:
                swap = C[0] > C[1]                   # orientation: the parents are rebuilt from the keys
                lo, hi = xp.minimum(C[0], C[1]), xp.maximum(C[0], C[1], out=C[1])
                old_k, old_v = edge_keys, edge_nodes
            else:                                    # quadrilateral face, k == 2: smallest vertex
                lo, hi = face_key_ends(*C)           # and the one diagonally opposite to it
                old_k, old_v = face_keys, face_nodes
            lo, hi = lo.ravel(), hi.ravel()
            if may_exist:
                # the distinct keys first (one sort of the packed keys), then those looked up
                # in the registry: sorted queries, each a binary search near the last one,
                # instead of one search per (cell, entity) slot in random order -- cache
                # misses over the whole registry (2-D, 247k cells split in a 1.5M-edge
                # registry: 0.2 s).  The new keys, their first slots and node ids as before
                akeys, afirst, ainv = unique_pairs(lo, hi)
                val = lookup(old_k, old_v, akeys)
                new = xp.flatnonzero(val < 0)
                ukeys, first = akeys.take(new), afirst.take(new)
                _check_nodes(n_next + ukeys.size)
                val[new] = xp.arange(n_next, n_next + ukeys.size)
                nodes = val.take(ainv)
                del akeys, afirst, ainv, val, new
            else:                                    # nothing registered: all new
                ukeys, first, nodes = unique_pairs(lo, hi)
                _check_nodes(n_next + ukeys.size)
                nodes += n_next                      # = created[inv]
            created = xp.arange(n_next, n_next + ukeys.size, dtype=np.int64)
            n_next += ukeys.size
            if k == 1:
                edge_keys, edge_nodes = merge_registry(edge_keys, edge_nodes, ukeys, created)
            else:
                face_keys, face_nodes = merge_registry(face_keys, face_nodes, ukeys, created)
            nodes = nodes.reshape(m, pos.size)
            for j, p in enumerate(pos):              # column copies: cheaper than L[:, pos] = nodes
                L[:, int(p)] = nodes[:, j]
            if k == 1:
                # parents (a, b) of each new midpoint where it first occurs: its key (lo, hi),
                # swapped where a > b there (one bool gather instead of two int64 gathers)
                plo, phi = ukeys >> 32, ukeys & 0xFFFFFFFF
                sw = swap.ravel()[first]
                new_par.append((k, [xp.where(sw, phi, plo), xp.where(sw, plo, phi)]))
            else:
                new_par.append((k, [c.ravel().take(first) for c in C]))
        _check_nodes(n_next)
        nodes = pool.submit(self._new_nodes, new_par, n_next, CN)

        # the cell arrays are written in place into the new forest's arrays (old part shared or
        # copied, children gathered straight into the tail): no child-sized temporaries to
        # concatenate
        nc = self.num_cells
        ncn = nc + m * nv
        # children: child c takes lattice points c + e for its vertices e
        cell_nodes = grown(self.cell_nodes, ncn)
        cli = ref.child_lattice_index(d).reshape(-1)
        if tuned(L):
            np.take(L, cli, axis=1, mode="clip", out=cell_nodes[nc:].reshape(m, nv * nv))
        else:
            cell_nodes[nc:] = xp.take(L, xp.asarray(cli), axis=1).reshape(m * nv, nv)
        X, kind, par = nodes.result()
        return replace(self, X=X, node_kind=kind, node_par=par, cell_nodes=cell_nodes,
                       edge_keys=edge_keys, edge_nodes=edge_nodes, face_keys=face_keys,
                       face_nodes=face_nodes, **kids.result())

    def _new_nodes(self, new_par, n_next, CN):
        """(X, node_kind, node_par) of the split forest: ``new_par`` lists (kind, parent
        columns) of the new nodes in order (edge midpoints, face centres, cell centres: the
        last with the split cells' vertices ``CN`` as parents), ``n_next`` nodes in all.
        Written in place (old part shared or copied, see _grow; new nodes after it):
        coordinates = mean of the parents."""
        d = self.dim
        nn0 = self.num_nodes
        X = grown(self.X, n_next)
        kind = grown(self.node_kind, n_next)
        par = grown(self.node_par, n_next)
        at = nn0
        for k, cols in new_par:
            end = at + cols[0].shape[0]
            _mean_of(self.X, cols, out=X[at:end])
            kind[at:end] = k
            if k == d:
                par[at:end] = CN                     # all 2^d columns: one block copy
            else:
                par[at:end] = -1                     # one contiguous fill, cheaper than a strided one
                for j, c in enumerate(cols):
                    par[at:end, j] = c
            at = end
        return X, kind, par

    def _child_cells(self, cells: np.ndarray) -> dict:
        """The cell arrays of the forest split at ``cells`` but its vertices: ``cell_parent``,
        ``cell_child0``, ``cell_level``, ``cell_region``, ``cell_bface`` (children after the old
        cells, 2^d consecutive per split cell, in the order of ``cells``).  cell_child0 changes
        for old cells: always a copy."""
        m, d = cells.size, self.dim
        xp = xp_of(cells)
        nv = 2 ** d
        cor = ref.corners(d)
        nc = self.num_cells
        ncn = nc + m * nv
        cell_parent = grown(self.cell_parent, ncn)
        for j in range(nv):                          # column copies: faster than one (m, nv) broadcast
            cell_parent[nc + j::nv] = cells
        cell_child0 = xp.empty(ncn, dtype=np.result_type(self.cell_child0.dtype, np.int64))
        cell_child0[:nc] = self.cell_child0
        cell_child0[cells] = nc + nv * xp.arange(m, dtype=np.int64)
        cell_child0[nc:] = -1
        cell_level = grown(self.cell_level, ncn)
        child_level = (self.cell_level[cells] + 1).astype(np.int16)
        for j in range(nv):                          # column copies, as for cell_parent
            cell_level[nc + j::nv] = child_level
        cell_region = None
        if self.cell_region is not None:             # children inherit their parent's region
            cell_region = grown(self.cell_region, ncn)
            child_region = self.cell_region[cells]
            for j in range(nv):
                cell_region[nc + j::nv] = child_region
        # boundary ids: child face (axis, side) lies on the parent face iff child bit == side
        faces = np.arange(2 * d)
        axis, side = faces // 2, faces % 2
        on_parent = cor[:, axis] == side[None, :]                         # (nv, 2d)
        pb = xp.take(self.cell_bface, cells, axis=0)                      # (m, 2d)
        cell_bface = grown(self.cell_bface, ncn)
        tail = cell_bface[nc:].reshape(m, nv * 2 * d)
        # only the cells with a boundary face (few, near the surface) give their children ids:
        # the others' children are all -1 (one fill instead of a gather of every row)
        bnd = xp.flatnonzero(pb.max(axis=1) >= 0)
        if bnd.size * 2 > m:
            bnd = None                               # mostly boundary (coarse meshes): all rows
        else:
            tail.fill(-1)
            pb = pb.take(bnd, axis=0)
        # one gather of the columns of [pb | -1] (faster than a broadcast where/masked write)
        pbx = xp.empty((pb.shape[0], 2 * d + 1), dtype=np.int32)
        for f in range(2 * d):                       # column copies: faster than pbx[:, :2d] = pb
            pbx[:, f] = pb[:, f]
        pbx[:, 2 * d] = -1
        cols = np.where(on_parent, faces, 2 * d).reshape(-1)
        if bnd is None and tuned(pbx):
            np.take(pbx, cols, axis=1, mode="clip", out=tail)
        elif bnd is None:
            tail[...] = xp.take(pbx, xp.asarray(cols), axis=1)
        else:
            tail[bnd] = xp.take(pbx, xp.asarray(cols), axis=1)
        return dict(cell_parent=cell_parent, cell_child0=cell_child0, cell_level=cell_level,
                    cell_bface=cell_bface, cell_region=cell_region)
