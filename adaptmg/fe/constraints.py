r"""Hanging-node and Dirichlet constraints: from an assembled system to a solvable one.

Let A, b be assembled over all DoFs of a space (hanging ones included) and H the
hanging-node matrix of :class:`~adaptmg.fe.space.Space`.  Every FE function is
u = H x where x holds the values at regular DoFs.  With the Dirichlet DoFs D
fixed to g and Z the 0/1 diagonal of the *free* DoFs (neither hanging nor in D),
the constrained system is

.. math::

    K = Z H^T A H Z + s (I - Z), \qquad
    f = Z H^T (b - A H g) + s\, g ,

where g is zero outside D and s > 0 is the mean diagonal of the free block (so
the identity rows do not spoil the conditioning).  Hanging rows of f are zero.
K is symmetric whenever A is.  After solving K x = f, the finite element
solution is ``u = H x`` (:meth:`Constraints.expand`).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .csr_ops import congruence_with_constraints, mask_rows_cols
from .space import Space

__all__ = ["Constraints"]


class Constraints:
    """Hanging-node constraints of ``space`` plus Dirichlet values on ``dirichlet`` DoFs.

    Parameters
    ----------
    space : Space
    dirichlet : array of DoF indices, optional
        e.g. ``space.boundary_dofs(ids=[0, 1])``.  Hanging DoFs are dropped from it
        (their values follow from their parents).
    values : float, array (num_dofs,) or callable g(x) -> (n,) or (n, c), optional
        Dirichlet values (default 0).
    """

    def __init__(self, space: Space, dirichlet=None, values=None):
        if not isinstance(space, Space):
            raise TypeError(f"Constraints expects a Space, got {type(space).__name__}")
        self.space = space
        n = space.num_dofs
        D = np.zeros(0, dtype=np.int64) if dirichlet is None else np.asarray(dirichlet)
        if D.size and not np.issubdtype(D.dtype, np.integer):
            raise ValueError(f"dirichlet must be an integer array of DoF indices, got dtype {D.dtype}")
        if D.size and (D.min() < 0 or D.max() >= n):
            raise ValueError(f"dirichlet DoF indices must lie in [0, {n}), got range [{D.min()}, {D.max()}]")
        hang = space.is_hanging
        fixed = np.zeros(n, dtype=bool)
        fixed[D] = True
        fixed &= ~hang
        self.dirichlet = np.flatnonzero(fixed)
        self.free = ~(fixed | hang)
        self.g = np.zeros(n)
        if values is not None and self.dirichlet.size:
            if callable(values):
                full = space.interpolate(values)
            else:
                full = np.broadcast_to(np.asarray(values, dtype=float), (n,)) if np.ndim(values) == 0 \
                    else np.asarray(values, dtype=float)
                if full.shape != (n,):
                    raise ValueError(f"values must be a scalar, an array of shape ({n},) or a callable, "
                                     f"got shape {full.shape}")
            if not np.isfinite(full[self.dirichlet]).all():
                raise ValueError("Dirichlet values contain NaN or Inf")
            self.g[self.dirichlet] = full[self.dirichlet]
        self.H = space.H
        self._scale = None

    @property
    def num_free(self) -> int:
        return int(self.free.sum())

    def _check_square(self, A):
        n = self.space.num_dofs
        if A.shape != (n, n):
            raise ValueError(f"matrix has shape {A.shape}, the space has {n} DoFs")

    def project(self, A) -> sp.csr_matrix:
        """H^T A H (all rows kept), the matrix acting on regular DoF values."""
        A = sp.csr_matrix(A)
        self._check_square(A)
        if self.space.hanging_nodes.size == 0:
            return A
        return congruence_with_constraints(A, self.H, np.flatnonzero(self.space.is_hanging))

    def matrix(self, A) -> sp.csr_matrix:
        """Constrained matrix K = Z H^T A H Z + s (I - Z)."""
        B = self.project(A)
        d = np.abs(B.diagonal()[self.free])
        self._scale = float(d.mean()) if d.size and d.mean() > 0 else 1.0
        K = mask_rows_cols(B, self.free, self.free, diagonal=self._scale)
        K.eliminate_zeros()
        K.sort_indices()
        return K

    def rhs(self, b, A=None) -> np.ndarray:
        """Constrained right-hand side f = Z H^T (b - A H g) + s g (A needed when g != 0)."""
        b = np.asarray(b, dtype=float)
        if b.shape != (self.space.num_dofs,):
            raise ValueError(f"right-hand side has shape {b.shape}, expected ({self.space.num_dofs},)")
        r = b
        if self.dirichlet.size and np.any(self.g):
            if A is None:
                raise ValueError("rhs needs the assembled matrix A to lift non-zero Dirichlet values")
            r = b - A @ (self.H @ self.g)
        f = self.H.T @ r
        f[~self.free] = 0.0
        if self._scale is None:
            if A is None:
                raise ValueError("call matrix(A) first or pass A: the Dirichlet row scale comes from A")
            self.matrix(A)
        f[self.dirichlet] = self._scale * self.g[self.dirichlet]
        return f

    def apply(self, A, b):
        """(K, f): the constrained matrix and right-hand side."""
        K = self.matrix(A)
        return K, self.rhs(b, A)

    def expand(self, x):
        """Finite element nodal values u = H x (numpy or cupy x; H moved to x's device once)."""
        from ..backend import backend_of
        be = backend_of(x)
        if be.is_gpu:
            if getattr(self, "_H_dev", None) is None:
                self._H_dev = be.asmatrix(self.H)
            return self._H_dev @ x
        x = np.asarray(x)
        if x.shape != (self.space.num_dofs,):
            raise ValueError(f"x has shape {x.shape}, expected ({self.space.num_dofs},)")
        return self.H @ x
