r"""Uniform refinement of a quadrilateral macro mesh and the node classes of seed 003 §4.1.

Every macro cell :math:`K_c` with vertices :math:`P_0..P_3` (lexicographic order) is
refined ``levels`` = J times; its fine nodes are the images of the reference lattice
:math:`(i/n, j/n)`, :math:`n = 2^J`, under the bilinear map
:math:`F_c(\xi,\eta) = \sum_v \hat N_v(\xi,\eta) P_v`.  A bilinear map restricted to a
sub-square is bilinear in that sub-square's coordinates, so the fine cells are exactly the
Q1 cells of the refined mesh and the Q1 spaces are nested on every macro mesh (distorted
cells included).

The interior (non-Dirichlet) fine nodes fall into three classes (seed 003 §4.1):

* :math:`\mathcal C`: macro vertices off the boundary,
* :math:`\mathcal E`: fine nodes inside interior macro edges,
* :math:`\mathcal I`: fine nodes inside macro cells, :math:`(n-1)^2` per cell.

Numbering (``RefinedMacroMesh.points`` follow it): first :math:`\mathcal C`, then
:math:`\mathcal E`, then :math:`\mathcal I` *group by group* — cells whose shapes are similar
(equal up to translation, rotation and scaling, which leave the 2-D Laplacian's stiffness
unchanged) form a group — and inside a group *node-major*: index
``offset_g + l * m_g + r`` for local interior node ``l`` of the ``r``-th cell of the group.
Then a group's interior block of a vector with k columns is one contiguous
``(n-1)^2 x (m_g k)`` matrix, and :math:`C_g^{-1}` applies to all its cells and columns in
one GEMM.  Dirichlet nodes (boundary vertices, then boundary edge nodes) come last.
"""
from __future__ import annotations

import numpy as np

__all__ = ["RefinedMacroMesh", "macro_square", "macro_square_with_hole"]


def _reference_lattice(n):
    """(n+1)^2 lattice indices (i, j), local index l = j (n+1) + i."""
    j, i = np.divmod(np.arange((n + 1) ** 2), n + 1)
    return i, j


def _shape_keys(P):
    """Similarity invariants of quads P (m, 4, 2): (z_k - z_0) / (z_1 - z_0), k = 2, 3."""
    z = P[..., 0] + 1j * P[..., 1]
    w = (z[:, 2:] - z[:, :1]) / (z[:, 1:2] - z[:, :1])
    key = np.stack([w.real, w.imag], axis=-1).reshape(len(P), 4)
    return np.round(key, 11) + 0.0          # + 0.0: -0.0 -> 0.0


