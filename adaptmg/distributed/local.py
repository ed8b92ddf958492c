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
matrix whose rows in ``S`` are exact.  Then

.. math::  B_o = (Z H^T)_{o,:}\, A\, (H Z)

by two sparse products whose factors carry the free masks (:func:`constraint_blocks`,
built from the hanging rows of ``H`` only, O(rank) entries), so ``B_o`` holds exactly the
free x free entries; ``s`` = mean of ``|B_ii|`` over the free DoFs (one ``Allreduce`` of a
sum and a count), and the owned rows of ``K`` are ``B_o`` (zeros dropped) plus ``s`` on
the diagonal of the non-free rows.  All of it through the backend's ``xp`` and sparse
module: on the GPU the view is assembled on the device (``device=, keep_on_device=True``)
and constrained there: the owned rows straight from ``A``, ``H`` and the owned rows of
``Z H^T`` by the row kernels of :mod:`adaptmg.device.congruence_rows` where the rows fit
their slots (2-D, 3-D scalar Q1), else by the one device congruence of
:mod:`adaptmg.fe.congruence` (:func:`~adaptmg.fe.congruence.congruence_on_device`:
cuSPARSE's products where they fit, else the expansion of the hanging entries, which needs
no SpGEMM), owned rows and free columns selected after it.

Transfer.  ``P = Z_f (\chi \otimes I_c) H_c Z_c`` (:mod:`adaptmg.multilevel.transfer`):
a row of ``\chi`` (fine node ``f``) is the coarse cell polynomial of any fine cell
containing ``f`` evaluated at ``f``, so the owned rows need the owned fine cells only
(:func:`~adaptmg.multilevel.transfer.prolongation` with ``nodes=, cells=``).
``R = P^T``: the owned (coarse) rows of R need the rows ``f`` of P with ``P_{fc} \ne 0``
for an owned coarse DoF ``c``; these fine nodes lie in the coarse cells touching the
coarse nodes ``{c owned} U {coarse hanging j with parent c}``, so the rank builds the
rows of P of the fine cells inside those coarse cells and transposes.  A rank that owns a
large share of a scalar Q1 level (:data:`WHOLE_P_SHARE`: few ranks, or a folded coarse
level) instead selects its rows from the whole ``P`` of the serial hierarchy's one-pass
forest path, which costs a third per row of the per-cell path (the same arrays).

A rank that owns no DoF of the level (a coarse level folded onto fewer ranks,
:func:`~.partition.level_ranks`) assembles nothing and gets empty row blocks; it still
joins the one ``Allreduce``.

The mesh (and the hanging-node matrices H, built from it) stay replicated on every
rank; what scales is the assembly, the Galerkin-free congruence and the transfer rows.

A mesh on the GPU (``space.mesh.backend``): the same functions run on its device arrays
through ``xp`` -- the owned rows and nodes, the needed cells, the cell-subset view (whose
``mesh.backend`` makes the library's forms assemble on the device), ``Z H^T``'s owned rows
(a device COO of the hanging rows of ``H``), the congruence and the Dirichlet rows -- and
the transfer rows come from ``P`` built on the device by
:func:`~adaptmg.multilevel.transfer.prolongation` with the rows this rank does not need
masked out (their nodes as above, :func:`_transfer_nodes`), and from its device transpose.
Nothing of
O(cells) comes to the host; the results equal the host mesh's (integers exactly, floats to
round-off: ``tests/distributed/test_device_mesh_rows.py``).

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

from ..backend import CPU, csr_from_arrays, get_backend, is_device_sparse, repeat
from ..device.congruence_rows import (available as rows_available, constrained_congruence, constrained_split_rows,
                                      fits as rows_fit)
from ..device.deferred import deferred_checks
from ..device.index_kernels import constrained_rows
from ..fe.csr_ops import congruence_with_constraints, row_positions
from ..mesh._touch import cells_with_vertex_in
from ..multilevel.hierarchy import _on_backend
from ..multilevel.transfer import prolongation
from .csr import SplitRows, split_rows

__all__ = ["CellSubset", "needed_cells", "local_constrained_rows", "local_transfer_rows", "unit_rows_csr"]


