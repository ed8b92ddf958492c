"""Matrix-free spectral-element operators on any hex/quad mesh (seed 004 §3, seed 002 BK1/BK3).

With the cell arrays ``u_K = u[cell_dofs]`` of shape (cells, n, ..., n), ``n = k+1``, the
tensor quadrature (weights ``w_q``; GLL collocated by default, ``"gauss"``: k+2 points),
``J = dx/dxi`` and the symmetric geometric factors

    G_q = w_q det J_q J_q^{-1} J_q^{-T}                (d(d+1)/2 numbers a point)

the operators are, cell by cell and then added into the global vector (``scatter``):

    mass (BK1):       (M u)_K = B^T (w det J) B u_K                     (B = I for GLL)
    stiffness (BP3):  (K u)_K = sum_ij Dhat_i^T G_ij Dhat_j u_K
    Helmholtz:        (H u)_K = c_m (M u)_K + c_k (K u)_K     (c_m = 1, c_k = dt: M + dt K)

with ``Dhat_0 = B x B x DB`` etc. applied by sum factorisation (one batched matmul per
tensor axis, :func:`adaptmg.spectral.space.contract`).  ``geometry="stored"`` keeps G and
w det J (d(d+1)/2 + 1 numbers a point); ``"on_the_fly"`` recomputes them every apply from
the 2^d vertex coordinates (multilinear cells only), reading 2^d d numbers a cell.
Everything is written against ``xp`` (NumPy or CuPy), in float64 or float32.  On the GPU
the collocated 3-D operator with stored geometry runs as one fused element kernel
(:mod:`adaptmg.spectral.kernels`: gather, gradient, flux, transpose and mass in one pass)
followed by the same ``scatter`` SpMV; ``fused=False`` keeps the batched-matmul path."""
from __future__ import annotations

import numpy as np

from ..backend import get_backend
from ..device.kernels import get_kernel
from ..mesh import reference as ref
from .basis import quadrature_rule
from .kernels import fused_cell_apply, scatter_sum
from .space import (SpectralSpace, array_nbytes, cell_chunks, cofactors, contract, interpolate,
                    jacobian_components, local_indices, reference_gradient, retype_csr)

__all__ = ["SpectralOperator", "geometric_factors"]


def _pairs(d):
    """The index pairs of the stored entries of a symmetric d x d matrix, diagonal first."""
    return [(i, i) for i in range(d)] + [(i, j) for i in range(d) for j in range(i + 1, d)]


def _factors(J, w, xp, G=None, wdet=None):
    """G and w det J from J by components ``J[i][j]`` (cells, nq) and weights w (nq,):
    ``G_ab = (w / det) sum_k C_ka C_kb`` (C the cofactors, ``J^{-1} = C^T / det``, so
    ``G = w det J^{-1} J^{-T}``), written into ``G`` (d(d+1)/2, cells, nq) and ``wdet``
    (cells, nq) when given (cast to their dtype); ``G=False``: w det J only."""
    C, det = cofactors(J)
    d = len(J)
    if wdet is None:
        wdet = w[None, :] * det
    else:
        wdet[...] = w[None, :] * det
    if G is False:
        return None, wdet
    s = w[None, :] / det
    vals = (s * sum(C[k][a] * C[k][b] for k in range(d)) for a, b in _pairs(d))
    if G is None:
        return xp.stack(list(vals)), wdet
    for m, v in enumerate(vals):
        G[m] = v
    return G, wdet


def geometric_factors(J, w, xp):
    """``(G, wdet)``: G (d(d+1)/2, cells, nq) in the order (00, 11, 22, 01, 02, 12) -- 2-D:
    (00, 11, 01) -- and w det J (cells, nq), from J (cells, nq, d, d) and weights w (nq,)."""
    d = J.shape[-1]
    return _factors([[J[..., i, j] for j in range(d)] for i in range(d)], xp.asarray(w), xp)


