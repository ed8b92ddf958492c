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

import copy

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, is_device_array, is_device_sparse, to_host
from ..device.congruence_rows import available as _rows_available, constrained_congruence, fits as _rows_fit
from ..device.index_kernels import constrained_csr
from .congruence import congruence_map_on
from .csr_ops import (NodeBlockMatrix, as_csr, congruence_map, congruence_with_constraints, csr_diagonal,
                      diagonal_positions,
                      expand_node_blocks, mask_rows_cols)
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
    build_H : build the space's hanging-node matrix ``H`` now (default) or on first use
        (:func:`adaptmg.multigrid` builds the finest one on a worker of its own: the
        prolongation needs only :attr:`free`).
    """

    def __init__(self, space: Space, dirichlet=None, values=None, build_H=True):
        if not isinstance(space, Space):
            raise TypeError(f"Constraints expects a Space, got {type(space).__name__}")
        self.space = space
        n = space.num_dofs
        # the space's array module: NumPy, or CuPy for a space on a device mesh (the DoF lists,
        # masks and values then live there; O(1) scalars are read back)
        xp = space.backend.xp
        D = xp.zeros(0, dtype=np.int64) if dirichlet is None else xp.asarray(dirichlet)
        if D.size and not np.issubdtype(D.dtype, np.integer):
            raise ValueError(f"dirichlet must be an integer array of DoF indices, got dtype {D.dtype}")
        if D.size and bool(((D < 0) | (D >= n)).any()):      # one read (the range: on error only)
            raise ValueError(f"dirichlet DoF indices must lie in [0, {n}), got range [{D.min()}, {D.max()}]")
        hang = space.is_hanging
        fixed = xp.zeros(n, dtype=bool)
        fixed[D] = True
        fixed &= ~hang
        self.dirichlet = xp.flatnonzero(fixed)
        self.free = ~(fixed | hang)
        self.g = self._values(values)
        self._scale = None
        if build_H and space.hanging_nodes.shape[0]:   # (its length: no read of the mask)
            space.H             # built now (as before); without hanging nodes only when used

    @property
    def H(self):
        """The space's hanging-node matrix (without hanging nodes the identity, built on first
        use: :meth:`matrix` does not need it)."""
        return self.space.H

    def _values(self, values):
        """The Dirichlet value vector g (zero off the Dirichlet DoFs) of ``values``."""
        space, n = self.space, self.space.num_dofs
        xp = space.backend.xp
        g = xp.zeros(n)
        if values is not None and self.dirichlet.size:
            if callable(values):
                full = space.interpolate(values)
            else:
                full = xp.broadcast_to(xp.asarray(values, dtype=float), (n,)) if np.ndim(values) == 0 \
                    else xp.asarray(values, dtype=float)
                if full.shape != (n,):
                    raise ValueError(f"values must be a scalar, an array of shape ({n},) or a callable, "
                                     f"got shape {full.shape}")
            if not bool(xp.isfinite(full[self.dirichlet]).all()):
                raise ValueError("Dirichlet values contain NaN or Inf")
            g[self.dirichlet] = full[self.dirichlet]
        return g

    def with_values(self, values):
        """These constraints with other Dirichlet values g: the same space, Dirichlet DoFs and
        (once :meth:`matrix` has run, e.g. inside :func:`adaptmg.multigrid`) the same Dirichlet
        row scale s, so :meth:`rhs` fits the matrix already built and needs no second
        :meth:`matrix` (a full congruence product) to learn s.  ``values`` as in the
        constructor."""
        out = copy.copy(self)
        out.g = self._values(values)
        return out

    @property
    def num_free(self) -> int:
        return int(self.free.sum())

    def _check_backend(self, a, what):
        """A host ``a`` (matrix or vector) for a space on a device mesh is a ValueError: the
        constraints live on the device, and nothing is moved silently."""
        if self.space._on_device:
            raise ValueError(f"Constraints: the space's mesh lives on the GPU, so the {what} must be a "
                             f"CuPy/cupyx array (e.g. assemble.load(space, f, device='gpu')), got "
                             f"{type(a).__module__}.{type(a).__name__}; or use mesh.to('cpu')")

    def _check_square(self, A):
        n = self.space.num_dofs
        if A.shape != (n, n):
            raise ValueError(f"matrix has shape {A.shape}, the space has {n} DoFs")

    def project(self, A):
        """H^T A H (all rows kept), the matrix acting on regular DoF values (SciPy CSR; a
        :class:`~adaptmg.fe.csr_ops.NodeBlockMatrix` stays one; a CuPy matrix stays on the device)."""
        if isinstance(A, NodeBlockMatrix):
            self._check_square(A)
            return A if self.space.hanging_nodes.size == 0 else A.congruence(self.space.H_nodes)
        if is_device_sparse(A):
            self._check_square(A)
            return _device_project(self, A)
        self._check_backend(A, "matrix")
        A = as_csr(A)                              # a csr_matrix stays itself (flags kept)
        self._check_square(A)
        if self.space.hanging_nodes.size == 0:
            return A
        return congruence_with_constraints(A, self.H, np.flatnonzero(self.space.is_hanging))

    def matrix(self, A):
        """Constrained matrix K = Z H^T A H Z + s (I - Z).

        ``A``: SciPy sparse (result SciPy CSR), a CuPy sparse matrix (the products run on the
        device by cuSPARSE SpGEMM, the result is CuPy CSR; see :func:`_device_matrix`) or a
        :class:`~adaptmg.fe.csr_ops.NodeBlockMatrix` (the congruence on its scalar node
        pattern, expanded once; see :meth:`_matrix_blocks`; with a GPU backend and a free mask
        that differs between a node's components, expanded on the device and constrained as
        a CuPy matrix).
        """
        if isinstance(A, NodeBlockMatrix):
            if self.space._on_device and not getattr(getattr(A, "backend", None), "is_gpu", False):
                raise ValueError("Constraints.matrix: the space's mesh lives on the GPU, so the node-block "
                                 "matrix must be one of the GPU (NodeBlockMatrix(..., backend=gpu), e.g. "
                                 "the fields of assemble.elasticity(..., format='fields') on that mesh); "
                                 "or use mesh.to('cpu')")
            return self._matrix_blocks(A)
        if is_device_sparse(A):
            self._check_square(A)
            return _device_matrix(self, A)
        self._check_backend(A, "matrix")
        # without hanging nodes H = I: project() returns A itself (no product, no copy), and
        # K = Z A Z + s (I - Z) is one masking pass over A (zeros dropped in the same pass)
        B = self.project(A)
        d = np.abs(B.diagonal()[self.free])
        self._scale = float(d.mean()) if d.size and d.mean() > 0 else 1.0
        K = mask_rows_cols(B, self.free, self.free, diagonal=self._scale, drop_zeros=True)
        K.sort_indices()                           # no-op for sorted input (flag carried over)
        return K

    def _matrix_blocks(self, A: NodeBlockMatrix) -> sp.csr_matrix:
        r"""K for :math:`A = \sum_f S_f \otimes C_f` on the node pattern.

        When the free mask is the same for all components of a node (Dirichlet on whole
        nodes; hanging nodes always are), Z = Z_n (x) I_c and

        .. math:: K = \sum_f (Z_n H_n^T S_f H_n Z_n) \otimes C_f + s\, (I - Z_n) \otimes I_c :

        one congruence map on the scalar pattern for all fields (only free pairs formed,
        plus the diagonal of the fixed nodes), an identity field for ``s (I - Z)`` and one
        expansion to CSR; zeros are dropped as in the general path.  Otherwise the
        expanded matrix takes the general path.  With a GPU ``A.backend`` the expansion runs on
        the device and K is a CuPy CSR matrix (:func:`~adaptmg.fe.csr_ops.expand_node_blocks`);
        there ``s (I - Z)`` is added to the fixed nodes' diagonal blocks during the expansion
        instead of as an identity field (no (nnz, F + 1) copy of the fields on the host), and
        the congruence itself runs there too (:meth:`_matrix_blocks_on`).
        """
        self._check_square(A)
        c, n = A.c, self.space.num_nodes
        if c != self.space.components:
            raise ValueError(f"the block matrix has {c} components, the space {self.space.components}")
        fr = self.free.reshape(n, c)
        be = getattr(A, "backend", None)
        if not bool((fr == fr[:, :1]).all()):
            if be is not None and be.is_gpu:           # expanded on the device, constrained there
                return self.matrix(expand_node_blocks(be, A.indptr, A.indices, A.data, A.coef, n))
            return self.matrix(A.tocsr())
        fn = fr[:, 0]
        fixed = self.space.backend.xp.flatnonzero(~fn)
        if be is not None and be.is_gpu:
            return self._matrix_blocks_on(be, A, fn, fixed)
        ip, ind, T = congruence_map(A.indptr, A.indices, self.space.H_nodes, fn, extra_diagonal=fixed)
        data = T @ A.data
        dp = diagonal_positions(ip, ind, n)
        self._scale = _block_scale(data, dp[fn], A.coef)
        ident = np.zeros((ind.size, 1))
        ident[dp[fixed], 0] = 1.0
        coef = np.concatenate([A.coef, self._scale * np.eye(c)[None]], axis=0)
        K = NodeBlockMatrix(ip, ind, np.hstack([data, ident]), coef, n).tocsr()
        K.eliminate_zeros()
        return K

    def _matrix_blocks_on(self, be, A, fn, fixed):
        r""":meth:`_matrix_blocks` on the backend ``be`` (the GPU; NumPy in the CPU tests): the
        congruence map there (:func:`~.congruence.congruence_map_on`: the expansion of the
        hanging and fixed nodes' entries and one sort, no SpGEMM), the fields' values
        ``T @ data`` by one sparse-times-dense product, ``s`` from the free nodes' diagonal
        blocks (one scalar read back) and the expansion to CSR there with ``s (I - Z)`` on the
        fixed nodes' diagonal blocks.  Only the rows of ``H_n`` of the hanging and fixed nodes
        and the free mask travel (and the fields, when they are on the host); for a space on a
        device mesh nothing travels (``H_n`` and the mask are there)."""
        n, c = self.space.num_nodes, A.c
        ip, ind, T = congruence_map_on(be, A.indptr, A.indices, self.space.H_nodes, fn, extra_diagonal=fixed,
                                       on_mesh_device=self.space._on_device)
        data = T @ be.asarray(A.data)
        dp = diagonal_positions(ip, ind, n)
        self._scale = _block_scale(data, dp[be.asarray(fn)], A.coef)
        return expand_node_blocks(be, ip, ind, data, A.coef, n, drop_zeros=True,
                                  diagonal=(dp[be.asarray(fixed)], self._scale * np.eye(c)))

    @property
    def scale(self):
        """The Dirichlet row scale ``s`` of the last :meth:`matrix` (rows ``s * I`` on the fixed
        DoFs: the mean of ``|B_ii|`` over the free DoFs); None before the first."""
        return self._scale

    def rhs(self, b, A=None) -> np.ndarray:
        """Constrained right-hand side f = Z H^T (b - A H g) + s g (A needed when g != 0;
        host or device matrix).  A host ``b`` gives a host result; a CuPy ``b`` (e.g.
        ``assemble.load(..., device="gpu")``) a CuPy result computed on the device."""
        dev = backend_of(b) if is_device_array(b) else None
        if dev is None:
            self._check_backend(b, "right-hand side")
            b = np.asarray(b, dtype=float)
        if b.shape != (self.space.num_dofs,):
            raise ValueError(f"right-hand side has shape {b.shape}, expected ({self.space.num_dofs},)")
        if dev is None:
            HT, H, free, dirichlet, g = self.H.T, self.H, self.free, self.dirichlet, self.g
            r = b
        else:
            HT, H, free, dirichlet, g = self._device_parts(dev)
            r = b.astype(float, copy=False)
        if self.dirichlet.size and bool(self.space.backend.xp.any(self.g)):
            if A is None:
                raise ValueError("rhs needs the assembled matrix A to lift non-zero Dirichlet values")
            r = r - _product_on(A, H @ g, dev)
        if self._scale is None:
            if A is None:
                raise ValueError("call matrix(A) first or pass A: the Dirichlet row scale comes from A")
            self.matrix(A)
        f = HT @ r
        f[~free] = 0.0
        f[dirichlet] = self._scale * g[dirichlet]
        return f

    def _device_parts(self, be):
        """H^T, H, the free mask and the Dirichlet DoFs and values on the device (made once;
        made again when ``g`` was replaced by another array -- changing it in place after the
        first device ``rhs`` is not seen)."""
        parts = getattr(self, "_dev_parts", None)
        if parts is None or getattr(self, "_dev_g_host", None) is not self.g:
            self._dev_g_host = self.g
            parts = (self._HT_on(be), be.asmatrix(self.H), be.asarray(self.free),
                     be.asarray(self.dirichlet), be.asarray(self.g))
            self._dev_parts = parts
        return parts

    def _HT_on(self, be):
        """:math:`H^T` as CSR on the device ``be`` (made once; transposed there when ``H`` is)."""
        HT = getattr(self, "_HT_dev", None)
        if HT is None:
            H = self.H
            HT = H.T.tocsr() if is_device_sparse(H) else be.asmatrix(H.T.tocsr())
            self._HT_dev = HT
        return HT

    def apply(self, A, b):
        """(K, f): the constrained matrix and right-hand side."""
        K = self.matrix(A)
        return K, self.rhs(b, A)

    def expand(self, x):
        """Finite element nodal values u = H x (numpy or cupy x; H moved to x's device once)."""
        be = backend_of(x)
        if be.is_gpu:
            if getattr(self, "_H_dev", None) is None:
                self._H_dev = be.asmatrix(self.H)
            return self._H_dev @ x
        self._check_backend(x, "vector")
        x = np.asarray(x)
        if x.shape != (self.space.num_dofs,):
            raise ValueError(f"x has shape {x.shape}, expected ({self.space.num_dofs},)")
        return self.H @ x


# ----------------------------------------------------------------------------- any backend
def _block_scale(data, dpos, coef):
    r"""The Dirichlet row scale ``s`` of a node-block matrix: the mean of :math:`|K_{ii}|` over the
    free DoFs, from the fields ``data`` at the free nodes' diagonal entries ``dpos`` (arrays of
    one backend); 1 when there are none or they are all zero."""
    if int(dpos.shape[0]) == 0:
        return 1.0
    xp = backend_of(data).xp
    d = xp.abs(data[dpos] @ xp.asarray(np.einsum("frr->fr", coef)))
    mean = float(d.mean())
    return mean if mean > 0 else 1.0


def _device_project(cons, A, be=None):
    r""":math:`H^T A H` on ``A``'s backend: A plus corrections from its hanging rows and columns
    only -- on the device :func:`~.congruence.congruence_on_device` (cuSPARSE SpGEMM up to a
    size, else the expansion without SpGEMM, which cuSPARSE refuses for lack of resources at
    millions of rows), on the host
    SciPy's products (:func:`~.csr_ops.congruence_with_constraints`)."""
    A = A.tocsr()
    if cons.space.hanging_nodes.size == 0:
        return A
    return congruence_with_constraints(A, cons.H, cons.space.backend.xp.flatnonzero(cons.space.is_hanging))


def _device_matrix(cons, A, be=None):
    r""":math:`K = Z H^T A H Z + s (I - Z)` written once against the backend's array and sparse
    modules (``numpy``/``scipy.sparse`` or ``cupy``/``cupyx.scipy.sparse``), so that a device
    matrix never leaves the device: :math:`B = H^T A H` (:func:`_device_project`), ``s`` the
    mean of :math:`|B_{ii}|` over the free DoFs, then the entries of B in free rows and
    columns (zeros dropped, as :meth:`Constraints.matrix` does) and ``s`` in the diagonal
    entry of the others: one masking pass (:func:`~.csr_ops.mask_rows_cols`), or, where a
    removed row stores no diagonal entry, written row by row as canonical CSR
    (:func:`~adaptmg.device.index_kernels.constrained_csr`; the host via COO) -- at once with
    hanging nodes (their rows of :math:`H^T A H` are empty: the masking pass would fail after
    a dozen launches and two reads).  With hanging nodes on a device mesh (``H`` there) K is
    written row by row from A, H and :math:`H^T` without forming B
    (:func:`~adaptmg.device.congruence_rows.constrained_congruence`: two kernels, one read) in
    2-D and for scalar Q1 in 3-D, whose rows have at most 64 distinct columns.
    """
    be = backend_of(A) if be is None else be
    xp = be.xp
    space = cons.space
    # rows that fit the kernels' 64 column slots (2-D, 3-D scalar Q1); the others keep the products
    if _rows_fit(space) and space.hanging_nodes.size and space._on_device and is_device_sparse(space.H):
        H, HT = space.H, cons._HT_on(be)
        if _rows_available(A, H, HT):          # K row by row: two kernels and one read
            K, cons._scale = constrained_congruence(A, H, HT, cons.free)
            return K
    B = _device_project(cons, A, be)
    B.sum_duplicates()
    z = xp.asarray(cons.free)
    d = xp.abs(csr_diagonal(B))[z]
    mean = float(d.mean()) if d.size else 0.0
    cons._scale = mean if mean > 0 else 1.0
    if cons.space.hanging_nodes.size == 0:     # (H^T A H stores no entry in a hanging row)
        try:
            return mask_rows_cols(B, cons.free, cons.free, diagonal=cons._scale, drop_zeros=True)
        except ValueError:                     # a removed row without a stored diagonal entry
            pass
    return constrained_csr(B, z, cons._scale)              # two row kernels on the device


def _product_on(A, v, dev):
    """``A @ v`` where ``v`` lives: on the host (``dev`` None) or on the device ``dev``,
    whichever side the matrix ``A`` is on."""
    if dev is None:
        return to_host(A @ backend_of(A).asarray(v)) if is_device_sparse(A) else A @ v
    return (A if is_device_sparse(A) else dev.asmatrix(A)) @ v
