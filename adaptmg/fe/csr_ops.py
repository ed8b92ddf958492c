"""Small O(nnz) helpers on SciPy CSR matrices used during setup."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _count_before(indptr: np.ndarray, p: np.ndarray) -> np.ndarray:
    """For each ``indptr[r]``, how many of the sorted entry positions ``p`` lie before it
    (= ``np.searchsorted(p, indptr)``), through the rows of the (few) positions."""
    rows = np.searchsorted(indptr, p, side="right") - 1          # row holding each position
    return np.cumsum(np.bincount(rows + 1, minlength=indptr.size))


def mask_rows_cols(A, rows: np.ndarray, cols: np.ndarray, diagonal=None) -> sp.csr_matrix:
    """A copy of CSR ``A`` with the entries outside ``rows`` x ``cols`` (boolean masks) removed.

    Equals ``diag(rows) @ A @ diag(cols)`` without two sparse products.  With
    ``diagonal`` (a number, square A), each removed row becomes the single entry
    ``diagonal`` on the diagonal: ``diag(rows) A diag(cols) + diagonal (I - diag(rows))``.
    Each row keeps its order, so sorted input gives sorted output.

    Cost: one boolean per entry (row mask repeated, column mask gathered), one compression
    of data and indices; the new row pointers come from the fewer of the dropped or kept
    entries: ``indptr_new[r] = indptr[r] - #{dropped before indptr[r]} = #{kept before
    indptr[r]}``.  A removed row that stores exactly one diagonal entry keeps that entry
    (set to ``diagonal``); only removed rows without one (e.g. the hanging rows of
    H^T A H) get an inserted entry.
    """
    A = sp.csr_matrix(A)
    indptr, indices = A.indptr, A.indices
    rowlen = np.diff(indptr)
    keep = np.repeat(rows, rowlen)                 # one bool per entry, no index gather
    keep &= cols[indices]
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
    out = sp.csr_matrix((data, indices, indptr.astype(A.indptr.dtype, copy=False)), shape=A.shape)
    out.has_sorted_indices = A.has_sorted_indices
    return out


def congruence_with_constraints(A, H, hanging: np.ndarray) -> sp.csr_matrix:
    r"""H^T A H for a constraint matrix H that differs from I only in the rows ``hanging``.

    With H = I + S^T D (S selects the hanging rows, D = H[hanging] - I[hanging]):

    .. math:: H^T A H = A + (A S^T) D + D^T (S A) + D^T (S A S^T) D,

    where every correction involves only the hanging rows/columns of A, so the cost is
    one pass over A plus work proportional to the hanging part -- instead of two full
    sparse products.
    """
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