class CellSubset:
    """A space restricted to the cells ``cells`` (global DoF numbering kept): what
    ``assemble`` is called on.  ``assemble(CellSubset(space, cells))`` equals
    ``assemble(space)`` in every row whose node touches only cells of ``cells``."""

    def __init__(self, space, cells):
        m = space.mesh
        xp = m.backend.xp
        cells = xp.asarray(cells).astype(np.int64, copy=False)
        self.space = space
        self.cell_ids = cells
        # row gathers by take (Q1: the DoF table is the mesh's cell table, gathered once)
        self.cell_dofs = xp.take(space.cell_dofs, cells, axis=0)
        mc = self.cell_dofs if space.cell_dofs is m.cells else xp.take(m.cells, cells, axis=0)
        self.mesh = SimpleNamespace(dim=m.dim, points=m.points, cells=mc, backend=m.backend,
                                    num_cells=int(cells.size), num_nodes=m.num_nodes)
        self.dim = space.dim
        self.degree = space.degree
        self.components = space.components
        self.element = space.element
        self.num_nodes = space.num_nodes
        self.num_dofs = space.num_dofs

    def __repr__(self):
        return f"CellSubset({self.cell_ids.size} of {self.space.mesh.num_cells} cells, dofs={self.num_dofs})"


def _hanging_with_parent_in(space, node_mask):
    """Nodes ``k`` (hanging) whose row of ``H_nodes`` has a column in ``node_mask``."""
    hn = space.hanging_nodes
    if not hn.size:
        return hn
    xp = space.mesh.backend.xp
    Hh = space.H_nodes[hn]
    rid = repeat(xp.arange(hn.size), xp.diff(Hh.indptr), total=Hh.indices.size, xp=xp)
    hit = xp.bincount(rid, weights=node_mask[Hh.indices].astype(float), minlength=hn.size)
    return hn[hit > 0]


def needed_cells(space, node_mask):
    """Sorted cells touching a node of ``node_mask`` or a hanging node with a parent in it."""
    need = node_mask.copy()
    need[_hanging_with_parent_in(space, node_mask)] = True
    return cells_with_vertex_in(space.cell_dofs, need)


def _hanging_rows_coo(space, dofs):
    """(row, column, value) of the rows ``dofs`` (sorted hanging DoFs) of ``H`` (on the mesh's
    backend)."""
    xp = space.mesh.backend.xp
    if not dofs.size:
        z = xp.zeros(0, dtype=np.int64)
        return z, z, xp.zeros(0)
    H = space.H if xp is not np else sp.csr_matrix(space.H)
    Hh = H[dofs].tocoo()
    return dofs[Hh.row], Hh.col.astype(np.int64), Hh.data


def unit_rows_csr(be, shape, ur, uc, hr, hc, hv):
    r"""Canonical CSR (on ``be``) of the unit entries ``(ur, uc)`` (at most one a row) plus the
    entries ``(hr, hc, hv)`` (distinct positions, none on a unit entry): the shape of
    :math:`(Z H^T)_{o,:}`, whose row ``i`` is ``e_i`` (a free regular DoF) and the weights
    :math:`H_{ki}` of the hanging ``k`` with parent ``i``, and of the local rows of
    :math:`HZ` (:func:`hz_rows_coo`; :class:`~.matrix_free.DistMatrixFree`).

    Written into place: only the few non-unit entries are sorted (by the keys
    ``row * N + column``) and each row's unit entry goes between its smaller and larger
    columns -- not a COO conversion, which sorts every entry (twice on the device, cupyx's
    ``sum_duplicates`` and ``coosort``: :func:`constraint_blocks` 16 -> 13 ms over the three
    local levels of 19M DoFs per H200).  Repeated positions (an ``H`` with duplicate entries)
    take that conversion, which sums them."""
    xp = be.xp
    n, N = shape
    it = np.int32 if max(N, n, ur.size + hr.size) < np.iinfo(np.int32).max else np.int64
    key = hr.astype(np.int64) * N + hc
    order = xp.argsort(key)
    key, hr, hc, hv = key[order], hr[order], hc[order], hv[order]
    if key.size > 1 and bool((key[1:] == key[:-1]).any()):
        M = be.sparse.coo_matrix((xp.concatenate([xp.ones(ur.size), hv]),
                                  (xp.concatenate([ur, hr]), xp.concatenate([uc, hc]))), shape=shape).tocsr()
        M.sum_duplicates()
        return M
    ucol = xp.full(n, -1, dtype=np.int64)
    ucol[ur] = uc
    cnt = xp.bincount(hr, minlength=n) + (ucol >= 0)
    indptr = xp.zeros(n + 1, dtype=np.int64)
    xp.cumsum(cnt, out=indptr[1:])
    first = xp.searchsorted(hr, xp.arange(n))            # each row's first non-unit entry
    # a unit entry after the row's smaller columns; a non-unit one after its row's smaller
    # non-unit entries and, if larger, the unit entry
    upos = indptr[ur] + (xp.searchsorted(key, ur.astype(np.int64) * N + uc) - first[ur])
    uh = ucol[hr]
    hpos = indptr[hr] + (xp.arange(hr.size) - first[hr]) + ((uh >= 0) & (uh < hc))
    nnz = ur.size + hr.size
    indices = xp.empty(nnz, dtype=it)
    data = xp.empty(nnz)
    indices[upos] = uc
    data[upos] = 1.0
    indices[hpos] = hc
    data[hpos] = hv
    M = csr_from_arrays(be.sparse, data, indices, indptr.astype(it), shape)
    M.has_canonical_format = True
    return M


