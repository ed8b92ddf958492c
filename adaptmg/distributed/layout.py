r"""Ownership of a distributed vector space: which rank owns each global entry, and where.

:class:`Layout` holds a replicated owner array (``owner[i]``: the rank of global entry
``i``); this rank's entries ``rows`` are its owned indices in increasing order and
``local`` maps a global index to its position among them (-1 where another rank owns it):

.. math::  \text{local}[\text{rows}[k]] = k, \qquad x_{\text{local}} = x_{\text{global}}[\text{rows}].

A layout of device owners (a mesh on the GPU) computes and keeps ``rows`` and ``local``
there.  :class:`RangeLayout` is ownership by contiguous ranges (O(P) memory).  Both are what
:class:`~.csr.DistCSR` and the hierarchies use to split matrices and exchange halos.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_device_array, to_host

__all__ = ["Layout", "RangeLayout"]


class Layout:
    """Ownership of the entries of one distributed vector space (one level's DoFs).

    ``owner`` (length N, replicated) gives the rank of every global entry; ``rows`` are
    this rank's entries (sorted global indices), ``local`` maps a global index to its
    position among them (-1 elsewhere).

    Device owners (a device mesh's, :func:`~.partition.dof_owners` on CuPy arrays): ``rows``,
    ``local`` and ``counts`` are computed on the device and kept there (``rows_on``,
    ``local_on``); the host arrays ``owner``, ``rows``, ``local`` are copies made on first
    use (the set-up asks the host only for the owners and positions of ghost and send
    entries, O(halo): :meth:`owner_of`, :meth:`local_index`)."""

    def __init__(self, owner: np.ndarray, comm):
        size = comm.Get_size()
        self.comm = comm
        self.rank = comm.Get_rank()
        self._dev = None
        if is_device_array(owner):                       # the device-native layout
            from ..backend import backend_of
            xp = backend_of(owner).xp
            dev = owner.astype(np.int64, copy=False)
            lo, hi = (int(dev.min()), int(dev.max())) if dev.size else (0, 0)
            if dev.ndim != 1 or lo < 0 or hi >= size:
                raise ValueError(f"owner must be a 1-D array of ranks in [0, {size}), got shape "
                                 f"{dev.shape}, range [{lo}, {hi}]")
            self.N = int(dev.size)
            rows = xp.flatnonzero(dev == self.rank)
            self.n = int(rows.size)
            it = np.int32 if self.N < np.iinfo(np.int32).max else np.int64
            local = xp.full(self.N, -1, dtype=it)
            local[rows] = xp.arange(self.n, dtype=it)
            self.counts = to_host(xp.bincount(dev, minlength=size)).astype(np.int64)
            self._dev = {"xp": xp, "owner": dev, "rows": rows, "local": local}
            return
        owner = np.asarray(owner, dtype=np.int64)
        if owner.ndim != 1 or (owner.size and (owner.min() < 0 or owner.max() >= size)):
            raise ValueError(f"owner must be a 1-D array of ranks in [0, {size}), got shape "
                             f"{owner.shape}, range [{owner.min() if owner.size else '-'}, "
                             f"{owner.max() if owner.size else '-'}]")
        self.owner = owner
        self.N = owner.size
        self.rows = np.flatnonzero(owner == self.rank)
        self.n = self.rows.size
        self.local = np.full(self.N, -1, dtype=np.int64)
        self.local[self.rows] = np.arange(self.n)
        self.counts = np.bincount(owner, minlength=size)

    def __getattr__(self, name):
        # a device-native layout's host arrays, copied on first use
        if name in ("owner", "rows", "local") and self.__dict__.get("_dev") is not None:
            v = to_host(self._dev[name]).astype(np.int64)
            setattr(self, name, v)
            return v
        raise AttributeError(name)

    def _on_device(self, xp):
        return xp is not np and self._dev is not None

    def owner_on(self, xp):
        """``owner`` as an ``xp`` array (a device layout's own; else one copy up, kept)."""
        if xp is np:
            return self.owner
        if self._dev is not None:
            return self._dev["owner"]
        dev = self.__dict__.get("_dev_owner")
        if dev is None:
            dev = self._dev_owner = xp.asarray(self.owner)
        return dev

    def rows_on(self, xp):
        """``rows`` as an ``xp`` array (a device layout's own; else a copy up)."""
        return self._dev["rows"] if self._on_device(xp) else (self.rows if xp is np else xp.asarray(self.rows))

    def local_on(self, xp):
        """``local`` as an ``xp`` array, int32 where ``N`` fits (the device copy made once)."""
        if self._on_device(xp):
            return self._dev["local"]
        key = "_local_" + ("np" if xp is np else "dev")
        dev = self.__dict__.get(key)
        if dev is None or dev[0] is not xp:
            loc = self.local.astype(np.int32) if self.N < np.iinfo(np.int32).max else self.local
            dev = (xp, loc if xp is np else xp.asarray(loc))
            setattr(self, key, dev)
        return dev[1]

    def owner_of(self, g: np.ndarray) -> np.ndarray:
        """Owner rank of the global indices ``g`` (host array; a device layout gathers them
        there: O(g) copied)."""
        if self._dev is not None and "owner" not in self.__dict__:
            xp = self._dev["xp"]
            return to_host(self._dev["owner"][xp.asarray(np.asarray(g, dtype=np.int64))]).astype(np.int64)
        return self.owner[g]

    def local_index(self, xp, g):
        """Position of each global index ``g`` (an ``xp`` array) among this rank's entries, -1
        where another rank owns it (one gather of the compact ``local``; host ``g`` of a device
        layout: gathered there, O(g) copied)."""
        if xp is np and self._dev is not None and "local" not in self.__dict__:
            d = self._dev["xp"]
            return to_host(self._dev["local"][d.asarray(np.asarray(g, dtype=np.int64))]).astype(np.int64)
        return self.local_on(xp)[g]

    def scatter(self, x_global: np.ndarray) -> np.ndarray:
        """This rank's part of a replicated global vector (a copy)."""
        x_global = np.asarray(x_global)
        if x_global.shape != (self.N,):
            raise ValueError(f"global vector must have shape ({self.N},), got {x_global.shape}")
        return np.ascontiguousarray(x_global[self.rows])

    def allgather(self, x_local, device: bool = False, transport: str = "mpi"):
        """The global vector on every rank (one ``Allgatherv`` of host buffers; with ``transport``
        "nccl" and a device ``x_local`` one ``ncclAllGather`` on the devices,
        :func:`.nccl.nccl_allgather`: nothing of O(N) crosses to the host).

        The received buffer is rank-major (rank 0's entries, then rank 1's, ...); global
        entry ``i`` sits at position ``perm^{-1}[i]`` with ``perm`` the stable argsort of
        ``owner``.  A device layout reorders on its device (``perm`` sorted there once and
        kept, from the distinct keys ``owner * N + i``, so any sort gives it: no host copy of
        the owners, no host sort of N entries) and returns the device vector with
        ``device=True`` (else a host copy); a host layout returns a host array."""
        if x_local.shape != (self.n,):
            raise ValueError(f"local vector must have shape ({self.n},), got {x_local.shape}")
        on_dev = self._dev is not None and "owner" not in self.__dict__
        if on_dev and transport == "nccl" and is_device_array(x_local):
            from .nccl import nccl_allgather
            buf = nccl_allgather(self.comm, x_local, self.counts)
        else:
            buf = np.empty(self.N, dtype=x_local.dtype)
            displ = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
            self.comm.Allgatherv(np.ascontiguousarray(to_host(x_local)), [buf, (self.counts, displ)])
        if on_dev:
            xp = self._dev["xp"]
            perm = self._dev.get("perm")
            if perm is None:                               # unique keys: any sort gives perm
                own = self._dev["owner"]
                perm = self._dev["perm"] = (own * self.N + xp.arange(self.N, dtype=own.dtype)).argsort()
            out = xp.empty(self.N, dtype=buf.dtype)
            out[perm] = xp.asarray(buf)                    # rank-major -> global order
            return out if device else to_host(out)
        out = np.empty_like(buf)
        out[np.argsort(self.owner, kind="stable")] = buf     # rank-major -> global order
        return out


class RangeLayout:
    """:class:`Layout` for ownership by contiguous ranges -- rank ``p`` owns the global indices
    ``starts[p] .. starts[p + 1] - 1`` (a :class:`~.forest.DistributedForest` numbers its
    owned nodes so; a level gathered on rank 0 is ``[0, N, ..., N]``) -- in O(P) memory: the
    owner of ``g`` is a binary search in ``starts``, its local position ``g - starts[rank]``.
    The interface of :class:`Layout` that :class:`DistCSR` and the hierarchies use (no
    replicated ``owner`` / ``local`` arrays)."""

    def __init__(self, starts, comm):
        starts = np.asarray(starts, dtype=np.int64)
        size = comm.Get_size()
        if starts.shape != (size + 1,) or starts[0] != 0 or (np.diff(starts) < 0).any():
            raise ValueError(f"RangeLayout: starts must be {size + 1} non-decreasing integers from 0, "
                             f"got {starts.tolist() if starts.size <= 16 else starts.shape}")
        self.comm, self.starts = comm, starts
        self.N = int(starts[-1])
        self.rank = comm.Get_rank()
        self.lo, self.hi = int(starts[self.rank]), int(starts[self.rank + 1])
        self.n = self.hi - self.lo
        self.counts = np.diff(starts)

    @classmethod
    def from_counts(cls, n_owned: int, comm) -> "RangeLayout":
        """The layout of ranges of ``n_owned`` entries per rank, in rank order (collective)."""
        counts = comm.allgather(int(n_owned))
        return cls(np.concatenate([[0], np.cumsum(counts)]), comm)

    @property
    def rows(self) -> np.ndarray:
        """This rank's entries (sorted global indices)."""
        return np.arange(self.lo, self.hi, dtype=np.int64)

    def rows_on(self, xp):
        """``rows`` as an ``xp`` array (made there)."""
        return xp.arange(self.lo, self.hi, dtype=np.int64)

    def owner_of(self, g: np.ndarray) -> np.ndarray:
        """Owner rank of the global indices ``g`` (host array)."""
        return np.searchsorted(self.starts, np.asarray(g, dtype=np.int64), side="right") - 1

    def local_index(self, xp, g):
        """``g - starts[rank]`` where this rank owns ``g``, else -1 (``xp`` arrays)."""
        g = g.astype(xp.int64)                     # a copy: shifted in place
        g -= self.lo
        # lo <= g < hi as one unsigned comparison of g - lo (a negative one wraps above hi - lo)
        return xp.where(g.view(xp.uint64) < xp.uint64(self.hi - self.lo), g, -1)

    def scatter(self, x_global: np.ndarray) -> np.ndarray:
        """This rank's part of a replicated global vector (a copy)."""
        x_global = np.asarray(x_global)
        if x_global.shape != (self.N,):
            raise ValueError(f"global vector must have shape ({self.N},), got {x_global.shape}")
        return x_global[self.lo:self.hi].copy()

    def allgather(self, x_local: np.ndarray) -> np.ndarray:
        """The global vector on every rank (one ``Allgatherv``: rank order is global order)."""
        if x_local.shape != (self.n,):
            raise ValueError(f"local vector must have shape ({self.n},), got {x_local.shape}")
        buf = np.empty(self.N, dtype=x_local.dtype)
        self.comm.Allgatherv(np.ascontiguousarray(x_local), [buf, (self.counts, self.starts[:-1])])
        return buf
