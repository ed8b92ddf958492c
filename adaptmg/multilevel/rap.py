r"""Galerkin triple products :math:`R A P` that stay inside cuSPARSE's 32-bit indices.

cupyx's sparse product (cuSPARSE SpGEMM) counts the entries of a product in 32-bit
integers: when :math:`A P` has more than :math:`2^{31} - 1` of them, the result comes back
wrong without an error (measured on an H200: ``adaptmg.amg`` on the 3-D Q1 matrix of
20,984,719 rows, 567M entries, got a first coarse level with 993,675 zero diagonal entries).
On the device the product is therefore summed over row blocks :math:`I_b` of :math:`A`,

.. math::  R A P = \sum_b R_{:, I_b} \, (A_{I_b, :} P),

with each block's work bounded: row :math:`k` of :math:`A` costs

.. math::  w_k = \sum_{j \in A_k} \mathrm{nnz}(P_{j,:})

multiply-adds in :math:`A P` (an upper bound on its entries in row :math:`k`), and a block
holds rows whose :math:`w_k` sum to at most ``limit`` (default :math:`2^{30}`).  Below the
limit it is the one product ``R @ (A @ P)`` as before (a 3-D Q1 matrix of 2.66M rows and its
smoothed-aggregation P: about 6e8 by this count, estimated from its row lengths).  SciPy
switches to 64-bit indices by itself, so host matrices are multiplied directly unless a
``limit`` is given (the tests run the blocked path so).
The blocks' products are summed in one pass (their entries stacked, duplicates summed); a
block the device refuses (cuSPARSE's own buffers beside CuPy's memory pool) is split in
halves.  Known limit: on the 21M-row matrix the blocked products still stopped with
cuSPARSE's INSUFFICIENT_RESOURCES (H200, CuPy 14.2): a RuntimeError that says so and
names ``setup='pyamg'``, no longer a wrong matrix.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, is_device_error, is_device_sparse, to_host

__all__ = ["rap", "LIMIT"]

#: work per block of rows on the device (multiply-adds of its rows of A P)
LIMIT = 2 ** 30


def _row_work(A, P, xp):
    """:math:`w_k` of the module docstring, per row of ``A`` (int64)."""
    p_row = xp.diff(P.indptr).astype(xp.int64)
    acc = xp.zeros(A.indices.size + 1, dtype=xp.int64)
    xp.cumsum(p_row[A.indices], out=acc[1:])
    return acc[A.indptr[1:]] - acc[A.indptr[:-1]]


def rap(R, A, P, limit=None):
    """:math:`R A P` as a CSR matrix of ``A``'s backend (see the module docstring).

    ``limit``: the bound on a block's work; default :data:`LIMIT` for device matrices and no
    blocking for host ones."""
    if R.shape[1] != A.shape[0] or A.shape[1] != P.shape[0]:
        raise ValueError(f"rap: shapes do not chain: R {R.shape}, A {A.shape}, P {P.shape}")
    device = is_device_sparse(A)
    if limit is None:
        if not device:
            return (R @ (A @ P)).tocsr()
        limit = LIMIT
    be = backend_of(A) if device else None
    xp, sparse = (be.xp, be.sparse) if device else (np, sp)
    A, P, R = A.tocsr(), P.tocsr(), R.tocsr()
    w = _row_work(A, P, xp)
    total = int(w.sum())
    if total <= limit:
        return (R @ (A @ P)).tocsr()
    # cut the rows where the running work passes multiples of total / nb (nb blocks of at
    # most ~limit each; one block per row at worst, whatever a single row costs)
    nb = math.ceil(2 * total / limit)
    run = xp.cumsum(w)
    marks = xp.asarray(np.arange(1, nb, dtype=np.int64) * (total // nb))
    cuts = np.unique(np.concatenate([[0], to_host(xp.searchsorted(run, marks, side="right")), [A.shape[0]]]))
    Rc = R.tocsc()
    parts = []
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):        # O(blocks): a handful
        if r1 > r0:
            parts.extend(_block(Rc, A, P, r0, r1, xp))
    if len(parts) == 1:
        return parts[0]
    # the blocks' sum in one pass: their entries stacked, duplicates summed by the conversion
    coo = [p.tocoo() for p in parts]
    out = sparse.coo_matrix((xp.concatenate([c.data for c in coo]),
                             (xp.concatenate([c.row for c in coo]), xp.concatenate([c.col for c in coo]))),
                            shape=(R.shape[0], P.shape[1]))
    out.sum_duplicates()
    return out.tocsr()


def _block(Rc, A, P, r0, r1, xp, depth=0):
    """The products of rows ``r0:r1`` of ``A``: ``[R[:, r0:r1] (A[r0:r1] P)]``, or those of its
    halves when the device refuses (cuSPARSE reports INSUFFICIENT_RESOURCES where its own
    buffers do not fit beside CuPy's memory pool: the pool's cached blocks are freed first)."""
    try:
        return [(Rc[:, r0:r1].tocsr() @ (A[r0:r1] @ P)).tocsr()]
    except Exception as exc:                              # noqa: BLE001 - device errors only
        if xp is np or not is_device_error(exc):
            raise
        if r1 - r0 < 2 or depth >= 8:
            raise RuntimeError(
                f"rap: the device's sparse library could not form rows {r0}:{r1} of the Galerkin "
                f"product R (A P) ({A.shape[1]:,} columns of A), not even after {depth} halvings "
                f"({type(exc).__name__}: {exc}); known for adaptmg.amg's device set-up of a 3-D Q1 "
                f"matrix of 21M rows (H200, CuPy 14.2): use setup='pyamg' there") from exc
    xp.get_default_memory_pool().free_all_blocks()
    mid = (r0 + r1) // 2
    return _block(Rc, A, P, r0, mid, xp, depth + 1) + _block(Rc, A, P, mid, r1, xp, depth + 1)
