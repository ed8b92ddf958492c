r"""Partition of an adaptive mesh along a space-filling curve, and DoF ownership.

Cell order (the p4est way).  Every active cell is a leaf of the refinement forest: a
root cell of the coarse mesh plus a refinement path (child indices ``c_1 .. c_k``).
Children are numbered lexicographically, child ``c`` having the bits
``(x, y, z) = (c & 1, c >> 1 & 1, c >> 2 & 1)``, which is exactly the Morton digit of
the child in its parent.  Root cells are ordered by the Morton (Z-order) code of their
centroids (quantised to 2^21 steps of one size for every axis: the bounding box's longest
side over 2^21, so the order follows the domain's shape).  The curve
order of the active cells is the lexicographic order of ``(root key, c_1, c_2, ...)``:
a depth-first traversal of the forest along the Z-curve, computed with one
``np.lexsort`` (no Python loop over cells; one pass per refinement level).

Cut.  With weights ``w`` (default 1 per cell) the cell at curve position ``i`` goes to
rank ``floor(P * W_i / W)``, ``W_i`` the weight before it: ``P`` contiguous ranges of
equal weight, so with unit weights every rank holds ``floor(n/P)`` or ``ceil(n/P)``
cells.

Coarser levels of the global-coarsening hierarchy are not cut again: a coarse cell
lives on the rank that holds most of its children (ties: the lowest rank), so
prolongation and restriction are mostly rank-local.

Folding (:func:`fold_cell_ranks`).  A coarse level that is to live on ``P_l < P`` ranks
(see :func:`level_ranks`) keeps this voted partition but folds it onto ranks
``0 .. P_l - 1``: its ``n_l`` cells are sorted by (voted rank, curve position) and the
cell at position ``i`` goes to rank ``floor(P_l i / n_l)``.  The ranks' cell ranges stay
contiguous along the curve, each new rank gets ``floor(n_l / P_l)`` or ``ceil(n_l / P_l)``
cells, and where ``P_l`` divides ``P`` and the voted partition is balanced this is the
plain fold ``r -> floor(r P_l / P)`` (old ranks ``k P / P_l .. (k + 1) P / P_l - 1`` merge
into rank ``k``).

DoF ownership.  A DoF node belongs to the lowest rank among the cells that have it in
their ``cell_dofs`` (for a hanging node: the fine cells it is a vertex of); all
components of a node share its owner.

A mesh on the GPU (``mesh.backend``): every function here runs on its device arrays through
the backend's ``xp`` (the curve keys, the votes, the fold, the owners by a scatter-min) and
returns device arrays -- the same integers as on the host mesh.  Only the walk fallback of
:func:`curve_order` (keys beyond 63 bits) runs on a host copy of the mesh.
"""
from __future__ import annotations

import numpy as np

from ..backend import in_host_memory, stable_argsort
from ..device.curve_keys import walk_keys
from ..device.cell_kernels import majority_ranks, scatter_cells

__all__ = ["curve_order", "partition_cells", "coarse_cell_ranks", "dof_owners", "imbalance",
           "level_ranks", "fold_cell_ranks", "level_ownership"]

_BITS = {2: 31, 3: 21}


#: the bit-spreading steps of :func:`_morton` per dimension: (shift, mask) pairs that move
#: bit ``b`` of a coordinate to bit ``d b`` (the classic "part by 1 / by 2" sequences)
_SPREAD = {2: ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
               (2, 0x3333333333333333), (1, 0x5555555555555555)),
           3: ((32, 0x001F00000000FFFF), (16, 0x001F0000FF0000FF), (8, 0x100F00F00F00F00F),
               (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249))}


def _xp(a):
    """The array module of ``a`` (NumPy or CuPy, :mod:`adaptmg.backend` tells)."""
    from ..backend import backend_of
    return backend_of(a).xp


def _morton(q: np.ndarray) -> np.ndarray:
    """Interleave the bits of quantised coordinates q (n, d) (x lowest) into uint64 keys:
    bit ``b`` of axis ``a`` goes to bit ``d b + a`` (the low ``_BITS[d]`` bits of each axis)."""
    n, d = q.shape
    xp = _xp(q)
    key = xp.zeros(n, dtype=np.uint64)
    for a in range(d):
        x = q[:, a].astype(np.uint64) & np.uint64((1 << _BITS[d]) - 1)
        for shift, mask in _SPREAD[d]:
            x = (x | (x << np.uint64(shift))) & np.uint64(mask)
        key |= x << np.uint64(a)
    return key


