"""Small O(nnz) helpers on SciPy CSR matrices used during setup."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, csr_from_arrays, is_device_array, is_device_sparse, segment_owner, to_host
from .sparsity import Pattern, _index_dtype


def csr_entry_rows(indptr, nnz):
    """The row of each of the ``nnz`` stored entries of a CSR matrix with row pointer ``indptr``,
    on ``indptr``'s backend (one binary search per entry; dtype of ``indptr``)."""
    xp = backend_of(indptr).xp
    return xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1


#: device CSR matrices with at least this many entries take their diagonal by
#: :func:`row_positions` (:func:`csr_diagonal`): cupyx's ``csr_matrix.diagonal`` bisects a
#: row with 32-bit ``(j_min + j_max) / 2``, which wraps once the entry positions pass 2^30
#: (an illegal address at 5.6e7 3-D Q1 DoFs on an H200)
DIAGONAL_SEARCH_NNZ = 2 ** 30


def row_positions(xp, indptr, indices, cols, rows=None):
    """Position of the entry ``(i, cols[i])`` of every row ``i`` of a CSR matrix with sorted
    rows (-1 where the row has none), or with ``rows`` of the entries ``(rows[k], cols[k])``:
    one vectorised binary search over all of them at once in 64-bit positions,
    ``ceil(log2(longest row + 1))`` steps of O(searches) work (no pass over the entries)."""
    if rows is None:
        lo, end = indptr[:-1].astype(xp.int64), indptr[1:].astype(xp.int64)
    else:
        lo, end = indptr[rows].astype(xp.int64), indptr[rows + 1].astype(xp.int64)
    hi = end.copy()
    n, nnz = lo.size, int(indices.size)
    if n == 0 or nnz == 0:
        return xp.full(n, -1, dtype=xp.int64)
    longest = int((hi - lo).max())
    for _ in range(longest.bit_length()):
        mid = (lo + hi) // 2
        less = (lo < hi) & (indices[xp.minimum(mid, nnz - 1)] < cols)
        lo = xp.where(less, mid + 1, lo)
        hi = xp.where(less | (lo >= hi), hi, mid)
    at = xp.minimum(lo, nnz - 1)
    return xp.where((lo < end) & (indices[at] == cols), lo, -1)


def csr_diagonal(A):
    """The main diagonal of the sparse matrix ``A`` where it lives (``A.diagonal()``), except
    for a device CSR of :data:`DIAGONAL_SEARCH_NNZ` entries or more, whose diagonal comes
    from :func:`row_positions` (its rows sorted in place first if they are not: the same
    matrix, its entries reordered): the same values."""
    if not is_device_sparse(A) or A.format != "csr" or A.nnz < DIAGONAL_SEARCH_NNZ:
        return A.diagonal()
    if not A.has_sorted_indices:
        A.sort_indices()
    return diagonal_by_search(A)


def diagonal_by_search(A):
    """The main diagonal of the CSR ``A`` (sorted rows, any backend) by :func:`row_positions`:
    the stored value of ``(i, i)``, 0 where row ``i`` stores none."""
    xp = backend_of(A.data).xp
    n = min(A.shape)
    pos = row_positions(xp, A.indptr[:n + 1], A.indices, xp.arange(n, dtype=A.indices.dtype))
    return xp.where(pos >= 0, A.data[xp.maximum(pos, 0)], xp.zeros((), dtype=A.data.dtype))


def _count_before(indptr: np.ndarray, p: np.ndarray) -> np.ndarray:
    """For each ``indptr[r]``, how many of the sorted entry positions ``p`` lie before it
    (= ``np.searchsorted(p, indptr)``): through the rows of the positions when they are fewer
    than the rows, else by that search itself (a binary search per row instead of per position)."""
    if p.size > indptr.size:
        return np.searchsorted(p, indptr).astype(np.int64, copy=False)
    rows = np.searchsorted(indptr, p, side="right") - 1          # row holding each position
    return np.cumsum(np.bincount(rows + 1, minlength=indptr.size))


_MASK_BLOCK = 1 << 16       # entries per block of :func:`_entry_mask` (its temporaries stay in cache)