def constraint_blocks(space, rows, dofs, free):
    r"""Host CSR blocks of :math:`HZ` (``Z`` the 0/1 diagonal of the free DoFs ``free``) for
    the owned rows ``rows`` (sorted DoFs):

    * ``HZT_o`` (n_o x N): rows ``rows`` of :math:`(HZ)^T = Z H^T` -- the unit entry of a free
      regular DoF ``i`` and the weights :math:`H_{ki}` of the hanging DoFs ``k`` with parent
      ``i`` (rows of non-free DoFs are empty);
    * ``HZ`` (N x N): the rows ``dofs`` (sorted, the DoFs of the assembled cells: every
      column of :math:`Z H^T A` lies among them) of :math:`HZ` -- the unit entry of a free
      regular DoF, the free parents of a hanging one; the other rows are empty.

    Only the hanging rows of ``H`` are read (a regular DoF's row of H is its unit row): no
    O(N) transpose or product of the global H.  On a mesh on the GPU (``dofs`` None) only
    ``HZT_o``, built there (``HZ`` None: the device congruence needs it not)."""
    be = space.mesh.backend
    xp = be.xp
    N, n = space.num_dofs, rows.size
    hang = space.is_hanging
    reg = rows[~hang[rows] & free[rows]]
    local = xp.full(N, -1, dtype=np.int64)
    local[rows] = xp.arange(n)
    hk, hp, hw = _hanging_rows_coo(space, xp.flatnonzero(hang))
    m = xp.flatnonzero((local[hp] >= 0) & free[hp])     # hanging k with an owned free parent
    HZT_o = unit_rows_csr(be, (n, N), local[reg], reg, local[hp[m]], hk[m], hw[m])
    if dofs is None:
        return HZT_o, None
    r, c, v, nu = hz_rows_coo(space, dofs, free)
    HZ = unit_rows_csr(CPU, (N, N), r[:nu], c[:nu], r[nu:], c[nu:], v[nu:])
    return HZT_o, HZ


def hz_rows_coo(space, dofs, free):
    """``(row, column, value, nunit)`` of the rows ``dofs`` (sorted DoFs, the mesh's array
    module) of :math:`HZ` in global DoF numbers: a free regular DoF's unit entry, a hanging
    DoF's free parents with their weights (a Dirichlet DoF's row is empty); the ``nunit``
    unit entries first (the form :func:`unit_rows_csr` takes)."""
    xp = space.mesh.backend.xp
    hang = space.is_hanging
    reg = dofs[~hang[dofs] & free[dofs]]
    hk, hp, hw = _hanging_rows_coo(space, dofs[hang[dofs]])
    keep = free[hp]
    return (xp.concatenate([reg, hk[keep]]), xp.concatenate([reg, hp[keep]]),
            xp.concatenate([xp.ones(reg.size), hw[keep]]), int(reg.size))


