r"""Distributed CSR matrices in the PETSc MPIAIJ layout, and distributed vector operations.

Layout.  Each level's DoFs are owned by ranks (:mod:`.partition`).  A rank's part of a
vector holds its owned entries, in increasing global index.  A rank's part of a matrix
``M`` (rows owned by the row partition, columns numbered by the column partition) is
two CSR blocks:

.. math::  M_{\text{rank}} = [\, M_{oo} \;|\; M_{og} \,], \qquad
           y_{o} = M_{oo}\, x_{o} + M_{og}\, x_{g},

``M_oo`` over the columns this rank owns and ``M_og`` over the *ghost* columns (owned
elsewhere, referenced by an owned row), numbered by (owner rank, global index).

Halo exchange.  At set-up every rank tells each owner (one ``Alltoallv``) which of the
owner's entries it needs; the product then posts ``Irecv`` of the ghost values and
``Isend`` of the packed owned values (NumPy buffers, no pickling), multiplies the owned
block while the messages travel, waits, and adds the ghost block.  The time spent
posting, packing and waiting is accumulated in a :class:`~.comm.HaloTimer`.

Vector reductions (:func:`dot`, :func:`norm`) are a local BLAS dot plus one
``Allreduce``; :func:`dots` reduces several at once (one message per reduction group).

GPU backend (``DistCSR(..., backend="gpu")`` or :meth:`DistCSR.to`).  The owned rows are
split on the device (a host matrix's owned rows are moved up first): the same
:func:`_split` through the backend's ``xp``, only the distinct ghost columns (O(halo)) come to
the host for the communication pattern.  The blocks ``Aoo_dev``, ``Aog_dev`` are cupyx CSR
with :func:`adaptmg.device.kernels.make_spmv` plans (``None`` for an empty block, whose plan
just scales ``y``); ``Aoo`` / ``Aog`` give host copies, made on first use, for inspection.
:meth:`DistCSR.to` moves a host matrix's blocks up.  Either way the send indices (all
destinations in one index array) and the send/ghost buffers live on the device.  Vectors are
CuPy arrays.  One exchange, by ``transport`` (:func:`.comm.resolve_transport`):

* ``"host"`` (host staging): ``take`` of the send entries on the device, one blocking D2H
  copy into a pinned host buffer, MPI ``Irecv``/``Isend`` on host buffers; the owned block's
  SpMV is launched meanwhile; after ``Waitall`` one H2D copy (current stream) of the
  received values into the device ghost buffer, then the ghost block's SpMV.  The next
  exchange waits for that copy (a CUDA event) before it reuses the host ghost buffer.
* ``"nccl"``: the same ``take`` on the current stream, then ``ncclSend``/``ncclRecv`` of
  device buffers inside one ``groupStart``/``groupEnd`` on the communicator's own stream
  (:func:`.nccl.nccl_stream`), which first waits for an event recorded after the ``take``;
  the owned block's SpMV runs on the current stream meanwhile (overlapping the exchange on
  the device), and the current stream waits for an event recorded after the group before
  the ghost block's SpMV.  Nothing waits on the host.  Successive exchanges are ordered by
  the same two events (the next ``take`` follows the ghost SpMV on the current stream).
  Everything a post needs (NCCL data type, stream handle, per neighbour the buffer address
  and count) is computed once (:meth:`DistCSR._nccl_plan`): a post is the gather, two
  event operations and the group.  A rank with nothing to send or receive in an exchange
  (a level folded onto other ranks) skips it altogether (``HaloTimer.idle``).
  Only when every rank has its own GPU.  **Not run in the test suite** (it needs two or
  more GPUs; the stand-in of ``tests/distributed/fake_cupy.py`` checks the bookkeeping).

One-pass kernels (GPU, int32 owned block: :attr:`DistCSR.fused_kernels`).  The ghost block's
rows with entries (the partition boundary) are kept row-compressed; a Jacobi sweep
(:meth:`DistCSR.jacobi_sweep`) and a residual (:meth:`DistCSR.residual`) run the one-pass CSR
kernel of :mod:`adaptmg.device.kernels` over the owned block while the exchange is in flight,
then one launch adds the ghost term on the ghost rows only
(:func:`adaptmg.device.kernels.csr_rows_add`); the product's ghost part takes the same launch
instead of an SpMV over every owned row.

The halo timer then measures the host side only (posting, copies, waiting).
Reductions of device vectors here (:func:`dots`): the local dots with the array module of
the vectors, one D2H copy of the partial sums, one host ``Allreduce`` in float64.  The
Krylov solve's reductions go through :func:`.comm.allreduce_sum` instead (on the device
with NCCL).
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..backend import (CPU, backend_of, csr_from_arrays, get_backend, is_device_array, is_device_sparse, nccl_module,
                       to_host)
from ..device import kernels as K
from ..device.index_kernels import owned_ghost_rows
from .comm import HaloTimer, alltoallv, resolve_transport, waitall
from .nccl import nccl_communicator, nccl_stream, nccl_type
from .layout import Layout, RangeLayout

__all__ = ["Layout", "RangeLayout", "DistCSR", "SplitRows", "dot", "dots", "norm"]

_TAG = 7301


class SplitRows(NamedTuple):
    """This rank's rows of a matrix, split already into the owned and the ghost columns of the
    column layout as :func:`_split` splits them: ``parts = (optr, ocol, oval, gptr, gcol, gval)``
    of :func:`adaptmg.device.index_kernels.owned_ghost_rows` for the layout's ``local`` table
    (owned columns local and sorted a row, ghost columns global and sorted a row), ``shape``
    ``(rows.n, cols.N)``.  What a kernel that writes the split itself hands to
    :class:`DistCSR` (``local_rows=True``): the rows of K by
    :func:`adaptmg.device.congruence_rows.constrained_split_rows`, no second pass over them."""
    parts: tuple
    shape: tuple

    @property
    def nnz(self):
        return int(self.parts[2].size + self.parts[5].size)

    @property
    def dtype(self):
        return self.parts[2].dtype


class DistCSR:
    """This rank's rows of a global CSR matrix ``M``, split MPIAIJ-style (see the module doc).

    Parameters
    ----------
    M : global (replicated) SciPy sparse matrix, shape (rows.N, cols.N).  Only the rows
        this rank owns are read.  With ``local_rows=True``: only this rank's rows, shape
        (rows.n, cols.N), in the order of ``rows.rows`` (global column numbers).
    rows, cols : :class:`Layout` of the row and column spaces (the same object for a
        square operator).
    timer : :class:`~.comm.HaloTimer` that accumulates the exchange time (optional).
    backend : None or "cpu" (NumPy vectors, the MPI exchange on NumPy buffers) or "gpu"
        (CuPy vectors; blocks and buffers on the device, see the module doc).
    transport : GPU only: "auto" (default: ``ADAPTMG_HALO_TRANSPORT`` or "auto", collective),
        "host" or "nccl" (:func:`.comm.resolve_transport`); ``self.transport`` is the one
        used ("mpi" on the CPU).

    ``A(x, y, alpha=1, beta=0)`` computes ``y <- alpha M x + beta y`` on local vectors (the
    signature of :func:`adaptmg.device.kernels.make_spmv` plans, so smoothers accept it);
    ``A @ x`` returns a new vector.  Collective: every rank of the communicator must call it.
    """

    def __init__(self, M, rows: Layout, cols: Layout, timer: HaloTimer | None = None,
                 local_rows: bool = False, backend=None, transport=None):
        be = get_backend(backend if backend is not None else "cpu")
        split = isinstance(M, SplitRows)
        if split and not local_rows:
            raise ValueError("DistCSR: SplitRows are a rank's own rows: pass local_rows=True")
        if is_device_sparse(M) and not local_rows:
            M = to_host(M)                              # a global matrix: its rows taken on the host
        want = (rows.n if local_rows else rows.N, cols.N)
        if tuple(M.shape) != want:
            raise ValueError(f"DistCSR: matrix shape {tuple(M.shape)} does not match the layouts "
                             f"{want}{' (local rows)' if local_rows else ''}")
        comm = rows.comm
        self.comm, self.rows, self.cols = comm, rows, cols
        self._gc = None                                 # compressed ghost rows (GPU, _to_device)
        self.timer = timer if timer is not None else HaloTimer()
        self.shape = (rows.n, cols.n)
        self.global_shape = (rows.N, cols.N)
        self.dtype = np.dtype(M.dtype)
        rank = comm.Get_rank()
        # the owned rows on the backend they are split on: the device when the target is the GPU
        # and the rank owns rows (a host matrix's owned rows are moved up first), else the host
        on = be if (be.is_gpu and rows.n) else CPU
        if split:                                       # split by the kernel that made them
            parts = tuple(on.asarray(a) if on.is_gpu else np.asarray(to_host(a)) for a in M.parts)
            Aoo, Aog, self.ghosts, counts = _blocks(on, parts, rows.n, cols)
            if counts[rank]:
                raise ValueError("DistCSR: the split rows have ghost columns this rank owns: they were "
                                 "split for another column layout")
            self.nnz_local = M.nnz
        else:
            if is_device_sparse(M):
                Ml = M.tocsr() if on.is_gpu else to_host(M)
            else:
                M = sp.csr_matrix(M)
                Ml = M if local_rows else M[rows.rows]
                Ml = on.asmatrix(Ml) if on.is_gpu else Ml
            Ml.sum_duplicates()
            Aoo, Aog, self.ghosts, counts = _split(on, Ml, cols, rank)
            self.nnz_local = int(Ml.nnz)
        self._Aoo = self._Aog = None                    # host blocks (made on first use on the GPU)
        self._exchange_pattern(counts)
        g = self.ghosts
        if be.is_gpu:
            if on.is_gpu:                               # split there: the blocks stay there
                self._to_device(be, transport, (Aoo if Aoo.nnz else None,
                                                Aog if (g.size and Aog.nnz) else None))
            else:
                self._Aoo, self._Aog = Aoo, Aog
                self._to_device(be, transport)
            return
        self._Aoo, self._Aog = Aoo, Aog
        self._poo = K.make_spmv(Aoo) if rows.n else None
        self._pog = K.make_spmv(Aog) if (rows.n and g.size) else None
        self._host_buffers()

    def _exchange_pattern(self, counts):
        """Who sends what to whom in a halo exchange, from ``self.ghosts`` (ordered by owner;
        ``counts[q]``: how many rank ``q`` owns, :func:`ghost_numbering`): the owners told
        which of their entries are wanted (one ``Alltoall`` of the counts, one ``Alltoallv`` of
        the indices); host transport (``mpi``) until :meth:`_to_device`."""
        comm, cols, g = self.comm, self.cols, self.ghosts
        size = comm.Get_size()
        rstart = np.concatenate([[0], np.cumsum(counts)])
        (asked,), got = alltoallv(comm, np.repeat(np.arange(size), counts), g, counts=True)
        idx = cols.local_index(np, asked.astype(np.int64, copy=False)) if asked.size else asked
        if asked.size and bool((idx < 0).any()):
            raise RuntimeError(f"{type(self).__name__}: a rank asked for entries this rank does not own")
        sstart = np.concatenate([[0], np.cumsum(got)])
        self._recv = [(q, slice(rstart[q], rstart[q + 1])) for q in range(size) if counts[q]]
        self._send = [(q, idx[sstart[q]:sstart[q + 1]]) for q in range(size) if got[q]]
        self.backend = CPU
        self.transport = "mpi"
        self._xp = np

    def _host_buffers(self):
        """The MPI exchange's host buffers (ghost values, one send buffer a neighbour)."""
        self._gbuf = np.zeros(self.ghosts.size, dtype=self.dtype)
        self._sbuf = [np.zeros(idx.size, dtype=self.dtype) for _, idx in self._send]

    @property
    def Aoo(self):
        """The owned-columns block ``M_oo`` as host CSR (on the GPU a copy of ``Aoo_dev``,
        made on first use: for inspection and tests)."""
        if self._Aoo is None:
            self._Aoo = _host_block(self.Aoo_dev, (self.rows.n, self.cols.n), self.dtype)
        return self._Aoo

    @property
    def Aog(self):
        """The ghost-columns block ``M_og`` as host CSR (see :attr:`Aoo`)."""
        if self._Aog is None:
            self._Aog = _host_block(self.Aog_dev, (self.rows.n, self.ghosts.size), self.dtype)
        return self._Aog

    def owned_block(self):
        """``M_oo`` on this matrix's backend (``Aoo_dev`` on the GPU; the host block where
        this rank owns no row or the block is empty)."""
        if self.backend.is_gpu and self.Aoo_dev is not None:
            return self.Aoo_dev
        return self.Aoo

    # ------------------------------------------------------------ device copies
    def to(self, backend="gpu", transport=None) -> "DistCSR":
        """A copy of this (host) matrix on ``backend``: the same layouts, ghosts and
        communication pattern (no new ``alltoall``), the blocks and buffers moved to the device
        (collective when ``transport`` must be resolved).  Self when already there."""
        be = get_backend(backend)
        if be.name == self.backend.name:
            return self
        if self.backend.is_gpu:
            raise ValueError("DistCSR.to: only a host matrix can be moved to the device")
        new = copy.copy(self)
        new._to_device(be, transport)
        return new

    def _to_device(self, be, transport, blocks=None):
        """Device blocks (``blocks``: already there, else the host blocks moved), send indices
        and buffers; the halo transport (module doc)."""
        xp = be.xp
        self.transport = resolve_transport(self.comm, transport, be)
        self.backend, self._xp = be, xp
        n = self.rows.n
        if blocks is None:
            blocks = (_device_block(be, self._Aoo) if n else None,
                      _device_block(be, self._Aog) if (n and self.ghosts.size) else None)
        self.Aoo_dev, self.Aog_dev = blocks
        self._poo = _device_plan(self.Aoo_dev) if n else None
        self._pog = _device_plan(self.Aog_dev) if (n and self.ghosts.size) else None
        self._gc = _compressed_rows(xp, self.Aog_dev)
        sizes = [idx.size for _, idx in self._send]
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._sslices = [(q, slice(int(off[i]), int(off[i + 1]))) for i, (q, _) in enumerate(self._send)]
        sidx = np.concatenate([idx for _, idx in self._send]) if self._send else np.zeros(0, np.int64)
        self._sidx = xp.asarray(sidx.astype(np.int32 if self.cols.n < 2 ** 31 else np.int64))
        self._sdev = xp.zeros(int(off[-1]), dtype=self.dtype)
        self._gbuf = xp.zeros(self.ghosts.size, dtype=self.dtype)          # device ghost values
        staged = self.transport == "host"                                  # host staging buffers
        self._shost = _pinned(xp, int(off[-1]) if staged else 0, self.dtype)
        self._ghost = _pinned(xp, self.ghosts.size if staged else 0, self.dtype)
        self._sbuf = None
        self._h2d = None                 # CUDA event after the last H2D copy of ghost values
        self._nccl = self._nstream = None
        if self.transport == "nccl":
            self._nccl, self._nstream = nccl_communicator(self.comm), nccl_stream(self.comm)
            self._sent = xp.cuda.Event(disable_timing=True)      # after the gather (current)
            self._landed = xp.cuda.Event(disable_timing=True)    # after the group (NCCL stream)
            self._nccl_plan()

    def _nccl_plan(self):
        """The per-exchange constants of the NCCL transport, computed once: the module, the
        data type constant, the stream's handle, and per neighbour ``(address, count, peer)``
        of its part of the ghost buffer (receives) and of the send buffer (sends): the buffers
        are allocated once, so their addresses never change."""
        nccl = self._nccl_mod = nccl_module()
        dt, factor = nccl_type(nccl, self.dtype)
        size = self.dtype.itemsize
        g0 = self._gbuf.data.ptr if self._gbuf.size else 0
        s0 = self._sdev.data.ptr if self._sdev.size else 0
        self._nccl_dt, self._nstream_ptr = dt, self._nstream.ptr
        self._nccl_recv = [(int(g0 + s.start * size), int((s.stop - s.start) * factor), int(q))
                           for q, s in self._recv]                       # Python ints
        self._nccl_send = [(int(s0 + s.start * size), int((s.stop - s.start) * factor), int(q))
                           for q, s in self._sslices]
        # nothing to send or receive on this rank: the exchange is skipped (no group, no events)
        self._nccl_idle = not (self._nccl_recv or self._nccl_send)

    @property
    def fused_kernels(self) -> bool:
        """True where this rank's products run as one-pass kernels over the owned block plus
        a ghost-rows update (:meth:`jacobi_sweep`, :meth:`residual`): on the GPU, an owned
        block with int32 indices and a float dtype."""
        return bool(self.backend.is_gpu and self.rows.n and K.is_int32_csr(self.Aoo_dev)
                    and self.dtype in (np.float32, np.float64)
                    and (self._gc is not None or self.Aog_dev is None))

    def _ghost_add(self, out, alpha, scale=None):
        """``out += alpha scale M_og x_g`` on the ghost rows (``x_g`` the received ghost
        buffer; compressed rows on the GPU, else the ghost block's SpMV over all rows)."""
        if self._gc is not None:
            gptr, gind, gdat, grow = self._gc
            K.csr_rows_add(gptr, gind, gdat, grow, self._gbuf, out, alpha, scale)
        elif self._pog is not None and not isinstance(self._pog, _ScalePlan):   # else: no entries
            if scale is not None:
                raise RuntimeError("DistCSR: a scaled ghost update needs the compressed ghost rows")
            self._pog(self._gbuf, out, alpha, 1.0)
        return out

    def jacobi_sweep(self, x, b, dinv, omega, out):
        r"""One damped Jacobi sweep on the owned rows, ``out <- x + omega D^{-1} (b - M x)``
        (``out`` must not alias ``x``; :attr:`fused_kernels` only).  Since the sweep is
        linear in the ghost values,

        .. math:: \text{out} = \bigl[x + \omega D^{-1}(b - M_{oo} x)\bigr]
                               - \omega D^{-1} M_{og} x_g,

        the bracket is the one-pass CSR kernel over the owned block
        (:func:`adaptmg.device.kernels.csr_jacobi_sweep`), launched while the halo exchange
        is in flight, and the ghost term one launch over the ghost rows after it."""
        reqs = self._post(x)
        K.csr_jacobi_sweep(self.Aoo_dev, x, b, dinv, omega, out)
        self._wait(reqs)
        return self._ghost_add(out, -omega, dinv)

    def residual(self, x, b, r):
        """``r <- b - M x`` on the owned rows (``r`` distinct from ``x`` and ``b``): with
        :attr:`fused_kernels` the one-pass residual kernel over the owned block during the
        exchange, then the ghost rows; else a copy and the product."""
        if not self.fused_kernels:
            r[...] = b
            return self(x, r, -1.0, 1.0)
        reqs = self._post(x)
        K.csr_residual(self.Aoo_dev, x, b, r)
        self._wait(reqs)
        return self._ghost_add(r, -1.0)

    @property
    def neighbours(self):
        """Ranks this rank exchanges halo values with."""
        return sorted({q for q, _ in self._recv} | {q for q, _ in self._send})

    def exchange(self, x: np.ndarray) -> np.ndarray:
        """Fetch the ghost values of ``x`` (local, owned entries of the column space)."""
        reqs = self._post(x)
        self._wait(reqs)
        return self._gbuf

    def _post(self, x):
        if self.backend.is_gpu:
            return self._post_device(x)
        t = self.timer
        t0 = t.now()
        comm = self.comm
        reqs = [comm.Irecv(self._gbuf[s], source=q, tag=_TAG) for q, s in self._recv]
        for (q, idx), buf in zip(self._send, self._sbuf):
            np.take(x, idx, out=buf)
            reqs.append(comm.Isend(buf, dest=q, tag=_TAG))
            t.bytes += buf.nbytes
        t.seconds += t.now() - t0
        return reqs

    def _wait(self, reqs):
        t = self.timer
        t0 = t.now()
        if self.transport == "nccl":          # the ghost SpMV after the group (device-side wait)
            if reqs is not None:
                reqs.wait_event(self._landed)
        else:
            waitall(reqs)
            if self.transport == "host" and self.ghosts.size:
                # received values -> device ghost buffer, on the current stream (ordered before
                # the ghost block's SpMV); the next exchange waits for it before reusing _ghost
                xp = self._xp
                stream = xp.cuda.get_current_stream()
                self._gbuf.set(self._ghost, stream=stream)
                if self._h2d is None:
                    self._h2d = xp.cuda.Event(disable_timing=True)
                self._h2d.record(stream)
        t.seconds += t.now() - t0
        t.exchanges += 1

    def _post_device(self, x):
        """Gather the send entries on the device and start the exchange (module doc).  NCCL:
        returns the current stream (which :meth:`_wait` makes wait for the group), or None
        when this rank has nothing to send or receive; host staging: the MPI requests."""
        t = self.timer
        t0 = t.now()
        if self.transport == "nccl":
            if self._nccl_idle:
                t.idle += 1
                return None
            xp = self._xp
            stream = xp.cuda.get_current_stream()
            if self._nccl_send:
                xp.take(x, self._sidx, out=self._sdev)
            self._sent.record(stream)
            ns = self._nstream
            ns.wait_event(self._sent)
            nccl, nc, dt, sptr = self._nccl_mod, self._nccl, self._nccl_dt, self._nstream_ptr
            nccl.groupStart()
            try:
                for ptr, n, q in self._nccl_recv:
                    nc.recv(ptr, n, dt, q, sptr)
                for ptr, n, q in self._nccl_send:
                    nc.send(ptr, n, dt, q, sptr)
            finally:
                nccl.groupEnd()
            self._landed.record(ns)
            t.bytes += self._sdev.nbytes
            t.seconds += t.now() - t0
            return stream
        xp, comm = self._xp, self.comm                # host staging
        if self._sidx.size:
            xp.take(x, self._sidx, out=self._sdev)
        if self._h2d is not None and self._recv:
            self._h2d.synchronize()          # the last H2D copy out of _ghost is done
        reqs = [comm.Irecv(self._ghost[s], source=q, tag=_TAG) for q, s in self._recv]
        if self._sidx.size:
            self._sdev.get(out=self._shost)  # D2H, blocking (waits for the gather)
            for q, s in self._sslices:
                reqs.append(comm.Isend(self._shost[s], dest=q, tag=_TAG))
        t.bytes += self._sdev.nbytes
        t.seconds += t.now() - t0
        return reqs

    def _check_vectors(self, x, y):
        """The local vectors of a product: ``x`` over the owned columns, ``y`` the owned rows."""
        name = type(self).__name__
        if x.shape != (self.cols.n,) or y.shape != (self.rows.n,):
            raise ValueError(f"{name}: x must have shape ({self.cols.n},) and y ({self.rows.n},), "
                             f"got {x.shape} and {y.shape}")
        if x.dtype != self.dtype:
            raise TypeError(f"{name}: x has dtype {x.dtype}, the operator {self.dtype}")

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        """``y <- alpha M x + beta y`` (posts the exchange, owned block, wait, ghost block)."""
        self._check_vectors(x, y)
        reqs = self._post(x)
        if self._poo is not None:
            self._poo(x, y, alpha, beta)
        self._wait(reqs)
        if self.rows.n:
            self._ghost_add(y, alpha)
        return y

    #: ``spmv(x, y, alpha, beta)``: the product as :func:`adaptmg.device.kernels.make_spmv` takes
    #: it from an operator, so a :class:`~adaptmg.multilevel.level.Level` whose ``A``, ``P``,
    #: ``R`` are DistCSR runs in :class:`~adaptmg.multilevel.MultilevelSolver`'s cycle as is
    spmv = __call__

    def __matmul__(self, x):
        y = self._xp.zeros(self.rows.n, dtype=np.result_type(self.dtype, x.dtype))
        return self(x, y)

    def diagonal(self):
        """Diagonal entries of the owned rows (square operators with one layout; host array)."""
        return self.Aoo.diagonal()

    def __repr__(self):
        dev = "" if self.transport == "mpi" else f", {self.backend.name}, transport {self.transport}"
        return (f"DistCSR(rank {self.rows.rank}: {self.rows.n} of {self.global_shape[0]} rows, "
                f"{self.cols.n} owned + {self.ghosts.size} ghost columns, nnz {self.nnz_local}, "
                f"neighbours {self.neighbours}{dev})")


