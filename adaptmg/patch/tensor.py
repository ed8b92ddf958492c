"""One-dimensional ingredients of the tensor-product Q_k path.

Everything the matrix-free operator, the grid transfer and the vertex-patch
smoother need is built from a handful of small 1D matrices on the reference
interval [0, 1]:

* the k+1 Gauss-Lobatto support points ``x_0 = 0 < x_1 < ... < x_k = 1`` (roots
  of P_k' plus the end points, mapped from [-1, 1]);
* the Lagrange basis ``phi_i`` on them, evaluated with a Legendre Vandermonde
  matrix (well conditioned on Gauss-Lobatto points up to k = 10);
* the element mass ``Mh_ij = int_0^1 phi_i phi_j`` and stiffness
  ``Ah_ij = int_0^1 phi_i' phi_j'`` (Gauss-Legendre with k+2 points: exact);
* the two-cell vertex-patch matrices (2k+1 x 2k+1, assembled over [0, 2]) and
  their interior rows (2k-1 x 2k+1) used for the localised residual (eq. 2.8);
* the generalised eigenpairs ``Ah S = Mh S Lambda`` with ``S^T Mh S = I`` of the
  interior patch matrices: the fast-diagonalisation factors (eqs. 2.13-2.15).

On a cell of width h the matrices scale as ``M = h Mh`` and ``A = Ah / h``.
A tensor-product operator on a Cartesian cell with widths h_0..h_{d-1} is

    A^K = sum_d c_d  (Mh x ... x Ah (position d) x ... x Mh),
    c_d = (prod_e h_e) / h_d**2,

so only the two reference matrices and d scalars are ever stored.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from numpy.polynomial import legendre as L

__all__ = ["KMAX_2D", "KMAX_3D", "check_degree", "gauss_lobatto", "lagrange_eval",
           "reference_matrices", "patch_matrices", "fast_diag_factors", "eigenvalue_sums",
           "interval_matrices", "prolongation_1d", "ell_form"]

KMAX_2D = 10
KMAX_3D = 8


def check_degree(k, dim=None) -> int:
    """Validate the polynomial degree ``k`` (1..10 in 2D, 1..8 in 3D)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"degree k must be an int, got {type(k).__name__}")
    kmax = KMAX_3D if dim == 3 else KMAX_2D
    if not 1 <= int(k) <= kmax:
        raise ValueError(f"degree k must be in 1..{kmax}" + (f" for dim={dim}" if dim else "")
                         + f", got {k}")
    return int(k)


@functools.lru_cache(maxsize=None)
def gauss_lobatto(k: int) -> np.ndarray:
    """The k+1 Gauss-Lobatto points on [0, 1] (ends included, ascending)."""
    k = check_degree(k)
    if k == 1:
        t = np.array([-1.0, 1.0])
    else:
        inner = np.sort(L.Legendre.basis(k).deriv().roots().real)
        # one Newton polish step on P_k'(x) = 0 for full double accuracy
        d1 = L.Legendre.basis(k).deriv()
        d2 = d1.deriv()
        inner = inner - d1(inner) / d2(inner)
        t = np.concatenate([[-1.0], inner, [1.0]])
    x = 0.5 * (t + 1.0)
    x.setflags(write=False)
    return x


@functools.lru_cache(maxsize=None)
def _lagrange_coeffs(k: int) -> np.ndarray:
    t = 2.0 * gauss_lobatto(k) - 1.0
    V = L.legvander(t, k)              # V[i, j] = P_j(t_i)
    return np.linalg.inv(V)            # phi_i = sum_j C[j, i] P_j


