r"""H^T A H on any backend by expanding only the entries in hanging rows or columns.

H differs from the identity only in the rows h of the hanging DoFs, whose rows hold their
parents' weights (parents are regular DoFs).  Let E be the entries of A whose row or column
is hanging.  Then

.. math::  H^T A H = A + C, \qquad C = H^T E H - E, \qquad
           (H^T E H)_{pq} = \sum_{(i, j) \in E} H_{ip}\, a_{ij}\, H_{jq},

where a regular DoF is its own only parent (weight 1).  Every entry of E expands to
(parents of i) x (parents of j) pairs, so C has O(|E|) entries, in few rows T; ``A + C`` is
A with the rows T replaced by the canonical rows of ``A[T] + C[T]`` (a splice, no merge of
the whole matrix).  Over all of A this costs one flag gathered per entry (hanging column?)
and the splice's copy of data and indices; everything else is O(|E|).

Written once against the backend's ``xp`` / sparse module, with no SpGEMM (cuSPARSE refuses
``A @ H`` for lack of resources at ~21M rows, and even the thin products of the hanging part
at 2.7M rows).  It costs ~8-15 ms on an H200 at any size (launches and host syncs), so a
device matrix first tries two cuSPARSE SpGEMMs (:func:`congruence_by_products`, 1-3.5 ms up to
millions of rows) and falls back to the expansion when it is large or cuSPARSE refuses
(:func:`congruence_on_device`).  The host keeps SciPy's products
(:func:`~adaptmg.fe.csr_ops.congruence_with_constraints`), which are faster there; the
CPU tests run this code with NumPy against them.

The same expansion gives the congruence *map* of a node-block matrix's scalar pattern
(:func:`congruence_map_on`, the backend's twin of :func:`~adaptmg.fe.csr_ops.congruence_map`):
every stored entry e = (i, j) goes to the pairs (p, q) of the kept parents of i and j with
weight :math:`(H_n)_{ip} (H_n)_{jq}`; the pairs sorted by (p, q) are the new pattern and
their runs the rows of a sparse T, so that the values of :math:`Z H_n^T S_f H_n Z` for all
fields f are one product ``T @ data``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, csr_from_arrays, is_device_array, is_device_error, is_device_sparse, segment_owner, stable_argsort
from .space_xp import csr_rows

__all__ = ["congruence_by_expansion", "congruence_by_products", "congruence_on_device",
           "congruence_map_on", "SPGEMM_MAX_NNZ"]

#: device matrices with at most this many entries try cuSPARSE's SpGEMM first
#: (:func:`congruence_on_device`)
SPGEMM_MAX_NNZ = 2 ** 25


def _segments(be, counts, total):
    """``(owner, offset)`` of the ``total = sum(counts)`` entries of consecutive segments of
    lengths ``counts``: the segment index of each entry (:func:`adaptmg.backend.segment_owner`)
    and its position inside it."""
    xp = be.xp
    if total == 0:
        z = xp.zeros(0, dtype=xp.int64)
        return z, z
    own = segment_owner(counts, total, xp=xp)
    start = xp.cumsum(counts) - counts
    return own, xp.arange(total, dtype=xp.int64) - start[own]


def _row_entries(be, indptr, rows):
    """Positions of the entries of CSR rows ``rows`` (in that order) and the row (rank in
    ``rows``) of each."""
    xp = be.xp
    start = indptr[rows].astype(xp.int64)
    cnt = indptr[rows + 1].astype(xp.int64) - start
    own, off = _segments(be, cnt, int(cnt.sum()))
    return start[own] + off, own


def _parents(be, nodes, rank, hp_ptr, hp_idx, hp_w):
    """Each entry of ``nodes`` expanded to its parents: ``(owner, parent, weight)`` with
    ``owner`` the index into ``nodes``; a regular node (rank -1) is its own parent, weight 1;
    a hanging one has the parents of its row ``rank`` of the hanging rows' CSR."""
    xp = be.xp
    k = rank[nodes]
    hang = k >= 0
    kk = xp.where(hang, k, 0)
    cnt = xp.where(hang, hp_ptr[kk + 1] - hp_ptr[kk], 1)
    own, off = _segments(be, cnt, int(cnt.sum()))
    ko, ho = kk[own], hang[own]
    at = xp.where(ho, hp_ptr[ko] + off, 0)
    par = xp.where(ho, hp_idx[at], nodes[own])
    w = xp.where(ho, hp_w[at], 1.0)
    return own, par, w


def _index_array(a):
    """An int64 index array where it lives: a device array stays on the device."""
    return a.astype(backend_of(a).xp.int64) if is_device_array(a) else np.asarray(a, dtype=np.int64)