class _ScalePlan:
    """The SpMV plan of an empty device block: ``y <- beta y`` (no cuSPARSE descriptor for a
    matrix without entries)."""

    def __call__(self, x, y, alpha=1.0, beta=0.0):
        if beta == 0:
            y.fill(0)
        elif beta != 1:
            y *= beta
        return y


def _device_block(be, A):
    """``A`` (host CSR) as a device CSR matrix, None when it has no entries."""
    return be.asmatrix(A) if A.nnz else None


def _device_plan(A_dev):
    """The SpMV plan of a block (``y <- alpha A x + beta y``); a block that is None or has no
    entries only scales ``y`` (no cuSPARSE descriptor for a matrix without entries)."""
    return _ScalePlan() if A_dev is None or A_dev.nnz == 0 else K.make_spmv(A_dev)


def _compressed_rows(xp, G):
    """The rows of the device ghost block ``G`` that have entries, as a row-compressed CSR
    ``(indptr, indices, data, rows)`` (int32; the entries are ``G``'s own arrays, in order:
    dropping empty rows keeps them contiguous), or None (no block, or 64-bit indices)."""
    if G is None or not K.is_int32_csr(G):
        return None
    ptr = G.indptr
    rows = xp.flatnonzero(ptr[1:] != ptr[:-1]).astype(xp.int32)
    gptr = xp.concatenate([ptr[rows], ptr[-1:]]).astype(xp.int32)
    return gptr, G.indices, G.data, rows