def lagrange_eval(k: int, x, deriv: int = 0) -> np.ndarray:
    """Values (deriv=0) or derivatives (deriv=1) of the k+1 Lagrange basis
    functions on the Gauss-Lobatto points at the points ``x`` in [0, 1].
    Returns an array of shape (len(x), k+1)."""
    C = _lagrange_coeffs(k)
    t = 2.0 * np.asarray(x, dtype=float) - 1.0
    if deriv == 0:
        return L.legvander(t, k) @ C
    if deriv == 1:
        # d/dx = 2 d/dt; derivative of each Legendre polynomial P_j
        D = np.zeros((t.size, k + 1))
        for j in range(k + 1):            # loop over the degree, not the mesh
            D[:, j] = L.legval(t, L.legder(np.eye(k + 1)[j]))
        return 2.0 * D @ C
    raise ValueError(f"deriv must be 0 or 1, got {deriv}")


@functools.lru_cache(maxsize=None)
def reference_matrices(k: int):
    """(Mh, Ah): 1D element mass and stiffness on [0, 1], shape (k+1, k+1)."""
    k = check_degree(k)
    q, w = L.leggauss(k + 2)
    xq, wq = 0.5 * (q + 1.0), 0.5 * w
    B = lagrange_eval(k, xq)
    D = lagrange_eval(k, xq, 1)
    Mh = B.T @ (wq[:, None] * B)
    Ah = D.T @ (wq[:, None] * D)
    Mh = 0.5 * (Mh + Mh.T)
    Ah = 0.5 * (Ah + Ah.T)
    for a in (Mh, Ah):
        a.setflags(write=False)
    return Mh, Ah


@functools.lru_cache(maxsize=None)
def patch_matrices(k: int):
    """Two-cell (vertex patch) reference matrices on [0, 2], h = 1.

    Returns ``(Mb, Ab, Mi, Ai)``: ``Mb``/``Ab`` are the interior rows
    (2k-1 x 2k+1) of the assembled patch mass/stiffness (the 1D factors of
    the rectangular matrix ``A_bar_j`` of eq. 2.8), ``Mi``/``Ai`` the interior
    block (2k-1 x 2k-1), the 1D factors of ``A_j`` in eqs. 2.11/2.12."""
    Mh, Ah = reference_matrices(k)
    n = 2 * k + 1
    Mp = np.zeros((n, n))
    Ap = np.zeros((n, n))
    Mp[:k + 1, :k + 1] += Mh
    Mp[k:, k:] += Mh
    Ap[:k + 1, :k + 1] += Ah
    Ap[k:, k:] += Ah
    Mb, Ab = Mp[1:-1].copy(), Ap[1:-1].copy()
    Mi, Ai = Mp[1:-1, 1:-1].copy(), Ap[1:-1, 1:-1].copy()
    for a in (Mb, Ab, Mi, Ai):
        a.setflags(write=False)
    return Mb, Ab, Mi, Ai


def fast_diag_factors(A, M):
    """Generalised eigenpairs of the SPD pencil (A, M) (eq. 2.15).

    Returns ``(S, lam)`` with ``A S = M S diag(lam)`` and ``S^T M S = I``, so
    that ``(sum_d c_d A_d-position Kronecker products)^{-1} =
    (S x ... x S) diag(sum_d c_d lam_d)^{-1} (S x ... x S)^T`` (eqs. 2.13/2.14)."""
    A = np.asarray(A, dtype=float)
    M = np.asarray(M, dtype=float)
    lam, S = sla.eigh(A, M)
    return S, lam


def eigenvalue_sums(lams, coeffs):
    """The diagonal of eq. (2.13): ``D[a_{d-1}, ..., a_0] = sum_d c_d lam_d[a_d]``
    (numpy axis -1 = x), summed from z to x.  ``lams``: the 1D generalised
    eigenvalues per direction, x first; ``coeffs``: c_0..c_{d-1}."""
    d = len(coeffs)
    D = np.zeros(tuple(len(lams[d - 1 - ax]) for ax in range(d)))
    for ax in range(d):
        sh = [1] * d
        sh[ax] = len(lams[d - 1 - ax])
        D = D + coeffs[d - 1 - ax] * np.asarray(lams[d - 1 - ax]).reshape(sh)
    return D


