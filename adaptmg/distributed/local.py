r"""Per-rank set-up of a geometric level: only the cells a rank needs are assembled.

With the DoF owners of the level's space (:func:`~.partition.dof_owners`) a rank needs the
owned rows of

.. math::  K = Z H^T A H Z + s (I - Z), \qquad
           (H^T A H)_{ij} = \sum_{k, m} H_{ki} A_{km} H_{mj}.

Row ``i`` (owned) involves the rows ``k`` of ``A`` with ``H_{ki} \ne 0``: ``k = i`` and
every hanging DoF ``k`` that has ``i`` among its parents (such a ``k`` may be owned by
another rank).  A row of ``A`` is complete once every cell touching its node is
assembled, so the rank assembles

    cells(rank) = { cells touching a node of  S = owned nodes  U  {hanging k : H_{k,i} != 0, i owned} }

(owned cells plus one ghost layer, widened around hanging nodes with owned parents),
on a *cell-subset view* of the space (the same ``points``, ``num_nodes`` and DoF
numbering; ``cells`` / ``cell_dofs`` restricted), so ``assemble(view)`` is a global-size
matrix whose rows in ``S`` are exact.  Then ``B_o = (H^T)_{o,:} (A H)``, ``s`` = mean of
``|B_ii|`` over the free DoFs (one ``Allreduce`` of a sum and a count), and the owned
rows of ``K`` keep the free x free entries of ``B_o`` plus ``s`` on the diagonal of the
non-free rows.

Transfer.  ``P = Z_f (\chi \otimes I_c) H_c Z_c`` (:mod:`adaptmg.multilevel.transfer`):
a row of ``\chi`` (fine node ``f``) is the coarse cell polynomial of any fine cell
containing ``f`` evaluated at ``f``, so the owned rows need the owned fine cells only.
``R = P^T``: the owned (coarse) rows of R need the rows ``f`` of P with ``P_{fc} \ne 0``
for an owned coarse DoF ``c``; these fine nodes lie in the coarse cells touching the
coarse nodes ``{c owned} U {coarse hanging j with parent c}``, so the rank builds the
rows of P of the fine cells inside those coarse cells and transposes.

A rank that owns no DoF of the level (a coarse level folded onto fewer ranks,
:func:`~.partition.level_ranks`) assembles nothing and gets empty row blocks; it still
joins the one ``Allreduce``.

The mesh (and the hanging-node matrices H, built from it) stay replicated on every
rank; what scales is the assembly, the Galerkin-free congruence and the transfer rows.
The contract for ``assemble``: it must accept the cell-subset view (a duck-typed space
with ``mesh.points``, ``mesh.cells``, ``mesh.dim``, ``mesh.num_cells``, ``degree``,
``components``, ``cell_dofs``, ``num_nodes``, ``num_dofs``) -- the library's vectorised
forms (``adaptmg.assemble.stiffness``, ``elasticity``, ``mass``, ...) do; per-cell
coefficient arrays of the full mesh do not fit it.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from ..fe.csr_ops import congruence_with_constraints
from ..mesh import reference as ref

__all__ = ["CellSubset", "needed_cells", "local_constrained_rows", "local_transfer_rows"]


class CellSubset:
    """A space restricted to the cells ``cells`` (global DoF numbering kept): what
    ``assemble`` is called on.  ``assemble(CellSubset(space, cells))`` equals
    ``assemble(space)`` in every row whose node touches only cells of ``cells``."""

    def __init__(self, space, cells):
        cells = np.asarray(cells, dtype=np.int64)
        m = space.mesh
        self.space = space
        self.cell_ids = cells
        self.mesh = SimpleNamespace(dim=m.dim, points=m.points, cells=m.cells[cells],
                                    num_cells=int(cells.size), num_nodes=m.num_nodes)
        self.dim = space.dim
        self.degree = space.degree
        self.components = space.components
        self.element = space.element
        self.cell_dofs = space.cell_dofs[cells]
        self.num_nodes = space.num_nodes
        self.num_dofs = space.num_dofs

    def __repr__(self):
        return f"CellSubset({self.cell_ids.size} of {self.space.mesh.num_cells} cells, dofs={self.num_dofs})"


def _hanging_with_parent_in(space, node_mask):
    """Nodes ``k`` (hanging) whose row of ``H_nodes`` has a column in ``node_mask``."""
    hn = space.hanging_nodes
    if not hn.size:
        return hn
    Hh = space.H_nodes[hn]
    rid = np.repeat(np.arange(hn.size), np.diff(Hh.indptr))
    hit = np.bincount(rid, weights=node_mask[Hh.indices], minlength=hn.size)
    return hn[hit > 0]


def needed_cells(space, node_mask):
    """Sorted cells touching a node of ``node_mask`` or a hanging node with a parent in it."""
    need = node_mask.copy()
    need[_hanging_with_parent_in(space, node_mask)] = True
    return np.flatnonzero(need[space.cell_dofs].any(axis=1))


def local_constrained_rows(space, assemble, free, owner, comm):
    r"""Owned rows of ``K = Z H^T A H Z + s (I - Z)`` from the needed cells only (module doc).

    Returns ``(K_o, HT_o, cells)``: ``K_o`` the owned rows (n_o x N, sorted columns),
    ``HT_o`` the owned rows of ``H^T`` (for the right-hand side ``Z H^T b``) and the
    assembled cell ids."""
    c = space.components
    rank = comm.Get_rank()
    rows = np.flatnonzero(owner == rank)
    node_own = np.zeros(space.num_nodes, dtype=bool)
    node_own[rows // c] = True
    cells = needed_cells(space, node_own)
    N = space.num_dofs
    # a rank owning no DoF of the level (a coarse level folded onto fewer ranks) needs no
    # cell; it still takes part in the Allreduce of s below
    A = assemble(CellSubset(space, cells)) if rows.size else sp.csr_matrix((N, N))
    if getattr(A, "shape", None) != (N, N):
        raise ValueError(f"assemble(view) must return a {N} x {N} matrix, got shape {getattr(A, 'shape', None)}")
    A = sp.csr_matrix(A)
    H = space.H
    if space.hanging_nodes.size:       # the library's congruence: only hanging rows/columns touched
        B = congruence_with_constraints(A, H, np.flatnonzero(space.is_hanging))[rows]
        HT_o = sp.csr_matrix(H.tocsc()[:, rows].T)
    else:
        B = A[rows]
        HT_o = sp.csr_matrix((np.ones(rows.size), (np.arange(rows.size), rows)), shape=(rows.size, N))
    B.sum_duplicates()                           # canonical: sorted, one entry per (row, column)
    rid = np.repeat(np.arange(rows.size), np.diff(B.indptr))
    on = B.indices == rows[rid]
    diag = np.zeros(rows.size)
    diag[rid[on]] = B.data[on]
    fo = free[rows]
    loc = np.array([np.abs(diag[fo]).sum(), float(fo.sum())])
    tot = np.empty(2)
    comm.Allreduce(loc, tot)
    s = float(tot[0] / tot[1]) if tot[1] > 0 and tot[0] > 0 else 1.0
    return _mask_owned(B, rid, fo, free, rows, s), HT_o, cells


def _mask_owned(B, rid, fo, free, rows, s):
    """Rows of ``Z B Z + s (I - Z)`` (``B`` canonical CSR, ``rid`` the row of each entry):
    the entries of free rows in free columns (zeros dropped), each non-free row replaced by
    ``s`` on its diagonal (CSR in, CSR out, sorted; as :func:`adaptmg.fe.csr_ops.mask_rows_cols`
    does for a square matrix: a non-free row keeps its one diagonal entry, set to ``s``, and
    only rows without one get an inserted entry)."""
    keep = fo[rid]
    keep &= free[B.indices]
    keep &= B.data != 0
    fixed = np.flatnonzero(~fo)
    lens = np.diff(B.indptr)[fixed]
    k = np.repeat(np.arange(fixed.size), lens)                       # entries of the fixed rows
    ent = np.arange(k.size) + np.repeat(B.indptr[fixed] - (np.cumsum(lens) - lens), lens)
    dpos = ent[B.indices[ent] == rows[fixed[k]]]                     # canonical: at most one per row
    has = np.zeros(fixed.size, dtype=bool)
    has[k[B.indices[ent] == rows[fixed[k]]]] = True
    keep[dpos] = True
    csum = np.zeros(keep.size + 1, dtype=np.int64)
    np.cumsum(keep, out=csum[1:])
    indptr = csum[B.indptr]
    data = B.data[keep]
    ind = B.indices[keep].astype(np.int64)
    data[csum[dpos]] = s
    missing = fixed[~has]
    if missing.size:                             # rows with no stored diagonal: insert one
        at = indptr[missing]
        data = np.insert(data, at, s)
        ind = np.insert(ind, at, rows[missing])
        shift = np.zeros(indptr.size, dtype=np.int64)
        shift[missing + 1] = 1
        indptr = indptr + np.cumsum(shift)
    return sp.csr_matrix((data, ind, indptr), shape=(rows.size, B.shape[1]))


def _chi_rows(coarse, fine, nodes, cells, parent):
    """Rows ``nodes`` (sorted fine nodes) of the node embedding chi, each from the first of
    ``cells`` (fine cells) containing it (see :func:`adaptmg.multilevel.transfer.interpolation_matrix`)."""
    cidx, child = parent
    el = fine.element
    d, nloc = fine.dim, el.num_local
    cor = ref.corners(d).astype(float)
    W = np.stack([el.values((cor[b] + el.nodes) / 2.0) for b in range(2 ** d)] + [np.eye(nloc)])
    W[np.abs(W) < 1e-13] = 0.0                                   # (2^d + 1, nloc, nloc)
    cd = fine.cell_dofs[cells].ravel()
    first = np.full(fine.num_nodes, -1, dtype=np.int64)
    first[cd[::-1]] = np.arange(cd.size - 1, -1, -1)
    f = first[nodes]
    if (f < 0).any():
        raise RuntimeError("local transfer: a fine node lies in none of the rank's cells")
    cell = cells[f // nloc]
    sel = np.where(child[cell] < 0, 2 ** d, child[cell])
    w = W[sel, f % nloc]                                         # (n, nloc) weights
    cols = coarse.cell_dofs[cidx[cell]]                          # (n, nloc) coarse nodes
    nz = w != 0
    r = np.repeat(np.arange(nodes.size), nz.sum(1))
    M = sp.csr_matrix((w[nz], (r, cols[nz])), shape=(nodes.size, coarse.num_nodes))
    M.sum_duplicates()
    return M


def _p_rows(coarse, fine, nodes, cells, parent, free_c, free_f):
    """Rows (fine DoFs of ``nodes``) of P = Z_f (chi kron I_c) H_c Z_c."""
    c = fine.components
    chi = _chi_rows(coarse, fine, nodes, cells, parent)
    if c > 1:
        chi = sp.kron(chi, sp.identity(c), format="csr")
    P = (chi @ coarse.H).tocsr() if coarse.hanging_nodes.size else chi
    dofs = (nodes[:, None] * c + np.arange(c)).ravel()
    P = P.tocoo()
    keep = free_f[dofs[P.row]] & free_c[P.col] & (P.data != 0)
    P = sp.csr_matrix((P.data[keep], (P.row[keep], P.col[keep])), shape=P.shape)
    P.sort_indices()
    return P, dofs


def local_transfer_rows(coarse, fine, free_c, free_f, owner_c, owner_f, rank):
    """Owned rows of P (fine owned x coarse, global columns) and of R = P^T (coarse owned x
    fine, global columns), built from the rank's fine cells only (module doc).

    Returns ``(P_o, R_o, nfine_cells)``: the two blocks and how many fine cells were used."""
    c = fine.components
    parent = fine.mesh.parent_of(coarse.mesh)
    cidx = parent[0]
    # P rows: owned fine nodes (each in an owned fine cell); R rows: the fine nodes of the coarse
    # cells around owned coarse nodes (and coarse hanging nodes with an owned parent)
    fown = np.zeros(fine.num_nodes, dtype=bool)
    fown[np.flatnonzero(owner_f == rank) // c] = True
    fcells = np.flatnonzero(fown[fine.cell_dofs].any(axis=1))
    cown = np.zeros(coarse.num_nodes, dtype=bool)
    crow = np.flatnonzero(owner_c == rank)
    cown[crow // c] = True
    cmask = np.zeros(coarse.mesh.num_cells, dtype=bool)
    cmask[needed_cells(coarse, cown)] = True
    rcells = np.flatnonzero(cmask[cidx])
    nmask = fown.copy()
    nmask[fine.cell_dofs[rcells]] = True
    used = np.zeros(fine.mesh.num_cells, dtype=bool)
    used[fcells] = True
    used[rcells] = True
    cells = np.flatnonzero(used)
    P_all, dofs = _p_rows(coarse, fine, np.flatnonzero(nmask), cells, parent, free_c, free_f)
    P_o = P_all[np.flatnonzero(owner_f[dofs] == rank)]
    Rt = sp.csr_matrix(P_all.T)[crow].tocoo()                    # owned coarse rows, local fine columns
    R_o = sp.csr_matrix((Rt.data, (Rt.row, dofs[Rt.col])), shape=(crow.size, fine.num_dofs))
    R_o.sort_indices()
    return P_o, R_o, int(cells.size)
