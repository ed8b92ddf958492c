"""The refinement forest shared by the meshes of one refinement history.

Every cell and node ever created is kept in flat arrays (a forest whose roots
are the cells of the coarse mesh).  A :class:`~adaptmg.mesh.Mesh` is a set of
*active* (leaf) cells of such a forest.  The forest is only ever extended by
copying, so a mesh that holds an older forest never changes.

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

from dataclasses import dataclass, replace

import numpy as np

from . import reference as ref

MAX_NODES = 2 ** 31 - 1


def pack(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Order-independent int64 key of two node ids (< 2^31)."""
    lo = np.minimum(a, b).astype(np.int64)
    hi = np.maximum(a, b).astype(np.int64)
    return (lo << 32) | hi


def lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[keys == query] for each query (keys sorted), -1 where absent."""
    if keys.size == 0:
        return np.full(query.shape, -1, dtype=np.int64)
    idx = np.searchsorted(keys, query)
    idx = np.minimum(idx, keys.size - 1)
    found = keys[idx] == query
    return np.where(found, values[idx], -1)


def _mean_of(X: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """``X[parents].mean(axis=1)`` (same rounding: sequential sum, then division) without
    the (n, p, d) gather."""
    out = np.take(X, parents[:, 0], axis=0)
    for j in range(1, parents.shape[1]):
        out += np.take(X, parents[:, j], axis=0)
    out /= parents.shape[1]
    return out


def merge_registry(keys, values, new_keys, new_values):
    """Merge sorted ``new_keys`` (none of them in the sorted ``keys``) into the registry:
    each new key lands at its rank among the old keys plus its own index (no sort)."""
    n = keys.size + new_keys.size
    at = np.searchsorted(keys, new_keys) + np.arange(new_keys.size)
    old = np.ones(n, dtype=bool)
    old[at] = False
    k = np.empty(n, dtype=np.result_type(keys, new_keys))
    v = np.empty(n, dtype=np.result_type(values, new_values))
    k[at], v[at] = new_keys, new_values
    k[old], v[old] = keys, values
    return k, v


@dataclass(frozen=True)
class Forest:
    dim: int
    X: np.ndarray            # (nn, d) coordinates of all nodes
    node_kind: np.ndarray    # (nn,) int8: 0 coarse vertex, 1 edge mid, 2 face centre, d cell centre
    node_par: np.ndarray     # (nn, 2^d) int64 parents, -1 padded
    cell_nodes: np.ndarray   # (nc, 2^d) int64 lexicographic vertices
    cell_parent: np.ndarray  # (nc,) int64, -1 for roots
    cell_child0: np.ndarray  # (nc,) int64 first child (children contiguous), -1 if none
    cell_level: np.ndarray   # (nc,) int16
    cell_bface: np.ndarray   # (nc, 2d) int32 boundary id of each face, -1 interior
    edge_keys: np.ndarray
    edge_nodes: np.ndarray
    face_keys: np.ndarray
    face_nodes: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.X.shape[0]

    @property
    def num_cells(self) -> int:
        return self.cell_nodes.shape[0]

    @staticmethod
    def from_coarse(points: np.ndarray, cells: np.ndarray, bface: np.ndarray) -> "Forest":
        dim = points.shape[1]
        nn, nc = points.shape[0], cells.shape[0]
        nv = 2 ** dim
        e = np.zeros(0, dtype=np.int64)
        return Forest(dim=dim, X=np.ascontiguousarray(points, dtype=np.float64),
                      node_kind=np.zeros(nn, dtype=np.int8),
                      node_par=np.full((nn, nv), -1, dtype=np.int64),
                      cell_nodes=np.ascontiguousarray(cells, dtype=np.int64),
                      cell_parent=np.full(nc, -1, dtype=np.int64),
                      cell_child0=np.full(nc, -1, dtype=np.int64),
                      cell_level=np.zeros(nc, dtype=np.int16),
                      cell_bface=np.ascontiguousarray(bface, dtype=np.int32),
                      edge_keys=e, edge_nodes=e, face_keys=e, face_nodes=e)

    def with_points(self, X: np.ndarray) -> "Forest":
        return replace(self, X=X)

    def split(self, cells: np.ndarray) -> "Forest":
        """Return a forest in which every cell of ``cells`` (all without children) has 2^d children."""
        cells = np.asarray(cells, dtype=np.int64)
        m = cells.size
        if m == 0:
            return self
        d = self.dim
        nv = 2 ** d
        lat = ref.lattice(d, 3)                      # (3^d, d)
        cor = ref.corners(d)
        w3 = 3 ** np.arange(d)
        CN = np.take(self.cell_nodes, cells, axis=0)  # (m, nv)
        L = np.full((m, 3 ** d), -1, dtype=np.int64)
        L[:, (2 * cor * w3).sum(1)] = CN

        X, kind, par = [self.X], [self.node_kind], [self.node_par]
        n_next = self.num_nodes
        edge_keys, edge_nodes = self.edge_keys, self.edge_nodes
        face_keys, face_nodes = self.face_keys, self.face_nodes

        # an edge/face of a fresh cell of level l is registered only if a cell of level l that
        # shares it was split before (on a conforming coarse mesh, a cell of level k has the
        # dyadic level-k sub-edges/faces of its root, so cells of other levels never share
        # one exactly); without such a cell (e.g. a uniform refinement) every lookup would miss
        split_levels = np.unique(self.cell_level[self.cell_child0 >= 0])
        may_exist = bool(np.isin(np.unique(self.cell_level[cells]), split_levels).any())
        nodd = (lat == 1).sum(1)
        for k in range(1, d + 1):
            pos = np.flatnonzero(nodd == k)          # lattice points with k odd coordinates
            # parents: the corners of the entity, in lexicographic order over its odd axes
            pv = []
            for p in lat[pos]:
                mask = [cor[:, i] == p[i] // 2 for i in range(d) if p[i] != 1]
                sel = np.all(mask, axis=0) if mask else np.ones(nv, bool)
                pv.append(np.flatnonzero(sel))
            pv = np.array(pv)                        # (npos, 2^k)
            G = np.take(CN, pv, axis=1)              # (m, npos, 2^k)
            if k == d:                               # cell centres: always new
                nodes = n_next + np.arange(m * pos.size, dtype=np.int64)
                parents = G.reshape(-1, 2 ** k)
                coords = _mean_of(self.X, parents)
                n_next += nodes.size
            else:
                if k == 1:
                    keys = pack(G[..., 0], G[..., 1]).ravel()
                    old_k, old_v = edge_keys, edge_nodes
                else:                                # quadrilateral face, k == 2
                    g = G.reshape(-1, 4)
                    amin = np.argmin(g, axis=1)
                    r = np.arange(g.shape[0])
                    keys = pack(g[r, amin], g[r, 3 - amin])
                    old_k, old_v = face_keys, face_nodes
                nodes = lookup(old_k, old_v, keys) if may_exist else np.full(keys.shape, -1, dtype=np.int64)
                new = nodes < 0
                ukeys, first, inv = np.unique(keys[new], return_index=True, return_inverse=True)
                created = n_next + np.arange(ukeys.size, dtype=np.int64)
                nodes[new] = created[inv]
                parents = np.take(G.reshape(-1, 2 ** k), np.flatnonzero(new)[first], axis=0)
                coords = _mean_of(self.X, parents)
                n_next += ukeys.size
                if k == 1:
                    edge_keys, edge_nodes = merge_registry(edge_keys, edge_nodes, ukeys, created)
                else:
                    face_keys, face_nodes = merge_registry(face_keys, face_nodes, ukeys, created)
            L[:, pos] = nodes.reshape(m, pos.size)
            X.append(coords)
            kind.append(np.full(coords.shape[0], k, dtype=np.int8))
            pp = np.full((coords.shape[0], nv), -1, dtype=np.int64)
            pp[:, :2 ** k] = parents
            par.append(pp)
        if n_next > MAX_NODES:
            raise ValueError(f"refinement would create {n_next} nodes; at most {MAX_NODES} are supported")

        # children: child c takes lattice points c + e for its vertices e
        child_nodes = np.take(L, ref.child_lattice_index(d).reshape(-1), axis=1).reshape(m * nv, nv)
        nc = self.num_cells
        child0 = self.cell_child0.copy()
        child0[cells] = nc + nv * np.arange(m, dtype=np.int64)
        # boundary ids: child face (axis, side) lies on the parent face iff child bit == side
        faces = np.arange(2 * d)
        axis, side = faces // 2, faces % 2
        on_parent = cor[:, axis] == side[None, :]                         # (nv, 2d)
        pb = np.take(self.cell_bface, cells, axis=0)                      # (m, 2d)
        cb = np.empty((m, nv, 2 * d), dtype=np.int32)
        cb[...] = pb[:, None, :]
        cb[:, ~on_parent] = -1
        cb = cb.reshape(m * nv, 2 * d)
        return replace(
            self,
            X=np.concatenate(X), node_kind=np.concatenate(kind), node_par=np.concatenate(par),
            cell_nodes=np.concatenate([self.cell_nodes, child_nodes]),
            cell_parent=np.concatenate([self.cell_parent, np.repeat(cells, nv)]),
            cell_child0=np.concatenate([child0, np.full(m * nv, -1, dtype=np.int64)]),
            cell_level=np.concatenate([self.cell_level, np.repeat(self.cell_level[cells] + 1, nv).astype(np.int16)]),
            cell_bface=np.concatenate([self.cell_bface, cb]),
            edge_keys=edge_keys, edge_nodes=edge_nodes, face_keys=face_keys, face_nodes=face_nodes,
        )