def _pinned(xp, n, dtype):
    """A host NumPy array of ``n`` entries in page-locked memory (plain memory where that
    fails or ``n == 0``): the staging buffers of the host-staged exchange."""
    dtype = np.dtype(dtype)
    if n == 0:
        return np.zeros(0, dtype)
    try:
        mem = xp.cuda.alloc_pinned_memory(n * dtype.itemsize)
        a = np.frombuffer(mem, dtype, n)
    except Exception:                      # e.g. out of page-locked memory: pageable is correct too
        a = np.empty(n, dtype)
    a[...] = 0
    return a


def _split(be, Ml, cols, rank):
    r"""``(M_oo, M_og, ghosts, counts)`` of the canonical CSR rows ``Ml`` (global columns) on ``be``
    (module doc): an entry is owned when its local column (``cols``' compact ``local`` table,
    or a range test of a :class:`RangeLayout`) is not -1, else a ghost.  Both blocks come from
    :func:`adaptmg.device.index_kernels.owned_ghost_rows` (on the device a count and a fill
    kernel over the rows, each entry read once a pass; on the host its twin), each keeping the
    rows' order; ``ghosts`` (host) are the distinct ghost columns ordered by (owner, global
    index), found by one ``unique`` over the ghost entries -- only they cross to the host on
    the GPU, O(halo) -- and each ghost entry's column is its position among them; ``counts``
    the ghosts per owner (:func:`ghost_numbering`).  The owned block's rows stay sorted (the
    local numbering keeps the owned columns' order); so do the ghost block's where the ghosts
    are in increasing global order too (one owner, or owners of increasing ranges: every row
    at P = 2), else they are sorted (on the device a sort of the block's entries)."""
    return _blocks(be, split_rows(Ml, cols).parts, Ml.shape[0], cols)