def _root_ranks(F, roots: np.ndarray) -> np.ndarray:
    """Rank of each root cell (sorted forest ids ``roots``) in the Morton order of the root
    centroids, ties by root id.  The centroids are quantised with one scale for every axis
    (the bounding box's longest side), so the curve's first cuts cross the domain's long
    axis: the roots of a 4 x 2 x 2 box in halves x < 2 and x >= 2, as the Morton order of
    their integer positions (p4est's brick).  Scaled per axis, each side mapped onto the
    whole range, the top bit was the short z axis's: the cut of a 2 x 1 x 1 box into two ran
    along it, twice the cut area of the unit cubes side by side, and put both refined balls
    of the weak-scaling problem on rank 0."""
    d, xp = F.dim, _xp(roots)
    cen = F.X[F.cell_nodes[roots]].mean(axis=1)
    lo, hi = cen.min(axis=0), cen.max(axis=0)
    span = float((hi - lo).max())                         # one root: no extent, scale 1
    span = span if span > 0 else 1.0
    q = xp.floor((cen - lo) / span * (2 ** _BITS[d] - 1) + 0.5)
    rank = xp.empty(roots.size, dtype=np.int64)
    # roots ascend: the stable sort of the Morton keys is lexsort((roots, keys))
    rank[stable_argsort(_morton(q))] = xp.arange(roots.size)
    return rank


def _curve_keys(mesh):
    r"""One int64 key per active cell whose order is the curve order, or None when it does not
    fit into 63 bits (then :func:`_curve_order_walk`).  On the device one thread a cell walks
    up to its root (:func:`adaptmg.device.curve_keys.walk_keys`: the same keys, in one launch);
    on the host:

    Top down from the roots, one step per level (no walk up from every cell): a cell of level
    ``k`` below the root of rank ``r`` with child digits ``c_1 .. c_k`` has the key
    ``((r << d k) | c_1 .. c_k) << d (L - k)`` (``L`` the mesh's deepest level), so comparing
    keys compares (root rank, c_1, c_2, ...) with missing digits as 0 -- the lexicographic
    order of the walk's ``lexsort``; two active cells never share a key (neither is the other's
    ancestor).  A cell reached that is not active has 2^d children (they tile it), which are
    visited next.  If that fails (a forest cell without children under no active cell) or not
    every active cell is reached, None."""
    F, d, xp = mesh._forest, mesh.dim, mesh.backend.xp
    ids = mesh.cell_ids.astype(np.int64, copy=False)
    n = ids.size
    if n == 0:
        return None
    L = int(F.cell_level[ids].max())
    roots = xp.flatnonzero(F.cell_level == 0)
    if (max(roots.size - 1, 1).bit_length() + d * L > 63):
        return None
    if not in_host_memory(ids):                # the device: one thread a cell walks up to its root
        rr = xp.zeros(int(roots[-1]) + 1, dtype=np.int64)
        rr[roots] = _root_ranks(F, roots)
        return walk_keys(xp, ids, F.cell_parent.astype(np.int64, copy=False),
                         F.cell_child0.astype(np.int64, copy=False), F.cell_level.astype(np.int16, copy=False),
                         rr, d, L)
    active = xp.zeros(F.num_cells, dtype=bool)
    active[ids] = True
    fkey = xp.zeros(F.num_cells, dtype=np.int64)   # the key of every active cell, by forest id
    front, key = roots, _root_ranks(F, roots)
    kids = xp.arange(2 ** d, dtype=np.int64)
    found = 0
    for k in range(L + 1):
        act = active[front]
        done = front[act]
        fkey[done] = key[act] << (d * (L - k))
        found += done.size
        front, key = front[~act], key[~act]
        if not front.size:
            break
        c0 = F.cell_child0[front]
        if k == L or bool((c0 < 0).any()):     # a dead end: the mesh does not tile the forest
            return None
        front = (c0[:, None] + kids).ravel()
        key = ((key << d)[:, None] | kids).ravel()
    if found != n or front.size:
        return None
    return fkey[ids]


def curve_order(mesh) -> np.ndarray:
    """Permutation of the active cells of ``mesh`` along the Morton curve over root cells and
    refinement paths (``mesh.cells[order]`` is the curve order)."""
    keys = _curve_keys(mesh)
    if keys is None:
        if mesh.backend.is_gpu:                # the rare walk on a host copy
            return mesh.backend.asarray(_curve_order_walk(mesh.to("cpu")))
        return _curve_order_walk(mesh)
    # distinct keys: any sort gives this permutation; the stable one (timsort) profits from the
    # runs of the forest order (the children of a cell are consecutive ids)
    return stable_argsort(keys)