def local_constrained_rows(space, assemble, free, owner, comm, backend=CPU, rhs_rows=True, local=None,
                           aside=None, beside=None):
    r"""Owned rows of ``K = Z H^T A H Z + s (I - Z)`` from the needed cells only (module doc).

    :math:`B_o = (Z H^T)_{o,:} A (H Z)` by two sparse products (:func:`constraint_blocks`:
    the free-column masks are in the factors, so ``B_o`` holds only the free x free entries),
    explicit zeros dropped, ``s`` the mean of :math:`|B_{ii}|` over the free DoFs of all ranks
    (the diagonal found by a binary search per row), plus ``s`` on the diagonal of the
    owned non-free rows (one sparse sum).

    ``backend``: where the rows are built -- the same code through ``xp``.  On the GPU
    ``assemble`` is called as :func:`adaptmg.multigrid` calls it there
    (:func:`~adaptmg.multilevel.hierarchy._on_backend`: ``device=, keep_on_device=True``
    when it takes them) and constrained there: with hanging nodes whose rows fit them
    (:func:`adaptmg.device.congruence_rows.fits`: 2-D, 3-D scalar Q1) the owned rows of
    :math:`Z H^T A H Z + s (I - Z)` straight from ``A``, ``H`` and the owned rows of
    :math:`Z H^T` by the two row kernels of
    :func:`~adaptmg.device.congruence_rows.constrained_congruence` (no :math:`H^T A H` of the
    whole local matrix); otherwise :math:`H^T A H` (:func:`_device_projected`), then its owned
    rows by one count and one fill kernel (:func:`adaptmg.device.index_kernels.constrained_rows`).
    Either way two numbers (for ``s``) cross between the count and the fill, then the
    ``Allreduce``.  On the host the products of the two constraint blocks.

    ``local``: the local index of every column (the level layout's ``local_on(xp)``, -1 for
    another rank's column), or None.  Given (int32: fewer than 2^31 columns), the row kernels
    write ``K_o`` split already into the owned and the ghost columns, a
    :class:`~.csr.SplitRows` for :class:`~.csr.DistCSR`
    (:func:`adaptmg.device.congruence_rows.constrained_split_rows`: no second pass over the
    rows to split them -- two H200, 21M DoFs a rank: the finest level's split, 11 ms, gone);
    the other paths ignore it.

    ``aside``: a :class:`~adaptmg.device.priority.PriorityStream` (a device mesh): the
    assembly is queued first, its det J check deferred
    (:func:`adaptmg.device.deferred.deferred_checks`: no host wait for its element kernels),
    and the constraint blocks are built on the priority stream while its kernels run (they
    read nothing the assembly makes).  ``beside``: a callable (no arguments) of more such
    work, run after the constraint blocks -- on the priority stream with them where
    ``aside`` applies, else on the current stream before the assembly; on every rank
    before the ``Allreduce`` of ``s`` (it may hold collectives of its own).

    Returns ``(K_o, HZT_o, cells)``: ``K_o`` the owned rows (n_o x N, sorted columns) on
    ``backend`` (host CSR for a rank without rows; :class:`~.csr.SplitRows` with ``local``
    where the row kernels ran), ``HZT_o`` the owned rows of ``Z H^T``
    (``HZT_o @ b`` is the owned part of ``Z H^T b``; None on a device mesh with
    ``rhs_rows=False``: a level that takes no right-hand side) and the assembled cell ids --
    both on the mesh's backend (host arrays for a host mesh)."""
    be = get_backend(backend)
    on_dev = space.mesh.backend.is_gpu               # a device mesh: everything on its arrays
    if on_dev and not be.is_gpu:
        raise ValueError("local_constrained_rows: the space's mesh lives on the GPU; pass "
                         "backend='gpu' or use a space on mesh.to('cpu')")
    xp = space.mesh.backend.xp
    rank = comm.Get_rank()
    c = space.components
    owner, free = xp.asarray(owner), xp.asarray(free)
    rows = xp.flatnonzero(owner == rank)
    node_own = xp.zeros(space.num_nodes, dtype=bool)
    node_own[rows // c] = True
    cells = needed_cells(space, node_own)
    view = CellSubset(space, cells)
    N = space.num_dofs
    dofs = None
    if not on_dev:                                   # the DoFs of the assembled cells (host products)
        mark = np.zeros(space.num_nodes, dtype=bool)
        mark[view.cell_dofs] = True
        nodes = np.flatnonzero(mark)
        dofs = (nodes[:, None] * c + np.arange(c)).ravel()
    # on a device mesh with hanging nodes whose rows fit them, the owned rows of K by the row
    # kernels, which read the owned rows of H^T (HZT_o)
    kernels = (on_dev and be.is_gpu and rows.size > 0 and rows_fit(space)
               and space.hanging_nodes.shape[0] > 0 and is_device_sparse(space.H))
    blocks = rhs_rows or not on_dev or kernels
    A = None
    if aside is not None and on_dev and rows.size and blocks:
        mark = aside.mark()                          # the cells, the view and H are made
        with deferred_checks():                      # det J read at the end: no wait here
            A = _on_backend(assemble, be)(view)      # its kernels queued
            with aside.after(mark):                  # the blocks (and beside) meanwhile
                HZT_o, HZ = constraint_blocks(space, rows, dofs, free)
                if beside is not None:
                    beside()
    else:
        HZT_o, HZ = constraint_blocks(space, rows, dofs, free) if blocks else (None, None)
        if beside is not None:
            beside()
    HZT_ret = HZT_o if (rhs_rows or not on_dev) else None
    if not rows.size:
        # a rank owning no DoF of the level (a coarse level folded onto fewer ranks) needs no
        # cell; it still takes part in the Allreduce of s
        _row_scale(comm, 0.0, 0)
        return sp.csr_matrix((0, N)), HZT_ret, cells
    if A is None:
        A = _on_backend(assemble, be)(view)
    if getattr(A, "shape", None) != (N, N):
        raise ValueError(f"assemble(view) must return a {N} x {N} matrix, got shape {getattr(A, 'shape', None)}")
    # products on ``be`` -- on the host when a factor is empty (every owned row or every
    # column non-free: no device product of an empty matrix), the result moved there
    wb = be if on_dev or (HZT_o.nnz and HZ.nnz) else CPU
    if wb.is_gpu:                                # no cuSPARSE SpGEMM of the level's matrix
        A = wb.asmatrix(A)
        scale = lambda d, m: _row_scale(comm, d, m)           # noqa: E731
        rows_d, free_d = wb.asarray(rows), wb.asarray(free)
        if kernels and rows_available(A, space.H, HZT_o, rows_d):
            if local is not None and local.dtype == np.int32:
                parts, _ = constrained_split_rows(A, space.H, HZT_o, free_d, wb.asarray(local), rows=rows_d,
                                                  scale=scale)
                return SplitRows(parts, (rows.size, N)), HZT_ret, cells
            K_o, _ = constrained_congruence(A, space.H, HZT_o, free_d, rows=rows_d, scale=scale)
        else:
            K_o, _ = constrained_rows(_device_projected(space, A), rows_d, free_d, scale)
        return be.asmatrix(K_o), HZT_ret, cells
    B = ((HZT_o @ sp.csr_matrix(A)) @ HZ).tocsr()
    B.sum_duplicates()
    B = _drop_zeros(wb, B)
    fo = free[rows]
    xw = wb.xp
    d = 0.0
    if B.nnz:
        pos = row_positions(xw, B.indptr, B.indices, xw.asarray(rows))
        d = float((xw.abs(B.data[xw.maximum(pos, 0)]) * ((pos >= 0) & xw.asarray(fo))).sum())
    s = _row_scale(comm, d, int(fo.sum()))
    fixed = xp.flatnonzero(~fo)
    if fixed.size:                               # s on the (empty) non-free rows' diagonal
        S = space.mesh.backend.sparse.coo_matrix((xp.full(fixed.size, s), (fixed, rows[fixed])),
                                                 shape=B.shape).tocsr()
        B = (B + wb.asmatrix(S)).tocsr()
        B.sort_indices()
    return be.asmatrix(B), HZT_ret, cells


def _device_projected(space, A):
    r""":math:`H^T A H` of a device ``A``, canonical: the congruence of the whole local matrix on
    the device (:func:`adaptmg.fe.csr_ops.congruence_with_constraints`, which falls back from
    cuSPARSE's products to the expansion of the hanging entries where cuSPARSE refuses them --
    it does for :func:`constraint_blocks`' factors at millions of rows); the owned rows of
    :math:`Z H^T A H Z + s (I - Z)` are then one count and one fill kernel
    (:func:`adaptmg.device.index_kernels.constrained_rows`)."""
    hanging = space.mesh.backend.xp.flatnonzero(space.is_hanging)
    B = congruence_with_constraints(A, space.H, hanging) if hanging.size else A.tocsr()
    B.sum_duplicates()
    return B


def _drop_zeros(be, B):
    """``B`` (canonical CSR on ``be``) without its explicit zeros (``B`` itself when it has
    none), compressed explicitly (see :func:`adaptmg.fe.csr_ops._mask_device` for why not
    ``eliminate_zeros``)."""
    xp = be.xp
    nz = B.data != 0
    if bool(nz.all()):
        return B
    before = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(nz, dtype=xp.int64)])
    out = csr_from_arrays(be.sparse, B.data[nz], B.indices[nz], before[B.indptr].astype(B.indptr.dtype), B.shape)
    out.has_canonical_format = True
    return out


