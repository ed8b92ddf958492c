"""One-dimensional ingredients of the spectral-element path (seed 004 §2-4).

On the reference interval [0, 1] with the k+1 Gauss-Lobatto-Legendre (GLL) points
``t_0 = 0 < ... < t_k = 1`` (:func:`adaptmg.patch.tensor.gauss_lobatto`):

* GLL weights ``rho_i = 1 / (k (k+1) P_k(2 t_i - 1)^2)`` (sum 1): the collocated
  quadrature, exact for degree 2k-1, that makes the mass matrix diagonal;
* the differentiation matrix ``D_qp = phi_p'(t_q)`` of the Lagrange basis on the
  GLL points (the derivative of the interpolant at the GLL points);
* the ``quadrature="gauss"`` alternative (BK1/BK3 of seed 002): ``k+2`` Gauss-Legendre
  points, the interpolation ``B_qp = phi_p(s_q)`` and derivative ``DB_qp = phi_p'(s_q)``;
* the 1D extended-pencil matrices of seed 004 §4.2 (eq. 10): the element plus one
  GLL node of each neighbour (k+3 nodes, indices -1..k+1), stiffness and lumped mass
  assembled over the cells of width 1 around it with homogeneous Dirichlet conditions at the
  next nodes (-2 and k+2), and their generalised eigenpairs ``K S = M S diag(lam)``,
  ``S^T M S = I`` -- the fast-diagonalisation factors of the separable local solve.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg as sla
from numpy.polynomial import legendre as L

from ..patch.tensor import check_degree, gauss_lobatto, lagrange_eval

__all__ = ["KMAX", "check_spectral_degree", "gll_points", "gll_weights", "gll_derivative",
           "quadrature_rule", "pencil_factors", "local_indices", "SIDE_EXTEND", "SIDE_DIRICHLET", "SIDE_FREE"]

KMAX = 8

# per cell side of the extended pencil: a neighbour across it (extend by one node),
# a Dirichlet boundary (the element's end node is fixed), a free (Neumann) boundary
SIDE_EXTEND, SIDE_DIRICHLET, SIDE_FREE = 0, 1, 2


def local_indices(k: int, dim: int) -> np.ndarray:
    """((k+1)^d, d) tensor index (a_0 = x, ...) of each local node of a cell, x fastest."""
    a = np.arange((k + 1) ** dim)
    return np.stack([(a // (k + 1) ** ax) % (k + 1) for ax in range(dim)], axis=1)


def check_spectral_degree(k) -> int:
    """Validate the degree ``k`` (1..8; TypeError for non-integers)."""
    k = check_degree(k)
    if k > KMAX:
        raise ValueError(f"spectral degree k must be in 1..{KMAX}, got {k}")
    return k


def gll_points(k: int) -> np.ndarray:
    """The k+1 GLL points on [0, 1]."""
    return gauss_lobatto(check_spectral_degree(k))


@functools.lru_cache(maxsize=None)
def gll_weights(k: int) -> np.ndarray:
    """GLL quadrature weights on [0, 1] (they sum to 1)."""
    t = 2.0 * gll_points(k) - 1.0
    w = 1.0 / (k * (k + 1) * L.legval(t, np.eye(k + 1)[k]) ** 2)
    w.setflags(write=False)
    return w


@functools.lru_cache(maxsize=None)
def gll_derivative(k: int) -> np.ndarray:
    """``D_qp = phi_p'(t_q)`` on the GLL points of [0, 1], shape (k+1, k+1)."""
    D = lagrange_eval(k, gll_points(k), 1)
    D.setflags(write=False)
    return D


@functools.lru_cache(maxsize=None)
def quadrature_rule(k: int, kind: str = "gll"):
    """``(B, DB, w)`` of a tensor quadrature for Q_k on [0, 1]: ``B`` (nq, k+1) interpolates
    nodal values to the points (None for the collocated GLL rule), ``DB`` (nq, k+1) gives
    the derivative there, ``w`` (nq,) the weights."""
    k = check_spectral_degree(k)
    if kind == "gll":
        return None, gll_derivative(k), gll_weights(k)
    if kind == "gauss":
        q, w = L.leggauss(k + 2)
        s = 0.5 * (q + 1.0)
        B, DB, w = lagrange_eval(k, s), lagrange_eval(k, s, 1), 0.5 * w
        for a in (B, DB, w):
            a.setflags(write=False)
        return B, DB, w
    raise ValueError(f"quadrature must be 'gll' or 'gauss', got {kind!r}")


@functools.lru_cache(maxsize=None)
def _pencil_matrices(k: int, left: int, right: int):
    """Extended 1D stiffness and lumped mass (k+3 nodes, width-1 cells) for the side kinds
    ``left``/``right``; removed nodes (no neighbour, or a Dirichlet end) get a unit row."""
    D, w = gll_derivative(k), gll_weights(k)
    Kel = D.T @ (w[:, None] * D)                 # GLL stiffness (exact: degree 2k-2)
    n = 5 * k + 1                                # five cells, nodes 0..5k; the element is 2k..3k
    K, M = np.zeros((n, n)), np.zeros(n)         # (five: for k = 1 node -1 is a vertex of two cells)
    for c in range(5):                           # reference cells, not the mesh
        K[c * k:(c + 1) * k + 1, c * k:(c + 1) * k + 1] += Kel
        M[c * k:(c + 1) * k + 1] += w
    keep = np.arange(2 * k - 1, 3 * k + 2)       # nodes -1..k+1 of the element
    K, M = K[np.ix_(keep, keep)], np.diag(M[keep])
    drop = []
    if left != SIDE_EXTEND:
        drop.append(0)                           # no neighbour node
        if left == SIDE_DIRICHLET:
            drop.append(1)
        else:                                    # free end: the element's own end node
            K[1, 1], M[1, 1] = Kel[0, 0], w[0]
    if right != SIDE_EXTEND:
        drop.append(k + 2)
        if right == SIDE_DIRICHLET:
            drop.append(k + 1)
        else:
            K[k + 1, k + 1], M[k + 1, k + 1] = Kel[k, k], w[k]
    for i in drop:
        K[i, :] = K[:, i] = 0.0
        M[i, :] = M[:, i] = 0.0
        K[i, i] = M[i, i] = 1.0
    return K, M, np.array(drop, dtype=np.int64)


@functools.lru_cache(maxsize=None)
def pencil_factors(k: int):
    """Fast-diagonalisation factors of the 9 extended pencils (3 side kinds a side).

    Returns ``(S, lam, keep)`` of shapes (9, k+3, k+3), (9, k+3), (9, k+3): pencil
    ``3 left + right`` has ``K S = M S diag(lam)``, ``S^T M S = I``; ``keep`` is 0 on
    the nodes that do not belong to that pencil (their modes never see data)."""
    k = check_spectral_degree(k)
    S = np.zeros((9, k + 3, k + 3))
    lam = np.zeros((9, k + 3))
    keep = np.ones((9, k + 3))
    for left in range(3):                        # the 9 side kinds, not the mesh
        for right in range(3):
            K, M, drop = _pencil_matrices(k, left, right)
            lam[3 * left + right], S[3 * left + right] = sla.eigh(K, M)
            keep[3 * left + right, drop] = 0.0
    for a in (S, lam, keep):
        a.setflags(write=False)
    return S, lam, keep
