"""MPI plumbing of :mod:`adaptmg.distributed`: the communicator, error agreement, abort guard.

Everything here is host-side mpi4py.  ``mpi4py`` is imported lazily, so that
``import adaptmg.distributed`` works (and a one-rank run takes the serial code path)
where it is not installed.

Failure policy.  A distributed solve must never hang because one rank failed:

* **Input errors** are agreed on before any collective that could block:
  :func:`agree` is one ``allreduce`` of a flag; every rank then raises the same
  ``ValueError`` naming the ranks and the first message.
* **Anything else** (an exception in a user callback, an assembly error on one rank)
  is caught by :func:`guard` -- a context manager that prints the traceback with the
  rank's number to stderr and calls ``comm.Abort(1)``, which makes ``mpiexec``
  terminate every rank.  :func:`install_excepthook` does the same for a whole script
  (like ``python -m mpi4py script.py``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
import traceback

__all__ = ["get_comm", "have_mpi", "agree", "guard", "install_excepthook", "HaloTimer",
           "launched_size", "launched_rank"]

#: environment variables in which MPI launchers announce the job size / this process's rank
#: (MPICH/Hydra and Intel MPI: PMI_*; Open MPI: OMPI_COMM_WORLD_*)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def _env_int(names):
    for name in names:
        v = os.environ.get(name, "")
        if v.isdigit():
            return int(v)
    return None


def launched_size() -> int:
    """Number of processes ``mpiexec`` started (1 when not launched by an MPI launcher),
    read from the launcher's environment: nothing is imported or initialised."""
    return _env_int(_SIZE_VARS) or 1


def launched_rank() -> int:
    """This process's rank in the launched job (0 when not launched by an MPI launcher)."""
    return _env_int(_RANK_VARS) or 0


def have_mpi() -> bool:
    """True when mpi4py can be imported."""
    return importlib.util.find_spec("mpi4py") is not None


def get_comm(comm=None):
    """``comm`` itself, or ``MPI.COMM_WORLD`` when it is None and mpi4py is installed, else None
    (serial).  Anything that is not an mpi4py communicator raises TypeError."""
    if comm is None:
        if not have_mpi():
            return None
        from mpi4py import MPI
        return MPI.COMM_WORLD
    if not (hasattr(comm, "Get_rank") and hasattr(comm, "Allreduce")):
        raise TypeError(f"comm must be an mpi4py communicator or None, got {type(comm).__name__}")
    return comm


def agree(comm, ok: bool, message: str = "") -> None:
    """Collective check: raise the same ``ValueError`` on every rank when ``ok`` is False on any.

    One ``allgather`` of ``(ok, message)``; the error names the failing ranks and the
    first failing rank's message.  Call it before a collective that a failing rank
    would never reach."""
    if comm is None or comm.Get_size() == 1:
        if not ok:
            raise ValueError(message)
        return
    flags = comm.allgather((bool(ok), "" if ok else str(message)))
    bad = [r for r, (f, _) in enumerate(flags) if not f]
    if bad:
        raise ValueError(f"rank(s) {bad} rejected the input: {flags[bad[0]][1]}")


def _abort(comm, exc_type, exc, tb):
    rank = comm.Get_rank()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(f"[adaptmg.distributed] rank {rank} of {comm.Get_size()} failed; "
                     f"aborting all ranks:\n{text}")
    sys.stderr.flush()
    # the launcher forwards stderr through a pipe and tears the job down on MPI_Abort: give
    # it a moment to pass this message on (seen lost once under load in the test suite)
    time.sleep(0.5)
    comm.Abort(1)
    os._exit(1)        # MPI_Abort may return on the calling rank (MPICH): never run on


class guard:
    """Context manager: an exception inside it on any rank aborts every rank (``comm.Abort(1)``)
    after printing it with the rank's number.  On one rank (or comm None) it lets the
    exception propagate as usual."""

    def __init__(self, comm):
        self.comm = comm

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.comm is not None and self.comm.Get_size() > 1 \
                and not issubclass(exc_type, (KeyboardInterrupt, GeneratorExit)):
            _abort(self.comm, exc_type, exc, tb)
        return False


def install_excepthook(comm=None) -> None:
    """Make an uncaught exception on any rank abort all ranks (``sys.excepthook``)."""
    comm = get_comm(comm)
    if comm is None or comm.Get_size() == 1:
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
            return
        _abort(comm, exc_type, exc, tb)

    sys.excepthook = hook


class HaloTimer:
    """Accumulates the seconds spent in halo exchanges (posting, packing, waiting)."""

    __slots__ = ("seconds", "exchanges", "bytes")

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds = 0.0
        self.exchanges = 0
        self.bytes = 0

    @staticmethod
    def now():
        return time.perf_counter()
