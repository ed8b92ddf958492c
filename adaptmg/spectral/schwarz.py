"""Seed 004's two-scale additive Schwarz preconditioner ``P = P^c + P^f`` (§4).

Fine scale ``P^f = W^{1/2} (sum_s R_s^T Atilde_s^{-1} R_s) W^{1/2}``, ``W`` the inverse of
the number of subdomains holding a DoF (symmetric multiplicity scaling: without it the
mass-dominated limit of the heat equation needs twice the iterations of Jacobi, with it
P^f is exact there; measured 3-D k = 3 Poisson on 2^3 cells: 25 -> 11 CG iterations
two-scale, 20 -> 7 p-multigrid).  One overlapping subdomain per cell,
the cell plus one GLL node layer across each of its faces ((k+3)^d nodes, indices
-1..k+1 a direction; the layer is the neighbour's first node inside, found by matching
the shared face's global DoFs, so any orientation and vertex valence works).  The
nodes of the box that lie across edges or corners (two or three indices outside
0..k) belong to no face neighbour and stay out of R_s (zero data, result dropped).
``Atilde_s`` is the separable approximation of ``c_m M + c_k K`` on a box with the
cell's mean edge lengths h_0..h_{d-1} (geometric factors ignored, seed 004 §4.2):

    Atilde_s = c_m (x)_d h_d Mhat_d + c_k sum_d (Khat_d / h_d) (x)_{e != d} h_e Mhat_e,

``Khat``/``Mhat`` the extended-pencil GLL stiffness and lumped mass
(:func:`adaptmg.spectral.basis.pencil_factors`; Dirichlet at nodes -2 and k+2, or at the
cell's own end node on a Dirichlet boundary).  With ``Khat S = Mhat S diag(lam)``,
``S^T Mhat S = I`` the inverse is the fast diagonalisation

    Atilde_s^{-1} = (prod_d h_d)^{-1} (S_{d-1} x ... x S_0)
                    diag(1 / (c_m + c_k sum_d lam_d / h_d^2)) (S_{d-1} x ... x S_0)^T,

one batched matmul per axis and direction, with the cells' S picked from 9 pencils.

Coarse scale ``P^c = P A_1^{-1} P^T``: ``P`` interpolates Q1 on the mesh vertices into
the GLL nodes (the multilinear shape functions at the GLL points), ``A_1^{-1}`` is one
V(2,2) cycle of :func:`adaptmg.multigrid` on the Q1 problem ``c_m M_1 + c_k K_1``
(geometric levels, then algebraic ones) with Chebyshev-Jacobi smoothing
(:data:`Q1_SMOOTHER`) as a preconditioner.  On a 2:1 mesh with hanging nodes the
transfer is ``P H_1`` (``H_1`` the Q1 constraint matrix of :mod:`adaptmg.fe.space`) with
the hanging rows and columns of both sides dropped, and the fine scale leaves the hanging
DoFs out of its patches (they are masked like Dirichlet DoFs)."""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import CPU
from ..mesh import reference as ref
from .basis import SIDE_DIRICHLET, SIDE_EXTEND, SIDE_FREE, pencil_factors
from .space import SpectralSpace, array_nbytes, local_indices, retype_csr, row_ids

__all__ = ["FineSchwarz", "CoarseQ1", "TwoScale", "face_neighbours", "q1_interpolation", "q1_multigrid",
           "masked_transfer", "space_transfer", "q1_constraints", "Q1_SMOOTHER"]


