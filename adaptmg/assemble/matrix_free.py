r"""Matrix-free Q1 Laplacian on quad/hex cells: :math:`v \mathrel{+}= A u` without forming
:math:`A`, and the diagonal of the constrained operator :math:`(HZ)^T A (HZ)`.

The stiffness matrix of :func:`adaptmg.assemble.stiffness` (coefficient 1) is
:math:`A = \sum_K P_K^T A_K P_K` with the element matrix

.. math::  (A_K)_{ab} = \sum_q w_q \det J_q\,
           (J_q^{-T} \hat\nabla\hat\phi_a(\xi_q)) \cdot (J_q^{-T} \hat\nabla\hat\phi_b(\xi_q))

on the same tensor Gauss rule (2 points per direction).  :meth:`Q1Laplacian.apply` recomputes
:math:`J_q` from the cell's :math:`2^d` vertices at every product and adds

.. math::  (A_K u_K)_a = \sum_q \hat\nabla\hat\phi_a^T \, J_q^{-1}
           \bigl(w_q \det J_q\, J_q^{-T} \hat\nabla\hat u_K(\xi_q)\bigr)

into ``v``: a cell reads :math:`2^d` node indices (int32), :math:`2^d d` coordinates and
:math:`2^d` values and adds :math:`2^d` values -- no matrix and no geometry is stored
(against 27 entries a row, 324 bytes a DoF, for the assembled 3-D matrix).  Any multilinear
cell (not only parallelepipeds); ``det J <= 0`` at a quadrature point is refused when the
operator is made.

:meth:`Q1Laplacian.constrained_diagonal` gives :math:`\mathrm{diag}((HZ)^T A (HZ))` for a
sparse ``HZ`` (nodes x columns: a node's value from the columns; hanging nodes take their
parents' weights): per cell :math:`\sum_{a,b} (HZ)_{n_a j} (A_K)_{ab} (HZ)_{n_b j}` for every
column ``j`` reached from the cell.

On the GPU both are one CUDA kernel (a thread a cell, the products added with ``atomicAdd``:
the order of the additions varies, so results agree with the host to round-off, not bit for
bit); on the host the same sums over chunks of cells with NumPy -- a reference and a memory
saver there, some 30-50x slower than the assembled matrix's SpMV (the Jacobians are recomputed
at every product); the GPU kernel is the fast path.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import constant, get_backend
from ..fe.geometry import _det_inv, q1_tables
from ..fe.quadrature import default_num_points, tensor_gauss

__all__ = ["Q1Laplacian"]

_SRC = r"""
#define NV (1 << DIM)
#define NQ (1 << DIM)

__device__ __forceinline__ double adaptmg_mf_inverse(const double J[DIM][DIM], double Ji[DIM][DIM]) {
#if DIM == 2
    double det = J[0][0] * J[1][1] - J[0][1] * J[1][0];
    double r = 1.0 / det;
    Ji[0][0] = J[1][1] * r;  Ji[0][1] = -J[0][1] * r;
    Ji[1][0] = -J[1][0] * r; Ji[1][1] = J[0][0] * r;
#else
    double c00 = J[1][1] * J[2][2] - J[1][2] * J[2][1];
    double c01 = J[1][2] * J[2][0] - J[1][0] * J[2][2];
    double c02 = J[1][0] * J[2][1] - J[1][1] * J[2][0];
    double det = J[0][0] * c00 + J[0][1] * c01 + J[0][2] * c02;
    double r = 1.0 / det;
    Ji[0][0] = c00 * r;
    Ji[0][1] = (J[0][2] * J[2][1] - J[0][1] * J[2][2]) * r;
    Ji[0][2] = (J[0][1] * J[1][2] - J[0][2] * J[1][1]) * r;
    Ji[1][0] = c01 * r;
    Ji[1][1] = (J[0][0] * J[2][2] - J[0][2] * J[2][0]) * r;
    Ji[1][2] = (J[0][2] * J[1][0] - J[0][0] * J[1][2]) * r;
    Ji[2][0] = c02 * r;
    Ji[2][1] = (J[0][1] * J[2][0] - J[0][0] * J[2][1]) * r;
    Ji[2][2] = (J[0][0] * J[1][1] - J[0][1] * J[1][0]) * r;
#endif
    return det;
}