def _hanging_rows(be, H, hanging, n):
    """The hanging rows of the CSR ``H`` on ``be`` -- ``(ptr, parents, weights)``, int64 /
    float64 -- and ``rank`` (length ``n``: a DoF's position among ``hanging``, -1 if regular).
    ``H`` and ``hanging`` on the host (moved: O(|h|)) or, for a space on a device mesh, both
    on the device (the rows gathered there: :func:`~.space_xp.csr_rows`)."""
    xp = be.xp
    if is_device_sparse(H):                                  # a device mesh's H: rows gathered there
        h = xp.asarray(hanging).astype(xp.int64)
        hp = csr_rows(be, H, h)
    else:
        Hh = sp.csr_matrix(H)[hanging]                       # the hanging rows: O(|h|), moved
        hp = (xp.asarray(Hh.indptr.astype(np.int64)), xp.asarray(Hh.indices.astype(np.int64)),
              xp.asarray(Hh.data.astype(np.float64)))
        h = xp.asarray(hanging)
    rank = xp.full(n, -1, dtype=xp.int64)
    rank[h] = xp.arange(h.shape[0], dtype=xp.int64)
    return hp, h, rank


def congruence_by_products(A, H, hanging):
    r""":math:`H^T (A H)` by two sparse products on ``A``'s backend (cuSPARSE SpGEMM on the
    device), ``H`` built there from its hanging rows (``H`` the host CSR constraint matrix,
    ``hanging`` the sorted hanging DoFs, host): the identity in the regular rows, the parents'
    weights in the hanging ones, and an explicit zero on each hanging DoF's diagonal, so that,
    as with :func:`congruence_by_expansion`, the rows and columns of hanging DoFs keep a
    pattern (with explicit zeros) that includes their diagonal entries."""
    be = backend_of(A)
    xp, xs = be.xp, be.sparse
    A = A.tocsr()
    n = A.shape[0]
    hanging = _index_array(hanging)
    if hanging.shape[0] == 0:
        return A
    (hp_ptr, hp_idx, hp_w), h, rank = _hanging_rows(be, H, hanging, n)
    reg = xp.flatnonzero(rank < 0)
    own, _ = _segments(be, hp_ptr[1:] - hp_ptr[:-1], int(hp_idx.shape[0]))
    rows = xp.concatenate([reg, h, h[own]])
    cols = xp.concatenate([reg, h, hp_idx])
    vals = xp.concatenate([xp.ones(reg.shape[0]), xp.zeros(h.shape[0]), hp_w]).astype(A.dtype)
    it = A.indices.dtype
    Hd = xs.coo_matrix((vals, (rows.astype(it), cols.astype(it))), shape=(n, n)).tocsr()
    B = (Hd.T.tocsr() @ (A @ Hd)).tocsr()
    B.sum_duplicates()
    return B


def congruence_on_device(A, H, hanging):
    """:math:`H^T A H` for a device CSR ``A``: :func:`congruence_by_products` (two cuSPARSE
    SpGEMMs, a few launches: ~1-3.5 ms on an H200 for 2-D meshes up to 2.1M DoFs) where ``A``
    has at most :data:`SPGEMM_MAX_NNZ` entries, else -- or where cuSPARSE refuses them for lack
    of resources or memory, as at 2.7M rows in 3-D -- :func:`congruence_by_expansion` (no
    SpGEMM; ~8-15 ms at any size, bound by its launches and host syncs).  Either gives the
    same matrix up to rounding."""
    if A.nnz <= SPGEMM_MAX_NNZ:
        try:
            return congruence_by_products(A, H, hanging)
        except Exception as exc:                  # noqa: BLE001 -- only the device's own errors
            if not is_device_error(exc):
                raise
    return congruence_by_expansion(A, H, hanging)