def _row_scale(comm, absdiag_sum, count):
    """The Dirichlet row scale ``s``: the mean of ``|B_ii|`` over the free DoFs of all ranks
    (one ``Allreduce`` of the local sum and count; 1 when there is none)."""
    tot = np.empty(2)
    comm.Allreduce(np.array([float(absdiag_sum), float(count)]), tot)
    return float(tot[0] / tot[1]) if tot[1] > 0 and tot[0] > 0 else 1.0


#: a rank owning at least this share of a level's DoFs builds all rows of P by the serial
#: hierarchy's one-pass Q1 forest path and selects its rows: measured 1.1 s for all 4.8M
#: rows against 2.4 s for half of them from the rank's cells (the general per-cell path)
WHOLE_P_SHARE = 0.25


def local_transfer_rows(coarse, fine, free_c, free_f, owner_c, owner_f, rank, whole=None, split=None):
    """Owned rows of P (fine owned x coarse, global columns) and of R = P^T (coarse owned x
    fine, global columns), built from the rank's fine cells only (module doc) -- or, for a
    scalar Q1 space where the rank owns at least :data:`WHOLE_P_SHARE` of the fine DoFs
    (``whole`` None; True / False force it), selected from the whole P of
    :func:`~adaptmg.multilevel.transfer.prolongation`'s forest path (the same rows, entry
    for entry, in a third of the time per row).

    Spaces on a mesh on the GPU: ``P`` built on the device by
    :func:`~adaptmg.multilevel.transfer.prolongation`'s device paths (any degree and
    components), its owned rows and those of its transpose selected there -- the whole ``P``
    where the rank owns at least :data:`WHOLE_P_SHARE` of the fine DoFs (``whole`` None; finding
    the rows it needs costs more than building the others), else with every fine row this
    rank does not need masked out (the fine free mask restricted to the nodes of
    :func:`_transfer_nodes`: rows are independent, so the kept ones equal the whole ``P``'s;
    ``whole`` True / False force either).

    ``split``: ``(coarse layout, fine layout)``, the column layouts of ``P`` and ``R``: the
    blocks come as :class:`~.csr.SplitRows` for them (:func:`~.csr.split_rows`; on the device
    the owned rows read in place from ``P`` and its transpose, no copy of them first).

    Returns ``(P_o, R_o, nfine_cells)``: the two blocks and how many fine cells were used."""
    if split is not None:
        P_o, R_o, cells = _transfer_rows(coarse, fine, free_c, free_f, owner_c, owner_f, rank, whole, True)
        if isinstance(P_o, tuple):                      # (the whole matrix, its rows)
            return split_rows(P_o[0], split[0], P_o[1]), split_rows(R_o[0], split[1], R_o[1]), cells
        return split_rows(P_o, split[0]), split_rows(R_o, split[1]), cells
    return _transfer_rows(coarse, fine, free_c, free_f, owner_c, owner_f, rank, whole, False)