/* J_kb = sum_a X[a][k] dN[q][a][b] at quadrature point q */
__device__ __forceinline__ void adaptmg_mf_jacobian(const double X[NV][DIM], const double* dN, int q,
                                                    double J[DIM][DIM]) {
    for (int k = 0; k < DIM; ++k)
        for (int b = 0; b < DIM; ++b) J[k][b] = 0.0;
    for (int a = 0; a < NV; ++a)
        for (int k = 0; k < DIM; ++k)
            for (int b = 0; b < DIM; ++b) J[k][b] += X[a][k] * dN[(q * NV + a) * DIM + b];
}

/* v[cells[c, a]] += (A_K u_K)_a for every cell c */
extern "C" __global__ void adaptmg_mf_q1_apply(const long long ncells, const int* __restrict__ cells,
        const double* __restrict__ pts, const double* __restrict__ dN, const double* __restrict__ w,
        const double* __restrict__ u, double* __restrict__ v) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncells) return;
    int nd[NV];
    double X[NV][DIM], ue[NV], ye[NV];
    for (int a = 0; a < NV; ++a) {
        nd[a] = cells[c * NV + a];
        ue[a] = u[nd[a]];
        ye[a] = 0.0;
        for (int k = 0; k < DIM; ++k) X[a][k] = pts[(long long)nd[a] * DIM + k];
    }
    for (int q = 0; q < NQ; ++q) {
        double J[DIM][DIM], Ji[DIM][DIM];
        adaptmg_mf_jacobian(X, dN, q, J);
        double wd = w[q] * adaptmg_mf_inverse(J, Ji);
        double g[DIM], f[DIM], t[DIM];
        for (int b = 0; b < DIM; ++b) g[b] = 0.0;
        for (int a = 0; a < NV; ++a)
            for (int b = 0; b < DIM; ++b) g[b] += ue[a] * dN[(q * NV + a) * DIM + b];
        for (int k = 0; k < DIM; ++k) {              /* f = w det J J^{-T} g */
            double s = 0.0;
            for (int b = 0; b < DIM; ++b) s += Ji[b][k] * g[b];
            f[k] = wd * s;
        }
        for (int b = 0; b < DIM; ++b) {              /* t = J^{-1} f */
            double s = 0.0;
            for (int k = 0; k < DIM; ++k) s += Ji[b][k] * f[k];
            t[b] = s;
        }
        for (int a = 0; a < NV; ++a)
            for (int b = 0; b < DIM; ++b) ye[a] += dN[(q * NV + a) * DIM + b] * t[b];
    }
    for (int a = 0; a < NV; ++a) atomicAdd(&v[nd[a]], ye[a]);
}

