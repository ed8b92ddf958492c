r"""A distributed level whose operator is applied matrix-free: the owned rows of

.. math::  K = Z H^T A H Z + s (I - Z)

(:mod:`.local`'s constrained operator, the same rows) with :math:`A` the Q1 Laplacian of the
rank's cells, never assembled (:class:`adaptmg.assemble.matrix_free.Q1Laplacian`).

Set-up.  The rank's cells are those :func:`.local.needed_cells` gives for its owned DoFs (owned
nodes' cells plus those of hanging nodes with an owned parent): :math:`A u` is then exact at
every node that :math:`(Z H^T)_{o,:}` reads.  Their vertices get a compact local numbering
(``lnodes``); the columns of the level are the owned DoFs, then the *ghosts* (free DoFs that a
local node's row of :math:`HZ` reaches and another rank owns, ordered by (owner, global index)
as :class:`~.csr.DistCSR` orders them, with its halo exchange).  Two sparse factors:

* ``HZ`` (local nodes x columns): a free regular node's unit entry, a hanging node's free
  parents with their weights (Dirichlet nodes: empty rows);
* ``ZHT`` (owned rows x local nodes): the owned rows of :math:`Z H^T`
  (:func:`.local.constraint_blocks`), columns renumbered.

Product.  With the owned entries ``x`` and the exchanged ghost values ``x_g``:

.. math::  y \leftarrow \alpha\,\bigl(ZHT\, A_{loc}\, (HZ_o\, x + HZ_g\, x_g)
           + s\,(1 - z_o) \circ x\bigr) + \beta y

(``HZ`` split into its owned and ghost columns: the owned part runs while the ghost values
travel, the ghost part only over the rows it reaches; three SpMVs with about one entry a row
and one cell kernel).  The diagonal (Jacobi, Chebyshev) is
:math:`\mathrm{diag}((HZ)^T A (HZ))` on the free rows, by one pass over the cells, and ``s``
(the mean of its absolute values over all ranks' free DoFs: one ``Allreduce``) on the others.

Memory per owned DoF (3-D, about one cell a node): the cells (32 bytes, int32), the local
points (24), ``HZ`` and ``ZHT`` (about 16 each) and two local vectors (16): ~100 bytes (the
diagonal is kept on the host), against ~330 for the owned rows of the assembled ``K`` (27
entries a row) -- and no limit of 2^31 entries on a rank's matrix.

Only the stiffness form of :func:`adaptmg.assemble.stiffness` with coefficient 1 on a scalar Q1
space (:func:`adaptmg.distributed.solve` with ``matrix_free=True`` checks it).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..assemble.matrix_free import Q1Laplacian
from ..backend import CPU, csr_from_arrays, get_backend, to_host
from ..device import kernels as K
from ..device.index_kernels import owned_ghost_rows
from .comm import HaloTimer
from .csr import DistCSR, _block, _compressed_rows, _device_plan, ghost_numbering
from .local import _row_scale, constraint_blocks, hz_rows_coo, needed_cells, unit_rows_csr

__all__ = ["DistMatrixFree"]


class DistMatrixFree(DistCSR):
    """This rank's rows of the constrained Q1 Laplacian ``K`` of ``space``, applied without a
    matrix (module doc); the interface of :class:`~.csr.DistCSR` (``A(x, y, alpha, beta)``,
    ``A @ x``, ``residual``, ``diagonal``, ``owned_block``: the diagonal as a sparse matrix, for
    the smoothers), one halo exchange a product.

    Parameters
    ----------
    space : scalar Q1 :class:`~adaptmg.fe.Space` (its mesh replicated: host or this rank's GPU).
    free : free-DoF mask of the level (length ``num_dofs``, the mesh's array module).
    layout : the level's :class:`~.layout.Layout` (rows and columns).
    timer, backend, transport : as for :class:`~.csr.DistCSR`.
    """

    def __init__(self, space, free, layout, timer: HaloTimer | None = None, backend=None, transport=None):
        be = get_backend(backend if backend is not None else "cpu")
        mb = space.mesh.backend
        if space.degree != 1 or space.components != 1:
            raise ValueError(f"DistMatrixFree: a scalar Q1 space only, got degree {space.degree} "
                             f"with {space.components} components")
        if mb.is_gpu and not be.is_gpu:
            raise ValueError("DistMatrixFree: the space's mesh lives on the GPU; pass backend='gpu'")
        xp = mb.xp
        comm = layout.comm
        self.comm, self.rows, self.cols = comm, layout, layout
        self._gc = None
        self.timer = timer if timer is not None else HaloTimer()
        self.shape = (layout.n, layout.n)
        self.global_shape = (layout.N, layout.N)
        self.dtype = np.dtype(np.float64)
        self.nnz_local = 0
        on = be if be.is_gpu else CPU
        if layout.n:
            self._build(space, xp.asarray(free), layout, on)
        else:                      # a rank owning none of the level's DoFs (a folded level)
            self.ghosts = np.zeros(0, dtype=np.int64)
            self._exchange_pattern(np.zeros(comm.Get_size(), dtype=np.int64))
            self.scale = _row_scale(comm, 0.0, 0)
            self.lnodes = on.xp.zeros(0, dtype=np.int32)
            self.num_cells = 0
            self._op = self._ZHT = self._HZo = self._HZg = self._pzt = self._pho = self._phg = None
            self._hzg = None
            self._diag = np.zeros(0)
            self._fixed = on.xp.zeros(0, dtype=np.int64)
            self._u = self._v = on.xp.zeros(0)
        if be.is_gpu:
            self._to_device(be, transport, (None, None))
        else:
            self._poo = self._pog = None
            self._host_buffers()

    def _build(self, space, free, layout, on):
        """The rank's cells, local nodes, the factors ``HZ`` / ``ZHT``, the cell operator, the
        diagonal and ``s`` (module doc); the exchange pattern of the ghost columns."""
        xp, comm = space.mesh.backend.xp, layout.comm
        n, N = layout.n, space.num_dofs
        rows = layout.rows_on(xp)
        own = xp.zeros(N, dtype=bool)
        own[rows] = True
        cells = needed_cells(space, own)
        it = np.int32 if N < np.iinfo(np.int32).max else np.int64
        cn = xp.take(space.cell_dofs, cells, axis=0).astype(it, copy=False)
        del own, cells
        mark = xp.zeros(N, dtype=bool)
        mark[cn] = True
        lnodes = xp.flatnonzero(mark).astype(it)
        del mark
        loc = xp.full(N, -1, dtype=it)
        loc[lnodes] = xp.arange(lnodes.size, dtype=it)
        cells_l = loc[cn]
        del cn
        HZ, self.ghosts, counts = self._node_columns(space, free, lnodes, loc, layout)
        ZHT = self._owned_rows(space, rows, free, loc, lnodes.size)
        del loc
        self._exchange_pattern(counts)
        self.num_cells = int(cells_l.shape[0])
        self._op = Q1Laplacian(space.mesh.points[lnodes], cells_l, on, check=True)
        del cells_l
        self.lnodes = on.asarray(lnodes)
        HZ, self._ZHT = on.asmatrix(HZ), on.asmatrix(ZHT)
        self._pzt = _device_plan(self._ZHT)
        d = self._op.constrained_diagonal(HZ, n + self.ghosts.size)[:n]
        fo = on.asarray(free[rows])
        self.scale = s = _row_scale(comm, float(on.xp.abs(d[fo]).sum()), int(fo.sum()))
        self._diag = to_host(on.xp.where(fo, d, s))        # host: the smoother keeps its own
        del d
        self._fixed = on.xp.flatnonzero(~fo)                # s (I - Z): the owned non-free rows
        self._HZo, self._HZg = _column_blocks(on, HZ, n)    # owned and ghost columns of HZ
        del HZ
        self._pho = _device_plan(self._HZo)
        # the ghost columns reach few rows (the partition's rim): only those rows are updated
        # (the row kernel takes int32 indices; with 64-bit ones, an SpMV over every local row)
        self._hzg = _compressed_rows(on.xp, self._HZg) if self._HZg is not None and self._HZg.nnz else None
        self._phg = _device_plan(self._HZg) if self._HZg is not None and self._hzg is None else None
        self._u = on.xp.zeros(int(lnodes.size))
        self._v = on.xp.zeros(int(lnodes.size))

    @staticmethod
    def _node_columns(space, free, lnodes, loc, layout):
        """``(HZ, ghosts, counts)``: ``HZ`` (local nodes x (owned + ghost) columns, CSR on the
        mesh's backend), the ghost DoFs (host, ordered by (owner, global index)) and how many
        each rank owns."""
        xp = space.mesh.backend.xp
        r, c, val, nu = hz_rows_coo(space, lnodes, free)
        lc = layout.local_index(xp, c).astype(np.int64)    # owned: its position; else -1
        ghost = lc < 0
        ghosts, gpos, counts = ghost_numbering(xp, c[ghost].astype(np.int64), layout)
        if gpos.size:
            lc[ghost] = layout.n + gpos
        shape = (int(lnodes.size), layout.n + ghosts.size)
        r = loc[r]                                         # the unit entries first
        HZ = unit_rows_csr(space.mesh.backend, shape, r[:nu], lc[:nu], r[nu:], lc[nu:], val[nu:])
        return HZ, ghosts, counts

    @staticmethod
    def _owned_rows(space, rows, free, loc, nloc):
        """The owned rows of :math:`Z H^T` over the local nodes (CSR, the mesh's backend)."""
        ZHT, _ = constraint_blocks(space, rows, None, free)
        col = loc[ZHT.indices]
        if col.size and bool((col < 0).any()):
            raise RuntimeError("DistMatrixFree: an owned row reaches a node outside the rank's cells")
        out = csr_from_arrays(space.mesh.backend.sparse, ZHT.data, col.astype(ZHT.indices.dtype), ZHT.indptr,
                              (rows.size, nloc))
        out.has_sorted_indices = True          # loc increases with the global index
        return out

    @property
    def fused_kernels(self) -> bool:
        """No one-pass CSR kernels: the products go through :meth:`__call__`."""
        return False

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        """``y <- alpha K x + beta y`` (exchange, then the two sparse factors and the cells)."""
        self._check_vectors(x, y)
        reqs = self._post(x)
        if self.rows.n:
            self._pho(x, self._u)                           # while the ghost values travel
        self._wait(reqs)
        if not self.rows.n:
            return y
        if self._hzg is not None:
            gptr, gind, gdat, grow = self._hzg
            K.csr_rows_add(gptr, gind, gdat, grow, self._gbuf, self._u)
        elif self._phg is not None:
            self._phg(self._gbuf, self._u, 1.0, 1.0)
        self._v.fill(0)
        self._op.apply(self._u, self._v)
        self._pzt(self._v, y, alpha, beta)
        if self._fixed.size:
            y[self._fixed] += (alpha * self.scale) * x[self._fixed]
        return y

    spmv = __call__

    def diagonal(self):
        """Diagonal entries of the owned rows (host array)."""
        return self._diag

    def owned_block(self):
        """The diagonal of the owned rows as a sparse matrix on the backend: what a Jacobi or
        Chebyshev smoother is built from (its products then go through this operator)."""
        be = self.backend
        if be.is_gpu and self.rows.n:
            return be.sparse.diags(be.asarray(self._diag), format="csr")
        return sp.diags(self._diag, format="csr")

    def constrain_load(self, b):
        """Owned entries of ``Z H^T b`` (``b`` the global unconstrained load vector)."""
        xp = self.backend.xp
        bl = xp.asarray(b, dtype=np.float64)[self.lnodes]
        f = xp.zeros(self.rows.n)
        if self.rows.n:
            self._pzt(bl, f)
        return f

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's operator data (cells, points, the two factors, buffers)."""
        mats = sum(int(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes)
                   for M in (self._HZo, self._HZg, self._ZHT) if M is not None)
        vecs = sum(int(a.nbytes) for a in (self._u, self._v, self.lnodes, self._fixed))
        return (self._op.nbytes if self._op is not None else 0) + mats + vecs

    def __repr__(self):
        return (f"DistMatrixFree(rank {self.rows.rank}: {self.rows.n} of {self.global_shape[0]} rows, "
                f"{self.num_cells} cells, {self.ghosts.size} ghost columns, neighbours {self.neighbours}, "
                f"{self.backend.name}, transport {self.transport})")


def _column_blocks(be, HZ, n):
    """``(HZ[:, :n], HZ[:, n:])`` of the canonical CSR ``HZ`` on ``be`` (the second None when
    there is no ghost column): the owned columns are the range ``0 .. n - 1``, split off as
    DistCSR splits its rows (:func:`~adaptmg.device.index_kernels.owned_ghost_rows`); a
    row's ghost columns come after its owned ones, so both blocks keep sorted rows."""
    optr, ocol, oval, gptr, gcol, gval = owned_ghost_rows(HZ.indptr, HZ.indices, HZ.data, None, 0, n)
    rows, width = HZ.shape[0], HZ.shape[1] - n
    HZo = _block(be, oval, ocol, optr, (rows, n), sorted_=True)
    HZg = _block(be, gval, gcol - n, gptr, (rows, width), sorted_=True)
    return HZo, (HZg if width > 0 else None)
