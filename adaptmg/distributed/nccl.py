"""NCCL plumbing of :mod:`adaptmg.distributed` (GPU backend, one GPU per rank): the
communicator and stream of an MPI communicator, and the collectives and point-to-point calls
built on them that leave their results on the device.

* :func:`nccl_communicator` -- the ``NcclCommunicator`` over the ranks of an MPI
  communicator, made once per communicator (rank 0's unique id broadcast over MPI), with
  ``NCCL_MAX_NCHANNELS`` defaulting to :data:`NCCL_CHANNELS`; :func:`start_nccl_communicator`
  begins making it on a thread (its first use waits); :func:`nccl_ready` says whether it
  exists or is being made (then "nccl" needs no new agreement, :func:`.comm.resolve_transport`).
* :func:`nccl_stream` -- the non-blocking stream on which all of a communicator's NCCL work
  runs, in the same order on every rank; :class:`_Ordered` puts a call there between two
  events, after the current stream's work so far and before its later work: the host never
  waits.
* :class:`NcclSum` (``ncclAllReduce``, the Krylov solvers' inner products on the device) and
  :func:`nccl_allgather`; :func:`nccl_pass` (one rank's device arrays into another's, the
  hand-over of :func:`.comm.pass_arrays`); :func:`nccl_type` maps a dtype to NCCL's constant.

Nothing here imports CuPy or NCCL at module level: :func:`adaptmg.backend.nccl_module` is
asked when a call needs it.
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["NCCL_CHANNELS", "NcclSum", "nccl_allgather", "nccl_available", "nccl_communicator",
           "nccl_pass", "nccl_ready", "nccl_stream", "nccl_type", "start_nccl_communicator"]


def nccl_type(nccl, dtype):
    """``(NCCL data type constant, entries per element)`` for ``dtype``: a complex array is
    sent (and summed: the sum of complex numbers is the sum of their real and imaginary
    parts) as twice as many entries of its real type."""
    dtype = np.dtype(dtype)
    factor = 2 if dtype.kind == "c" else 1
    base = dtype.type(0).real.dtype if factor == 2 else dtype
    names = {"float64": "NCCL_FLOAT64", "float32": "NCCL_FLOAT32", "int64": "NCCL_INT64",
             "int32": "NCCL_INT32"}
    name = names.get(base.name)
    if name is None:
        raise TypeError(f"no NCCL type for dtype {dtype}")
    return getattr(nccl, name), factor


class _Ordered:
    """Two events that put NCCL calls on the communicator's stream (:func:`nccl_stream`, where
    all of its NCCL work goes, in the same order on every rank) after the current stream's
    work so far and before its later work -- the host never waits."""

    def __init__(self, comm, xp):
        self.xp = xp
        self.stream = nccl_stream(comm)
        self.sptr = self.stream.ptr
        self.ready = xp.cuda.Event(disable_timing=True)    # after the inputs (current stream)
        self.done = xp.cuda.Event(disable_timing=True)     # after the call (NCCL stream)

    def run(self, call):
        cur = self.xp.cuda.get_current_stream()
        self.ready.record(cur)
        self.stream.wait_event(self.ready)
        call(self.sptr)
        self.done.record(self.stream)
        cur.wait_event(self.done)


class NcclSum:
    r"""``a -> sum over the ranks of comm of a`` on the device: one ``ncclAllReduce`` (sum)
    of the CuPy array ``a`` into a new device array, which is returned.

    Ordering (the same pattern as the NCCL halo exchange of :mod:`.csr`, :class:`_Ordered`):
    an event recorded on the current stream after ``a`` was computed, the communicator's
    stream waits for it, runs the allreduce and records a second event that the current
    stream waits for.  So the result is read only after the allreduce, and ``a``'s and the
    result's memory (CuPy's pool reuses it in order on the current stream) is not reused
    before it; the host never waits.  ``calls`` counts the reductions."""

    def __init__(self, comm):
        from ..backend import get_backend, nccl_module
        self.xp = xp = get_backend("gpu").xp
        self.nccl = nccl_module()
        self.op = getattr(self.nccl, "NCCL_SUM", 0)       # ncclSum is 0 in every NCCL version
        self.nc = nccl_communicator(comm)
        self.order = _Ordered(comm, xp)
        self.calls = 0

    def __call__(self, a):
        xp = self.xp
        if not isinstance(a, xp.ndarray):
            raise TypeError(f"NcclSum reduces device (CuPy) arrays, got {type(a).__name__}")
        a = xp.ascontiguousarray(a)
        dt, factor = nccl_type(self.nccl, a.dtype)
        out = xp.empty_like(a)
        self.order.run(lambda sptr: self.nc.allReduce(a.data.ptr, out.data.ptr, a.size * factor, dt, self.op, sptr))
        self.calls += 1
        return out


def nccl_allgather(comm, x, counts):
    """Every rank's device vector ``x`` (``counts[p]`` entries on rank ``p``) concatenated in
    rank order, on every rank's device: one ``ncclAllGather`` of the vectors padded to the
    largest count (ordered as :class:`NcclSum`; collective)."""
    from ..backend import get_backend, nccl_module
    xp = get_backend("gpu").xp
    counts = np.asarray(counts, dtype=np.int64)
    m, rank = int(counts.max(initial=0)), comm.Get_rank()
    if x.shape != (int(counts[rank]),):
        raise ValueError(f"nccl_allgather: rank {rank} has {x.shape} entries, counts say {int(counts[rank])}")
    send = xp.zeros(m, dtype=x.dtype)
    send[:x.size] = x
    recv = xp.empty(m * counts.size, dtype=x.dtype)
    dt, factor = nccl_type(nccl_module(), x.dtype)
    nc = nccl_communicator(comm)
    if m:
        _Ordered(comm, xp).run(lambda sptr: nc.allGather(send.data.ptr, recv.data.ptr, m * factor, dt, sptr))
    return xp.concatenate([recv[p * m:p * m + int(c)] for p, c in enumerate(counts)])


def nccl_pass(comm, arrays, src, dst):
    """Rank ``src``'s device ``arrays`` written into rank ``dst``'s (same shapes and dtypes),
    their bytes by one group of ``ncclSend`` / ``ncclRecv`` (ordered as :class:`NcclSum`: the
    host does not wait); ranks other than ``src`` and ``dst`` must not call it
    (:func:`.comm.pass_arrays` decides who does)."""
    from ..backend import get_backend, nccl_module
    xp = get_backend("gpu").xp
    rank = comm.Get_rank()
    nccl, nc = nccl_module(), nccl_communicator(comm)
    views = [a.view(xp.uint8).ravel() for a in arrays if a.nbytes]

    def group(sptr):
        nccl.groupStart()
        try:
            for v in views:
                if rank == src:
                    nc.send(v.data.ptr, v.size, nccl.NCCL_UINT8, dst, sptr)
                else:
                    nc.recv(v.data.ptr, v.size, nccl.NCCL_UINT8, src, sptr)
        finally:
            nccl.groupEnd()
    _Ordered(comm, xp).run(group)


def nccl_available() -> bool:
    """True when ``cupy.cuda.nccl`` imports and reports itself available
    (:func:`adaptmg.backend.nccl_module`)."""
    from ..backend import nccl_module
    return nccl_module() is not None


_NCCL = {}        # id(comm) -> (comm, NcclCommunicator): built once per communicator
_NCCL_STREAMS = {}   # id(comm) -> (comm, cupy Stream): the halo exchanges' stream


def nccl_stream(comm):
    """The CUDA stream (non-blocking, on the current device) on which the NCCL halo exchanges
    over ``comm`` run, one per communicator, so that they overlap the owned block's SpMV on
    the current stream (:mod:`.csr`)."""
    hit = _NCCL_STREAMS.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    from ..backend import get_backend
    stream = get_backend("gpu").xp.cuda.Stream(non_blocking=True)
    _NCCL_STREAMS[id(comm)] = (comm, stream)
    return stream


#: ``NCCL_MAX_NCHANNELS`` that :func:`nccl_communicator` sets where the environment does not
#: (before NCCL reads it).  NCCL connects a communicator's channels lazily, on the first
#: collective and the first send/receive, at a cost per channel: on two NVLink H200 (NCCL
#: 2.28.9, ``scripts/bench_nccl_first_use.py``) the first all-reduce and the first
#: send/receive group took 0.94 + 1.20 s with NCCL's default channels, 0.16 + 0.15 s with 4
#: (2: 0.10 + 0.08; 8: 0.32 + 0.31); a fresh process's first distributed set-up at 4.8M DoFs
#: (``scripts/bench_distributed.py --ranks 2 --dofs-per-rank 2.6e6``, kernel caches filled)
#: 3.08 s with NCCL's channels, 1.12 s with 4 (0.26 s warm).  The exchanges here are halos
#: and scalar sums: with 4 channels the solves took the same time (``bench_distributed.py``
#: with ``NCCL_MAX_NCHANNELS`` set: 21M DoFs per GPU 87.1 vs 86.5 ms, 2.7M DoFs on two 12.7
#: vs 13.4 ms; with 2 channels 88.9 and 15.2 ms).  A value in the environment is kept.
NCCL_CHANNELS = 4


def nccl_communicator(comm):
    """The NCCL communicator over the ranks of ``comm`` (same rank numbers), built once per
    communicator (collective the first time: rank 0's unique id is broadcast over MPI) on
    the current device; ``NCCL_MAX_NCHANNELS`` defaults to :data:`NCCL_CHANNELS` for the
    process (set before the first communicator, when the environment has none).  One whose
    making :func:`start_nccl_communicator` began is waited for (its error raised here)."""
    start_nccl_communicator(comm)                # nothing when it exists or is being made
    nc = _NCCL[id(comm)][1]
    if isinstance(nc, _Pending):
        nc = nc.result()
        _NCCL[id(comm)] = (comm, nc)
    return nc


class _Pending:
    """An NCCL communicator being made on a thread (:func:`start_nccl_communicator`)."""

    def __init__(self, make, device):
        import threading
        self._out = None
        self._err = None

        def run():
            try:
                if device is not None:
                    device.use()                 # the thread's current device: the caller's
                self._out = make()
            except BaseException as exc:         # noqa: BLE001 - re-raised by result()
                self._err = exc
        self._thread = threading.Thread(target=run, name="adaptmg-nccl-init", daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if self._err is not None:
            raise RuntimeError(f"NCCL transport: making the communicator failed: {self._err}") from self._err
        return self._out


def start_nccl_communicator(comm) -> None:
    """Begin making :func:`nccl_communicator`'s communicator of ``comm`` (collective: rank 0's
    unique id is broadcast over MPI here) and return: ``ncclCommInitRank`` runs on a thread
    (it lets go of the interpreter), the first :func:`nccl_communicator` call waits for it.
    NCCL's first communicator in a process costs ~0.5 s (two H200: 0.55 s, a second one
    0.035 s), which the caller's set-up work now hides.  Nothing when it exists or is
    being made."""
    if nccl_ready(comm):
        return
    from ..backend import get_backend, nccl_module
    nccl = nccl_module()
    if nccl is None:
        raise RuntimeError("NCCL transport: cupy.cuda.nccl is not available on this rank")
    os.environ.setdefault("NCCL_MAX_NCHANNELS", str(NCCL_CHANNELS))
    rank, size = comm.Get_rank(), comm.Get_size()
    uid = nccl.get_unique_id() if rank == 0 else None
    uid = comm.bcast(uid, root=0)
    try:
        device = get_backend("gpu").xp.cuda.Device()
    except (ImportError, RuntimeError):         # no device to select (a stand-in NCCL in tests)
        device = None
    _NCCL[id(comm)] = (comm, _Pending(lambda: nccl.NcclCommunicator(size, uid, rank), device))  # keeps id(comm) unique


def nccl_ready(comm) -> bool:
    """Whether ``comm`` has its NCCL communicator already, or is making it
    (:func:`nccl_communicator`, :func:`start_nccl_communicator`)."""
    hit = _NCCL.get(id(comm))
    return hit is not None and hit[0] is comm