/* d[j] += sum_{a,b} HZ[n_a, j] (A_K)_{ab} HZ[n_b, j]; bad[c] = 1 where det J <= 0 */
extern "C" __global__ void adaptmg_mf_q1_diagonal(const long long ncells, const int* __restrict__ cells,
        const double* __restrict__ pts, const double* __restrict__ dN, const double* __restrict__ w,
        const int* __restrict__ hp, const int* __restrict__ hc, const double* __restrict__ hv,
        double* __restrict__ d, unsigned char* __restrict__ bad) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncells) return;
    int nd[NV];
    double X[NV][DIM], Ke[NV][NV];
    for (int a = 0; a < NV; ++a) {
        nd[a] = cells[c * NV + a];
        for (int k = 0; k < DIM; ++k) X[a][k] = pts[(long long)nd[a] * DIM + k];
        for (int b = 0; b < NV; ++b) Ke[a][b] = 0.0;
    }
    unsigned char flag = 0;
    for (int q = 0; q < NQ; ++q) {
        double J[DIM][DIM], Ji[DIM][DIM], G[NV][DIM];
        adaptmg_mf_jacobian(X, dN, q, J);
        double det = adaptmg_mf_inverse(J, Ji);
        if (!(det > 0.0)) flag = 1;
        double wd = w[q] * det;
        for (int a = 0; a < NV; ++a)
            for (int k = 0; k < DIM; ++k) {          /* physical gradient J^{-T} dN_a */
                double s = 0.0;
                for (int b = 0; b < DIM; ++b) s += Ji[b][k] * dN[(q * NV + a) * DIM + b];
                G[a][k] = s;
            }
        for (int a = 0; a < NV; ++a)
            for (int b = 0; b < NV; ++b) {
                double s = 0.0;
                for (int k = 0; k < DIM; ++k) s += G[a][k] * G[b][k];
                Ke[a][b] += wd * s;
            }
    }
    bad[c] = flag;
    for (int a = 0; a < NV; ++a)
        for (int p = hp[nd[a]]; p < hp[nd[a] + 1]; ++p) {
            int j = hc[p];
            double s = 0.0;
            for (int b = 0; b < NV; ++b)
                for (int r = hp[nd[b]]; r < hp[nd[b] + 1]; ++r)
                    if (hc[r] == j) s += Ke[a][b] * hv[r];
            atomicAdd(&d[j], hv[p] * s);
        }
}
"""

_BLOCK = 128
#: cells per NumPy chunk on the host (a few MB of temporaries a chunk)
HOST_CHUNK = 1 << 14


@functools.lru_cache(maxsize=None)
def _module(xp, dim):
    return xp.RawModule(code=_SRC, options=(f"-DDIM={dim}",))


@functools.lru_cache(maxsize=None)
def _tables(dim):
    """Gauss weights (nq,) and Q1 reference gradients (nq, 2^d, d) of the stiffness form's rule."""
    xi, w = tensor_gauss(dim, default_num_points(1))
    return np.ascontiguousarray(w), np.ascontiguousarray(q1_tables(dim, xi)[1])