def _curve_order_walk(mesh) -> np.ndarray:
    """:func:`curve_order` by walking every cell up to its root (one ``lexsort`` over the
    digits): for meshes whose keys do not fit into 63 bits."""
    F = mesh._forest
    d = mesh.dim
    cur = np.asarray(mesh.cell_ids, dtype=np.int64).copy()
    lev = F.cell_level[cur].astype(np.int64)
    L = int(lev.max()) if lev.size else 0
    digits = np.zeros((L, cur.size), dtype=np.int64)
    deep = np.arange(cur.size)               # walkers not yet at their root
    for k in range(L):                       # one step up the tree per level
        at = lev[deep] - k                   # current depth of each walker
        if not at.all():                     # some reached their root: drop them (a walker
            keep = at > 0                    # stays deep until it does, so ``deep`` shrinks)
            deep, at = deep[keep], at[keep]
        c = cur[deep]
        par = F.cell_parent[c]
        digits[at - 1, deep] = c - F.cell_child0[par]
        cur[deep] = par
    roots = np.unique(cur)
    rrank = np.empty(F.num_cells, dtype=np.int64)
    rrank[roots] = _root_ranks(F, roots)
    keys = [digits[k] for k in range(L - 1, -1, -1)] + [rrank[cur]]
    return np.lexsort(keys)