def _entry_mask(A, rows, cols, all_rows: bool, drop_zeros: bool) -> np.ndarray:
    """One boolean per stored entry of CSR ``A``: row in ``rows``, column in ``cols`` and, with
    ``drop_zeros``, value != 0.

    Block by block: the column gather ``cols[indices]`` with int32 indices would first convert
    the whole index array to ``intp`` (8 bytes per entry of fresh memory, costlier than the
    gather), and each further condition would be one more entry-sized temporary; per block of
    ``_MASK_BLOCK`` entries these all stay in cache and the result is written once."""
    indices, nnz = A.indices, A.indices.size
    rr = None
    gone = None                                   # entries of the removed rows, when they are few
    if not all_rows:
        indptr = A.indptr
        removed = np.flatnonzero(~rows)
        lens = indptr[removed + 1] - indptr[removed]
        if 8 * int(lens.sum()) < nnz:             # e.g. Dirichlet rows: clear their ranges afterwards
            gone = np.repeat(indptr[removed] - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
        else:
            rr = np.repeat(rows, np.diff(indptr))  # no index gather
    if nnz <= 2 * _MASK_BLOCK:
        keep = cols[indices]
        if rr is not None:
            keep &= rr
        if drop_zeros:
            keep &= A.data != 0
        if gone is not None:
            keep[gone] = False
        return keep
    keep = np.empty(nnz, dtype=bool)
    data = A.data
    buf = np.empty(_MASK_BLOCK, dtype=np.intp)
    zb = np.empty(_MASK_BLOCK, dtype=bool)
    for s in range(0, nnz, _MASK_BLOCK):
        e = min(s + _MASK_BLOCK, nnz)
        m = e - s
        b = buf[:m]
        np.copyto(b, indices[s:e], casting="safe")
        k = keep[s:e]
        np.take(cols, b, out=k)
        if rr is not None:
            np.logical_and(k, rr[s:e], out=k)
        if drop_zeros:
            z = zb[:m]
            np.not_equal(data[s:e], 0, out=z)
            np.logical_and(k, z, out=k)
    if gone is not None:
        keep[gone] = False
    return keep


def _mask_device(A, rows, cols, drop_zeros, diagonal=None):
    """:func:`mask_rows_cols` for a cupyx CSR matrix, on the device: one boolean per entry,
    then the compression (row pointers from the running count of kept entries).  Built
    explicitly: cupyx's ``eliminate_zeros()`` returned wrong values on such a masked matrix
    (CuPy 14.2, H100: same nnz, entries off by 1e-4).

    ``diagonal``: each removed row keeps its stored diagonal entry, set to ``diagonal`` (no
    insertion, so the compression stays one pass); a removed row without a stored diagonal
    entry is a ValueError (finite element matrices and their congruences store every
    diagonal entry; :func:`_device_matrix` in :mod:`.constraints` falls back to inserting)."""
    be = backend_of(A)
    xp = be.xp
    A = A.tocsr()
    indptr, indices, data = A.indptr, A.indices, A.data
    rows, cols = xp.asarray(rows).astype(bool, copy=False), xp.asarray(cols).astype(bool, copy=False)
    all_rows = bool(rows.all())
    keep = cols[indices]
    if not all_rows:
        row_of = csr_entry_rows(indptr, indices.size)
        kept_row = rows[row_of]
        keep &= kept_row
    if drop_zeros:
        keep &= data != 0
    diag = None
    if diagonal is not None and not all_rows:
        diag = ~kept_row
        diag &= indices == row_of
        del row_of, kept_row
        if int(diag.sum()) != int((~rows).sum()):
            raise ValueError("mask_rows_cols: a removed row stores no (or more than one) diagonal "
                             "entry; diagonal= needs one in each on the device")
        keep |= diag
    before = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(keep, dtype=xp.int64)])
    vals = data[keep]
    if diag is not None:
        vals[diag[keep]] = diagonal
    out = csr_from_arrays(be.sparse, vals, indices[keep], before[indptr].astype(indptr.dtype), A.shape)
    out.has_canonical_format = bool(A.has_canonical_format)
    return out


def as_csr(A) -> sp.csr_matrix:
    """``A`` itself when it is a SciPy ``csr_matrix`` (keeping SciPy's cached sorted/canonical
    flags, which ``sp.csr_matrix(A)`` -- a new object on the same arrays -- forgets, so that
    the next check re-scans the indices), else ``sp.csr_matrix(A)``."""
    return A if type(A) is sp.csr_matrix else sp.csr_matrix(A)


def canonical_known(A) -> bool:
    """True when SciPy already knows ``A`` to be canonical (its cached flag is set); never
    computes it (a False only means "not known": callers then take the checking path)."""
    return bool(A.__dict__.get("_has_canonical_format", False))