class Q1Laplacian:
    """The Q1 stiffness matrix of the cells ``cells`` ((C, 2^d) node indices into ``points``)
    as an operator (module doc).

    Parameters
    ----------
    points : (n, d) float64 node coordinates.
    cells : (C, 2^d) node indices (the mesh's vertex order), int32 kept (int64 narrowed).
    backend : "cpu" or "gpu" (the arrays are moved there).
    check : refuse cells with ``det J <= 0`` at a quadrature point (one pass; on the GPU the
        diagonal's pass does it, see :meth:`constrained_diagonal`).
    """

    def __init__(self, points, cells, backend="cpu", check=True):
        be = get_backend(backend)
        xp = be.xp
        points = xp.asarray(points, dtype=np.float64)
        cells = xp.asarray(cells)
        if points.ndim != 2 or points.shape[1] not in (2, 3):
            raise ValueError(f"points must have shape (n, 2) or (n, 3), got {tuple(points.shape)}")
        d = int(points.shape[1])
        if cells.ndim != 2 or cells.shape[1] != 2 ** d:
            raise ValueError(f"cells must have shape (C, {2 ** d}) for {d}-D points, got {tuple(cells.shape)}")
        if cells.dtype.kind not in "iu":
            raise TypeError(f"cells must be integer node indices, got dtype {cells.dtype}")
        if points.shape[0] >= 2 ** 31:
            raise ValueError("Q1Laplacian: more than 2^31 nodes (int32 node indices)")
        self.backend, self.dim = be, d
        self.points = xp.ascontiguousarray(points)
        self.cells = xp.ascontiguousarray(cells.astype(np.int32, copy=False))
        self.num_nodes = int(points.shape[0])
        self.num_cells = int(cells.shape[0])
        w, dN = _tables(d)
        self._w, self._dN = constant(w, xp), constant(dN, xp)
        if check and not be.is_gpu:
            self._check_host()

    @property
    def nbytes(self) -> int:
        """Bytes of the operator's own arrays (points and cells)."""
        return int(self.points.nbytes + self.cells.nbytes)

    # ------------------------------------------------------------------ host twin
    def _chunks(self):
        for s in range(0, self.num_cells, HOST_CHUNK):
            cl = self.cells[s:s + HOST_CHUNK]
            X = self.points[cl]                                  # (n, 2^d, d)
            J = np.ascontiguousarray(np.tensordot(X, self._dN, axes=([1], [1])).transpose(0, 2, 1, 3))
            det, inv = _det_inv(J)
            yield s, cl, det, inv

    def _check_host(self):
        for s, cl, det, _ in self._chunks():
            bad = ~(det > 0).all(axis=1)
            if bad.any():
                raise ValueError(f"Q1Laplacian: cell {s + int(np.flatnonzero(bad)[0])} has det J <= 0 "
                                 f"at a quadrature point (inverted or degenerate)")

    def _gradients(self, inv):
        """Physical gradients of the shape functions (n, nq, 2^d, d): J^{-T} dN."""
        return np.einsum("cqbk,qab->cqak", inv, self._dN)

    # ------------------------------------------------------------------ operator
    def apply(self, u, v):
        """``v += A u`` (``u``, ``v`` vectors over the points, on the operator's backend)."""
        if self.backend.is_gpu:
            self._launch("adaptmg_mf_q1_apply", (self.cells, self.points, self._dN, self._w, u, v))
            return v
        wq, nv, d = self._w, 2 ** self.dim, self.dim
        D = self._dN.transpose(1, 0, 2).reshape(nv, -1)          # (2^d, nq d): one GEMM a chunk
        for s, cl, det, inv in self._chunks():
            n, nq = det.shape
            g = (u[cl] @ D).reshape(n, nq, d)                    # reference gradient of u
            f = np.einsum("cqbk,cqb->cqk", inv, g) * (wq * det)[:, :, None]     # w det J^{-T} g
            t = np.einsum("cqbk,cqk->cqb", inv, f)               # J^{-1} f
            ye = t.reshape(n, -1) @ D.T
            v += np.bincount(cl.ravel(), weights=ye.ravel(), minlength=v.size)
        return v

    def constrained_diagonal(self, HZ, ncols):
        r"""``diag((HZ)^T A (HZ))`` (``ncols`` entries) for the sparse ``HZ`` (points x columns,
        CSR on the operator's backend: int32 indices on the GPU).  On the GPU the same pass
        checks ``det J > 0`` (ValueError naming a cell)."""
        be, xp = self.backend, self.backend.xp
        if HZ.shape != (self.num_nodes, ncols):
            raise ValueError(f"HZ must have shape {(self.num_nodes, ncols)}, got {HZ.shape}")
        d = xp.zeros(ncols, dtype=np.float64)
        if be.is_gpu:
            bad = xp.zeros(self.num_cells, dtype=np.uint8)
            self._launch("adaptmg_mf_q1_diagonal",
                         (self.cells, self.points, self._dN, self._w, HZ.indptr.astype(np.int32, copy=False),
                          HZ.indices.astype(np.int32, copy=False), HZ.data, d, bad))
            hit = xp.flatnonzero(bad)
            if hit.size:
                raise ValueError(f"Q1Laplacian: cell {int(hit[0])} has det J <= 0 at a quadrature "
                                 f"point (inverted or degenerate)")
            return d
        # host: each node's row of HZ padded to m entries (column -1: none)
        cnt = np.diff(HZ.indptr)
        m = max(int(cnt.max()) if cnt.size else 0, 1)
        pc = np.full((self.num_nodes, m), -1, dtype=np.int64)
        pv = np.zeros((self.num_nodes, m))
        slot = np.arange(HZ.indices.size) - np.repeat(HZ.indptr[:-1], cnt)
        row = np.repeat(np.arange(self.num_nodes), cnt)
        pc[row, slot], pv[row, slot] = HZ.indices, HZ.data
        wq = self._w
        for s, cl, det, inv in self._chunks():
            G = self._gradients(inv)
            Ke = np.einsum("cqak,cqbk,cq->cab", G, G, wq * det)
            c, v = pc[cl], pv[cl]                                # (n, 2^d, m)
            same = (c[:, :, :, None, None] == c[:, None, None, :, :]) & (c[:, :, :, None, None] >= 0)
            t = np.einsum("cab,cbr,capbr->cap", Ke, v, same)
            ok = c >= 0
            d += np.bincount(c[ok], weights=(v * t)[ok], minlength=ncols)
        return d

    def _launch(self, name, args):
        n = self.num_cells
        if n:
            xp = self.backend.xp
            _module(xp, self.dim).get_function(name)(((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,),
                                                      (np.int64(n),) + tuple(args))

    def __repr__(self):
        return f"Q1Laplacian({self.dim}-D, {self.num_cells} cells, {self.num_nodes} nodes, {self.backend.name})"