def partition_cells(mesh, size: int, weights=None) -> np.ndarray:
    """Rank (0..size-1) of every active cell: contiguous curve ranges of equal weight."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    n, xp = mesh.num_cells, mesh.backend.xp
    order = curve_order(mesh)
    if weights is None:
        rank_sorted = (xp.arange(n, dtype=np.int64) * size) // max(n, 1)
    else:
        w = mesh.backend.asarray(weights, dtype=float)
        if w.shape != (n,) or not bool(xp.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise ValueError(f"weights must be {n} finite non-negative numbers with a positive sum, "
                             f"got shape {w.shape}")
        ws = w[order]
        before = xp.cumsum(ws) - ws
        rank_sorted = xp.minimum((before * size / ws.sum()).astype(np.int64), size - 1)
    ranks = xp.empty(n, dtype=np.int64)
    ranks[order] = rank_sorted
    return ranks


def coarse_cell_ranks(fine_mesh, coarse_mesh, fine_ranks: np.ndarray, size: int) -> np.ndarray:
    """Ranks of the cells of ``coarse_mesh`` (one global-coarsening step below ``fine_mesh``):
    the rank holding most of a coarse cell's fine cells (ties: the lowest rank;
    :func:`~adaptmg.device.cell_kernels.majority_ranks`, a ValueError for a rank outside
    ``0 .. size - 1``)."""
    cidx, _ = fine_mesh.parent_of(coarse_mesh)
    return majority_ranks(cidx, fine_ranks, coarse_mesh.num_cells, size)


def level_ranks(dofs, size, c=0, min_dofs_per_rank=None):
    r"""Number of ranks ``P_l`` each level works on (``dofs``: DoFs per level, coarse -> fine).

    .. math::  P_{L} = P, \qquad
               P_l = \min\Bigl(P_{l+1},\; \max\bigl(1, \lfloor N_l / m \rfloor\bigr)\Bigr)
               \quad (c \le l < L), \qquad P_l = 1 \quad (l < c),

    ``P = size``, ``N_l = dofs[l]``, ``m = min_dofs_per_rank``: the finest level is on all
    ranks (the user's partition), a coarser distributed level on as many ranks as give each
    at least ``m`` DoFs (at most ``P``, at least one, never more than the next finer level),
    and the levels below ``c`` (agglomerated, see :func:`~.hierarchy.level_owners`) on rank 0.
    ``min_dofs_per_rank`` None or 0: every distributed level on all ``P`` ranks."""
    if min_dofs_per_rank is not None and (isinstance(min_dofs_per_rank, bool) or not isinstance(
            min_dofs_per_rank, (int, np.integer)) or min_dofs_per_rank < 0):
        raise ValueError(f"min_dofs_per_rank must be None or a non-negative integer, "
                         f"got {min_dofs_per_rank!r}")
    L = len(dofs)
    out = [1] * L
    p = int(size)
    for l in range(L - 1, min(c, L - 1) - 1, -1):
        if l < L - 1 and min_dofs_per_rank:
            p = min(p, max(1, int(dofs[l]) // int(min_dofs_per_rank)))
        out[l] = p
    return out


def fold_cell_ranks(mesh, cell_ranks: np.ndarray, size_l: int) -> np.ndarray:
    """``cell_ranks`` (a partition of ``mesh`` over any number of ranks) folded onto ranks
    ``0 .. size_l - 1``: cells sorted by (rank, curve position), equal contiguous pieces
    (module doc).  Unchanged when every rank is already below ``size_l``."""
    xp = mesh.backend.xp
    cell_ranks = xp.asarray(cell_ranks).astype(np.int64, copy=False)
    n = cell_ranks.size
    if size_l < 1:
        raise ValueError(f"size_l must be a positive integer, got {size_l!r}")
    if n == 0 or int(cell_ranks.max()) < size_l:
        return cell_ranks.copy()
    if size_l == 1:
        return xp.zeros(n, dtype=np.int64)
    pos = xp.empty(n, dtype=np.int64)
    pos[curve_order(mesh)] = xp.arange(n)
    # the device has no lexsort of a tuple: one sort of the distinct keys (rank, position), the
    # same permutation (the host keeps lexsort: 2x faster than that sort there)
    order = np.lexsort((pos, cell_ranks)) if xp is np else (cell_ranks * n + pos).argsort()
    out = xp.empty(n, dtype=np.int64)
    out[order] = (xp.arange(n, dtype=np.int64) * size_l) // n
    return out


def level_ownership(spaces, fine_cell_ranks, nranks, size: int):
    """Cell ranks and DoF owners of the distributed geometric levels ``spaces`` (coarse ->
    fine, each a global-coarsening step below the next; the finest partitioned by
    ``fine_cell_ranks`` over ``size`` ranks): a coarser level's cells by the vote of
    :func:`coarse_cell_ranks` on the next finer level's unfolded ranks, then folded onto its
    ``nranks[i]`` ranks (:func:`fold_cell_ranks`, :func:`level_ranks`), its DoFs owned by
    :func:`dof_owners`.  Returns ``(owners, cell_ranks)``, one array per level, int64 on the
    meshes' array module."""
    if len(nranks) != len(spaces):
        raise ValueError(f"level_ownership: {len(spaces)} levels but {len(nranks)} rank counts")
    xp = spaces[-1].mesh.backend.xp
    cell = [None] * len(spaces)
    cell[-1] = xp.asarray(fine_cell_ranks).astype(np.int64, copy=False)
    if cell[-1].shape != (spaces[-1].mesh.num_cells,):
        raise ValueError(f"fine_cell_ranks must have one rank per cell ({spaces[-1].mesh.num_cells}), "
                         f"got shape {cell[-1].shape}")
    for i in range(len(spaces) - 2, -1, -1):
        cell[i] = coarse_cell_ranks(spaces[i + 1].mesh, spaces[i].mesh, cell[i + 1], size)
    owners = []
    for i, s in enumerate(spaces):
        if nranks[i] < size:                 # fewer ranks than the job: fold the partition
            cell[i] = fold_cell_ranks(s.mesh, cell[i], nranks[i])
        owners.append(dof_owners(s, cell[i]))
    return owners, cell


def dof_owners(space, cell_ranks: np.ndarray) -> np.ndarray:
    """Owner rank of every DoF of ``space``: the lowest rank among the cells touching its node
    (one scatter-min over the (cell, node) slots, :func:`adaptmg.device.cell_kernels.scatter_cells`:
    on the device one kernel of atomic minima, int32 -- there is no int16 atomic minimum --,
    on the host the ranks repeated to the slots in int16 where they fit, a quarter of
    int64's bytes; one H200, the 42M-cell mesh of a two-rank set-up: 5.3 ms with the ranks
    repeated on the device)."""
    cd = space.cell_dofs
    xp = _xp(cd)
    ranks = xp.asarray(cell_ranks).astype(np.int64, copy=False)
    small = ranks.size == 0 or int(ranks.max()) < np.iinfo(np.int16).max
    vt = (np.int16 if xp is np else np.int32) if small else np.int64
    top = np.iinfo(vt).max
    owner = xp.full(space.num_nodes, top, dtype=vt)
    scatter_cells(cd, ranks.astype(vt), lo=owner)     # on the device one kernel, no repeated ranks
    if bool((owner == top).any()):
        raise RuntimeError("dof_owners: some DoF nodes belong to no cell")
    return xp.repeat(owner.astype(np.int64), space.components)


def imbalance(cell_ranks: np.ndarray, size: int) -> float:
    """max over ranks of (cells on the rank) / (mean cells per rank) - 1."""
    cnt = _xp(cell_ranks).bincount(cell_ranks, minlength=size)
    return float(cnt.max() / cnt.mean() - 1.0)