def split_rows(M, cols, rows=None) -> SplitRows:
    """The rows ``rows`` of the canonical CSR ``M`` (global columns; int64 row numbers of its
    array module, in the order wanted; None: every row) split for the column layout ``cols``
    as :class:`DistCSR` splits a rank's rows (:func:`_split`), as :class:`SplitRows`: what
    ``DistCSR(split_rows(M, cols, rows), rows_layout, cols, local_rows=True)`` takes -- the
    same blocks as ``DistCSR(M[rows], ...)`` without the copy ``M[rows]``
    (:func:`adaptmg.device.index_kernels.owned_ghost_rows` reads the chosen rows in place)."""
    xp = backend_of(M.data).xp
    if isinstance(cols, RangeLayout):
        table, lo, hi = None, cols.lo, cols.hi
    elif M.nnz == 0:                  # no entries: no table to look in (a device layout's stays there)
        table, lo, hi = None, 0, cols.n
    else:
        table, lo, hi = cols.local_on(xp), 0, 0
    n = M.shape[0] if rows is None else int(rows.shape[0])
    return SplitRows(owned_ghost_rows(M.indptr, M.indices, M.data, table, lo, hi, rows), (n, M.shape[1]))


def _blocks(be, parts, rows, cols):
    """:func:`_split`'s ``(M_oo, M_og, ghosts, counts)`` from the split ``parts = (optr, ocol,
    oval, gptr, gcol, gval)`` of ``rows`` rows (:class:`SplitRows`)."""
    optr, ocol, oval, gptr, gcol, gval = parts
    ghosts, gpos, counts = ghost_numbering(be.xp, gcol, cols)
    Aoo = _block(be, oval, ocol, optr, (rows, cols.n), sorted_=True)
    in_order = ghosts.size < 2 or bool(np.all(ghosts[1:] > ghosts[:-1]))     # host, O(halo)
    Aog = _block(be, gval, gpos, gptr, (rows, ghosts.size), sorted_=in_order)
    return Aoo, Aog, ghosts, counts