def congruence_by_expansion(A, H, hanging):
    """:math:`H^T A H` (module doc) for a CSR ``A`` on its backend (SciPy or cupyx), ``H`` the
    host CSR constraint matrix and ``hanging`` the sorted hanging DoFs (host).  The result is
    canonical CSR on ``A``'s backend; rows and columns of hanging DoFs keep their pattern with
    explicit zeros (their diagonal entries included)."""
    be = backend_of(A)
    xp, xs = be.xp, be.sparse
    A = A.tocsr()
    A.sum_duplicates()
    n = A.shape[0]
    hanging = _index_array(hanging)
    if hanging.shape[0] == 0:
        return A
    (hp_ptr, hp_idx, hp_w), h, rank = _hanging_rows(be, H, hanging, n)
    is_h = rank >= 0
    indptr = A.indptr

    # E: entries in a hanging column (one flag an entry) or a hanging row
    e_col = xp.flatnonzero(is_h[A.indices])
    e_row, _ = _row_entries(be, indptr, h)
    e = xp.unique(xp.concatenate([e_col.astype(xp.int64), e_row]))
    r = xp.searchsorted(indptr, e, side="right").astype(xp.int64) - 1
    c = A.indices[e].astype(xp.int64)
    v = A.data[e]

    # H^T E H: rows expanded to their parents, then columns
    o1, p, wp = _parents(be, r, rank, hp_ptr, hp_idx, hp_w)
    o2, q, wq = _parents(be, c[o1], rank, hp_ptr, hp_idx, hp_w)
    m = o1[o2]
    crow = xp.concatenate([p[o2], r])
    ccol = xp.concatenate([q, c])
    cval = xp.concatenate([v[m] * wp[o2] * wq, -v])

    # the rows T that C touches, and their new contents A[T] + C[T] (canonical, zeros kept)
    T = xp.unique(crow)
    a_pos, a_own = _row_entries(be, indptr, T)
    tr = xp.searchsorted(T, crow)
    srow = xp.concatenate([a_own, tr])
    scol = xp.concatenate([A.indices[a_pos].astype(xp.int64), ccol])
    sval = xp.concatenate([A.data[a_pos], cval.astype(A.data.dtype)])
    S = xs.coo_matrix((sval, (srow, scol)), shape=(T.shape[0], n)).tocsr()
    S.sum_duplicates()
    S.sort_indices()

    # splice: rows of A outside T shift by the growth of the rows T before them
    lenA = (indptr[1:] - indptr[:-1]).astype(xp.int64)
    lenS = (S.indptr[1:] - S.indptr[:-1]).astype(xp.int64)
    lenB = lenA.copy()
    lenB[T] = lenS
    ptrB = xp.zeros(n + 1, dtype=xp.int64)
    ptrB[1:] = xp.cumsum(lenB)
    nnzB = int(ptrB[-1])
    grow = xp.zeros(T.shape[0] + 1, dtype=xp.int64)
    grow[1:] = xp.cumsum(lenS - lenA[T])
    ends = indptr[T + 1].astype(xp.int64)
    ent = xp.arange(A.indices.shape[0], dtype=xp.int64)
    # an entry inside row T_k lands inside that row's new range (it is overwritten below)
    dest = ent + grow[xp.searchsorted(ends, ent, side="right")]
    del ent
    it = xp.int32 if max(nnzB, n) < 2**31 - 1 else xp.int64
    data = xp.empty(nnzB, dtype=A.data.dtype)
    indices = xp.empty(nnzB, dtype=it)
    data[dest] = A.data
    indices[dest] = A.indices
    del dest
    s_pos, s_own = _row_entries(be, S.indptr, xp.arange(T.shape[0], dtype=xp.int64))
    at = ptrB[T][s_own] + (s_pos - S.indptr[s_own].astype(xp.int64))
    data[at] = S.data[s_pos]
    indices[at] = S.indices[s_pos]
    B = csr_from_arrays(xs, data, indices, ptrB.astype(it), A.shape)
    B.has_canonical_format = True
    return B


def _kept_parent_rows_on(be, Hn, keep, n):
    """The rows of :func:`congruence_map_on` for ``Hn`` and ``keep`` of a space on a device mesh
    (both on ``be``): :func:`~adaptmg.fe.csr_ops.kept_parents` there -- ``Hn``'s columns masked
    to the kept nodes, a node its own only parent where its one entry is (i, i) with weight 1
    -- and the other nodes' rows gathered (:func:`~.space_xp.csr_rows`), with the empty row and
    dummy entry of the host branch; ``(ptr, parents, weights, rank)``."""
    from .csr_ops import mask_rows_cols
    xp = be.xp
    keep = xp.asarray(keep).astype(bool)
    if keep.shape != (n,) or Hn.shape != (n, n):
        raise ValueError(f"keep must have shape ({n},) and Hn ({n}, {n}), got {keep.shape} and {Hn.shape}")
    Hk = mask_rows_cols(Hn, xp.ones(n, dtype=bool), keep)          # parents restricted to kept nodes
    hp = Hk.indptr.astype(xp.int64)
    one = (hp[1:] - hp[:-1]) == 1
    if int(Hk.nnz):
        at = xp.where(one, hp[:-1], 0)
        own = one & (Hk.indices[at] == xp.arange(n, dtype=Hk.indices.dtype)) & (Hk.data[at] == 1.0)
    else:
        own = xp.zeros(n, dtype=bool)
    special = xp.flatnonzero(~own)
    ptr, idx, w = csr_rows(be, Hk, special)
    rank = xp.full(n, -1, dtype=xp.int64)
    rank[special] = xp.arange(special.shape[0], dtype=xp.int64)
    return (xp.concatenate([ptr, ptr[-1:]]), xp.concatenate([idx, xp.zeros(1, dtype=xp.int64)]),
            xp.concatenate([w, xp.zeros(1)]), rank)