def face_neighbours(mesh):
    """(cells, 2d) neighbour cell and its local face across each face (-1: boundary)."""
    d = mesh.dim
    fv = ref.face_vertices(d)
    cells = np.asarray(mesh.cells)
    nc = cells.shape[0]
    keys = np.sort(cells[:, fv], axis=2).reshape(nc * 2 * d, -1)
    inv = row_ids(keys)
    order = np.argsort(inv, kind="stable")
    s = inv[order]
    pair = np.flatnonzero(s[1:] == s[:-1])                     # consecutive equal keys
    nb = np.full(nc * 2 * d, -1, dtype=np.int64)
    nb[order[pair]] = order[pair + 1]
    nb[order[pair + 1]] = order[pair]
    nb = nb.reshape(nc, 2 * d)
    cell = np.where(nb >= 0, nb // (2 * d), -1)
    face = np.where(nb >= 0, nb % (2 * d), -1)
    return cell, face


def _cell_contract(u, A, axis, dim):
    """Per-cell matrices A (cells, m, n) along tensor axis ``axis`` of u (cells, n, ..., n)."""
    if axis == 0:
        At = A.swapaxes(1, 2)
        return u @ (At[:, None] if dim == 3 else At)
    if axis == 1:
        return (A[:, None] if dim == 3 else A) @ u
    nc, nz = u.shape[0], u.shape[1]
    return (A @ u.reshape(nc, nz, -1)).reshape((nc, A.shape[1]) + u.shape[2:])


def _face_permutation(cd, k, d, fln, c, f, c2, f2, xp):
    """(pairs, n^(d-1)) on ``xp``: for the face ``f`` of cell ``c`` shared with face ``f2`` of
    ``c2`` (``cd`` the cell DoFs, ``fln`` the face-local nodes, pairs on ``xp``), the
    neighbour's face-local index of each of my face nodes.  Face-local nodes are
    lexicographic in the face's two free axes, ``j = u + n v``; the neighbour sees them through
    one of the 8 symmetries of the square (2-D: 2 of the segment), read off where my corners
    (0, 0) and (k, 0) sit among its corners -- one table look-up a pair, no sort."""
    n = k + 1
    u = np.arange(n ** (d - 1)) % n
    v = np.arange(n ** (d - 1)) // n if d == 3 else np.zeros(n, dtype=np.int64)
    corners = [0, k] if d == 2 else [0, k, k * n, k * n + k]
    fc = xp.asarray(fln[:, corners])
    mine = cd[c[:, None], fc[f]]
    theirs = cd[c2[:, None], fc[f2]]
    where0 = xp.argmax(theirs == mine[:, :1], axis=1)                  # my (0, 0) among theirs
    where1 = xp.argmax(theirs == mine[:, 1:2], axis=1)                 # my (k, 0)
    perms, table = [], np.zeros((len(corners), len(corners)), dtype=np.int64)
    cu = np.array([0, k, 0, k])[:len(corners)]
    cv = np.array([0, 0, k, k])[:len(corners)]
    for swap in ((False, True) if d == 3 else (False,)):               # the symmetries, not the mesh
        for fu in (False, True):
            for fv in ((False, True) if d == 3 else (False,)):
                a, b = (v, u) if swap else (u, v)
                a, b = (k - a if fu else a), (k - b if fv else b)
                perm = a + n * b
                at = {int(ca + n * cb): i for i, (ca, cb) in enumerate(zip(cu, cv))}
                table[at[int(perm[corners[0]])], at[int(perm[corners[1]])]] = len(perms)
                perms.append(perm)
    return xp.asarray(np.array(perms))[xp.asarray(table)[where0, where1]]


class FineSchwarz:
    """``P^f`` of seed 004 on a :class:`SpectralSpace` (see the module docstring).

    ``dirichlet``: the fixed DoFs (their residual is zero and their result is dropped);
    ``mass``/``stiffness``: c_m, c_k of the operator it approximates.  ``fused`` (GPU,
    3-D): the whole of P^f but the global sum runs as one kernel a cell box
    (:mod:`adaptmg.spectral.fdm_kernels`); elsewhere the batched matmuls below."""

    def __init__(self, space: SpectralSpace, dirichlet, *, mass=0.0, stiffness=1.0,
                 dtype=np.float64, backend=None):
        from ..backend import get_backend
        self.backend = be = get_backend(backend if backend is not None else "auto")
        xp = self.xp = be.xp
        d, k = space.dim, space.degree
        m = k + 3
        nc, N = space.mesh.num_cells, space.num_dofs
        self.dtype = np.dtype(dtype)
        fixed = np.zeros(N, bool)
        fixed[np.asarray(dirichlet, dtype=np.int64)] = True
        nbc, nbf = space.on_backend(CPU, "face_neighbours", lambda: face_neighbours(space.mesh))
        ext = self._ext = space.on_backend(                     # made once a space and backend
            be, "extended", lambda: self._extended_dofs(space, m, (nbc, nbf), be))
        # side kind of every face: a neighbour, a Dirichlet boundary face, a free one
        fln = space.face_local_nodes()
        on_fixed = fixed[space.cell_dofs[:, fln]].all(axis=2)            # (nc, 2d)
        # hanging faces (no conforming neighbour, not on the boundary): the pencil extends
        # over a virtual neighbour without data, as across a conforming face (measured 2-D
        # k = 3 two-scale 35 -> 23 iterations, p-multigrid 28 -> 17, against 25 / 18 with the
        # fine side Dirichlet and 35 / 28 with both sides free)
        hanging_face = np.zeros_like(on_fixed)
        if space.hanging_dofs.size:
            bc, bf, _ = space.mesh.boundary_faces(None)
            hanging_face = nbc < 0
            hanging_face[bc, bf] = False
        kind = np.where((nbc >= 0) | hanging_face, SIDE_EXTEND, np.where(on_fixed, SIDE_DIRICHLET, SIDE_FREE))
        variant = 3 * kind[:, 0::2] + kind[:, 1::2]                      # (nc, d)
        S, lam, keep = pencil_factors(k)
        h = space.cell_lengths()
        # the 9 pencils' S and each cell's variant ids (what the fused GPU kernel,
        # adaptmg/spectral/fdm_kernels.py, reads); the per-cell S of the batched path is
        # derived from them when that path first runs (:attr:`S`)
        self.fused = bool(be.is_gpu and d == 3 and self.dtype in (np.float32, np.float64))
        self.S9 = xp.asarray(S, dtype=self.dtype)
        self.variant = xp.asarray(variant, dtype=np.int32)
        self.lam = xp.asarray(lam[variant] / h[:, :, None] ** 2, dtype=self.dtype)
        self.scale = xp.asarray(1.0 / np.prod(h, axis=1), dtype=self.dtype)
        # nodes of the box that take part (on the backend): in the pencils of every
        # direction, a DoF, not fixed
        valid = (ext >= 0).reshape((nc,) + (m,) * d)
        keepb = xp.asarray(keep > 0)
        for ax in range(d):                                              # the axes
            sh = [nc] + [1] * d
            sh[d - ax] = m
            valid &= keepb[self.variant[:, ax]].reshape(sh)
        valid = valid.reshape(nc, -1)
        valid &= ~xp.asarray(fixed)[xp.maximum(ext, 0)]
        cols = xp.flatnonzero(valid.ravel())
        rows = ext.ravel()[cols]
        self.index = xp.where(valid, ext, ext.dtype.type(N))
        self.scatter_matrix = be.sparse.coo_matrix((xp.ones(cols.size, dtype=self.dtype), (rows, cols)),
                                                   shape=(N, ext.size)).tocsr()
        count = xp.bincount(rows, minlength=N)                           # patches holding a DoF
        self.weight = xp.where(count > 0, 1.0 / xp.sqrt(xp.maximum(count, 1)), 0.0).astype(self.dtype)
        del ext, valid, cols, rows, count
        self.mass, self.stiffness = float(mass), float(stiffness)
        self.shape = (N, N)
        self._bshape = (nc,) + (m,) * d
        self.dim = d

    def astype(self, dtype):
        """The same fine scale in ``dtype`` from this one's arrays (index, variants and the
        scatter matrix's structure shared)."""
        import copy
        out = copy.copy(self)
        out.__dict__.pop("S", None)                     # the batched path's cached S
        out.dtype = dtype = np.dtype(dtype)
        for name in ("S9", "lam", "scale", "weight"):
            setattr(out, name, getattr(self, name).astype(dtype, copy=False))
        out.scatter_matrix = retype_csr(self.scatter_matrix, dtype, self.backend)
        return out

    def arrays(self):
        """The arrays P^f holds on its backend (for :func:`~adaptmg.spectral.space.array_nbytes`)."""
        return [self.index, self.S9, self.variant, self.lam, self.scale, self.weight, self.scatter_matrix,
                self._ext]

    def nbytes(self):
        """Bytes of P^f's arrays on its backend."""
        return array_nbytes(*self.arrays())

    @functools.cached_property
    def S(self):
        """``(cells, d, m, m)``: every cell's pencil eigenvectors per axis (the batched
        path's operand), ``S9[variant]``."""
        return self.S9[self.variant]

    @staticmethod
    def _extended_dofs(space, m, neighbours=None, backend=CPU):
        """(cells, (k+3)^d) global DoF of every node of the extended box, -1 where none, on
        ``backend`` (``neighbours``: :func:`face_neighbours` of the mesh, when already at hand;
        the (cells, 2d) pairs are found on the host, the boxes filled on the backend)."""
        xp = backend.xp
        d, k, n = space.dim, space.degree, space.degree + 1
        nc = space.mesh.num_cells
        cd = space.on_backend(backend, "cell_dofs")
        ext = xp.full((nc, m ** d), -1, dtype=cd.dtype)
        li = local_indices(k, d)
        ext[:, xp.asarray(((li + 1) * m ** np.arange(d)).sum(1))] = cd  # cell node -> box node
        nbc, nbf = face_neighbours(space.mesh) if neighbours is None else neighbours
        fln = space.face_local_nodes()                                   # (2d, n^(d-1))
        c, f = np.nonzero(nbc >= 0)
        c2, f2 = nbc[c, f], nbf[c, f]
        step = np.where(f2 % 2 == 0, 1, -1) * n ** (f2 // 2)             # one node inwards
        c, f, c2, f2, step = (xp.asarray(a) for a in (c, f, c2, f2, step))
        inward = cd[c2[:, None], xp.asarray(fln)[f2] + step[:, None]]
        matched = xp.take_along_axis(inward, _face_permutation(cd, k, d, fln, c, f, c2, f2, xp), axis=1)
        out = li[fln] + 1                                                # (2d, n^(d-1), d): per face,
        for face in range(2 * d):                                        # its nodes moved one layer out
            out[face, :, face // 2] = 0 if face % 2 == 0 else m - 1
        ext[c[:, None], xp.asarray((out * m ** np.arange(d)).sum(2))[f]] = matched
        return ext

    def __call__(self, r):
        """``P^f r`` for a global residual ``r`` (zero on the fixed DoFs)."""
        xp, d = self.xp, self.dim
        if self.fused:                                                   # GPU, 3-D: one kernel
            from .fdm_kernels import fdm_apply
            return fdm_apply(self, r)
        rp = xp.concatenate([self.weight * r.astype(self.dtype, copy=False), xp.zeros(1, dtype=self.dtype)])
        t = rp[self.index].reshape(self._bshape)
        for ax in range(d):
            t = _cell_contract(t, self.S[:, ax].swapaxes(1, 2), ax, d)
        lam = self.lam
        den = None
        for ax in range(d):                                              # sum_d lam_d, broadcast
            sh = [lam.shape[0]] + [1] * d
            sh[d - ax] = lam.shape[2]
            v = lam[:, ax].reshape(sh)
            den = v if den is None else den + v
        t = t * (self.scale.reshape((-1,) + (1,) * d) / (self.mass + self.stiffness * den))
        for ax in range(d):
            t = _cell_contract(t, self.S[:, ax], ax, d)
        return self.weight * (self.scatter_matrix @ t.reshape(-1))


def q1_interpolation(space: SpectralSpace):
    """CSR (num_dofs, mesh nodes): Q1 on the mesh vertices interpolated into the GLL nodes."""
    return space.interpolation(1, space.mesh.cells, space.mesh.num_nodes)


#: smoother of the Q1 coarse scale's levels (``q1_multigrid``'s default).  Degree-3
#: Chebyshev-Jacobi instead of damped Jacobi: on cells of aspect ratio ~2 (the O-grid of
#: :func:`adaptmg.spectral.meshes.ogrid_cylinder`) omega = 4 / (3 lambda_max(D^-1 A)) falls
#: to 0.44 and Jacobi barely smooths the long directions.  Measured V(2,2) factors of the
#: Q1 problem, O-grid 16 / 32 / 64 (geometric levels): Jacobi 0.49 / 0.56 / 0.60,
#: Chebyshev 0.11 / 0.11 / 0.11; the unit cube and the distorted cube 0.11 with either.
Q1_SMOOTHER = "chebyshev"


def q1_multigrid(mesh, dirichlet, *, mass=0.0, stiffness=1.0, dtype=np.float64, backend=None,
                 **multigrid_kwargs):
    """``(ml, fixed)``: :func:`adaptmg.multigrid` on ``c_m M_1 + c_k K_1`` (Q1 on the mesh
    vertices, DoF = mesh node) with the Dirichlet ids ``dirichlet`` ("all", ids or None),
    and the fixed vertex DoFs.  ``multigrid_kwargs`` go to :func:`adaptmg.multigrid`; the
    smoother defaults to :data:`Q1_SMOOTHER`."""
    multigrid_kwargs.setdefault("smoother", Q1_SMOOTHER)
    from .. import assemble, multigrid
    from ..fe import Space
    from ..multilevel.hierarchy import dirichlet_dofs
    cm, ck = float(mass), float(stiffness)

    def form(s):
        A = ck * assemble.stiffness(s)
        return A + cm * assemble.mass(s) if cm else A
    q1 = Space(mesh, 1)
    spec = dirichlet if dirichlet is None or isinstance(dirichlet, str) else \
        dict(ids=np.atleast_1d(np.asarray(dirichlet, dtype=np.int64)))
    ml = multigrid(q1, form, dirichlet=spec, backend=backend, dtype=dtype, **multigrid_kwargs)
    return ml, dirichlet_dofs(q1, spec)


def q1_constraints(mesh):
    """``(H_1, hanging nodes)`` of Q1 on the mesh vertices (:class:`adaptmg.fe.Space`), or
    ``(None, [])`` on a conforming mesh."""
    if not mesh.num_hanging_nodes:
        return None, np.zeros(0, dtype=np.int64)
    from ..fe import Space
    q1 = Space(mesh, 1)
    return q1.H, q1.hanging_nodes


def masked_transfer(P, fine_fixed, coarse_fixed, backend, dtype, coarse_H=None):
    """``(P, R)`` on ``backend``: ``Z_f P Z_c`` (no transfer into or out of fixed DoFs) and
    its transpose stored as CSR.  With the coarse side's hanging-node matrix ``coarse_H``
    the transfer is ``Z_f P H_c Z_c`` (values at the coarse regular DoFs; pass the hanging
    DoFs of both sides among the fixed ones)."""
    if coarse_H is not None:
        P = (P @ coarse_H).tocsr()
    zf = np.ones(P.shape[0])
    zf[np.asarray(fine_fixed, dtype=np.int64)] = 0.0
    zc = np.ones(P.shape[1])
    zc[np.asarray(coarse_fixed, dtype=np.int64)] = 0.0
    P = (sp.diags(zf) @ P @ sp.diags(zc)).tocsr()
    P.eliminate_zeros()
    return backend.asmatrix(P, dtype=dtype), backend.asmatrix(P.T.tocsr(), dtype=dtype)


def space_transfer(space, degree, cell_dofs, num_coarse, fine_fixed, coarse_fixed, backend, dtype,
                   coarse_H=None):
    """``(P, R)`` of :func:`masked_transfer` for ``P = space.interpolation(degree, cell_dofs,
    num_coarse)``; without ``coarse_H`` built on ``backend`` with the masks applied as it is
    written (no diagonal products) and ``R = P^T`` by the backend's CSR transpose."""
    if coarse_H is not None:
        return masked_transfer(space.interpolation(degree, cell_dofs, num_coarse), fine_fixed,
                               coarse_fixed, backend, dtype, coarse_H=coarse_H)
    xp = backend.xp
    zf = xp.ones(space.num_dofs)
    zf[xp.asarray(np.asarray(fine_fixed, dtype=np.int64))] = 0.0
    zc = xp.ones(num_coarse)
    zc[xp.asarray(np.asarray(coarse_fixed, dtype=np.int64))] = 0.0
    P = space.interpolation(degree, cell_dofs, num_coarse, backend, zf, zc)
    P = retype_csr(P, dtype, backend)
    return P, P.T.tocsr()


class CoarseQ1:
    """``P^c r = P A_1^{-1} P^T r`` with one cycle of :func:`adaptmg.multigrid` on the Q1
    problem of the mesh (``dirichlet``: boundary ids or "all", as for the spectral space).

    The cycle runs on the fixed buffers of ``ml.buffered_cycle()`` (one CUDA-graph launch
    on the GPU) and ``P``, ``P^T`` are SpMV plans (:func:`adaptmg.device.kernels.make_spmv`,
    cuSPARSE descriptors made once): :meth:`add_to` adds ``P^c r`` into a vector with no
    copy, cast or temporary."""

    def __init__(self, space: SpectralSpace, dirichlet, fixed, *, mass=0.0, stiffness=1.0,
                 dtype=np.float64, backend=None, transfer=None, **multigrid_kwargs):
        from ..backend import get_backend
        from ..device.kernels import make_spmv
        be = self.backend = get_backend(backend if backend is not None else "auto")
        self.dtype = np.dtype(dtype)
        self._args = (space, dirichlet, fixed, dict(mass=mass, stiffness=stiffness, **multigrid_kwargs))
        self.ml, cfixed = q1_multigrid(space.mesh, dirichlet, mass=mass, stiffness=stiffness,
                                       dtype=dtype, backend=be, **multigrid_kwargs)
        self.cycle = self.ml.buffered_cycle()
        if transfer is None:
            H1, hang1 = q1_constraints(space.mesh)      # hanging nodes: regular -> regular values
            transfer = space_transfer(space, 1, space.mesh.cells, space.mesh.num_nodes,
                                      np.union1d(fixed, space.hanging_dofs), np.union1d(cfixed, hang1),
                                      be, dtype, coarse_H=H1)
        self.P, self.R = (retype_csr(A, self.dtype, be) for A in transfer)
        self._P, self._R = make_spmv(self.P), make_spmv(self.R)

    def astype(self, dtype):
        """The coarse scale in ``dtype``: the Q1 hierarchy built again in it (it is small),
        the transfers' structure shared with this one's (``transfer=(P, R)``)."""
        space, dirichlet, fixed, kw = self._args
        return CoarseQ1(space, dirichlet, fixed, dtype=dtype, backend=self.backend,
                        transfer=(self.P, self.R), **kw)

    def arrays(self):
        """The arrays and CSR matrices the coarse scale holds on its backend: the transfers,
        each level's matrices and work vectors (for :func:`~adaptmg.spectral.space.array_nbytes`)."""
        out = [self.P, self.R, self.cycle.b, self.cycle.x]
        for lev in self.ml._dev:
            out += [getattr(lev, a, None) for a in ("A", "P", "R", "RA", "AP", "x", "b", "r")]
        return [a for a in out if hasattr(a, "nbytes") or hasattr(a, "indptr")]

    def nbytes(self):
        """Bytes of P^c's arrays on its backend (:meth:`arrays`; smoother data not counted)."""
        return array_nbytes(*self.arrays())

    @functools.cached_property
    def M(self):
        """The cycle as a LinearOperator (``ml.aspreconditioner()``)."""
        return self.ml.aspreconditioner()

    def _direct(self, y):
        """Whether :meth:`add_to` can run on the plans and the cycle's buffers for ``y``."""
        return np.dtype(y.dtype) == self.dtype and y.flags.c_contiguous and self.cycle.b.dtype == self.dtype

    def solve(self, r):
        """``x_c = A_1^{-1} P^T r`` (the restriction into ``cycle.b``, one cycle): returns the
        cycle's own output buffer ``cycle.x`` (valid until the next cycle)."""
        self._R(self.backend.xp.ascontiguousarray(r, dtype=self.dtype), self.cycle.b)
        return self.cycle()

    def add_to(self, r, y, xc=None):
        """``y <- y + P^c r`` in place (``r``, ``y`` of the space's DoFs); returns ``y``.
        ``xc``: the coarse solution :meth:`solve` already returned for ``r``."""
        if not self._direct(y):
            y += self.P @ self.M.matvec(self.R @ r)
            return y
        return self._P(self.solve(r) if xc is None else xc, y, 1.0, 1.0)

    def __call__(self, r):
        return self.add_to(r, self.backend.xp.zeros(self.P.shape[0], dtype=self.dtype))


class TwoScale:
    """``P = P^c + P^f`` (seed 004 eq. before §4.1); ``coarse`` a :class:`CoarseQ1`.

    ``concurrent`` ("auto": on the GPU; True: GPU only; False): P^c's restriction and
    cycle run on a second CUDA stream while P^f runs on the current one, joined by an event
    before P^c's prolongation adds into P^f's vector (``y <- P^f r + P (A_1^{-1} P^T r)``,
    the same products in the same order as sequentially).  Safe because the two parts
    share no buffer: P^c writes only the cycle's fixed buffers and its levels' vectors,
    P^f its fresh output; ``r`` is only read by both, and the caller's stream waits for
    the second one before anything after the call.  The CPU, a capture in progress, or a
    dtype mismatch runs the two parts one after the other."""

    def __init__(self, fine, coarse, concurrent="auto"):
        if concurrent not in (True, False, "auto"):
            raise ValueError(f"concurrent must be True, False or 'auto', got {concurrent!r}")
        be = coarse.backend
        if concurrent is True and not be.is_gpu:
            raise ValueError("concurrent=True needs the GPU backend (CUDA streams); use False or 'auto'")
        self.fine, self.coarse = fine, coarse
        self.concurrent = be.is_gpu if concurrent == "auto" else concurrent
        self._streams = None

    def astype(self, dtype):
        """Both scales in ``dtype`` (:meth:`FineSchwarz.astype`, :meth:`CoarseQ1.astype`)."""
        return TwoScale(self.fine.astype(dtype), self.coarse.astype(dtype), self.concurrent)

    def nbytes(self):
        return self.fine.nbytes() + self.coarse.nbytes()

    def __call__(self, r):
        coarse = self.coarse
        if self.concurrent and np.dtype(self.fine.dtype) == coarse.dtype == coarse.cycle.b.dtype:
            xp = coarse.backend.xp
            current = xp.cuda.get_current_stream()
            if not current.is_capturing():
                if self._streams is None:       # (second stream, r ready, P^c done)
                    self._streams = (xp.cuda.Stream(non_blocking=True), xp.cuda.Event(disable_timing=True),
                                     xp.cuda.Event(disable_timing=True))
                side, ready, done = self._streams
                r = xp.ascontiguousarray(r, dtype=coarse.dtype)
                ready.record(current)
                with side:
                    side.wait_event(ready)
                    xc = coarse.solve(r)
                    done.record(side)
                y = self.fine(r)
                current.wait_event(done)
                return coarse.add_to(r, y, xc)
        return coarse.add_to(r, self.fine(r))      # P^f's fresh vector takes P^c r in place