def mask_rows_cols(A, rows: np.ndarray, cols: np.ndarray, diagonal=None, drop_zeros=False) -> sp.csr_matrix:
    """A copy of CSR ``A`` with the entries outside ``rows`` x ``cols`` (boolean masks) removed.

    Equals ``diag(rows) @ A @ diag(cols)`` without two sparse products.  With
    ``diagonal`` (a number, square A), each removed row becomes the single entry
    ``diagonal`` on the diagonal: ``diag(rows) A diag(cols) + diagonal (I - diag(rows))``.
    Each row keeps its order, so sorted input gives sorted output (and canonical input,
    when SciPy knows it, gives output flagged canonical).  ``drop_zeros=True`` also removes
    the explicit zeros, as a following ``eliminate_zeros()`` would (same arrays), in the same
    pass.

    Cost: one boolean per entry (row mask repeated -- skipped when all rows are kept --,
    column mask gathered, zeros tested, block-wise: :func:`_entry_mask`), one compression of
    data and indices; the new row pointers come from the fewer of the dropped or kept
    entries: ``indptr_new[r] = indptr[r] - #{dropped before indptr[r]} = #{kept before
    indptr[r]}``.  A removed row that stores exactly one diagonal entry keeps that entry
    (set to ``diagonal``); only removed rows without one (e.g. the hanging rows of
    H^T A H) get an inserted entry.

    A cupyx CSR ``A`` (canonical, as the device assembly gives it) is masked on the device
    (:func:`_mask_device`; with ``diagonal``, every removed row must store its diagonal
    entry) and stays there.
    """
    if is_device_sparse(A):
        return _mask_device(A, rows, cols, drop_zeros, diagonal)
    A = as_csr(A)
    rows = np.asarray(rows, dtype=bool)
    cols = np.asarray(cols, dtype=bool)
    canonical = canonical_known(A)
    indptr, indices = A.indptr, A.indices
    rowlen = np.diff(indptr)
    keep = _entry_mask(A, rows, cols, bool(rows.all()), drop_zeros)    # one bool per entry
    dtype = A.dtype if diagonal is None else np.result_type(A.dtype, type(diagonal))
    diag_pos = missing = None
    if diagonal is not None:
        removed = np.flatnonzero(~rows)
        lens = rowlen[removed]
        k = np.repeat(np.arange(removed.size), lens)            # removed row (rank) of each entry
        ent = np.arange(k.size) + np.repeat(indptr[removed] - (np.cumsum(lens) - lens), lens)
        on_diag = indices[ent] == removed[k]
        ndiag = np.bincount(k[on_diag], minlength=removed.size)
        diag_pos = ent[on_diag & (ndiag[k] == 1)]
        keep[diag_pos] = True                      # the row's one diagonal entry stays
        missing = removed[ndiag != 1]              # no (or a duplicated) diagonal entry: insert one
    nkeep = int(np.count_nonzero(keep))
    if 2 * nkeep < keep.size:                      # few kept entries (e.g. a few columns): gather them
        kept = np.flatnonzero(keep)
        drop = None
        data = A.data[kept].astype(dtype, copy=False)
        indices = indices[kept]
        indptr = _count_before(indptr, kept)
    else:                                          # few dropped entries (e.g. Dirichlet rows/columns)
        drop = np.flatnonzero(~keep)
        data = A.data[keep].astype(dtype, copy=False)
        indices = indices[keep]
        indptr = indptr - _count_before(indptr, drop)
    if diagonal is not None:
        data[np.searchsorted(kept, diag_pos) if drop is None else diag_pos - np.searchsorted(drop, diag_pos)] = diagonal
        if missing.size:
            at = indptr[missing]                   # start of each (now empty) row
            data = np.insert(data, at, diagonal)
            indices = np.insert(indices, at, missing.astype(indices.dtype))
            shift = np.zeros(indptr.size, dtype=indptr.dtype)
            shift[missing + 1] = 1
            indptr = indptr + np.cumsum(shift)
    out = sp.csr_matrix((data, indices, indptr.astype(A.indptr.dtype, copy=False)), shape=A.shape, copy=False)
    if canonical:
        out.has_canonical_format = True
    else:
        out.has_sorted_indices = A.has_sorted_indices
    if drop_zeros and diagonal is not None and diagonal == 0:
        out.eliminate_zeros()                      # the diagonal entries of the removed rows
    return out