def ghost_numbering(xp, gi, cols):
    """``(ghosts, gpos, counts)`` of the ghost columns ``gi`` (global indices owned elsewhere, an
    ``xp`` array, repeats allowed): ``ghosts`` the distinct ones ordered by (owner, global
    index) (host), ``gpos`` each entry's position among them (``xp``) and ``counts[q]`` the
    ghosts owned by rank ``q`` (host, one per rank of ``cols``).

    One ``unique`` on ``xp``; the order is that of the keys ``owner * N + index`` (distinct).
    Where the owners are on the device too (a device layout's, or a :class:`RangeLayout`'s
    ranges) the keys are sorted there and one copy of them (O(halo)) comes to the host; else
    the distinct ghosts come down and their owners are looked up on the host."""
    N, size = cols.N, cols.comm.Get_size()
    gu = xp.unique(gi)                                   # sorted by global index
    on_device = xp is not np and (isinstance(cols, RangeLayout) or getattr(cols, "_dev", None) is not None)
    if on_device and size * N < 2 ** 62:
        own = (xp.searchsorted(xp.asarray(cols.starts), gu, side="right") - 1 if isinstance(cols, RangeLayout)
               else cols.owner_on(xp)[gu])
        key = own * N + gu
        keys = xp.sort(key)
        pos = xp.searchsorted(keys, key)                 # gu[i]'s position in that order
        keys = to_host(keys).astype(np.int64, copy=False)
        owners, ghosts = np.divmod(keys, N)
    else:
        gu_h = np.asarray(to_host(gu), dtype=np.int64)
        own = np.asarray(cols.owner_of(gu_h), dtype=np.int64)
        order = np.lexsort((gu_h, own))                  # by owner, then global index
        pos = np.empty(order.size, dtype=np.int64)
        pos[order] = np.arange(order.size)
        pos = xp.asarray(pos)
        owners, ghosts = own[order], gu_h[order]
    gpos = pos[xp.searchsorted(gu, gi)] if gi.size else gi
    return ghosts, gpos, np.bincount(owners, minlength=size).astype(np.int64)


