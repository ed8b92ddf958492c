"""MPI plumbing of :mod:`adaptmg.distributed`: the communicator, error agreement, abort guard,
and for the GPU backend the device of each rank and the halo transport.

Everything here is host-side mpi4py.  ``mpi4py`` is imported lazily, so that
``import adaptmg.distributed`` works (and a one-rank run takes the serial code path)
where it is not installed.  CuPy is reached only through ``adaptmg.backend.get_backend("gpu")``
and NCCL through :mod:`.nccl` (its communicator, stream and device collectives), so
nothing here needs a GPU unless the GPU backend is asked for.

GPU backend (see :mod:`.csr` for the exchange itself):

* :func:`select_device` -- every rank uses device ``local_rank % device_count``, the local
  rank read from the launcher's environment (:func:`local_rank_from_env`:
  ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``, ``PMI_LOCAL_RANK``) or else from a
  split of the communicator by shared-memory node (``Split_type(COMM_TYPE_SHARED)``); done
  once per process, before the first CuPy allocation (:func:`adaptmg.distributed.solve`
  calls it first thing).
* :func:`resolve_transport` -- the halo transport: ``"host"`` (device gather, D2H copy
  into a pinned host buffer, MPI ``Isend``/``Irecv``, H2D copy into the ghost buffer) or
  ``"nccl"`` (``ncclSend``/``ncclRecv`` of device buffers in one group on the current
  stream), the latter only when every rank sits on a different GPU (NCCL refuses two ranks
  on one device) and ``cupy.cuda.nccl`` is available; :func:`choose_transport` is the
  rule.  ``"mpi"`` names the CPU backend's exchange (NumPy buffers).
* :func:`allreduce_sum` -- the Krylov solvers' global reductions: a host ``Allreduce``
  (``"mpi"``, ``"host"``) or, with the NCCL transport, :class:`.nccl.NcclSum`, an
  ``ncclAllReduce`` on the device that leaves the result there (no host synchronisation).

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
import socket
import sys
import time
import traceback

import numpy as np

from .nccl import NcclSum, nccl_available, nccl_pass, nccl_ready

__all__ = ["allreduce_sum", "collective_property", "mpi_family", "mpi4py_family", "check_launch", "find_mpiexec", "mpiexec_flags", "mpiexec_command", "get_comm", "have_mpi", "agree", "guard", "install_excepthook", "HaloTimer",
           "launched_size", "launched_rank", "local_rank_from_env", "local_rank", "device_for_rank",
           "select_device", "choose_transport", "resolve_transport", "pass_arrays",
           "waitall", "alltoallv", "TRANSPORTS"]

#: environment variables in which MPI launchers announce the job size / this process's rank
#: (MPICH/Hydra and Intel MPI: PMI_*; Open MPI: OMPI_COMM_WORLD_*)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")
#: ... and this process's rank among those on its node (Open MPI, Intel MPI / MPICH hydra, PMI)
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")


def mpiexec_flags(version_text: str, euid: int, gpu: bool = False) -> list:
    """Extra ``mpiexec`` arguments for the launcher that printed ``version_text``
    (``mpiexec --version``): Open MPI refuses more ranks than cores without
    ``--oversubscribe`` and to run as root without ``--allow-run-as-root``; MPICH's hydra
    needs neither.

    ``gpu`` (one rank per GPU): Open MPI binds each of up to two ranks to *one* core unless
    told otherwise, and a GPU rank's NCCL threads (its proxy, the lazy connection of its
    channels on the first collective) then share that core with the rank: ``--bind-to none``
    (two H200, 4.8M DoFs, the first set-up in a fresh process, three runs each on one machine:
    1.33-1.42 s bound, 1.09-1.15 s not -- the smoothers' phase, whose power iterations make
    NCCL's first all-reduces, 0.37 -> 0.10 s; warm set-ups differ within their run-to-run
    noise; hydra binds nothing by default)."""
    if "Open MPI" not in version_text and "OpenRTE" not in version_text:
        return []
    return (["--oversubscribe"] + (["--allow-run-as-root"] if euid == 0 else [])
            + (["--bind-to", "none"] if gpu else []))


def mpi_family(version_text: str) -> str:
    """``"openmpi"``, ``"mpich"`` (MPICH, its Hydra launcher, Intel MPI) or ``""`` (unknown) for
    the output of ``mpiexec --version`` or of ``MPI.Get_library_version()``."""
    t = version_text.lower()
    if "open mpi" in t or "openrte" in t or "open-mpi" in t:
        return "openmpi"
    if "mpich" in t or "hydra" in t or "intel(r) mpi" in t:
        return "mpich"
    return ""


_FAMILY = {}


def mpi4py_family() -> str:
    """:func:`mpi_family` of the MPI library mpi4py is linked with (asked once, in a child
    Python that does not initialise MPI either: ``MPI_Get_library_version`` may be called
    before ``MPI_Init``); ``""`` without mpi4py or when unknown."""
    if "mpi4py" not in _FAMILY:
        import subprocess
        fam = ""
        if have_mpi():
            try:
                r = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = "
                                    "mpi4py.rc.finalize = False; from mpi4py import MPI; "
                                    "print(MPI.Get_library_version())"],
                                   capture_output=True, text=True, timeout=60)
                fam = mpi_family(r.stdout)
            except (OSError, subprocess.SubprocessError):
                pass
        _FAMILY["mpi4py"] = fam
    return _FAMILY["mpi4py"]


def _version_text(mpiexec: str) -> str:
    import subprocess
    try:
        r = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        return r.stdout + r.stderr
    except (OSError, subprocess.SubprocessError):
        return ""


def find_mpiexec() -> str | None:
    """The launcher of the MPI library mpi4py is linked with: among the ``mpiexec`` next to the
    running Python (the ``mpi`` extra installs MPICH's there), then ``mpiexec`` and ``mpirun``
    on the PATH, the first whose ``--version`` names the same family (:func:`mpi_family`:
    Open MPI or MPICH); where that is unknown, the first of them; None when there is none.

    A launcher of the other family starts every rank as a singleton (each sees
    ``COMM_WORLD.Get_size() == 1``), as the MPICH wheel's ``mpiexec`` does beside an mpi4py
    built on a machine's Open MPI; :func:`get_comm` refuses such a launch."""
    import shutil
    found = [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    found += [shutil.which(name) for name in ("mpiexec", "mpirun")]
    cands = []
    for c in found:
        if c and os.access(c, os.X_OK) and os.path.realpath(c) not in map(os.path.realpath, cands):
            cands.append(c)
    if not cands:
        return None
    want = mpi4py_family()
    if want:
        for c in cands:
            if mpi_family(_version_text(c)) == want:
                return c
    return cands[0]


def mpiexec_command(n: int, mpiexec: str | None = None, gpu: bool = False) -> list | None:
    """``[mpiexec, <flags>, "-n", n]`` to start ``n`` ranks, or None when no launcher is found.

    The launcher is ``mpiexec`` if given, else :func:`find_mpiexec`; its flags come from
    :func:`mpiexec_flags` (``gpu``: one rank per GPU)."""
    if mpiexec is None:
        mpiexec = find_mpiexec()
    if mpiexec is None:
        return None
    text = _version_text(mpiexec)
    euid = os.geteuid() if hasattr(os, "geteuid") else -1
    return [mpiexec] + mpiexec_flags(text, euid, gpu) + ["-n", str(int(n))]


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


def check_launch(world_size: int, launched: int | None = None) -> None:
    """Raise RuntimeError when a launcher announced ``launched`` > 1 processes
    (:func:`launched_size`) but ``COMM_WORLD`` has ``world_size == 1``: the launcher belongs to
    another MPI library than mpi4py's, every rank would run alone (and the job would repeat the
    serial solve ``launched`` times)."""
    launched = launched_size() if launched is None else int(launched)
    if launched > 1 and world_size == 1:
        raise RuntimeError(
            f"mpiexec started {launched} processes but each sees MPI.COMM_WORLD of size 1: the "
            f"launcher does not belong to the MPI library mpi4py is linked with "
            f"({mpi4py_family() or 'unknown'}); start the job with that library's mpiexec "
            f"(adaptmg.distributed.comm.mpiexec_command finds it; Open MPI as root: mpiexec "
            f"--allow-run-as-root -n {launched} ...)")


def get_comm(comm=None):
    """``comm`` itself, or ``MPI.COMM_WORLD`` when it is None and mpi4py is installed, else None
    (serial).  Anything that is not an mpi4py communicator raises TypeError; ``COMM_WORLD`` of
    size 1 in a job a launcher announced as larger raises RuntimeError (:func:`check_launch`)."""
    if comm is None:
        if not have_mpi():
            return None
        from mpi4py import MPI
        check_launch(MPI.COMM_WORLD.Get_size())
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
    exception propagate as usual; so it does on the ranks of an in-process communicator
    (:mod:`.thread_comm`), after aborting that communicator (the other ranks' calls raise)."""

    def __init__(self, comm):
        self.comm = comm

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.comm is not None and self.comm.Get_size() > 1 \
                and not issubclass(exc_type, (KeyboardInterrupt, GeneratorExit)):
            if getattr(self.comm, "in_process", False):
                self.comm.Abort(1)       # ranks of one process: the others' calls raise, this propagates
                return False
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


class collective_property:
    """A property computed on first access and kept in the instance (``functools.cached_property``
    without its lock), for values whose computation is collective.

    Python 3.11's ``cached_property`` holds one lock per property for *every* instance while it
    computes: where the ranks of :mod:`.thread_comm` are threads of one process, the first rank
    to ask waits inside the collective for the others, which wait for the lock -- a deadlock
    (3.12 dropped the lock).  As with MPI ranks, each instance here is computed by its own
    rank only once."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def waitall(requests) -> None:
    """Wait for the point-to-point ``requests`` (mpi4py's ``Request.Waitall``; the requests of
    an in-process communicator, :mod:`.thread_comm`, one by one)."""
    if not requests:
        return
    if getattr(requests[0], "in_process", False):
        for r in requests:
            r.Wait()
        return
    from mpi4py import MPI
    MPI.Request.Waitall(requests)


def _displs(counts):
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def alltoallv(comm, dest: np.ndarray, *arrays, counts: bool = False):
    """Send row ``i`` of every array to rank ``dest[i]`` (one ``Alltoall`` of the counts, one
    ``Alltoallv`` per array; NumPy buffers, no pickling).  Returns the received arrays: rows
    grouped by source rank, each source's rows in the order it sent them; ``counts=True``:
    ``(arrays, rcount)``, ``rcount[q]`` the rows received from rank ``q``."""
    P = comm.Get_size()
    dest = np.asarray(dest, dtype=np.int64)
    # rows already grouped by destination (often: destinations found in sorted ids) are sent
    # as they are; else the stable order, rows gathered by take (not a 2-D fancy index)
    grouped = dest.size < 2 or bool((dest[1:] >= dest[:-1]).all())
    order = None if grouped else np.argsort(dest, kind="stable")

    def rows(a):
        a = np.asarray(a)
        return a if order is None else a.take(order, axis=0)
    if P == 1:
        out = [np.array(a) if order is None else rows(a) for a in arrays]   # copies, as received
        return (out, np.array([dest.size], dtype=np.int64)) if counts else out
    scount = np.bincount(dest, minlength=P).astype(np.int64)
    rcount = np.empty(P, dtype=np.int64)
    comm.Alltoall(scount, rcount)
    out = []
    for a in arrays:
        a = np.ascontiguousarray(rows(a))
        w = int(np.prod(a.shape[1:], dtype=np.int64))
        r = np.empty((int(rcount.sum()),) + a.shape[1:], dtype=a.dtype)
        sc, rc = scount * w, rcount * w
        comm.Alltoallv([a.reshape(-1), (sc, _displs(sc))], [r.reshape(-1), (rc, _displs(rc))])
        out.append(r)
    return (out, rcount) if counts else out


def allreduce_sum(comm, transport="mpi"):
    """``partial -> sum over the ranks of comm``: the reduction that
    :func:`adaptmg.linalg._vectorops.global_reductions` takes to make the Krylov solvers'
    inner products and norms global.

    ``transport`` (the hierarchy's halo transport, :func:`resolve_transport`): ``"mpi"``
    (CPU) and ``"host"`` -- one ``Allreduce`` of a NumPy array; a CuPy partial is copied to
    the host (a synchronisation), reduced there and uploaded again.  ``"nccl"`` -- a
    :class:`.nccl.NcclSum`: the partial is summed on the device (``ncclAllReduce``), the result is
    a device array and the host does not wait."""
    if transport == "nccl":
        return NcclSum(comm)
    if transport not in ("mpi", "host"):
        raise ValueError(f"allreduce_sum: transport must be 'mpi', 'host' or 'nccl', got {transport!r}")
    from ..backend import backend_of, is_device_array, to_host

    def f(a):
        dev = is_device_array(a)
        h = np.ascontiguousarray(to_host(a) if dev else a)
        out = np.empty_like(h)
        comm.Allreduce(h, out)
        return backend_of(a).xp.asarray(out) if dev else out
    return f


_PASS_TAG = 23       # pass_arrays' MPI messages


def pass_arrays(comm, arrays, src: int, dst: int, transport: str = "mpi") -> None:
    """Rank ``src``'s ``arrays`` copied into rank ``dst``'s ``arrays`` (buffers of the same
    shapes and dtypes there, written in place; other ranks do nothing).  Their bytes go by
    one NCCL group of sends / receives where ``transport`` is ``"nccl"`` and the arrays are
    on the device (ordered on the current stream as :class:`.nccl.NcclSum`: the host does not
    wait), else by MPI (device arrays through host copies)."""
    rank = comm.Get_rank()
    if rank not in (src, dst) or src == dst:
        return
    from ..backend import backend_of, is_device_array, to_host
    arrays = list(arrays)
    if any(not a.flags.c_contiguous for a in arrays):
        raise ValueError("pass_arrays: the arrays must be C-contiguous")
    if transport == "nccl" and arrays and all(is_device_array(a) for a in arrays):
        nccl_pass(comm, arrays, src, dst)
        return
    for a in arrays:
        if rank == src:
            comm.Send(np.ascontiguousarray(to_host(a)), dest=dst, tag=_PASS_TAG)
        elif is_device_array(a):
            h = np.empty(a.shape, dtype=a.dtype)
            comm.Recv(h, source=src, tag=_PASS_TAG)
            a[...] = backend_of(a).xp.asarray(h)
        else:
            comm.Recv(a, source=src, tag=_PASS_TAG)


class HaloTimer:
    """Accumulates the seconds spent in halo exchanges (posting, packing, waiting), their
    number, the bytes sent, and ``idle``: NCCL exchanges skipped because this rank had
    nothing to send or receive in them (counted in ``exchanges`` too)."""

    __slots__ = ("seconds", "exchanges", "bytes", "idle")

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds = 0.0
        self.exchanges = 0
        self.bytes = 0
        self.idle = 0

    @staticmethod
    def now():
        return time.perf_counter()


# ------------------------------------------------------------------ GPU backend: devices
def local_rank_from_env(environ=None):
    """This process's rank on its node as announced by the launcher (the first of
    ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``, ``PMI_LOCAL_RANK`` holding a
    non-negative integer), or None."""
    env = os.environ if environ is None else environ
    for name in _LOCAL_RANK_VARS:
        v = str(env.get(name, "")).strip()
        if v.isdigit():
            return int(v)
    return None


def local_rank(comm=None) -> int:
    """Rank of this process on its node: from the launcher's environment, else (collective
    on ``comm``) the rank in ``comm.Split_type(MPI.COMM_TYPE_SHARED)``; 0 without a
    communicator, and for the ranks of an in-process communicator (:mod:`.thread_comm`: they
    share the process's device)."""
    if getattr(comm, "in_process", False):
        return 0                            # ranks of one process share its device
    r = local_rank_from_env()
    if r is not None:
        return r
    comm = get_comm(comm)
    if comm is None or comm.Get_size() == 1:
        return 0
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank()
    finally:
        node.Free()


def device_for_rank(local: int, count: int) -> int:
    """The GPU of a rank with node-local rank ``local`` among ``count`` visible devices."""
    if count < 1:
        raise ValueError(f"no CUDA device to choose from (device count {count})")
    if local < 0:
        raise ValueError(f"local rank must be non-negative, got {local}")
    return local % count


_SELECTED = {"device": None}


def select_device(comm=None) -> int:
    """Make device ``local_rank % device_count`` CuPy's current device (once per process:
    later calls return the device chosen first) and return its number.  Call it before
    any CuPy allocation (arrays live on the device that was current when they were made)."""
    if _SELECTED["device"] is not None:
        return _SELECTED["device"]
    try:              # the device first: the GPU backend's set-up (kernel caches, the cubin
        import cupy   # prefetch) would otherwise open a CUDA context on device 0 in every rank
        cupy.cuda.Device(device_for_rank(local_rank(comm), cupy.cuda.runtime.getDeviceCount())).use()
    except Exception:                          # no CuPy or no device: get_backend says so below
        pass
    from ..backend import get_backend
    cupy = get_backend("gpu").xp
    dev = device_for_rank(local_rank(comm), cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    _SELECTED["device"] = dev
    return dev


def names_gpu(backend) -> bool:
    """Whether a ``backend`` argument names the GPU ("gpu", "cuda" or a GPU
    :class:`~adaptmg.backend.Backend`) -- without asking CUDA anything (so a caller can
    :func:`select_device` before the backend is made; "auto" is not known without asking)."""
    if isinstance(backend, str):
        return backend.lower() in ("gpu", "cuda")
    return bool(getattr(backend, "is_gpu", False))


def _placement():
    """(host name, PCI bus id or device number) of this rank's current GPU."""
    from ..backend import get_backend
    cupy = get_backend("gpu").xp
    d = cupy.cuda.Device()
    try:
        key = str(d.pci_bus_id)
    except Exception:                        # pragma: no cover - very old CuPy
        key = f"device{d.id}"
    return socket.gethostname(), key


# ------------------------------------------------------------------ GPU backend: transport
#: halo transports: "mpi" (CPU backend), "host" (GPU, host-staged MPI), "nccl" (GPU, NCCL p2p)
TRANSPORTS = ("mpi", "host", "nccl")
_REQUESTS = ("auto", "host", "nccl")


def choose_transport(requested, placements, nccl_ok):
    """The halo transport of a GPU run: ``(transport, reason)``.

    ``placements``: per rank (host name, device key) of its GPU; ``nccl_ok``: per rank
    whether ``cupy.cuda.nccl`` is usable.  ``"nccl"`` needs more than one rank, every rank
    on a different GPU and NCCL on all of them; ``"auto"`` takes it then, else ``"host"``;
    ``"host"`` is always host staging.  A request for ``"nccl"`` that cannot be met gives
    ``("", reason)`` (the caller raises)."""
    if requested not in _REQUESTS:
        raise ValueError(f"halo transport must be one of {_REQUESTS}, got {requested!r}")
    if requested == "host":
        return "host", "requested"
    placements = [tuple(p) for p in placements]
    why = ""
    if len(placements) < 2:
        why = "one rank"
    elif len(set(placements)) < len(placements):
        why = "ranks share a GPU (NCCL needs one GPU per rank)"
    elif not all(nccl_ok):
        why = "cupy.cuda.nccl is not available on every rank"
    if not why:
        return "nccl", "every rank on its own GPU"
    return ("host" if requested == "auto" else ""), why


def resolve_transport(comm, requested=None, backend=None) -> str:
    """The halo transport for ``backend`` on ``comm`` (collective for a GPU backend unless
    ``requested`` is ``"host"``): ``"mpi"`` on the CPU; on the GPU :func:`choose_transport`
    over the allgathered placements of all ranks.  ``requested`` None: the environment
    variable ``ADAPTMG_HALO_TRANSPORT`` or ``"auto"``.  ``"host"`` is returned as is, and
    ``"nccl"`` once ``comm`` has its NCCL communicator (:func:`.nccl.nccl_communicator`: made by
    every rank together after a check that passed, so every rank skips the collective
    alike -- a hierarchy's matrices take its resolved transport without one each).  ``"nccl"``
    requested where it cannot be used raises the same ValueError on every rank."""
    if backend is None or not getattr(backend, "is_gpu", False):
        return "mpi"
    if requested is None:
        requested = os.environ.get("ADAPTMG_HALO_TRANSPORT", "auto").strip().lower() or "auto"
    if requested == "mpi":
        raise ValueError("halo transport 'mpi' is the CPU backend's; on the GPU use "
                         "'auto', 'host' or 'nccl'")
    if requested == "host":
        return "host"
    if requested not in _REQUESTS:
        raise ValueError(f"halo transport must be one of {_REQUESTS}, got {requested!r}")
    if comm.Get_size() == 1:
        return "host"
    if requested == "nccl" and nccl_ready(comm):
        return "nccl"
    info = comm.allgather((_placement(), nccl_available()))
    choice, why = choose_transport(requested, [p for p, _ in info], [ok for _, ok in info])
    if not choice:
        raise ValueError(f"halo transport 'nccl' requested but {why}")
    return choice
