r"""Cell geometry of the multilinear (isoparametric) map, vectorised over cells.

Every cell T is the image of the reference cell :math:`[0,1]^d` under

.. math::  x(\hat x) = \sum_{v=0}^{2^d-1} X_v \hat N_v(\hat x),

where :math:`X_v` are the cell's vertices in lexicographic order and
:math:`\hat N_v` the :math:`Q_1` basis. Its Jacobian
:math:`J_{ab} = \partial x_a / \partial \hat x_b` gives the volume element
:math:`dx = \det J \, d\hat x` and the chain rule for gradients,
:math:`\nabla_x \phi = J^{-T} \nabla_{\hat x} \hat\phi`.

All arrays are laid out as (cells, quadrature points, ...). J is computed with
one matrix product over all cells (vertex coordinates times reference
gradients), the determinant and inverse with explicit cofactor formulas. A
cell whose determinant is not positive at some quadrature point (inverted,
degenerate or wrongly ordered) is an error.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of
from .element import LagrangeQ

__all__ = ["CellGeometry", "cell_geometry", "jacobian_error", "metric_factor", "q1_tables", "affine_mask", "sym_pairs", "matmul_serial"]


_GEMM_SERIAL = 1 << 18   # OpenBLAS runs dgemm single-threaded up to m*n*k = 65536 * 4


def matmul_serial(A, B, out=None):
    """``A @ B`` (2-D) in row blocks small enough for BLAS to stay single-threaded.

    Assembly multiplies tall, thin matrices (cells x small) by small reference
    tensors. Multi-threaded BLAS gains nothing on such memory-bound products and
    its thread hand-off collapses on a loaded machine (measured: 10x slower with
    2 OpenBLAS threads on a busy 2-core box), so the rows are split into blocks
    with m*n*k <= 2^18, which OpenBLAS executes on the calling thread.
    """
    m, k = A.shape
    n = B.shape[1]
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(A, B))
    rows = max(1, _GEMM_SERIAL // max(1, n * k))
    if rows >= m:
        return np.matmul(A, B, out=out)
    for r in range(0, m, rows):
        np.matmul(A[r:r + rows], B, out=out[r:r + rows])
    return out


def jacobian_error(bad_mask):
    """ValueError for cells with det J <= 0; ``bad_mask`` is a boolean array over cells."""
    bad = np.flatnonzero(bad_mask)
    return ValueError(
        f"{bad.size} cell(s) have a non-positive Jacobian determinant at a quadrature point "
        f"(first offending cell index {bad[0]}); check the vertex ordering (lexicographic: "
        f"vertex v at reference corner (v&1, (v>>1)&1, (v>>2)&1)) and that no cell is inverted")


def _det(J):
    """Determinant of a stack of 1x1 / 2x2 / 3x3 matrices (..., d, d)."""
    d = J.shape[-1]
    if d == 1:
        return J[..., 0, 0].copy()
    if d == 2:
        return J[..., 0, 0] * J[..., 1, 1] - J[..., 0, 1] * J[..., 1, 0]
    return (J[..., 0, 0] * (J[..., 1, 1] * J[..., 2, 2] - J[..., 1, 2] * J[..., 2, 1])
            - J[..., 0, 1] * (J[..., 1, 0] * J[..., 2, 2] - J[..., 1, 2] * J[..., 2, 0])
            + J[..., 0, 2] * (J[..., 1, 0] * J[..., 2, 1] - J[..., 1, 1] * J[..., 2, 0]))


def sym_pairs(d):
    """Index pairs (a, b), a <= b, of the packed symmetric d x d layout used by :func:`metric_factor`."""
    return [(a, b) for a in range(d) for b in range(a, d)]


def metric_factor(J, detJ, w, packed=False):
    r"""Stiffness factor :math:`F = w \det J\, J^{-1}J^{-T} = w\,\mathrm{adj}(J^TJ)/\det J`.

    Uses the cofactors of the symmetric metric :math:`J^TJ` (no inverse needed).
    Returns (..., d, d), or with ``packed=True`` the d(d+1)/2 entries
    ``F[..., a, b]`` for the pairs of :func:`sym_pairs`, shape (..., d(d+1)/2).
    """
    d = J.shape[-1]
    g = [[None] * d for _ in range(d)]
    for a in range(d):
        for b in range(a, d):
            g[a][b] = g[b][a] = (J[..., :, a] * J[..., :, b]).sum(-1)
    s = w / detJ
    pairs = sym_pairs(d)
    out = backend_of(J).xp.empty(J.shape[:-2] + (len(pairs),))     # NumPy or CuPy J
    for p, (a, b) in enumerate(pairs):
        if d == 1:
            out[..., p] = s
        elif d == 2:
            out[..., p] = (g[1 - a][1 - b] if a == b else -g[a][b]) * s
        else:
            a1, a2, b1, b2 = (a + 1) % 3, (a + 2) % 3, (b + 1) % 3, (b + 2) % 3
            out[..., p] = (g[a1][b1] * g[a2][b2] - g[a1][b2] * g[a2][b1]) * s
    if packed:
        return out
    F = backend_of(J).xp.empty(J.shape)
    for p, (a, b) in enumerate(pairs):
        F[..., a, b] = F[..., b, a] = out[..., p]
    return F


@functools.lru_cache(maxsize=None)
def _twist_terms(nv):
    """Vertex index tuples (plus, minus) of the coefficients of the monomials of degree >= 2:
    the coefficient of prod_{a in S} xhat_a is sum_{v subset S} (-1)^{|S| - |v|} X_v."""
    out = []
    for S in range(nv):
        k = bin(S).count("1")
        if k < 2:
            continue
        sub = [v for v in range(nv) if v & ~S == 0]
        out.append((tuple(v for v in sub if (k - bin(v).count("1")) % 2 == 0),
                    tuple(v for v in sub if (k - bin(v).count("1")) % 2 == 1)))
    return tuple(out)


def affine_mask(X, rtol=1e-12):
    r"""Cells whose multilinear map is affine (parallelograms / parallelepipeds), boolean (ncells,).

    The map is :math:`x(\hat x) = \sum_\alpha c_\alpha \hat x^\alpha` over the multi-indices
    :math:`\alpha \in \{0,1\}^d`; it is affine iff every coefficient with
    :math:`|\alpha| \ge 2` vanishes (relative to the cell size
    :math:`\max_v |X_v - X_0|_\infty`). The coefficients are signed sums of vertex rows
    (:func:`_twist_terms`), evaluated on a (vertices, dim, cells) copy of X so that every
    operation runs over contiguous rows of ncells values.
    """
    X = np.asarray(X, dtype=np.float64)
    nc, nv, d = X.shape
    terms = _twist_terms(nv)
    if not terms or nc == 0:
        return np.ones(nc, dtype=bool)
    Xc = np.ascontiguousarray(X.transpose(1, 2, 0))        # (nv, d, nc)
    twist = None
    for plus, minus in terms:
        t = Xc[plus[0]] - Xc[minus[0]]
        for v in plus[1:]:
            t += Xc[v]
        for v in minus[1:]:
            t -= Xc[v]
        np.abs(t, out=t)
        tm = t.max(axis=0)
        twist = tm if twist is None else np.maximum(twist, tm, out=twist)
    D = Xc[1:] - Xc[:1]
    np.abs(D, out=D)
    size = D.reshape(-1, nc).max(axis=0)
    return twist <= rtol * size


def _det_inv(J):
    """Determinant and inverse of a stack of 2x2 / 3x3 matrices (..., d, d) (NumPy or CuPy)."""
    xp = backend_of(J).xp
    d = J.shape[-1]
    if d == 1:
        det = J[..., 0, 0].copy()
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / J
        return det, inv
    if d == 2:
        a, b, c, e = J[..., 0, 0], J[..., 0, 1], J[..., 1, 0], J[..., 1, 1]
        det = a * e - b * c
        adj = xp.empty_like(J)
        adj[..., 0, 0] = e
        adj[..., 0, 1] = -b
        adj[..., 1, 0] = -c
        adj[..., 1, 1] = a
    elif d == 3:
        adj = xp.empty_like(J)
        j = [[J[..., r, s] for s in range(3)] for r in range(3)]
        # adj[s, r] = cofactor(r, s)
        for r in range(3):
            r1, r2 = (r + 1) % 3, (r + 2) % 3
            for s in range(3):
                s1, s2 = (s + 1) % 3, (s + 2) % 3
                adj[..., s, r] = j[r1][s1] * j[r2][s2] - j[r1][s2] * j[r2][s1]
        det = j[0][0] * adj[..., 0, 0] + j[0][1] * adj[..., 1, 0] + j[0][2] * adj[..., 2, 0]
    else:
        raise ValueError(f"dimension must be 1, 2 or 3, got {d}")
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = adj / det[..., None, None]
    return det, inv


_Q1_CACHE = {}


def q1_tables(dim, xi):
    """Q1 values (nq, 2^d) and reference gradients (nq, 2^d, d) at ``xi``, memoised."""
    xi = np.ascontiguousarray(xi, dtype=np.float64)
    key = (dim, xi.shape, xi.tobytes())
    hit = _Q1_CACHE.get(key)
    if hit is None:
        q1 = LagrangeQ(1, dim)
        xi = q1._points(xi)
        hit = (q1.values(xi), q1.gradients(xi))
        if len(_Q1_CACHE) > 64:
            _Q1_CACHE.clear()
        _Q1_CACHE[key] = hit
    return hit


class CellGeometry:
    r"""Geometry of a set of cells at reference points ``xi`` (nq x d).

    Attributes
    ----------
    J : (ncells, nq, d, d)      :math:`J_{ab} = \partial x_a/\partial \hat x_b`
    detJ : (ncells, nq)
    invJ : (ncells, nq, d, d)   :math:`J^{-1}` (computed on first access); ``invJT`` is :math:`J^{-T}`
    x : (ncells, nq, d)         physical points (computed on first access)
    bad : boolean (ncells,)     cells with det J <= 0 at some point (only with ``check=False``)
    """

    def __init__(self, vertices, xi, check=True):
        X = np.asarray(vertices, dtype=np.float64)
        if X.ndim != 3:
            raise ValueError(f"vertices must have shape (ncells, 2**dim, dim), got {X.shape}")
        nc, nv, d = X.shape
        if nv != 2 ** d or d not in (1, 2, 3):
            raise ValueError(f"vertices must have shape (ncells, 2**dim, dim) with dim in 1..3, got {X.shape}")
        xi = np.asarray(xi, dtype=np.float64)
        if xi.ndim == 1 and xi.shape[0] == d:
            xi = xi[None, :]
        if xi.ndim != 2 or xi.shape[1] != d:
            raise ValueError(f"xi must have shape (npoints, {d}), got {xi.shape}")
        self._N, dN = q1_tables(d, xi)
        nq = xi.shape[0]
        self.dim, self.num_cells, self.num_points = d, nc, nq
        self.xi = xi
        self._X = X
        # J[c, q, a, b] = sum_v X[c, v, a] dN[q, v, b]  as one GEMM (nc*d, V) @ (V, nq*d)
        Xt = np.ascontiguousarray(X.transpose(0, 2, 1)).reshape(nc * d, nv)
        Jt = matmul_serial(Xt, np.ascontiguousarray(dN.transpose(1, 0, 2).reshape(nv, nq * d)))
        self.J = np.ascontiguousarray(Jt.reshape(nc, d, nq, d).transpose(0, 2, 1, 3))
        self.detJ = _det(self.J)
        bad = ~(self.detJ > 0).all(axis=1)            # catches NaN too
        self.bad = bad
        if check and bad.any():
            raise jacobian_error(bad)
        self._x = None
        self._invJ = None

    def head(self, n=1):
        """Geometry of the first ``n`` cells: views of this one's arrays (``J``, ``detJ``, ``bad``,
        and ``invJ`` / ``x`` once computed); what it computes later (``invJ``: element-wise from
        ``J``) has the same values as the corresponding rows here. Other attributes (e.g. the
        ``affine`` flag of assembly chunks) are copied."""
        g = object.__new__(CellGeometry)
        g.__dict__.update(self.__dict__)
        g.num_cells = min(int(n), self.num_cells)
        g._X, g.J, g.detJ, g.bad = self._X[:n], self.J[:n], self.detJ[:n], self.bad[:n]
        g._invJ = None if self._invJ is None else self._invJ[:n]
        g._x = None if self._x is None else self._x[:n]
        return g

    def congruent(self):
        """True if every cell has the same Jacobian, bit for bit, at every point (e.g. the
        translated cells of a uniform box mesh): per-cell quantities computed element-wise
        from ``J`` are then the same for all cells (see :meth:`head`)."""
        J = self.J
        return J.shape[0] > 0 and bool((J == J[:1]).all())

    @property
    def invJ(self):
        """:math:`J^{-1}`, (ncells, nq, d, d)."""
        if self._invJ is None:
            self._invJ = _det_inv(self.J)[1]
        return self._invJ

    @property
    def invJT(self):
        """:math:`J^{-T}` (a transposed view of ``invJ``)."""
        return self.invJ.swapaxes(-1, -2)

    @property
    def x(self):
        """Physical coordinates of the points, (ncells, nq, d)."""
        if self._x is None:
            nc, nv, d = self._X.shape
            Xt = np.ascontiguousarray(self._X.transpose(0, 2, 1)).reshape(nc * d, nv)
            self._x = matmul_serial(Xt, np.ascontiguousarray(self._N.T)).reshape(nc, d, -1).transpose(0, 2, 1)
        return self._x

    def physical_gradients(self, ref_grads):
        r"""Physical gradients :math:`J^{-T}\nabla_{\hat x}\hat\phi`, shape (ncells, nq, nloc, d).

        ``ref_grads`` is (nq, nloc, d) as returned by :meth:`LagrangeQ.gradients`.
        """
        return np.einsum("cqba,qib->cqia", self.invJ, ref_grads, optimize=True)

    def volumes(self, weights):
        """Cell volumes :math:`\\sum_q w_q \\det J_q`, shape (ncells,)."""
        return self.detJ @ np.asarray(weights, dtype=np.float64)


def cell_geometry(mesh, xi, cells=None, check=True):
    """:class:`CellGeometry` of ``mesh`` (all cells, or the index array/slice ``cells``) at ``xi``."""
    pts = np.asarray(mesh.points, dtype=np.float64)
    cl = np.asarray(mesh.cells)
    if cells is not None:
        cl = cl[cells]
    return CellGeometry(pts[cl], xi, check=check)