def congruence_map_on(be, indptr, indices, Hn, keep, extra_diagonal=None, on_mesh_device=False):
    r""":func:`~adaptmg.fe.csr_ops.congruence_map` on the backend ``be``: the pattern of
    :math:`Z H_n^T S H_n Z` (``Z = diag(keep)``) and the map T (nnz' x nnz, a CSR matrix of
    ``be``) from the values of any S on the scalar pattern ``(indptr, indices)`` (host or
    ``be`` arrays) to its values, ``T @ data`` for the fields (nnz, F) at once.

    A node that is kept and regular is its own parent (weight 1); any other node (hanging, or
    not kept) has the kept parents of its row of :math:`H_n` (none for a fixed regular node):
    only these rows of :math:`H_n` travel.  Every entry expands to the pairs of its parents
    (:func:`_parents`), ``extra_diagonal`` nodes add a zero-weight pair (p, p); one stable sort
    of the keys p n + q groups equal pairs (their sources in increasing order: T's columns
    sorted in each row) and gives the canonical pattern.  Returns ``(indptr', indices', T)``
    on ``be`` with the same pattern as the host map's and the same T up to the order of its
    stored entries.  ``on_mesh_device``: ``Hn`` and ``keep`` belong to a space on a device mesh
    and are used where they are (:func:`_kept_parent_rows_on`), nothing of them on the host.
    """
    xp, xs = be.xp, be.sparse
    n = int(indptr.shape[0]) - 1
    if on_mesh_device:
        hp_ptr, hp_idx, hp_w, rank = _kept_parent_rows_on(be, Hn, keep, n)
    else:
        from .csr_ops import kept_parents
        Hk, own = kept_parents(Hn, keep, n)
        special = np.flatnonzero(~own)                              # O(n) host work, no entries
        Hs = Hk[special]
        # one empty row and one dummy entry more: _parents' gathers stay in range also without
        # special nodes or without any parent (e.g. no hanging nodes, only fixed ones)
        hp_ptr = be.asarray(np.append(Hs.indptr, Hs.nnz).astype(np.int64))
        hp_idx = be.asarray(np.append(Hs.indices, 0).astype(np.int64))
        hp_w = be.asarray(np.append(Hs.data, 0.0).astype(np.float64))
        rank_h = np.full(n, -1, dtype=np.int64)
        rank_h[special] = np.arange(special.size)
        rank = be.asarray(rank_h)
    ip = be.asarray(indptr).astype(xp.int64)
    ind = be.asarray(indices).astype(xp.int64)
    nse = int(ind.shape[0])
    row, _ = _segments(be, ip[1:] - ip[:-1], nse)                  # row of every entry
    o1, p, wp = _parents(be, row, rank, hp_ptr, hp_idx, hp_w)
    del row
    o2, q, wq = _parents(be, ind[o1], rank, hp_ptr, hp_idx, hp_w)
    src, P, W = o1[o2], p[o2], wp[o2] * wq
    del o1, p, wp, o2
    xd = None if extra_diagonal is None else be.asarray(extra_diagonal).astype(xp.int64).ravel()
    if xd is not None and int(xd.shape[0]):                        # zero-weight pairs first
        src = xp.concatenate([xp.zeros(xd.shape[0], dtype=src.dtype), src])
        P, q = xp.concatenate([xd, P]), xp.concatenate([xd, q])
        W = xp.concatenate([xp.zeros(xd.shape[0]), W])
    keys = P * n + q
    del P, q
    order = stable_argsort(keys)
    sk = keys[order]
    del keys
    total = int(sk.shape[0])
    head = xp.ones(total, dtype=bool)
    if total > 1:
        xp.not_equal(sk[1:], sk[:-1], out=head[1:])
    starts = xp.flatnonzero(head)
    uk = sk[starts]
    del sk, head
    rows = uk // n
    nnz2 = int(uk.shape[0])
    it = xp.int32 if max(nnz2, n, nse, total) < 2**31 - 1 else xp.int64
    ip2 = xp.searchsorted(rows, xp.arange(n + 1, dtype=rows.dtype)).astype(it)
    ind2 = (uk - rows * n).astype(it)
    seg = xp.empty(nnz2 + 1, dtype=it)
    seg[:nnz2] = starts
    seg[nnz2] = total
    T = csr_from_arrays(xs, W[order], src[order].astype(it), seg, (nnz2, nse))
    return ip2, ind2, T