def stored_factors(space, B, DB, w, backend, dtype, stiffness=True):
    """``(G, wdet)`` of :func:`geometric_factors` for every cell of ``space`` on ``backend``,
    computed in float64 a chunk of cells at a time (:func:`~adaptmg.spectral.space.cell_chunks`:
    J is never held for the whole mesh) and stored in ``dtype``; ``G`` is None when
    ``stiffness`` is false (a mass operator reads only w det J)."""
    xp = backend.xp
    d, nc = space.dim, space.mesh.num_cells
    nq = DB.shape[0] ** d
    pts, cd = space.on_backend(backend, "points"), space.on_backend(backend, "cell_dofs")
    wq = xp.asarray(w)
    G = xp.empty((d * (d + 1) // 2, nc, nq), dtype=dtype) if stiffness else False
    wdet = xp.empty((nc, nq), dtype=dtype)
    for c in cell_chunks(nc, max(nq, cd.shape[1]), backend.name):
        _factors(jacobian_components(pts[cd[c]], B, DB, xp), wq, xp,
                 G[:, c] if stiffness else False, wdet[c])
    return (G if stiffness else None), wdet


class SpectralOperator:
    """``y = (c_m M + c_k K) x`` matrix-free on a :class:`SpectralSpace`.

    Parameters: ``mass``/``stiffness`` the coefficients c_m, c_k (BK1: 1, 0; Poisson: 0, 1;
    Helmholtz M + dt K: 1, dt); ``quadrature`` "gll" | "gauss"; ``geometry`` "stored" |
    "on_the_fly"; ``dtype`` float64 | float32; ``backend`` "auto" | "cpu" | "gpu"; ``fused``
    (GPU, 3-D, "gll", "stored" only; elsewhere ignored) the fused element kernel of
    :mod:`adaptmg.spectral.kernels` instead of the batched matmuls (attribute ``fused``:
    whether it is used); ``scatter`` (fused only) "kernel" | "spmv": the global sum of the
    element outputs by the kernel that skips the scatter matrix's values (the default: 14.5
    vs 12.1 GDoF/s at k = 3 fp64 on an H200, ``scripts/bench_spectral.py --sections op``) or
    by its SpMV."""

    def __init__(self, space: SpectralSpace, *, mass=0.0, stiffness=1.0, quadrature="gll",
                 geometry="stored", dtype=np.float64, backend="auto", fused=True, scatter="kernel"):
        if not isinstance(space, SpectralSpace):
            raise TypeError(f"SpectralOperator expects a SpectralSpace, got {type(space).__name__}")
        if geometry not in ("stored", "on_the_fly"):
            raise ValueError(f"geometry must be 'stored' or 'on_the_fly', got {geometry!r}")
        if scatter not in ("spmv", "kernel"):
            raise ValueError(f"scatter must be 'spmv' or 'kernel', got {scatter!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float64, np.float32):
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        if geometry == "on_the_fly" and space.mapping is not None:
            raise ValueError("geometry='on_the_fly' rebuilds multilinear cells from their vertices; "
                             "a curved space (mapping) needs geometry='stored'")
        self.space, self.dtype, self.geometry, self.quadrature = space, dtype, geometry, quadrature
        self.mass, self.stiffness = float(mass), float(stiffness)
        self.backend = be = get_backend(backend)
        xp = self.xp = be.xp
        d, k = space.dim, space.degree
        self._flux = get_kernel("geo_flux3" if d == 3 else "geo_flux2", be)
        B, DB, w = quadrature_rule(k, quadrature)
        self.nq = DB.shape[0]
        self.B = None if B is None else xp.asarray(B, dtype=dtype)
        self.DB = xp.asarray(DB, dtype=dtype)
        self._w = xp.asarray(_tensor_weights(w, d), dtype=dtype)
        self.cell_dofs = space.on_backend(be, "cell_dofs")             # shared by the space's operators
        self.scatter_matrix = retype_csr(space.on_backend(be, "gather"), dtype, be)
        self.shape = (space.num_dofs, space.num_dofs)
        self._cshape = (space.mesh.num_cells,) + (k + 1,) * d
        self._qshape = (space.mesh.num_cells,) + (self.nq,) * d
        self.fused = bool(fused) and be.is_gpu and d == 3 and self.B is None and geometry == "stored"
        self.scatter = scatter
        if geometry == "stored":            # on the backend in float64 a chunk at a time, stored in dtype
            fusable = d == 3 and B is None           # the fused kernel reads G whatever c_k is
            self.G, self.wdet = stored_factors(space, B, DB, _tensor_weights(w, d), be, dtype,
                                               stiffness=self.stiffness != 0.0 or fusable)
        else:
            self.X = xp.asarray(space.points[space.cell_dofs[:, space._vertex_local()]], dtype=dtype)
            self._dN = xp.asarray(_vertex_shape_gradients(k, quadrature, d), dtype=dtype)

    def astype(self, dtype):
        """The same operator in ``dtype`` (float64/float32) from this one's arrays: the
        factors rounded, the index arrays and the scatter matrix's structure shared."""
        import copy
        dtype = np.dtype(dtype)
        if dtype not in (np.float64, np.float32):
            raise ValueError(f"dtype must be float64 or float32, got {dtype}")
        out = copy.copy(self)
        out.dtype = dtype
        for name in ("B", "DB", "_w", "G", "wdet", "X", "_dN"):
            v = getattr(self, name, None)
            if v is not None:
                setattr(out, name, v.astype(dtype, copy=False))
        out.scatter_matrix = retype_csr(self.scatter_matrix, dtype, self.backend)
        return out

    def nbytes(self):
        """Bytes of the operator's arrays on its backend (factors, gather index, scatter
        matrix; the shared ones counted here too)."""
        return array_nbytes(self.G if self.geometry == "stored" else self.X,
                            self.wdet if self.geometry == "stored" else None,
                            self.cell_dofs, self.scatter_matrix)

    # ------------------------------------------------------------------ geometry
    def factors(self):
        """(G, w det J) at the quadrature points: stored, or computed now from the vertices."""
        if self.geometry == "stored":
            return self.G, self.wdet
        J = self.xp.einsum("cvi,qvj->cqij", self.X, self._dN)
        return geometric_factors(J, self._w, self.xp)

    # ------------------------------------------------------------------ apply
    def cell_apply(self, uc, G=None, wdet=None):
        """The cell operators on cell arrays ``uc`` (cells, n, ..., n), without assembly."""
        d, B, DB = self.space.dim, self.B, self.DB
        if G is None:
            G, wdet = self.factors()
        if self.fused:
            xp = self.xp
            nc = self._cshape[0]
            G, wdet = (xp.ascontiguousarray(a, dtype=self.dtype).reshape(s)
                       for a, s in ((G, (6, nc, -1)), (wdet, (nc, -1))))
            return fused_cell_apply(xp.ascontiguousarray(uc, dtype=self.dtype), self.cell_dofs, G,
                                    wdet, self.DB, self.mass, self.stiffness,
                                    gather=False).reshape(self._cshape)
        out = None
        if self.stiffness != 0.0:
            G = G.reshape((G.shape[0],) + self._qshape)
            g = reference_gradient(uc, B, DB, d)
            flux = [self.xp.empty_like(gi) for gi in g]
            self._flux(*g, *G, *flux)                              # flux_i = sum_j G_ij g_j, fused
            out = _gradient_transpose(flux, B, DB, d)
            if self.stiffness != 1.0:
                out *= self.stiffness
        if self.mass != 0.0:
            mq = interpolate(uc, B, d) * wdet.reshape(self._qshape)
            if self.mass != 1.0:
                mq = self.mass * mq
            mu = _interpolate_transpose(mq, B, d)
            out = mu if out is None else out + mu
        return out

    def matvec(self, x):
        """``y = A x`` for a global vector ``x`` (num_dofs,)."""
        x = self.xp.asarray(x)
        if x.shape != (self.shape[1],):
            raise ValueError(f"SpectralOperator: x must have shape ({self.shape[1]},), got {x.shape}")
        x = x.astype(self.dtype, copy=False)
        if self.fused:                        # gather inside the element kernel
            y = fused_cell_apply(self.xp.ascontiguousarray(x), self.cell_dofs, self.G, self.wdet,
                                 self.DB, self.mass, self.stiffness)
            if self.scatter == "kernel":
                return scatter_sum(self.scatter_matrix, y.reshape(-1))
            return self.scatter_matrix @ y.reshape(-1)
        uc = x[self.cell_dofs].reshape(self._cshape)
        return self.scatter_matrix @ self.cell_apply(uc).reshape(-1)

    __call__ = matvec

    def __matmul__(self, x):
        return self.matvec(x)

    def diagonal(self):
        """The diagonal of the assembled operator (for Jacobi), by the same sum factorisation
        with the entry-wise squares of the 1D matrices."""
        xp, d = self.xp, self.space.dim
        G, wdet = self.factors()
        B, DB = self.B, self.DB
        one = None if B is None else B * B
        out = 0.0
        if self.stiffness != 0.0:
            G = G.reshape((G.shape[0],) + self._qshape)
            Bm = xp.eye(self.nq, dtype=self.dtype) if B is None else B
            for m, (a, b) in enumerate(_pairs(d)):
                mats = []
                for ax in range(d):
                    Ma = DB if ax == a else Bm
                    Mb = DB if ax == b else Bm
                    mats.append(Ma * Mb)
                t = G[m]
                for ax in range(d):
                    t = contract(t, mats[ax].T, ax, d)
                out = out + (1.0 if a == b else 2.0) * self.stiffness * t
        if self.mass != 0.0:
            t = wdet.reshape(self._qshape)
            if one is not None:
                for ax in range(d):
                    t = contract(t, one.T, ax, d)
            out = out + self.mass * t
        return self.scatter_matrix @ out.reshape(-1)

    def load(self, f_values_at_quadrature):
        """``b_i = sum_q w det J f(x_q) phi_i(x_q)`` from f at the quadrature points
        (cells, nq^d)."""
        _, wdet = self.factors()
        fq = (self.xp.asarray(f_values_at_quadrature, dtype=self.dtype) * wdet).reshape(self._qshape)
        return self.scatter_matrix @ _interpolate_transpose(fq, self.B, self.space.dim).reshape(-1)

    def quadrature_points(self, on_backend=False):
        """(cells, nq^d, d) physical quadrature points (isoparametric), on the host (or on
        the operator's backend: the collocated GLL rule's are gathered there)."""
        sp_, d = self.space, self.space.dim
        if on_backend and self.B is None:
            be = self.backend
            return sp_.on_backend(be, "points")[sp_.on_backend(be, "cell_dofs")]
        B = None if self.B is None else quadrature_rule(sp_.degree, self.quadrature)[0]
        X = sp_.cell_points.reshape(self._cshape + (d,))
        out = np.stack([interpolate(X[..., i], B, d).reshape(X.shape[0], -1) for i in range(d)], -1)
        return self.xp.asarray(out) if on_backend else out

    def __repr__(self):
        return (f"SpectralOperator({self.space!r}, mass={self.mass}, stiffness={self.stiffness}, "
                f"{self.quadrature}, {self.geometry}, {self.dtype.name}, {self.backend.name}"
                f"{', fused' if self.fused else ''})")


def _gradient_transpose(flux, B, DB, d):
    """sum_i Dhat_i^T flux_i (the transpose of :func:`reference_gradient`)."""
    if B is None:
        out = None
        for ax in range(d):
            t = contract(flux[ax], DB.T, ax, d)
            out = t if out is None else out + t
        return out
    if d == 2:
        return contract(contract(flux[0], B.T, 1, 2), DB.T, 0, 2) + \
            contract(contract(flux[1], DB.T, 1, 2), B.T, 0, 2)
    # z first for every flux, then y, then x: share the B^T along z of flux 0 and 1
    fz0 = contract(flux[0], B.T, 2, 3)
    fz1 = contract(flux[1], B.T, 2, 3)
    fz2 = contract(flux[2], DB.T, 2, 3)
    y01 = contract(fz0, B.T, 1, 3)
    y12 = contract(fz1, DB.T, 1, 3) + contract(fz2, B.T, 1, 3)
    return contract(y01, DB.T, 0, 3) + contract(y12, B.T, 0, 3)


def _interpolate_transpose(v, B, d):
    if B is None:
        return v
    for ax in range(d):
        v = contract(v, B.T, ax, d)
    return v


def _tensor_weights(w, d):
    """Tensor quadrature weights, lexicographic with x fastest: (nq^d,)."""
    idx = local_indices(len(w) - 1, d)
    return np.prod(np.asarray(w)[idx], axis=1)


def _vertex_shape_gradients(k, quadrature, d):
    """dN_v/dxi_j of the multilinear vertex functions at the quadrature points: (nq^d, 2^d, d)."""
    from .basis import gll_points
    import numpy.polynomial.legendre as L
    if quadrature == "gll":
        t = np.asarray(gll_points(k))
    else:
        t = 0.5 * (L.leggauss(k + 2)[0] + 1.0)
    xi = t[local_indices(len(t) - 1, d)]                                  # (nq, d)
    cor = ref.corners(d)
    f = np.where(cor[None] == 1, xi[:, None, :], 1.0 - xi[:, None, :])    # (nq, nv, d)
    dN = np.empty(f.shape)
    for j in range(d):                                                    # the axes
        others = np.prod(np.delete(f, j, axis=2), axis=2)
        dN[:, :, j] = others * (2 * cor[None, :, j] - 1)
    return dN