def _transfer_rows(coarse, fine, free_c, free_f, owner_c, owner_f, rank, whole, lazy):
    """:func:`local_transfer_rows`; ``lazy``: on the device ``(matrix, rows)`` pairs instead
    of the rows taken out of the matrices."""
    c = fine.components
    if fine.mesh.backend.is_gpu:
        be = fine.mesh.backend
        xp = be.xp
        frow = xp.flatnonzero(xp.asarray(owner_f) == rank)
        crow = xp.flatnonzero(xp.asarray(owner_c) == rank)
        zf = xp.asarray(free_f)
        if whole is None:
            whole = frow.size >= WHOLE_P_SHARE * fine.num_dofs
        if not whole:
            # only the rows this rank needs (the others masked out of Z_f: no entries): the
            # owned fine DoFs and the fine DoFs of R's rows (module doc), as the host path
            zf = zf & xp.repeat(_transfer_nodes(coarse, fine, frow, crow)[0], c)
        P = prolongation(coarse, fine, xp.asarray(free_c), zf)

        def rows_of(M, idx):                  # (a rank without rows: an empty host block)
            if lazy:
                return M, idx
            return be.asmatrix(M[idx]) if idx.size else sp.csr_matrix((0, M.shape[1]))
        return rows_of(P, frow), rows_of(P.T.tocsr(), crow), fine.mesh.num_cells
    frow = np.flatnonzero(owner_f == rank)
    crow = np.flatnonzero(owner_c == rank)
    if whole is None:
        whole = fine.degree == 1 and c == 1 and frow.size >= WHOLE_P_SHARE * fine.num_dofs
    if whole:
        P = prolongation(coarse, fine, free_c, free_f)
        return P[frow], _transposed_rows(P, crow, None, fine.num_dofs), fine.mesh.num_cells
    nmask, fown, rcells = _transfer_nodes(coarse, fine, frow, crow)
    fcells = cells_with_vertex_in(fine.cell_dofs, fown)
    used = np.zeros(fine.mesh.num_cells, dtype=bool)
    used[fcells] = True
    used[rcells] = True
    cells = np.flatnonzero(used)
    nodes = np.flatnonzero(nmask)
    dofs = (nodes[:, None] * c + np.arange(c)).ravel()
    P_all = prolongation(coarse, fine, free_c, free_f, nodes=nodes, cells=cells)
    P_o = P_all[np.flatnonzero(owner_f[dofs] == rank)]
    return P_o, _transposed_rows(P_all, crow, dofs, fine.num_dofs), int(cells.size)


