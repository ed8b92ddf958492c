"""In-process ranks: a communicator whose ranks are the threads of one process, with the part
of mpi4py's interface that :mod:`adaptmg.distributed` uses.

What it is for: running the distributed code path -- both sides of every exchange, rank 0's
and rank 1's own branches -- without an MPI launcher.  ``adaptmg warmup``'s ``distributed``
task compiles the kernels of a two-rank GPU solve this way in one process
(:mod:`adaptmg.device.warmup`), and the tests use it to check the distributed path on 2-3
ranks in one interpreter.  It is not for speed: the ranks share the interpreter lock and the
process's current device, so on the GPU their halo transport is host staging
(:func:`.comm.resolve_transport` sees every rank on one device, and an NCCL communicator
needs a device per rank: NCCL is never used here).

Semantics.  A collective is an exchange of contributions: each rank stores its own, all wait
at a barrier, each reads what it needs, all wait again (so no rank overwrites a contribution
another has not read).  Objects travel as pickled copies, as with MPI; buffers (NumPy arrays)
are copied into the receiving buffers.  Point-to-point messages go through one FIFO queue per
``(source, destination, tag)``; ``Isend`` completes at once (the data is copied), ``Irecv``
when waited for (:func:`.comm.waitall`).  ``Abort`` breaks the barrier and flags the world:
every rank's next or pending call raises :class:`RankAborted` -- :func:`run_ranks` then
re-raises the failing rank's own exception.

    >>> from adaptmg.distributed.thread_comm import run_ranks
    >>> run_ranks(3, lambda comm: comm.allreduce(comm.Get_rank()))
    [3, 3, 3]
"""
from __future__ import annotations

import functools
import pickle
import queue
import sys
import threading
import time

import numpy as np

__all__ = ["ThreadComm", "ThreadRequest", "RankAborted", "run_ranks"]


class RankAborted(RuntimeError):
    """Raised in the ranks of an in-process communicator after one of them aborted."""


class _World:
    """What the ranks of one in-process communicator share (``timeout``: the longest a rank
    waits in one call for the others, seconds)."""

    def __init__(self, size, timeout):
        self.size = size
        self.timeout = timeout
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.box = [None] * size              # one contribution per rank (collectives)
        self.lock = threading.Lock()
        self.mail = {}                         # (source, dest, tag) -> queue.Queue
        self.aborted = threading.Event()

    def queue(self, src, dst, tag):
        with self.lock:
            return self.mail.setdefault((src, dst, tag), queue.Queue())


class ThreadRequest:
    """A point-to-point request of :class:`ThreadComm` (``Wait``; :func:`.comm.waitall`)."""

    in_process = True

    def __init__(self, complete=None):
        self._complete = complete              # None: complete already (a send)

    def Wait(self):
        if self._complete is not None:
            done, self._complete = self._complete, None
            done()