def congruence_with_constraints(A, H, hanging: np.ndarray) -> sp.csr_matrix:
    r"""H^T A H for a constraint matrix H that differs from I only in the rows ``hanging``.

    With H = I + S^T D (S selects the hanging rows, D = H[hanging] - I[hanging]):

    .. math:: H^T A H = A + (A S^T) D + D^T (S A) + D^T (S A S^T) D,

    where every correction involves only the hanging rows/columns of A, so the cost is
    one pass over A plus work proportional to the hanging part -- instead of two full
    sparse products.  SciPy's products on the host; a device matrix takes
    :func:`adaptmg.fe.congruence.congruence_on_device` (cuSPARSE SpGEMM where it is small
    enough and cuSPARSE accepts it, else the expansion without SpGEMM).
    """
    if is_device_sparse(A):
        from .congruence import congruence_on_device
        return congruence_on_device(A, H, hanging)
    A = sp.csr_matrix(A)
    n = A.shape[0]
    nh = hanging.size
    if nh == 0:
        return A
    Sel = sp.csr_matrix((np.ones(nh), (hanging, np.arange(nh))), shape=(n, nh))
    D = (sp.csr_matrix(H)[hanging] - Sel.T).tocsr()
    A_c = (A @ Sel).tocsr()                  # A S^T: the hanging columns, n x nh
    A_r = A[hanging]                         # S A: the hanging rows, nh x n
    A_hh = (A_r @ Sel).tocsr()
    corr = A_c @ D + D.T @ A_r + D.T @ (A_hh @ D)
    return (A + corr).tocsr()                # csr + csr gives canonical (summed, sorted) rows


def add_to_diagonal(A: sp.csr_matrix, d: np.ndarray) -> sp.csr_matrix:
    """A + diag(d) for CSR ``A`` (entries with d != 0 are added, missing diagonal entries created)."""
    A = sp.csr_matrix(A)
    nz = np.flatnonzero(d)
    if nz.size == 0:
        return A
    return (A + sp.csr_matrix((d[nz], (nz, nz)), shape=A.shape)).tocsr()


# ----------------------------------------------------------------------------- node-block matrices

def kept_parents(Hn, keep, n):
    """``(Hk, own)``: the node constraint matrix ``Hn`` (n x n) with its columns restricted to the
    kept nodes (each node's kept parents and weights) and the mask of the nodes that are kept
    and their own only parent (weight 1); ValueError for a ``keep`` or ``Hn`` of another size."""
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (n,):
        raise ValueError(f"keep must be a boolean mask of shape ({n},), got {keep.shape}")
    Hn = sp.csr_matrix(Hn)
    if Hn.shape != (n, n):
        raise ValueError(f"Hn has shape {Hn.shape}, the pattern has {n} rows")
    Hk = mask_rows_cols(Hn, np.ones(n, dtype=bool), keep)          # parents restricted to kept nodes
    hp = Hk.indptr
    one = np.flatnonzero(np.diff(hp) == 1)
    own = np.zeros(n, dtype=bool)                                    # kept node, its own only parent
    own[one] = (Hk.indices[hp[one]] == one) & (Hk.data[hp[one]] == 1.0)
    return Hk, own


