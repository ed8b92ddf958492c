r"""Spectral condition numbers :math:`\kappa(M) = \lambda_{max}/\lambda_{min}` of SPD matrices.

Dense matrices up to ``dense_max`` rows: all eigenvalues (``xp.linalg.eigvalsh``).  Larger
dense ones: :math:`\kappa = \lambda_{max}(M)\,\lambda_{max}(M^{-1})`, both by Lanczos with
full reorthogonalisation on the backend (the largest eigenvalue converges first), for which
the inverse must be given.  Sparse (SciPy) matrices: ARPACK's Lanczos, the smallest
eigenvalue by shift-invert (``sigma=0``) when ``ill_conditioned`` else directly.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from ..backend import backend_of, is_device_array

__all__ = ["condition_number", "lanczos_max"]


def lanczos_max(matvec, n, xp, *, steps=80, seed=0):
    """Largest eigenvalue of the symmetric operator ``matvec`` (vectors (n,) on ``xp``)."""
    steps = min(steps, n)
    rng = np.random.default_rng(seed)
    Q = xp.zeros((steps + 1, n))
    q = xp.asarray(rng.standard_normal(n))
    Q[0] = q / xp.linalg.norm(q)
    alpha, beta = np.zeros(steps), np.zeros(steps)
    k = steps
    for j in range(steps):
        w = matvec(Q[j])
        alpha[j] = float(Q[j] @ w)
        w = w - Q[:j + 1].T @ (Q[:j + 1] @ w)             # full reorthogonalisation, twice
        w = w - Q[:j + 1].T @ (Q[:j + 1] @ w)
        beta[j] = float(xp.linalg.norm(w))
        if beta[j] < 1e-12 * abs(alpha[j]):
            k = j + 1
            break
        Q[j + 1] = w / beta[j]
    T = np.diag(alpha[:k]) + np.diag(beta[:k - 1], 1) + np.diag(beta[:k - 1], -1)
    return float(np.linalg.eigvalsh(T)[-1])


def condition_number(M, *, inverse=None, dense_max=4000, ill_conditioned=False):
    """kappa(M) for an SPD dense (NumPy/CuPy) or SciPy sparse matrix ``M``.

    ``inverse``: :math:`M^{-1}` (dense array or a callable v -> M^{-1} v), needed for dense
    matrices with more than ``dense_max`` rows.
    """
    if sp.issparse(M):
        n = M.shape[0]
        if n <= dense_max:
            ev = np.linalg.eigvalsh(M.toarray())
            return float(ev[-1] / ev[0])
        lmax = sla.eigsh(M, k=1, which="LA", tol=1e-8, return_eigenvectors=False)[0]
        if ill_conditioned:
            lmin = sla.eigsh(M.tocsc(), k=1, sigma=0, which="LM", tol=1e-8, return_eigenvectors=False)[0]
        else:
            lmin = sla.eigsh(M, k=1, which="SA", tol=1e-8, return_eigenvectors=False)[0]
        return float(lmax / lmin)
    if not hasattr(M, "shape") or len(M.shape) != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"M must be a square matrix, got shape {getattr(M, 'shape', None)}")
    xp = backend_of(M).xp if is_device_array(M) else np
    n = M.shape[0]
    if n <= dense_max:
        ev = xp.linalg.eigvalsh(M)
        return float(ev[-1] / ev[0])
    if inverse is None:
        raise ValueError(f"condition_number: a dense matrix of {n} > dense_max = {dense_max} rows needs its inverse")
    inv = inverse if callable(inverse) else (lambda v: inverse @ v)
    return lanczos_max(lambda v: M @ v, n, xp) * lanczos_max(inv, n, xp)