def _op(op):
    """A binary reduction for ``op``: None or ``MPI.SUM`` (sum), ``MPI.MAX``, ``MPI.MIN``."""
    name = "sum" if op is None else None
    if name is None:
        try:
            from mpi4py import MPI
            name = next((n for n, o in (("sum", MPI.SUM), ("max", MPI.MAX), ("min", MPI.MIN)) if op == o), None)
        except ImportError:                    # pragma: no cover - an op without mpi4py
            name = None
    if name == "sum":
        return lambda a, b: a + b
    if name in ("max", "min"):
        arr = np.maximum if name == "max" else np.minimum
        one = max if name == "max" else min
        return lambda a, b: arr(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else one(a, b)
    raise TypeError(f"ThreadComm reduces with MPI.SUM, MPI.MAX or MPI.MIN, got {op!r}")


def _copy(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _flat(buf):
    """A 1-D view of the NumPy buffer ``buf`` (written in place: a C-contiguous array only, as
    MPI's buffers)."""
    a = np.asarray(buf)
    if not a.flags.c_contiguous:
        raise ValueError("ThreadComm: buffers must be C-contiguous NumPy arrays")
    return a.reshape(-1)


def _spec(buf):
    """``(array, counts, displacements)`` of an mpi4py vector buffer ``[array, (counts, displs)]``."""
    arr, (counts, displs) = buf[0], buf[1]
    return _flat(arr), np.asarray(counts, dtype=np.int64), np.asarray(displs, dtype=np.int64)


class ThreadComm:
    """Rank ``rank`` of an in-process communicator (module doc); made by :func:`run_ranks`."""

    in_process = True

    def __init__(self, world: _World, rank: int):
        self._world, self._rank = world, int(rank)

    def __repr__(self):
        return f"ThreadComm(rank {self._rank} of {self._world.size})"

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._world.size

    # ------------------------------------------------------------------ the exchange
    def _check(self):
        if self._world.aborted.is_set():
            raise RankAborted("another rank of the in-process communicator aborted")

    def _wait(self):
        w = self._world
        try:
            w.barrier.wait()
        except threading.BrokenBarrierError:
            if not w.aborted.is_set():           # the barrier's timeout: a rank never came
                self.Abort(1)
                raise RankAborted(f"rank {self._rank} waited {w.timeout} s in a collective that "
                                  "another rank never reached") from None
            raise RankAborted("another rank of the in-process communicator aborted") from None

    def _exchange(self, mine):
        """Every rank's contribution (this rank's ``mine``), in rank order; the references
        stay valid until the caller's next collective (read them, then :meth:`_wait`)."""
        self._check()
        self._world.box[self._rank] = mine
        self._wait()
        return list(self._world.box)

    def _collect(self, mine, read):
        """``read(contributions)`` between the two barriers of one collective."""
        everyone = self._exchange(mine)
        try:
            return read(everyone)
        finally:
            self._wait()

    # ------------------------------------------------------------------ object collectives
    def allgather(self, obj):
        return self._collect(obj, lambda a: [_copy(x) for x in a])

    def bcast(self, obj, root=0):
        return self._collect(obj if self._rank == root else None, lambda a: _copy(a[root]))

    def gather(self, obj, root=0):
        return self._collect(obj, lambda a: [_copy(x) for x in a] if self._rank == root else None)

    def allreduce(self, obj, op=None):
        return self._collect(obj, lambda a: functools.reduce(_op(op), [_copy(x) for x in a]))

    def exscan(self, obj, op=None):
        """The reduction over the ranks before this one (None on rank 0, as MPI leaves it)."""
        r = self._rank
        return self._collect(obj, lambda a: functools.reduce(_op(op), [_copy(x) for x in a[:r]]) if r else None)

    def Barrier(self):
        self._collect(None, lambda a: None)

    # ------------------------------------------------------------------ buffer collectives
    def Allreduce(self, sendbuf, recvbuf, op=None):
        f = _op(op)

        def read(a):
            recvbuf[...] = functools.reduce(f, [np.asarray(x) for x in a])
        self._collect(np.array(sendbuf, copy=True), read)

    def Bcast(self, buf, root=0):
        def read(a):
            if self._rank != root:
                buf[...] = a[root]
        self._collect(np.asarray(buf) if self._rank == root else None, read)

    def Alltoall(self, sendbuf, recvbuf):
        size = self._world.size

        def read(a):
            out = _flat(recvbuf).reshape(size, -1)
            for q in range(size):
                out[q] = np.asarray(a[q]).reshape(size, -1)[self._rank]
        self._collect(np.array(sendbuf, copy=True), read)

    def Alltoallv(self, sendbuf, recvbuf):
        r = self._rank

        def read(a):
            rb, rc, rd = _spec(recvbuf)
            for q, (sb, sc, sd) in enumerate(a):
                if sc[r] != rc[q]:
                    raise ValueError(f"Alltoallv: rank {q} sends {sc[r]} entries to rank {r}, "
                                     f"which expects {rc[q]}")
                rb[rd[q]:rd[q] + rc[q]] = sb[sd[r]:sd[r] + sc[r]]
        self._collect(_spec(sendbuf), read)

    def Allgatherv(self, sendbuf, recvbuf):
        def read(a):
            rb, counts, displs = _spec(recvbuf)
            for q, x in enumerate(a):
                if x.size != counts[q]:
                    raise ValueError(f"Allgatherv: rank {q} sends {x.size} entries, counts say {counts[q]}")
                rb[displs[q]:displs[q] + counts[q]] = x
        self._collect(np.asarray(sendbuf).reshape(-1), read)

    # ------------------------------------------------------------------ point to point
    def Send(self, buf, dest, tag=0):
        self._check()
        self._world.queue(self._rank, int(dest), tag).put(np.array(buf, copy=True))

    def Recv(self, buf, source, tag=0):
        q = self._world.queue(int(source), self._rank, tag)
        deadline = time.monotonic() + self._world.timeout
        while True:
            self._check()
            try:
                msg = q.get(timeout=0.05)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.Abort(1)
                    raise RankAborted(f"rank {self._rank} waited {self._world.timeout} s for a message "
                                      f"from rank {source} (tag {tag}) that never came") from None
        out = _flat(buf)
        if msg.size != out.size:
            raise ValueError(f"Recv: rank {source} sent {msg.size} entries into a buffer of {out.size}")
        out[...] = msg.reshape(-1)

    def Isend(self, buf, dest, tag=0):
        self.Send(buf, dest, tag)
        return ThreadRequest()

    def Irecv(self, buf, source, tag=0):
        return ThreadRequest(lambda: self.Recv(buf, source, tag))

    def Abort(self, errorcode=1):
        """Flag the world aborted and break its barrier: every rank's pending or next call
        raises :class:`RankAborted` (the threads are not killed)."""
        self._world.aborted.set()
        self._world.barrier.abort()


def run_ranks(size: int, fn, *args, timeout: float = 600.0, **kwargs) -> list:
    """``fn(comm, *args, **kwargs)`` on ``size`` threads, one rank of a :class:`ThreadComm`
    each; returns their results in rank order.  The threads use the caller's current CUDA
    device (when CuPy is loaded).  An exception on any rank aborts the others and is raised
    here (the first failing rank's own exception, not the :class:`RankAborted` of the rest).
    ``timeout``: the longest a rank waits in one collective or receive for the others
    (seconds); past it every rank is aborted -- a mismatched call fails instead of hanging."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"run_ranks: size must be a positive integer, got {size!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"run_ranks: timeout must be a positive number of seconds, got {timeout!r}")
    world = _World(int(size), float(timeout))
    results, errors = [None] * world.size, [None] * world.size
    device = None
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            device = cupy.cuda.runtime.getDevice()
        except Exception:                      # no device: the ranks do not need one
            device = None

    def main(r):
        comm = ThreadComm(world, r)
        try:
            if device is not None:
                cupy.cuda.Device(device).use()
            results[r] = fn(comm, *args, **kwargs)
        except BaseException as e:             # noqa: BLE001 - re-raised by the caller
            errors[r] = e
            comm.Abort(1)

    threads = [threading.Thread(target=main, args=(r,), name=f"adaptmg-rank-{r}", daemon=True)
               for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        own = [e for e in failed if not isinstance(e, RankAborted)]
        raise (own or failed)[0]
    return results
