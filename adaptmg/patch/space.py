"""Continuous Q_k on a uniformly refined Cartesian rectangle or box.

The coarse mesh has ``base[d]`` cells in direction d (default one cell: the
domain itself); level L has ``n_d = base[d] * 2**L`` cells of width
``h_d = lengths[d] / n_d``.  Support points are the tensor Gauss-Lobatto points
of every cell; the global numbering is lexicographic with direction 0 (x)
running fastest, and the boundary nodes (homogeneous Dirichlet) are removed,
so a vector is an array of ``prod_d (n_d k - 1)`` entries and
``u.reshape(space.shape)`` has axes ``(..., y, x)`` (numpy axis -1 is x).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.polynomial import legendre as L

from .tensor import check_degree, gauss_lobatto, lagrange_eval

__all__ = ["CartesianSpace"]


@dataclass(frozen=True)
class CartesianSpace:
    """Q_k on ``prod_d [0, lengths[d]]`` refined ``level`` times."""

    dim: int
    k: int
    level: int
    lengths: tuple = None
    base: tuple = None

    def __post_init__(self):
        if isinstance(self.dim, bool) or self.dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {self.dim!r}")
        check_degree(self.k, self.dim)
        if isinstance(self.level, bool) or not isinstance(self.level, (int, np.integer)):
            raise TypeError(f"level must be an int, got {type(self.level).__name__}")
        if self.level < 0 or self.level > 14:
            raise ValueError(f"level must be in 0..14, got {self.level}")
        lengths = (1.0,) * self.dim if self.lengths is None else tuple(float(a) for a in self.lengths)
        base = (1,) * self.dim if self.base is None else tuple(int(b) for b in self.base)
        if len(lengths) != self.dim or min(lengths) <= 0:
            raise ValueError(f"lengths must be {self.dim} positive numbers, got {self.lengths!r}")
        if len(base) != self.dim or min(base) < 1:
            raise ValueError(f"base must be {self.dim} positive ints, got {self.base!r}")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "base", base)
        if self.n_dofs == 0:
            raise ValueError(f"Q{self.k} on {self.cells} cells with Dirichlet boundary has no "
                             f"degree of freedom; use a higher level")

    # -- sizes -------------------------------------------------------------
    @property
    def cells(self) -> tuple:
        """Cells per direction (x first)."""
        return tuple(b << self.level for b in self.base)

    @property
    def h(self) -> tuple:
        return tuple(a / n for a, n in zip(self.lengths, self.cells))

    @property
    def n1d(self) -> tuple:
        """Interior nodes per direction (x first)."""
        return tuple(n * self.k - 1 for n in self.cells)

    @property
    def shape(self) -> tuple:
        """Array shape of a vector, numpy order (z, y, x)."""
        return tuple(reversed(self.n1d))

    @property
    def n_dofs(self) -> int:
        return int(np.prod(self.n1d))

    @property
    def coeffs(self) -> tuple:
        """c_d = prod(h) / h_d^2, x first: A^K = sum_d c_d (Ah in direction d)."""
        vol = float(np.prod(self.h))
        return tuple(vol / hd ** 2 for hd in self.h)

    def coarsen(self) -> "CartesianSpace":
        if self.level == 0:
            raise ValueError("level 0 has no coarser level")
        return CartesianSpace(self.dim, self.k, self.level - 1, self.lengths, self.base)

    def refine(self) -> "CartesianSpace":
        return CartesianSpace(self.dim, self.k, self.level + 1, self.lengths, self.base)

    def with_level(self, level: int) -> "CartesianSpace":
        return CartesianSpace(self.dim, self.k, level, self.lengths, self.base)

    # -- geometry ----------------------------------------------------------
    def nodes_1d(self, d: int, interior: bool = True) -> np.ndarray:
        """Coordinates of the support points in direction d."""
        x = gauss_lobatto(self.k)
        n = self.cells[d]
        c = np.arange(n)[:, None]
        pts = np.concatenate([((c + x[None, :-1]) * self.h[d]).ravel(), [self.lengths[d]]])
        return pts[1:-1] if interior else pts

    def check_vector(self, u, name="u"):
        shp = getattr(u, "shape", None)
        if shp is None:
            raise TypeError(f"{name} must be an array, got {type(u).__name__}")
        if shp != (self.n_dofs,):
            raise ValueError(f"{name} has shape {shp}, expected ({self.n_dofs},) for {self}")

    # -- data for the manufactured solution u = prod sin(pi x_i) ------------
    def load_separable(self, funcs, scale=1.0, nq=None, backend=None):
        """Load vector ``b_i = scale * int prod_d f_d(x_d) phi_i`` for a
        separable right-hand side: the Kronecker product of 1D load vectors
        (Gauss-Legendre with ``nq`` points per cell, default k+4).  With
        ``backend`` the product is formed on that backend (no host copy)."""
        if len(funcs) != self.dim:
            raise ValueError(f"need {self.dim} 1D functions, got {len(funcs)}")
        nq = self.k + 4 if nq is None else nq
        q, w = L.leggauss(nq)
        xq, wq = 0.5 * (q + 1), 0.5 * w
        B = lagrange_eval(self.k, xq)                         # (nq, k+1)
        vecs = []
        for d in range(self.dim):
            n, h = self.cells[d], self.h[d]
            X = (np.arange(n)[:, None] + xq[None, :]) * h     # (n, nq)
            F = funcs[d](X) * wq[None, :] * h                  # (n, nq)
            loc = F @ B                                        # (n, k+1)
            full = np.zeros(n * self.k + 1)
            full[:-1].reshape(n, self.k)[...] += loc[:, :-1]
            full[self.k::self.k] += loc[:, -1]
            vecs.append(full[1:-1])
        from ..backend import get_backend
        xp = get_backend(backend or "cpu").xp
        out = xp.asarray(np.array([scale]))
        for d in reversed(range(self.dim)):                   # z outermost
            out = (out[:, None] * xp.asarray(vecs[d])[None, :]).ravel()
        return out

    def sine_problem(self, backend=None):
        """(b, u_exact) for -Laplace u = f, u = prod sin(pi x_d / L_d) on the box."""
        def s(d):
            return lambda X: np.sin(np.pi * X / self.lengths[d])
        fac = sum((np.pi / a) ** 2 for a in self.lengths)
        return self.load_separable([s(d) for d in range(self.dim)], scale=fac, backend=backend), s

    def l2_error_sine(self, u, slab_points=1 << 25) -> float:
        r"""L2 norm of :math:`u_h - \prod_d \sin(\pi x_d / L_d)`, by Gauss quadrature with
        k+3 points per cell and direction (sum factorisation over cells).

        Runs on the array module of ``u`` (a CuPy vector stays on the device) and in
        slabs of cells along the slowest axis, each with at most about ``slab_points``
        quadrature points, so the temporaries stay bounded at any size (a 7e8-DoF
        vector would otherwise need tens of GB of them).  Per direction, the cell
        values at the quadrature points are
        :math:`V_{c,q} = \sum_{j<k} U_{ck+j} B_{qj} + U_{(c+1)k} B_{qk}`
        with :math:`B_{qj}` the Lagrange basis at the points.
        """
        from ..backend import backend_of
        xp = backend_of(u).xp
        self.check_vector(u)
        if u.dtype.kind != "f":
            raise TypeError(f"u must be a floating-point vector, got dtype {u.dtype}")
        k, nq, dim = self.k, self.k + 3, self.dim
        q, w = L.leggauss(nq)
        xq, wq = 0.5 * (q + 1), 0.5 * w
        B = lagrange_eval(k, xq)                               # (nq, k+1)
        Bi, Bl = xp.asarray(B[:, :k].T.copy()), xp.asarray(B[:, k].copy())
        U = xp.pad(u.astype(xp.float64, copy=False).reshape(self.shape), 1)   # boundary zeros
        # 1D factors per numpy axis ax (direction dim-1-ax): exact values and weights (n*nq,)
        ex, wt = [], []
        for ax in range(dim):
            d = dim - 1 - ax
            n, h = self.cells[d], self.h[d]
            X = ((np.arange(n)[:, None] + xq[None, :]) * h).ravel()
            ex.append(xp.asarray(np.sin(np.pi * X / self.lengths[d])))
            wt.append(xp.asarray(np.tile(wq * h, n)))
        n0 = self.cells[dim - 1]                               # cells along numpy axis 0
        per_cell = int(np.prod([self.cells[d] for d in range(dim - 1)])) * nq ** dim
        step = max(1, min(n0, int(slab_points) // per_cell))
        total = 0.0
        for c0 in range(0, n0, step):                          # slabs of cells along axis 0
            c1 = min(n0, c0 + step)
            V = U[c0 * k:c1 * k + 1]
            for ax in range(dim):
                V = xp.moveaxis(V, ax, -1)
                n = (V.shape[-1] - 1) // k                     # cells along this axis
                # (..., n, nq): the k leading nodes of each cell, then its last node
                W = V[..., :n * k].reshape(V.shape[:-1] + (n, k)) @ Bi
                W += V[..., k::k][..., None] * Bl
                V = xp.moveaxis(W.reshape(W.shape[:-2] + (n * nq,)), -1, ax)
            E, Wt = ex[0][c0 * nq:c1 * nq], wt[0][c0 * nq:c1 * nq]
            shp = [1] * dim
            shp[0] = E.size
            E, Wt = E.reshape(shp), Wt.reshape(shp)
            for ax in range(1, dim):
                shp = [1] * dim
                shp[ax] = ex[ax].size
                E = E * ex[ax].reshape(shp)
                Wt = Wt * wt[ax].reshape(shp)
            V -= E
            V *= V
            V *= Wt
            total += float(V.sum())
            del V, E, Wt
        return float(np.sqrt(total))

    def __repr__(self):
        return (f"CartesianSpace(dim={self.dim}, k={self.k}, level={self.level}, "
                f"cells={self.cells}, n_dofs={self.n_dofs})")
