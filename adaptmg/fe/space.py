r"""Continuous Lagrange spaces Q1/Q2 with c components on adaptive meshes.

DoF numbering: DoF index = node * c + component, where ``node`` runs over the
*DoF nodes* of the space.  For Q1 the DoF nodes are the mesh nodes.  For Q2 they
are the nodes of the uniformly refined mesh (edge midpoints, face centres and
cell centres of every cell, placed by the multilinear cell map), so that
``cell_dofs[K]`` lists the 3^d nodes of cell K in lexicographic order over the
reference lattice {0, 1/2, 1}^d.

Hanging nodes (seed 001 §2.2)
-----------------------------
A DoF node h that lies inside an edge or face of a coarser active cell K is not
free: the FE function there is the value of K's polynomial,

.. math::  u(x_h) = \sum_{j \in K} \hat\phi_j(\hat x_h)\, u_j ,

with :math:`\hat x_h` the reference coordinates of h in K.  The square matrix
:math:`H` holds identity rows for regular DoFs and these weights in hanging
rows (its hanging columns are zero), so ``H @ x`` performs all interpolations at
once and ``H.T @ r`` folds an assembled residual back onto the regular DoFs.
For Q1 the weights are 1/2 (edges) and 1/4 (faces); for Q2 they are products of
the 1-D quadratic weights (3/8, 3/4, -1/8) at the quarter points.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..mesh import Mesh
from ..mesh import reference as ref
from .element import LagrangeQ
from . import space_xp

__all__ = ["Space", "constraint_matrix"]


def constraint_matrix(n: int, hanging, cols, W) -> sp.csr_matrix:
    """The (n x n) CSR hanging-node matrix: identity rows on the regular indices, row
    ``hanging[i]`` holds the weights ``W[i]`` in the columns ``cols[i]``; chains (a weight
    on another hanging index) are substituted (H <- H H) until no hanging column is left.

    Without chains (the usual case) the canonical CSR is written directly -- one entry per
    regular row, the sorted nonzero weights of each hanging row -- instead of a COO -> CSR
    conversion that sorts all n + nnz entries."""
    hanging = np.asarray(hanging, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    W = np.asarray(W, dtype=float)
    is_h = np.zeros(n, dtype=bool)
    is_h[hanging] = True
    nz = W != 0
    # distinct hanging rows: ascending ones are (the meshes give them so; no hash of them all)
    ascending = hanging.size < 2 or bool((hanging[1:] > hanging[:-1]).all())
    if not is_h[cols[nz]].any() and (ascending or np.unique(hanging).size == hanging.size):
        if not ascending:
            order = np.argsort(hanging)
            hanging, cols, W, nz = hanging[order], cols[order], W[order], nz[order]
        it = np.int32 if n + int(nz.sum()) < np.iinfo(np.int32).max else np.int64
        # the rows between two hanging rows are identity rows, one entry each: indptr is
        # i + extra_j there (extra_j: the entries the j hanging rows before row i add beyond
        # one each) and the column of entry p is p - extra_j -- runs of a few hanging rows'
        # values repeated, instead of a count per row, its cumulative sum and scatters of
        # the n regular rows (2.7M rows: 67 -> 27 ms)
        extra = np.zeros(hanging.size + 1, dtype=it)
        np.cumsum(nz.sum(axis=1) - 1, out=extra[1:])
        indptr = np.arange(n + 1, dtype=it)
        indptr += np.repeat(extra, np.diff(np.concatenate([[0], hanging + 1, [n + 1]])))
        nnz = int(indptr[-1])
        indices = np.arange(nnz, dtype=it)
        indices -= np.repeat(extra, np.diff(np.concatenate([[0], indptr[hanging], [nnz]])))
        data = np.ones(nnz)
        if hanging.size:
            # each hanging row's nonzero weights sorted by column (zeros last, then dropped)
            key = np.where(nz, cols, n)
            order = np.argsort(key, axis=1, kind="stable")
            kc = np.take_along_axis(key, order, axis=1)
            kw = np.take_along_axis(W, order, axis=1)
            keep = kc < n
            at = indptr[hanging][:, None] + np.cumsum(keep, axis=1) - 1
            indices[at[keep]] = kc[keep]
            data[at[keep]] = kw[keep]
        H = sp.csr_matrix((data, indices, indptr), shape=(n, n), copy=False)
        H.has_canonical_format = True
        return H
    regular = ~is_h
    r = np.flatnonzero(regular)
    rows = np.concatenate([r, np.repeat(hanging, nz.sum(1))])
    cc = np.concatenate([r, cols[nz]])
    vv = np.concatenate([np.ones(r.size), W[nz]])
    H = sp.csr_matrix((vv, (rows, cc)), shape=(n, n))
    for _ in range(8):
        if not H[:, hanging].count_nonzero():
            break
        H = (H @ H).tocsr()
    else:
        raise RuntimeError("hanging-node constraints do not resolve (cyclic dependencies)")
    H.eliminate_zeros()
    H.sort_indices()
    return H


class Space:
    """Lagrange Q_k space (k = 1, 2) with ``components`` components on a :class:`Mesh`."""

    def __init__(self, mesh: Mesh, degree: int = 1, components: int = 1):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"Space expects an adaptmg Mesh, got {type(mesh).__name__}")
        if degree not in (1, 2) or isinstance(degree, bool):
            raise ValueError(f"degree must be 1 or 2, got {degree!r}")
        if not isinstance(components, (int, np.integer)) or isinstance(components, bool) or components < 1:
            raise ValueError(f"components must be a positive integer, got {components!r}")
        self.mesh = mesh
        self.degree = int(degree)
        self.components = int(components)
        self.dim = mesh.dim
        self.element = LagrangeQ(self.degree, self.dim)
        if self.degree == 1:
            self._carrier = mesh
            self._cell_dofs = None               # the mesh's cells, numbered on first use
        else:
            fine = mesh.refine()
            cidx, child = fine.parent_of(mesh)
            if mesh.backend.is_gpu:              # the carrier's table on the device (space_xp)
                cd = space_xp.q2_cell_dofs(mesh.backend.xp, fine.cells, cidx, child, mesh.num_cells)
            else:
                table = ref.child_lattice_index(self.dim)        # (children, vertices) -> lattice index
                cd = np.empty((mesh.num_cells, 3 ** self.dim), dtype=np.int64)
                cd[cidx[:, None], table[child]] = fine.cells
                cd.flags.writeable = False
            self._carrier = fine
            self._fine_parent = (cidx, child)
            self._cell_dofs = cd

    @property
    def backend(self):
        """The backend whose arrays hold the mesh, and so this space's index arrays, ``H`` and
        masks (:attr:`adaptmg.Mesh.backend`)."""
        return self.mesh.backend

    @property
    def _on_device(self) -> bool:
        return self.mesh.backend.is_gpu

    def find_hanging_nodes(self) -> None:
        """Find the hanging nodes of the DoF carrier mesh (the mesh for Q1, its refinement for
        Q2) in the forest's node ids, without numbering its nodes (kept for
        :attr:`hanging_nodes`): a set-up task that can run beside the numbering
        (:func:`adaptmg.multigrid`)."""
        self._carrier._hanging_forest

    @property
    def cell_dofs(self) -> np.ndarray:
        """(num_cells, nloc) DoF node indices of each cell, read-only (Q1: ``mesh.cells``,
        whose node numbering is computed on first use -- :func:`adaptmg.multigrid` does that
        on a worker thread while it coarsens the mesh)."""
        cd = self._cell_dofs
        return self.mesh.cells if cd is None else cd

    def __repr__(self) -> str:
        return (f"Space(Q{self.degree}, components={self.components}, dofs={self.num_dofs}, "
                f"hanging nodes={self.hanging_nodes.size}, cells={self.mesh.num_cells})")

    @property
    def num_nodes(self) -> int:
        return self._carrier.num_nodes

    @property
    def num_dofs(self) -> int:
        return self.num_nodes * self.components

    @property
    def points(self) -> np.ndarray:
        """(num_nodes, dim) coordinates of the DoF nodes."""
        return self._carrier.points

    # ------------------------------------------------------------------ hanging nodes
    @functools.cached_property
    def _hanging_rows(self):
        """(hanging nodes, (nh, nloc) columns, (nh, nloc) weights) before chain resolution."""
        C = self._carrier
        hn, par, owner = C.hanging_nodes, C.hanging_parents, C.hanging_owner
        if self._on_device:                    # the same rows on the device
            if self.degree == 1:
                return space_xp.hanging_rows(self.backend.xp, C.cells, hn, par, owner)
            return space_xp.hanging_rows(self.backend.xp, C.cells, hn, par, owner,
                                         fine_parent=self._fine_parent, cell_dofs=self.cell_dofs)
        d = self.dim
        cor = ref.corners(d).astype(float)
        # reference coordinates of h in its owner cell of the carrier mesh: mean of its parents' corners
        # (the parents are distinct vertices of the owner and -1 matches none: a vertex is hit
        # by at most one parent, so the sum over the parents is an "any", and the mean of the
        # hit corners one small matrix product of 0/1 values -- exact, as the einsum over the
        # (nh, nv, 4) floats it replaces, which took 64 ms at 2.6M cells)
        owner_cells = np.take(C.cells, owner, axis=0)
        hit = owner_cells == par[:, 0:1]                                  # (nh, nv)
        for p in range(1, par.shape[1]):
            hit |= owner_cells == par[:, p:p + 1]
        cnt = (par >= 0).sum(1)
        xi = (hit.astype(float) @ cor) / cnt[:, None]
        if self.degree == 1:
            K = owner
        else:
            cidx, child = self._fine_parent
            K = cidx[owner]
            xi = (cor[child[owner]] + xi) / 2.0
        W = self.element.values(xi) if hn.size else np.zeros((0, self.element.num_local))
        W[np.abs(W) < 1e-13] = 0.0
        return hn, self.cell_dofs[K], W

    @functools.cached_property
    def H_nodes(self) -> sp.csr_matrix:
        """Node-level hanging-node matrix (num_nodes x num_nodes), chains resolved."""
        n = self.num_nodes
        hn, cols, W = self._hanging_rows
        if self._on_device:
            return space_xp.constraint_matrix_on(self.backend, n, hn, cols, W)
        if hn.size == 0:                       # H = I, built directly (no COO -> CSR conversion)
            it = np.int32 if n < np.iinfo(np.int32).max else np.int64
            H = sp.csr_matrix((np.ones(n), np.arange(n, dtype=it), np.arange(n + 1, dtype=it)),
                              shape=(n, n), copy=False)
            H.has_canonical_format = True
            return H
        return constraint_matrix(n, hn, cols, W)

    @functools.cached_property
    def H(self) -> sp.csr_matrix:
        """DoF-level hanging-node matrix kron(H_nodes, I_c) (num_dofs x num_dofs)."""
        if self.components == 1:
            return self.H_nodes
        if self._on_device:
            return space_xp.kron_identity(self.backend, self.H_nodes, self.components)
        return sp.kron(self.H_nodes, sp.identity(self.components), format="csr")

    @property
    def hanging_nodes(self) -> np.ndarray:
        """Indices of the hanging DoF nodes."""
        return self._hanging_rows[0]

    @functools.cached_property
    def is_hanging(self) -> np.ndarray:
        """Boolean mask over DoFs: True for hanging (constrained) DoFs."""
        return self.backend.xp.repeat(self._carrier.is_hanging, self.components)

    # ------------------------------------------------------------------ boundary
    def boundary_nodes(self, ids=None, where=None) -> np.ndarray:
        """Sorted DoF nodes on boundary faces with boundary id in ``ids`` (all if None),
        restricted to nodes x with ``where(x)`` true (``where`` vectorised over (n, d) points;
        on a device mesh it gets CuPy points and the nodes are a CuPy array)."""
        return space_xp.boundary_nodes(self.backend.xp, self, ids, where)

    def boundary_dofs(self, ids=None, where=None, components=None) -> np.ndarray:
        """DoF indices node*c + comp of :meth:`boundary_nodes`, for the given components (all if None)."""
        return space_xp.boundary_dofs(self.backend.xp, self, ids, where, components)

    def interpolate(self, f) -> np.ndarray:
        """Nodal interpolant: vector of f at the DoF nodes (f(x): (n, d) -> (n,) or (n, c));
        on a device mesh ``f`` gets CuPy points and the result is a CuPy array."""
        return space_xp.interpolate(self.backend.xp, self, f)
