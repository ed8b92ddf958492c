r"""Method (M1) of seed 003 §4.1: a Schur-complement direct solver with dense inverses.

In the prehandled unknowns, ordered :math:`\mathcal C, \mathcal E, \mathcal I`
(:mod:`adaptmg.prehandle.macro`), with K = C u E the macro skeleton,

.. math::  A = \begin{pmatrix} A_{KK} & A_{KI} \\ A_{IK} & C \end{pmatrix},\qquad
           \Sigma = A_{KK} - A_{KI} C^{-1} A_{IK}
                  = \begin{pmatrix} G & \hat B \\ \hat B^T & \Lambda\end{pmatrix},\qquad
           \Pi = \Lambda - \hat B^T G^{-1} \hat B .

On orthogonal macro cells :math:`A_{\mathcal C\mathcal I} = 0`, so G = I and
:math:`\hat B = B = A_{\mathcal C\mathcal E}`: these are the paper's eqs. (13)-(17); on
distorted cells G and :math:`\hat B` carry the coarse-interior coupling.  The solve is

.. math::  y = C^{-1} b_I,\quad r = b_K - A_{KI} y,\quad
           x_E = \Pi^{-1}(r_E - \hat B^T G^{-1} r_C),\quad x_C = G^{-1}(r_C - \hat B x_E),\quad
           x_I = C^{-1}(b_I - A_{IK} x_K).

C is block diagonal, one block per macro cell and the same block for similar cells, so
:math:`C^{-1}` is one dense :math:`(n-1)^2` matrix per shape group applied to the group's
interior values of all cells and right-hand sides in one GEMM (node-major layout).
:math:`A_{KI}` is applied cell-wise with the dense local coupling :math:`K_g` of a group
(a GEMM, then a gather-sum over the at most ``valence`` cells of each skeleton node).
Everything is set up in double from the local hierarchical stiffness of one cell per
group (static condensation: :math:`\tilde\Sigma = \sum_c P_c^T (\tilde A_{KK}^c -
\tilde A_{KI}^c (\tilde A_{II}^c)^{-1} \tilde A_{IK}^c) P_c`, then
:math:`\Sigma = L_K^{-1}\tilde\Sigma L_K^{-T}`), and the dense factors are stored in the
working ``dtype`` (float64 / float32 / float16); float16 uses ``xp.matmul`` (tensor cores
on the GPU).  Right-hand sides are scaled by a power of two per column to the range of
the working precision.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend
from .hierarchical import PartialCholesky, global_transform, local_transform
from .macro import RefinedMacroMesh

__all__ = ["SchurSolver"]

_DTYPES = {np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)}


def _local_stiffness(rm, reps, S_loc=None):
    """Dense local stiffness (len(reps), (n+1)^2, (n+1)^2) of the macro cells ``reps``:
    the nodal Q1 matrix K_c, or the hierarchical S_loc^T K_c S_loc when S_loc is given."""
    from ..assemble import stiffness
    from ..fe import Space
    from ..mesh import Mesh
    n, nl, g = rm.n, (rm.n + 1) ** 2, len(reps)
    G = rm.local_to_global[reps]
    pts = rm.points[G].reshape(-1, 2)                          # disjoint copies of the cells
    jj, ii = np.divmod(np.arange(n * n), n)
    ll = jj * (n + 1) + ii
    loc = np.stack([ll, ll + 1, ll + n + 1, ll + n + 2], axis=1)
    cells = (loc[None] + nl * np.arange(g)[:, None, None]).reshape(-1, 4)
    K = stiffness(Space(Mesh.from_cells(pts, cells), 1)).tocsr()
    if S_loc is not None:
        Sb = sp.kron(sp.identity(g, format="csr"), S_loc, format="csr")
        K = Sb.T.tocsr() @ K @ Sb
    K = K.tocoo()
    dense = np.zeros((g, nl, nl))
    dense[K.row // nl, K.row % nl, K.col % nl] = K.data
    return dense


class SchurSolver:
    """Method (M1) on a :class:`RefinedMacroMesh` for the Q1 Laplacian with zero Dirichlet data.

    ``SchurSolver(rm, dtype=np.float16, prehandle=True, backend="auto")``;
    ``solve(b_h)``: nodal load vector(s) on the unknowns, shape (N,) or (N, k), -> nodal
    solution(s) x_h = S L^{-T} x in float64; ``solve_prehandled(b)``: the M1 solve of the
    prehandled system in the working dtype.  ``prehandle=False`` runs the same method on
    the nodal stiffness matrix (S = L = I): the "without prehandling" reference.
    Attributes: ``C_inv`` (list of dense group blocks), ``Pi_inv``, ``G_inv``, ``B_hat``,
    ``Pi`` and ``C_blocks`` (float64, kept when ``keep_factors``), ``L`` (PartialCholesky).
    """

    def __init__(self, rm, *, dtype=np.float64, prehandle=True, backend="auto", keep_factors=False):
        if not isinstance(rm, RefinedMacroMesh):
            raise TypeError(f"SchurSolver expects a RefinedMacroMesh, got {type(rm).__name__}")
        dt = np.dtype(dtype)
        if dt not in _DTYPES:
            raise TypeError(f"dtype must be float64, float32 or float16, got {dt}")
        be = self.backend = get_backend(backend)
        xp = be.xp
        self.rm, self.dtype, self.prehandle = rm, dt, bool(prehandle)
        nC, nE, N = rm.n_C, rm.n_E, rm.N
        nK = nC + nE
        reps = np.array([cg[0] for cg in rm.group_cells])
        Aloc = _local_stiffness(rm, reps, local_transform(rm.levels) if self.prehandle else None)
        sk, it = rm.skeleton_local, rm.interior_local
        A_II = xp.asarray(Aloc[:, it][:, :, it])
        A_KI = xp.asarray(Aloc[:, sk][:, :, it])
        A_KK = Aloc[:, sk][:, :, sk]
        gsk = rm.local_to_global[:, sk]                                # (m, 4n) global skeleton ids
        valid = gsk < nK
        grp = rm.group
        # skeleton diagonal and coarse block of S^T A_h S, scattered from the cells
        dK = np.bincount(gsk[valid], weights=np.broadcast_to(
            np.einsum("gii->gi", A_KK)[grp], gsk.shape)[valid], minlength=nK)
        vmask = valid & (gsk < nC)
        ai = np.nonzero(vmask[:, :, None] & vmask[:, None, :])
        A_CC = sp.coo_matrix((A_KK[grp[ai[0]], ai[1], ai[2]], (gsk[ai[0], ai[1]], gsk[ai[0], ai[2]])),
                             shape=(nC, nC)).toarray()
        if self.prehandle:
            dI = np.sqrt(np.einsum("gii->gi", Aloc[:, it][:, :, it]))        # (G, n_int)
            self.L = PartialCholesky(A_CC, np.concatenate([np.sqrt(dK[nC:])] + [
                np.repeat(dI[g], len(cg)) for g, cg in enumerate(rm.group_cells)]), backend=be)
            Linv_C = self.L.Linv_C
            dE = xp.asarray(np.sqrt(dK[nC:]))
        else:
            dI = np.ones((len(reps), len(it)))
            self.L = None
            Linv_C = xp.eye(nC)
            dE = xp.ones(nE)
        dI = xp.asarray(dI)
        # C^{-1} = D_I A~_II^{-1} D_I per group; local coupling K_g = A~_KI D_I^{-1}
        inv_II = xp.stack([xp.linalg.inv(a) for a in A_II])    # one LU per shape (not a batched small-matrix LU)
        C_inv = dI[:, :, None] * inv_II * dI[:, None, :]
        Kg = A_KI / dI[:, None, :]
        # static condensation: Sigma~ = sum_c P_c^T (A~_KK - A~_KI A~_II^{-1} A~_IK) P_c
        S_loc_g = xp.asarray(A_KK) - A_KI @ inv_II @ A_KI.transpose(0, 2, 1)
        pair = valid[:, :, None] & valid[:, None, :]
        pc, pa, pb = np.nonzero(pair)
        vals = S_loc_g[xp.asarray(grp[pc]), xp.asarray(pa), xp.asarray(pb)]
        Sig = be.sparse.coo_matrix((vals, (xp.asarray(gsk[pc, pa]), xp.asarray(gsk[pc, pb]))),
                                   shape=(nK, nK)).toarray()
        del vals
        # Sigma = L_K^{-1} Sigma~ L_K^{-T}
        Sig[:nC] = Linv_C @ Sig[:nC]
        Sig[nC:] /= dE[:, None]
        Sig[:, :nC] = Sig[:, :nC] @ Linv_C.T
        Sig[:, nC:] /= dE[None, :]
        Gm, B_hat, Lam = Sig[:nC, :nC], Sig[:nC, nC:], Sig[nC:, nC:]
        G_inv = xp.linalg.inv((Gm + Gm.T) / 2) if nC else xp.zeros((0, 0))
        M = B_hat.T @ G_inv                                               # B^T G^{-1} (nE, nC)
        Pi = Lam - M @ B_hat
        Pi = (Pi + Pi.T) / 2
        Pi_inv = xp.linalg.inv(Pi) if nE else xp.zeros((0, 0))
        if keep_factors:
            self.Pi, self.C_blocks = Pi, A_II / dI[:, :, None] / dI[:, None, :]
            self.Sigma = Sig
        del Sig, Lam, Pi
        cast = lambda a: xp.ascontiguousarray(a.astype(dt))
        self.C_inv = [cast(C_inv[g]) for g in range(len(reps))]
        self.K = [cast(Kg[g]) for g in range(len(reps))]
        self.KT = [cast(Kg[g].T) for g in range(len(reps))]
        self.Pi_inv, self.G_inv, self.B_hat, self.M = cast(Pi_inv), cast(G_inv), cast(B_hat), cast(M)
        self.Linv_C, self.Linv_CT = cast(Linv_C), cast(Linv_C.T)
        self.inv_dE = cast(1.0 / dE)
        # gather tables: skeleton node <- (group row block, slot, cell) rows of the stacked local results
        n_sk = len(sk)
        rows_of = np.empty(gsk.shape, np.int64)                          # row in the stacked array
        off = 0
        for cg in rm.group_cells:
            mg = len(cg)
            rows_of[cg] = off + np.arange(n_sk)[None, :] * mg + np.arange(mg)[:, None]
            off += n_sk * mg
        order = np.argsort(gsk[valid], kind="stable")
        nodes = gsk[valid][order]
        rws = rows_of[valid][order]
        cnt = np.bincount(nodes, minlength=nK)
        vmax = int(cnt.max()) if nK else 0
        pos = np.arange(len(nodes)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        table = np.full((nK, max(vmax, 1)), off, np.int64)
        table[nodes, pos] = rws
        self._gather_C = xp.asarray(table[:nC])
        self._gather_E = xp.asarray(table[nC:, :2])                      # an edge node lies in <= 2 cells
        gsk_d = np.where(valid, gsk, nK)
        self._scatter = [xp.asarray(np.ascontiguousarray(gsk_d[cg].T)) for cg in rm.group_cells]   # (n_sk, m_g)
        self.N, self.n_C, self.n_E, self.n_K = N, nC, nE, nK
        self._S = None

    # ------------------------------------------------------------------ solve
    def _check(self, b, name):
        xp = self.backend.xp
        if not isinstance(b, xp.ndarray):
            raise TypeError(f"{name} must be a {xp.__name__} array on the {self.backend.name} backend, "
                            f"got {type(b).__module__}.{type(b).__name__}")
        if b.ndim not in (1, 2) or b.shape[0] != self.N:
            raise ValueError(f"{name} must have shape ({self.N},) or ({self.N}, k), got {b.shape}")
        if b.dtype.kind != "f":
            raise TypeError(f"{name} must be a real floating-point array, got dtype {b.dtype}")

    def solve_prehandled(self, b):
        """x = A^{-1} b for the prehandled matrix A; b (N,) or (N, k) in the working dtype."""
        self._check(b, "b")
        if b.dtype != self.dtype:
            raise TypeError(f"solve_prehandled: b must have the solver's dtype {self.dtype}, got {b.dtype} "
                            "(solve() converts and scales)")
        xp = self.backend.xp
        vec = b.ndim == 1
        B = xp.ascontiguousarray(b.reshape(self.N, -1))
        k = B.shape[1]
        nC, nK = self.n_C, self.n_K
        rm = self.rm
        n_int = len(rm.interior_local)
        off = rm.group_offsets
        parts, bI = [], []
        for g, cg in enumerate(rm.group_cells):
            bg = B[off[g]:off[g + 1]].reshape(n_int, len(cg) * k)
            bI.append(bg)
            parts.append((self.K[g] @ (self.C_inv[g] @ bg)).reshape(-1, k))
        parts.append(xp.zeros((1, k), self.dtype))
        R = xp.concatenate(parts)
        rC = B[:nC] - self.Linv_C @ R[self._gather_C].sum(axis=1, dtype=self.dtype)
        rE = B[nC:nK] - R[self._gather_E].sum(axis=1, dtype=self.dtype) * self.inv_dE[:, None]
        xE = self.Pi_inv @ (rE - self.M @ rC)
        xC = self.G_inv @ (rC - self.B_hat @ xE)
        xt = xp.concatenate([self.Linv_CT @ xC, xE * self.inv_dE[:, None], xp.zeros((1, k), self.dtype)])
        X = xp.empty_like(B)
        X[:nC], X[nC:nK] = xC, xE
        for g, cg in enumerate(rm.group_cells):
            loc = xt[self._scatter[g]].reshape(-1, len(cg) * k)
            xp.matmul(self.C_inv[g], bI[g] - self.KT[g] @ loc, out=X[off[g]:off[g + 1]].reshape(n_int, -1))
        return X[:, 0] if vec else X

    def transforms(self):
        """(S, S^T) on the unknowns, CSR on the backend (built on first use)."""
        if self._S is None:
            be = self.backend
            if self.prehandle:
                S = global_transform(self.rm)[:self.N, :self.N].tocsr()
            else:
                S = sp.identity(self.N, format="csr")
            self._S = (be.asmatrix(S), be.asmatrix(S.T.tocsr()))
        return self._S

    def rhs(self, b_h):
        """b = L^{-1} S^T b_h in float64 (b_h: nodal load on the unknowns)."""
        self._check(b_h, "b_h")
        S, ST = self.transforms()
        t = ST @ b_h.astype(np.float64, copy=False)
        return self.L.apply_inv(t) if self.prehandle else t

    def back_transform(self, x):
        """x_h = S L^{-T} x in float64."""
        S, _ = self.transforms()
        x = x.astype(np.float64, copy=False)
        return S @ (self.L.apply_inv_t(x) if self.prehandle else x)

    def solve(self, b_h):
        """Nodal solution(s) x_h of A_h x_h = b_h (b_h (N,) or (N, k)); float64 result."""
        xp = self.backend.xp
        b = self.rhs(b_h)
        scale = xp.max(xp.abs(b), axis=0) if b.size else xp.ones(b.shape[1:])
        scale = xp.where(scale > 0, 2.0 ** xp.ceil(xp.log2(xp.where(scale > 0, scale, 1.0))), 1.0)
        x = self.solve_prehandled((b / scale).astype(self.dtype))
        return self.back_transform(x) * scale

    def __repr__(self):
        rm = self.rm
        return (f"SchurSolver(M1, {self.dtype}, prehandle={self.prehandle}, {self.backend.name}: "
                f"|C|={rm.n_C}, |E|={rm.n_E}, |I|={rm.n_I}, {rm.num_groups} C_i of size {(rm.n - 1) ** 2})")