def _transfer_nodes(coarse, fine, frow, crow):
    """The fine nodes whose rows of P a rank needs (a mask), on the mesh's backend: P's rows
    are its owned fine nodes ``frow // c`` (the second mask); R's rows (owned coarse DoFs
    ``crow``) need the fine nodes of the coarse cells around the owned coarse nodes and the
    coarse hanging nodes with an owned parent (the fine cells inside them: the third result)."""
    xp, c = fine.mesh.backend.xp, fine.components
    cidx = fine.mesh.parent_of(coarse.mesh)[0]
    fown = xp.zeros(fine.num_nodes, dtype=bool)
    fown[frow // c] = True
    cown = xp.zeros(coarse.num_nodes, dtype=bool)
    cown[crow // c] = True
    cmask = xp.zeros(coarse.mesh.num_cells, dtype=bool)
    cmask[needed_cells(coarse, cown)] = True
    rcells = xp.flatnonzero(cmask[cidx])
    nmask = fown.copy()
    for j in range(fine.cell_dofs.shape[1]):       # a vertex column at a time: no (cells, 2^d) gather
        nmask[xp.take(fine.cell_dofs[:, j], rcells)] = True
    return nmask, fown, rcells


def _transposed_rows(P, rows, cols, ncols):
    """Rows ``rows`` of ``P^T`` as canonical CSR of shape (rows.size, ncols) whose column ``j``
    is ``cols[j]`` (increasing, so every row stays sorted; None: column ``j`` itself)."""
    T = sp.csr_matrix(P.T)[rows]                  # CSC -> CSR by counting: sorted rows
    ind = T.indices if cols is None else cols[T.indices]
    it = np.int32 if max(ncols, T.nnz) < np.iinfo(np.int32).max else np.int64
    R = sp.csr_matrix((T.data, ind.astype(it), T.indptr.astype(it)), shape=(rows.size, ncols))
    R.has_sorted_indices = True
    return R