class RefinedMacroMesh:
    """A quad macro mesh refined ``levels`` times, with the node classes C / E / I.

    Attributes: ``points`` (all fine nodes, numbered C, E, I, Dirichlet), ``cells`` (fine
    cells, lexicographic), ``n_C, n_E, n_I`` and ``N = n_C + n_E + n_I`` (the unknowns are
    ``0..N-1``), ``group`` (group of each macro cell), ``group_cells`` (list of cell index
    arrays), ``local_to_global`` (m, (n+1)^2), ``skeleton_local`` (the 4n local indices on
    a macro cell's boundary), ``interior_local`` (the (n-1)^2 others, in interior order).
    """

    def __init__(self, points, cells, levels):
        P0 = np.asarray(points, dtype=np.float64)
        cells = np.asarray(cells)
        if P0.ndim != 2 or P0.shape[1] != 2:
            raise ValueError(f"macro points must have shape (n, 2), got {P0.shape}")
        if cells.ndim != 2 or cells.shape[1] != 4 or not np.issubdtype(cells.dtype, np.integer):
            raise ValueError(f"macro cells must be integers of shape (m, 4), got {cells.shape} {cells.dtype}")
        if cells.size == 0 or cells.min() < 0 or cells.max() >= len(P0):
            raise ValueError(f"macro cells must reference points in [0, {len(P0)})")
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or not 1 <= levels <= 14:
            raise ValueError(f"levels must be an integer in [1, 14], got {levels!r}")
        X = P0[cells]
        cross = lambda a, b: a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
        jac = cross(X[:, 1] - X[:, 0], X[:, 2] - X[:, 0]), cross(X[:, 3] - X[:, 2], X[:, 3] - X[:, 1])
        if (jac[0] <= 0).any() or (jac[1] <= 0).any():
            raise ValueError("macro cells must be convex and in lexicographic vertex order "
                             "(P0=(0,0), P1=(1,0), P2=(0,1), P3=(1,1) of the reference square)")
        self.macro_points, self.macro_cells, self.levels = P0, cells, int(levels)
        n = self.n = 1 << self.levels
        m = self.num_macro_cells = len(cells)
        nv = len(P0)
        # macro edges in lexicographic local order: j = 0, j = n, i = 0, i = n
        loc_edges = np.array([[0, 1], [2, 3], [0, 2], [1, 3]])
        ev = cells[:, loc_edges]                                   # (m, 4, 2) vertex ids
        edges, einv, ecount = np.unique(np.sort(ev, axis=2).reshape(-1, 2), axis=0,
                                        return_inverse=True, return_counts=True)
        einv = einv.reshape(m, 4)
        if ecount.max() > 2:
            raise ValueError("a macro edge is shared by more than two cells")
        bedge = ecount == 1
        bvert = np.zeros(nv, bool)
        bvert[edges[bedge].ravel()] = True
        used = np.zeros(nv, bool)
        used[cells.ravel()] = True
        if not used.all():
            raise ValueError(f"{int((~used).sum())} macro points belong to no cell")
        # raw ids: vertices, edge nodes (edge e, parameter t = 1..n-1 from its lower vertex), cell interiors
        ne = len(edges)
        i, j = _reference_lattice(n)
        raw = np.empty((m, (n + 1) ** 2), np.int64)
        corner = {(0, 0): 0, (n, 0): 1, (0, n): 2, (n, n): 3}
        for (ci, cj), v in corner.items():
            raw[:, cj * (n + 1) + ci] = cells[:, v]
        t = np.arange(1, n)
        for k, (sel, par) in enumerate([(j == 0, i), (j == n, i), (i == 0, j), (i == n, j)]):
            sel = sel & (par > 0) & (par < n)
            forward = ev[:, k, 0] < ev[:, k, 1]                     # local direction = global direction
            tg = np.where(forward[:, None], t[None, :], n - t[None, :])
            raw[:, np.flatnonzero(sel)] = nv + einv[:, k, None] * (n - 1) + tg - 1
        inner = (i > 0) & (i < n) & (j > 0) & (j < n)
        self.interior_local = np.flatnonzero(inner)
        self.skeleton_local = np.flatnonzero(~inner)
        n_int = (n - 1) ** 2
        raw[:, self.interior_local] = nv + ne * (n - 1) + np.arange(m)[:, None] * n_int + np.arange(n_int)
        # groups of similar cells
        _, group = np.unique(_shape_keys(X), axis=0, return_inverse=True)
        self.group = group.ravel()
        self.group_cells = [np.flatnonzero(self.group == g) for g in range(self.group.max() + 1)]
        # renumbering: C, E, I (group, node-major), Dirichlet
        ivert = np.flatnonzero(~bvert)
        iedge_nodes = (nv + np.flatnonzero(~bedge)[:, None] * (n - 1) + np.arange(n - 1)).ravel()
        parts = [ivert, iedge_nodes]
        for cg in self.group_cells:
            parts.append((nv + ne * (n - 1) + cg[None, :] * n_int + np.arange(n_int)[:, None]).ravel())
        parts += [np.flatnonzero(bvert),
                  (nv + np.flatnonzero(bedge)[:, None] * (n - 1) + np.arange(n - 1)).ravel()]
        order = np.concatenate(parts)
        n_raw = nv + ne * (n - 1) + m * n_int
        assert len(order) == n_raw
        new = np.empty(n_raw, np.int64)
        new[order] = np.arange(n_raw)
        self.local_to_global = new[raw]
        self.n_C, self.n_E, self.n_I = len(ivert), len(iedge_nodes), m * n_int
        self.N = self.n_C + self.n_E + self.n_I
        self.group_offsets = self.n_C + self.n_E + np.concatenate([[0], np.cumsum([len(c) * n_int for c in self.group_cells])])
        # coordinates: bilinear images of the lattice
        xi, eta = i / n, j / n
        Nhat = np.stack([(1 - xi) * (1 - eta), xi * (1 - eta), (1 - xi) * eta, xi * eta])   # (4, nl)
        pts = np.empty((n_raw, 2))
        pts[self.local_to_global] = np.einsum("vl,mvd->mld", Nhat, X)
        self.points = pts
        # fine cells: lower-left lattice node (ii, jj) of each of the n^2 sub-squares
        jj, ii = np.divmod(np.arange(n * n), n)
        ll = jj * (n + 1) + ii
        loc = np.stack([ll, ll + 1, ll + n + 1, ll + n + 2], axis=1)                    # (n^2, 4)
        self.cells = self.local_to_global[:, loc].reshape(-1, 4)

    @property
    def num_groups(self):
        return len(self.group_cells)

    def __repr__(self):
        return (f"RefinedMacroMesh({self.num_macro_cells} macro cells in {self.num_groups} shape groups, "
                f"levels={self.levels}, |C|={self.n_C}, |E|={self.n_E}, |I|={self.n_I}, N={self.N})")


def macro_square(k, lower=(0.0, 0.0), upper=(1.0, 1.0)):
    """Points and cells of the k x k macro mesh of a rectangle (h0 = 1/k on the unit square)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    x = np.linspace(lower[0], upper[0], k + 1)
    y = np.linspace(lower[1], upper[1], k + 1)
    X, Y = np.meshgrid(x, y)
    pts = np.stack([X.ravel(), Y.ravel()], axis=1)
    jj, ii = np.divmod(np.arange(k * k), k)
    ll = jj * (k + 1) + ii
    return pts, np.stack([ll, ll + 1, ll + k + 1, ll + k + 2], axis=1)


def macro_square_with_hole(outer=1.0, middle=0.7, hole=0.4):
    """16 quads between the square [-outer, outer]^2 and the hole [-hole, hole]^2, in two rings.

    Every side of the squares of half-widths ``hole < middle < outer`` is cut at its midpoint;
    each ring holds trapezoids of two mirror shapes, and the rings are not similar unless
    middle / hole = outer / middle: four cell shapes (groups), no parallelogram, and the
    8 vertices of the middle square are interior macro vertices.
    """
    if not 0 < hole < middle < outer:
        raise ValueError(f"need 0 < hole < middle < outer, got {hole}, {middle}, {outer}")
    ang = np.arange(8) * np.pi / 4                         # corners and side midpoints, ccw
    unit = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    sq = unit / np.abs(unit).max(axis=1, keepdims=True)   # on the unit square's boundary
    pts = np.concatenate([hole * sq, middle * sq, outer * sq])
    q = np.arange(8)
    cells = [np.stack([r * 8 + q, (r + 1) * 8 + q, r * 8 + (q + 1) % 8, (r + 1) * 8 + (q + 1) % 8], axis=1)
             for r in range(2)]                            # (0,0) inner q, (1,0) outer q: positive orientation
    return pts, np.concatenate(cells)