def _block(be, data, col, indptr, shape, sorted_):
    """CSR ``(data, col, indptr)`` with ``shape`` on ``be``, sorted rows (``sorted_``: known
    sorted already: the owned block of sorted rows); 32-bit indices where they fit.  On the
    GPU a block without entries (or columns) is an empty host matrix: there is no device
    matrix without entries."""
    nk = int(data.size)
    it = np.int32 if max(shape[1], nk) < np.iinfo(np.int32).max else np.int64
    if be.is_gpu and (nk == 0 or shape[1] == 0):
        return sp.csr_matrix(shape)
    A = csr_from_arrays(be.sparse, data, col.astype(it, copy=False), indptr.astype(it, copy=False), shape)
    if sorted_:                          # no re-sort (on the device a sort of every entry)
        A.has_sorted_indices = True
    else:
        A.sort_indices()
    return A


def _host_block(A_dev, shape, dtype):
    """Host CSR copy of a device block (an empty matrix for None)."""
    return sp.csr_matrix(shape, dtype=dtype) if A_dev is None else to_host(A_dev)


def dots(comm, pairs):
    """``[(a, b) for a, b in pairs]`` summed over all ranks with one ``Allreduce`` (a float64
    NumPy array; for CuPy vectors the local dots on the device, one D2H copy of them)."""
    pairs = list(pairs)
    if pairs and is_device_array(pairs[0][0]):
        xp = get_backend("gpu").xp
        loc = to_host(xp.stack([xp.dot(a, b) for a, b in pairs]).astype(np.float64))
        loc = np.ascontiguousarray(loc, dtype=np.float64)
    else:
        loc = np.array([np.dot(a, b) for a, b in pairs], dtype=np.float64)
    out = np.empty_like(loc)
    comm.Allreduce(loc, out)
    return out


def dot(comm, a, b) -> float:
    """Global inner product of two distributed vectors (one ``Allreduce``)."""
    return float(dots(comm, [(a, b)])[0])


def norm(comm, a) -> float:
    """Global 2-norm of a distributed vector (one ``Allreduce``)."""
    return float(np.sqrt(max(dot(comm, a, a), 0.0)))