@functools.lru_cache(maxsize=None)
def patch_fast_diag(k: int):
    """Fast-diagonalisation factors (S, lam) of the reference patch interior."""
    _, _, Mi, Ai = patch_matrices(k)
    S, lam = fast_diag_factors(Ai, Mi)
    S.setflags(write=False)
    lam.setflags(write=False)
    return S, lam


def interval_matrices(k: int, n: int, interior: bool = True):
    """Assembled 1D reference mass and stiffness (h = 1 per cell) on n cells,
    CSR, with the two end points removed when ``interior`` (Dirichlet)."""
    Mh, Ah = reference_matrices(k)
    c = np.arange(n)
    idx = (k * c[:, None] + np.arange(k + 1)[None, :])          # (n, k+1)
    rows = np.broadcast_to(idx[:, :, None], (n, k + 1, k + 1)).ravel()
    cols = np.broadcast_to(idx[:, None, :], (n, k + 1, k + 1)).ravel()
    N = n * k + 1
    M = sp.coo_matrix((np.broadcast_to(Mh, (n, k + 1, k + 1)).ravel(), (rows, cols)), (N, N)).tocsr()
    A = sp.coo_matrix((np.broadcast_to(Ah, (n, k + 1, k + 1)).ravel(), (rows, cols)), (N, N)).tocsr()
    if interior:
        M, A = M[1:-1, 1:-1], A[1:-1, 1:-1]
    return M.tocsr(), A.tocsr()


def prolongation_1d(k: int, n: int, interior: bool = True, tol: float = 1e-14):
    """Interpolation from Q_k on n cells to Q_k on 2n cells (1D, CSR).

    Each coarse cell [0, 1] holds 2k+1 fine nodes ``x/2`` and ``1/2 + x/2``;
    row i of the local matrix is ``phi_j(t_i)``.  Shared vertices take the
    value once (interpolation is continuous).  Entries below ``tol`` (exact
    zeros up to rounding) are dropped."""
    x = gauss_lobatto(k)
    t = np.concatenate([0.5 * x, 0.5 + 0.5 * x[1:]])            # 2k+1 points
    Ploc = lagrange_eval(k, t)
    Ploc[np.abs(Ploc) < tol] = 0.0
    c = np.arange(n)
    fi = 2 * k * c[:, None, None] + np.arange(2 * k)[None, :, None]   # skip last fine node
    ci = k * c[:, None, None] + np.arange(k + 1)[None, None, :]
    vals = np.broadcast_to(Ploc[:2 * k], (n, 2 * k, k + 1))
    rows = np.broadcast_to(fi, (n, 2 * k, k + 1)).ravel()
    cols = np.broadcast_to(ci, (n, 2 * k, k + 1)).ravel()
    Nf, Nc = 2 * n * k + 1, n * k + 1
    P = sp.coo_matrix((vals.ravel(), (rows, cols)), (Nf, Nc)).tocsr()
    P = P + sp.coo_matrix(([1.0], ([Nf - 1], [Nc - 1])), (Nf, Nc)).tocsr()
    if interior:
        P = P[1:-1, 1:-1]
    P = P.tocsr()
    P.eliminate_zeros()
    return P


def ell_form(M):
    """ELL form of the scipy sparse matrix ``M``: ``(cols, vals, width)`` with ``cols``
    (int32) and ``vals`` (float64) of shape ``(rows, width)``, ``width`` the longest row
    (at least 1), shorter rows padded with column 0 and weight 0."""
    M = sp.csr_matrix(M)
    nnz = np.diff(M.indptr)
    width = max(1, int(nnz.max()) if nnz.size else 1)
    cols = np.zeros((M.shape[0], width), dtype=np.int32)
    vals = np.zeros((M.shape[0], width))
    rows = np.repeat(np.arange(M.shape[0]), nnz)
    pos = np.arange(M.nnz) - np.repeat(M.indptr[:-1], nnz)
    cols[rows, pos] = M.indices
    vals[rows, pos] = M.data
    return cols, vals, width