def congruence_map(indptr, indices, Hn, keep, extra_diagonal=None):
    r"""The linear map from the values of *any* matrix S on one scalar pattern to those of
    :math:`Z H_n^T S H_n Z`, with :math:`Z = \mathrm{diag}(keep)`:

    .. math:: (H_n^T S H_n)_{pq} = \sum_{(i,j)} (H_n)_{ip}\, S_{ij}\, (H_n)_{jq} .

    Every stored entry e = (i, j) of the pattern contributes to the pairs (p, q) of the kept
    parents p of i and q of j (a regular node is its own parent, weight 1; a hanging node
    has its 2 or 4 parents).  The pairs are merged into a canonical CSR pattern by
    :class:`adaptmg.assemble.Pattern` (grouping by row, sorting within rows; no global
    sort) and the weights form a sparse T (nnz' x nnz), so that the values of the
    congruence of any S on this pattern are ``T @ S.data`` -- and of k matrices on it
    at once ``T @ data`` with data (nnz, k).  Entries of nodes that are regular and
    kept map one to one; only the hanging rows and columns expand.

    ``extra_diagonal``: nodes whose diagonal entry (p, p) the pattern must hold even
    without a contribution (T has an explicit zero there).

    Returns ``(indptr', indices', T)``.
    """
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    n = indptr.size - 1
    Hk, own = kept_parents(Hn, keep, n)
    hp = Hk.indptr.astype(np.int64)
    hi, hw = Hk.indices, Hk.data
    hlen = np.diff(hp)
    nse = indices.size
    rowlen = np.diff(indptr)
    # per node: 0 = no kept parent, 1 = kept and its own only parent, 2 = other (expands);
    # the entry's class is the product of its row's (a repeat, no gather) and column's
    # (a uint8 gather) -- 1: maps one to one, 2 or 4: expands, 0: dropped -- instead of
    # several entry-sized int64/boolean temporaries
    kind = np.where(own, 1, np.where(hlen > 0, 2, 0)).astype(np.uint8)
    code = np.repeat(kind, rowlen)
    code *= _gather_blocks(kind, indices)
    e_s = np.flatnonzero(code == 1)
    e_c = np.flatnonzero(code > 1)
    del code
    row_c = np.searchsorted(indptr, e_c, side="right") - 1          # row of each expanding entry
    col_c = indices[e_c]
    ni, nj = hlen[row_c], hlen[col_c]
    cnt = ni * nj
    t = np.repeat(np.arange(e_c.size), cnt)
    within = np.arange(t.size, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    a = within // nj[t]
    pa = hp[row_c[t]] + a
    pb = hp[col_c[t]] + (within - a * nj[t])
    xd = None
    if extra_diagonal is not None and np.size(extra_diagonal):
        xd = np.asarray(extra_diagonal, dtype=np.int64)
    et = _index_dtype(max(nse, n))           # T's column and the pairs' index type (SciPy's own choice)
    nx = 0 if xd is None else xd.size
    ns, nc = e_s.size, t.size
    E = np.zeros(ns + nc + nx, dtype=et)
    E[:ns] = e_s
    E[ns:ns + nc] = e_c[t]
    W = np.empty(ns + nc + nx)
    W[:ns] = 1.0
    np.multiply(hw[pa], hw[pb], out=W[ns:ns + nc])
    W[ns + nc:] = 0.0
    Pc = np.empty(nc + nx, dtype=et)
    Qc = np.empty(nc + nx, dtype=et)
    Pc[:nc] = hi[pa]
    Qc[:nc] = hi[pb]
    if nx:
        Pc[nc:] = xd
        Qc[nc:] = xd
    merged = _merge_simple(indptr, indices, e_s, Pc, Qc, n)
    if merged is not None:
        ip, ind, pos = merged
        T = sp.csr_matrix((W, (pos, E)), shape=(ind.size, nse))
        return ip, ind, T
    row = np.repeat(np.arange(n, dtype=np.int64), rowlen)
    P = np.concatenate([row[e_s], Pc])
    Q = np.concatenate([indices[e_s], Qc])
    pat = Pattern(P[:, None], Q[:, None], n, n)
    T = sp.csr_matrix((W, (pat.pos, E)), shape=(pat.nnz, nse))
    return pat.indptr, pat.indices, T


def _gather_blocks(table, idx):
    """``table[idx]`` block by block (an int32 ``idx`` is converted to ``intp`` per cache-sized
    block instead of as a whole; see :func:`_entry_mask`)."""
    m = idx.size
    if m <= 2 * _MASK_BLOCK or idx.dtype == np.intp:
        return table[idx]
    out = np.empty(m, dtype=table.dtype)
    buf = np.empty(_MASK_BLOCK, dtype=np.intp)
    for s in range(0, m, _MASK_BLOCK):            # loop over blocks of entries, not entries
        e = min(s + _MASK_BLOCK, m)
        b = buf[:e - s]
        np.copyto(b, idx[s:e], casting="safe")
        np.take(table, b, out=out[s:e])
    return out


def _merge_simple(indptr, indices, e_s, Pc, Qc, n):
    """Merged pattern of the entries ``e_s`` of a canonical CSR pattern and the pairs (Pc, Qc).

    The entries ``e_s`` keep their (row, column) and are already canonical (sorted, unique),
    so only the pairs go through :class:`Pattern`; the two canonical patterns are merged by
    SciPy's C++ ``csr_plus_csr`` (values 1 for the entries, 0.5 for the pairs: a merged
    value >= 1 holds an entry, one != 1 a pair; both keep their order in the merge).
    Returns ``(indptr', indices', pos)``, pos the merged position of the entries and then of
    the pairs -- the pattern and positions :class:`Pattern` gives for all of them -- or None
    when the input pattern is not canonical (the caller then builds the full Pattern).
    """
    ns, npair = e_s.size, Pc.size
    if ns == 0 or npair == 0:
        return None
    if indices.size > 1:                       # canonical input: columns increasing within every row
        inc = indices[1:] > indices[:-1]
        starts = indptr[:-1][np.diff(indptr) > 0]       # a new row may start lower
        inc[starts[starts > 0] - 1] = True
        if not inc.all():
            return None
    it = np.int64 if max(n, ns + npair) > np.iinfo(np.int32).max else np.int32
    ip_s = _count_before(indptr, e_s).astype(it)
    S = sp.csr_matrix((np.ones(ns), indices[e_s].astype(it, copy=False), ip_s), shape=(n, n), copy=False)
    S.has_sorted_indices = True
    S.has_canonical_format = True
    pc = Pattern(Pc[:, None], Qc[:, None], n, n)
    C = sp.csr_matrix((np.full(pc.nnz, 0.5), pc.indices.astype(it, copy=False), pc.indptr.astype(it, copy=False)),
                      shape=(n, n), copy=False)
    C.has_sorted_indices = True
    C.has_canonical_format = True
    U = S + C
    del S, C
    v = U.data
    pos_s = np.flatnonzero(v >= 1.0)
    pos_c = np.flatnonzero(v != 1.0)
    if pos_s.size != ns or pos_c.size != pc.nnz:
        return None
    pos = np.empty(ns + npair, dtype=_index_dtype(ns + npair))
    pos[:ns] = pos_s
    del pos_s
    pos[ns:] = pos_c[pc.pos]
    idx_t = _index_dtype(max(U.nnz, n))
    return U.indptr.astype(idx_t, copy=False), U.indices.astype(idx_t, copy=False), pos


class NodeBlockMatrix:
    r"""A c-component matrix :math:`A = \sum_f S_f \otimes C_f` stored on one scalar node pattern.

    ``S_f`` are scalar (nodes x nodes) matrices sharing the CSR pattern ``(indptr, indices)``,
    their values the columns of ``data`` (nnz, F); ``C_f = coef[f]`` are constant c x c
    matrices.  In the DoF layout ``node * c + component``,

    .. math:: A_{(n, r), (m, s)} = \sum_f (S_f)_{nm} (C_f)_{rs} .

    A system of coupled scalar operators (e.g. the elasticity system
    ``[[M, -dt M], [dt A, M]]`` with the 3 x 3 blocks of A: F = 10 fields, c = 6) is thus
    held with F values per node pair instead of its nnz(A) / nnz(S) ~ 18.  With a GPU
    ``backend`` the constrained matrix of :class:`adaptmg.Constraints` is expanded on the
    device (:func:`expand_node_blocks`: only the fields are copied there, the CSR is
    built there).  Since the
    hanging-node matrix of a c-component space is :math:`H = H_n \otimes I_c`,
    :math:`H^T A H = \sum_f (H_n^T S_f H_n) \otimes C_f`: the congruence acts on the
    scalar pattern only (:meth:`congruence`), and :class:`adaptmg.Constraints` uses it
    (:meth:`adaptmg.Constraints.matrix`).  :meth:`tocsr` expands to SciPy CSR.
    """

    def __init__(self, indptr, indices, data, coef, num_nodes, backend=None):
        self.backend = backend          # a GPU Backend: constrained matrices are made there
        self.num_nodes = n = int(num_nodes)
        # device arrays (e.g. elasticity(..., keep_on_device=True)) stay on their device
        self.on_device = is_device_array(data)
        xp = backend_of(data).xp if self.on_device else np
        if self.on_device and (backend is None or not backend.is_gpu):
            self.backend = backend_of(data)
        self.indptr = xp.asarray(indptr)
        self.indices = xp.asarray(indices)
        data = xp.asarray(data, dtype=np.float64)
        self.data = data[:, None] if data.ndim == 1 else data
        self.coef = np.asarray(coef, dtype=np.float64)
        if self.indptr.shape != (n + 1,) or self.indices.shape != (int(self.indptr[-1]),):
            raise ValueError(f"pattern of {n} rows needs indptr ({n + 1},) and indices (indptr[-1],), "
                             f"got {self.indptr.shape} and {self.indices.shape}")
        if self.coef.ndim != 3 or self.coef.shape[1] != self.coef.shape[2]:
            raise ValueError(f"coef must have shape (F, c, c), got {self.coef.shape}")
        if self.data.shape != (self.indices.size, self.coef.shape[0]):
            raise ValueError(f"data must have shape (nnz, F) = ({self.indices.size}, {self.coef.shape[0]}), "
                             f"got {self.data.shape}")
        self.c = self.coef.shape[1]
        self.shape = (n * self.c, n * self.c)
        self.dtype = np.dtype(np.float64)

    @property
    def nnz(self) -> int:
        """Stored entries of the expanded CSR (:meth:`tocsr`, before dropping zeros)."""
        return int(self.indices.size * np.count_nonzero(np.any(self.coef != 0, axis=0)))

    def to_host(self) -> "NodeBlockMatrix":
        """This matrix with host arrays (itself when they are on the host)."""
        if not self.on_device:
            return self
        return NodeBlockMatrix(to_host(self.indptr), to_host(self.indices), to_host(self.data), self.coef,
                               self.num_nodes, self.backend)

    def field(self, f) -> sp.csr_matrix:
        """The scalar matrix S_f (SciPy CSR)."""
        if self.on_device:
            return self.to_host().field(f)
        A = sp.csr_matrix((self.data[:, f], self.indices, self.indptr), shape=(self.num_nodes,) * 2)
        A.has_sorted_indices = True
        return A

    def congruence(self, Hn, keep=None) -> "NodeBlockMatrix":
        r""":math:`\sum_f (Z H_n^T S_f H_n Z) \otimes C_f` (Z = diag(keep) on the nodes; all kept by
        default): all F fields through one map :func:`congruence_map` on the scalar pattern."""
        if self.on_device:
            return self.to_host().congruence(Hn, keep)
        keep = np.ones(self.num_nodes, dtype=bool) if keep is None else keep
        ip, ind, T = congruence_map(self.indptr, self.indices, Hn, keep)
        return NodeBlockMatrix(ip, ind, T @ self.data, self.coef, self.num_nodes, self.backend)

    def diagonal_positions(self) -> np.ndarray:
        """Position of the entry (n, n) in the scalar pattern for every node, -1 where missing
        (on the arrays' backend)."""
        return diagonal_positions(self.indptr, self.indices, self.num_nodes)

    def diagonal(self) -> np.ndarray:
        """Diagonal of the expanded matrix, (n * c,) (host)."""
        if self.on_device:
            return self.to_host().diagonal()
        dp = self.diagonal_positions()
        cdiag = np.einsum("frr->fr", self.coef)                    # (F, c)
        d = self.data[np.maximum(dp, 0)] @ cdiag                      # (n, c)
        d[dp < 0] = 0.0
        return d.ravel()

    def tocsr(self) -> sp.csr_matrix:
        r"""SciPy CSR of the expanded matrix (sorted columns; explicit zeros kept).

        Row (n, r) holds, for every scalar entry (n, m) in column order, the components s
        of the union pattern :math:`U_r = \{s : (C_f)_{rs} \ne 0 \text{ for some } f\}`.
        Built component-major (rows (r, n): every block a contiguous (nnz, |U_r|) product
        ``data @ coef[:, r, U_r]``) and brought to the interleaved order by one CSR row
        gather (SciPy's C++ ``csr_row_index``).  Device fields are copied down first.
        """
        if self.on_device:
            return self.to_host().tocsr()
        n, c, nse = self.num_nodes, self.c, self.indices.size
        U = np.any(self.coef != 0, axis=0)
        widths = U.sum(axis=1)
        total = int(nse * widths.sum())
        it = np.int32 if max(total, n * c) < 2**31 - 1 else np.int64
        data = np.empty(total)
        indices = np.empty(total, dtype=it)
        indptr = np.empty(c * n + 1, dtype=np.int64)
        m = self.indices.astype(it) * it(c)
        off = 0
        for r in range(c):                                            # loop over components only
            cols = np.flatnonzero(U[r])
            w = cols.size
            blk = slice(off, off + nse * w)
            np.matmul(self.data, self.coef[:, r, cols], out=data[blk].reshape(nse, w))
            np.add(m[:, None], cols.astype(it)[None, :], out=indices[blk].reshape(nse, w))
            indptr[r * n:(r + 1) * n] = off + self.indptr[:-1].astype(np.int64) * w
            off += nse * w
        indptr[-1] = off
        big = sp.csr_matrix((data, indices, indptr.astype(it)), shape=self.shape, copy=False)
        big.has_sorted_indices = True
        rows = (np.arange(c, dtype=np.int64)[None, :] * n + np.arange(n, dtype=np.int64)[:, None]).ravel()
        out = big[rows]
        out.has_sorted_indices = True
        if out.indices.dtype != it:
            out.indices, out.indptr = out.indices.astype(it), out.indptr.astype(it)
        return out

    def __matmul__(self, x):
        """A @ x for a vector (n*c,): y = sum_f vec(S_f X C_f^T), X = x viewed as (n, c) (host)."""
        if self.on_device:
            return self.to_host() @ x
        x = np.asarray(x)
        if x.shape != (self.shape[1],):
            return self.tocsr() @ x
        X = x.reshape(self.num_nodes, self.c)
        Y = np.zeros_like(X, dtype=np.result_type(x.dtype, np.float64))
        for f in range(self.coef.shape[0]):                         # loop over fields only
            Y += self.field(f) @ (X @ self.coef[f].T)
        return Y.ravel()


def diagonal_positions(indptr, indices, num_nodes):
    """Position of the entry (n, n) of a scalar CSR pattern for every row n, -1 where missing;
    on the arrays' backend (NumPy or CuPy)."""
    xp = backend_of(indices).xp
    n = int(num_nodes)
    row = segment_owner((indptr[1:] - indptr[:-1]).astype(xp.int64), int(indices.shape[0]), xp=xp)
    at = xp.flatnonzero(indices == row)
    out = xp.full(n, -1, dtype=xp.int64)
    out[row[at]] = at
    return out


def expand_node_blocks(backend, indptr, indices, data, coef, num_nodes, drop_zeros=False, diagonal=None,
                       num_cols=None):
    r"""CSR of :math:`\sum_f S_f \otimes C_f` (see :class:`NodeBlockMatrix`) built on ``backend``
    (written once against its ``xp``/``sparse``: on the GPU only the pattern and the fields
    are copied up, the expanded matrix is made there).

    Destination of slot k (component ``U_r[k]``) of scalar entry e = (n, m) in row (n, r):
    ``indptr'[n c + r] + (e - indptr[n]) |U_r| + k``, with
    ``indptr'`` the prefix sum of the row lengths :math:`(indptr[n+1]-indptr[n]) |U_r|`: one
    scatter of a (nnz, |U_r|) block per component r.  ``drop_zeros``: entries equal to zero
    are removed afterwards (one compaction).  Columns stay sorted in each row.

    ``num_cols``: the scalar pattern's columns (default ``num_nodes``: square), e.g. for a
    transfer :math:`P \otimes I_c`.

    ``diagonal = (pos, D)``: also add the constant c x c block D to the scalar entries ``pos``
    (host or backend indices), as a field that is 1 at ``pos`` and 0 elsewhere with coefficient D
    would, without that field (e.g. ``s (I - Z)`` of :meth:`adaptmg.Constraints.matrix`).
    """
    xp, spm = backend.xp, backend.sparse
    coef = np.asarray(coef, dtype=np.float64)
    n, c = int(num_nodes), coef.shape[1]
    U = np.any(coef != 0, axis=0)
    if diagonal is not None:
        dblk = np.asarray(diagonal[1], dtype=np.float64)
        if dblk.shape != (c, c):
            raise ValueError(f"expand_node_blocks: the diagonal block must be {c} x {c}, got {dblk.shape}")
        U = U | (dblk != 0)
        dpos_x = backend.asarray(diagonal[0]).astype(xp.int64) if len(diagonal[0]) else None
    widths = U.sum(axis=1)
    nse = int(np.size(indices))
    total = nse * int(widths.sum())
    m = n if num_cols is None else int(num_cols)
    if max(total, n * c, m * c) >= 2**31 - 1:
        raise ValueError(f"expand_node_blocks: {total} entries need 64-bit indices, which the "
                         "backend's CSR does not take")
    it = np.int32
    # backend.asarray: large host arrays go up page-locked (one DMA), see adaptmg.backend
    ip = backend.asarray(indptr).astype(xp.int64)
    ind = backend.asarray(indices).astype(it)
    # host fields go up contiguous; device fields (also a strided view) stay where they are
    D = backend.asarray(data if is_device_array(data) else np.ascontiguousarray(data, dtype=np.float64))
    k = ip[1:] - ip[:-1]
    optr = xp.zeros(n * c + 1, dtype=xp.int64)
    optr[1:] = xp.cumsum((k[:, None] * xp.asarray(widths, dtype=xp.int64)[None, :]).ravel())
    e = xp.arange(nse, dtype=xp.int64)
    row = xp.searchsorted(ip, e, side="right") - 1              # scalar row of every entry
    within = e - ip[row]
    out_data = xp.empty(total, dtype=xp.float64)
    out_ind = xp.empty(total, dtype=it)
    starts = optr[:-1].reshape(n, c)
    for r in range(c):                                            # loop over components only
        cols = np.flatnonzero(U[r])
        w = cols.size
        dest = (starts[:, r][row] + within * w)[:, None] + xp.arange(w, dtype=xp.int64)[None, :]
        out_data[dest] = D @ xp.asarray(coef[:, r, cols])
        if diagonal is not None and dpos_x is not None:
            out_data[dest[dpos_x]] += xp.asarray(dblk[r, cols])[None, :]
        out_ind[dest] = ind[:, None] * it(c) + xp.asarray(cols.astype(it))[None, :]
    if drop_zeros:
        keep = out_data != 0
        cs = xp.zeros(total + 1, dtype=xp.int64)
        cs[1:] = xp.cumsum(keep)
        optr = cs[optr]
        out_data, out_ind = out_data[keep], out_ind[keep]
    return csr_from_arrays(spm, out_data, out_ind, optr.astype(it), (n * c, m * c))
