"""One level of a multigrid hierarchy (:class:`Level`): the operator ``A_l``, the transfers
``P_l`` (from the next coarser level) and ``R_l`` (stored explicitly, never applied as a
transposed SpMV), an optional smoother and printing metadata.  The cycle that runs a list
of levels is :class:`adaptmg.multilevel.MultilevelSolver`.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import is_sparse, to_host

__all__ = ["Level", "host_csr"]


def host_csr(A, copy=True):
    """Host CSR in canonical form (sorted, no duplicates); a copy unless ``copy=False``
    and ``A`` is already canonical host CSR (then ``A`` itself)."""
    A = to_host(A)
    if not copy and sp.issparse(A) and A.format == "csr" and A.has_canonical_format:
        return A
    A = sp.csr_matrix(A, copy=True) if sp.issparse(A) else sp.csr_matrix(np.asarray(A))
    A.sum_duplicates()
    A.sort_indices()
    return A


def _shape2(M, what):
    shape = getattr(M, "shape", None)
    if shape is None or len(shape) != 2:
        raise TypeError(f"{what} must be a matrix or an operator with a 2-D .shape, "
                        f"got {type(M).__name__}")
    return (int(shape[0]), int(shape[1]))


def _nnz(M):
    return int(M.nnz) if is_sparse(M) else None


class Level:
    """One level of the hierarchy.

    Parameters
    ----------
    A : sparse matrix (CSR preferred) or operator with ``.shape``, ``.dtype``, ``@``
        The level operator ``A_l`` (``n_l x n_l``).
    P : sparse matrix or operator, optional
        Prolongation from the next **coarser** level to this one, shape
        ``n_l x n_{l-1}``; ``None`` on the coarsest level.
    R : sparse matrix or operator, optional
        Restriction to the coarser level, shape ``n_{l-1} x n_l``.  Defaults to
        ``P^T`` stored explicitly as CSR (never applied as a transposed SpMV).
        Required when ``P`` is not a sparse matrix.
    smoother : object with ``.smooth(x, b, sweeps)``, a name, or None
        ``None`` uses the solver's default smoother built from ``A``.
    meta : dict, optional
        Printing information: ``cells``, ``hanging`` (hanging nodes), ``nnz``...
    """

    def __init__(self, A, P=None, R=None, smoother=None, meta=None):
        n, m = _shape2(A, "Level.A")
        if n != m:
            raise ValueError(f"Level.A must be square, got shape {(n, m)}")
        if not is_sparse(A) and not hasattr(A, "__matmul__"):
            raise TypeError(f"Level.A must support A @ x, got {type(A).__name__}")
        self.A = A
        self.n = n
        if P is not None:
            pr, pc = _shape2(P, "Level.P")
            if pr != n:
                raise ValueError(f"Level.P must have {n} rows (this level's size), got shape {(pr, pc)}")
            if R is None:
                if not is_sparse(P):
                    raise ValueError("Level.R is required when P is not a sparse matrix")
                R = P.T.tocsr()
            rr, rc = _shape2(R, "Level.R")
            if (rr, rc) != (pc, pr):
                raise ValueError(f"Level.R must have shape {(pc, pr)} (= P^T), got {(rr, rc)}")
        elif R is not None:
            raise ValueError("Level.R given without Level.P")
        self.P = P
        self.R = R
        self.smoother = smoother
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"Level.meta must be a dict, got {type(meta).__name__}")
        self.meta = dict(meta or {})

    @property
    def nnz(self):
        v = _nnz(self.A)
        return v if v is not None else self.meta.get("nnz")

    def __repr__(self):
        return f"Level(n={self.n}, nnz={self.nnz}, P={'yes' if self.P is not None else 'no'})"
