"""A NumPy stand-in for CuPy, to run the GPU code paths of adaptmg.distributed without a GPU.

Not a test module.  :func:`install` makes ``adaptmg.backend.get_backend("gpu")`` return a
backend whose array module is :data:`xp` below: arrays are a NumPy subclass whose type
claims to live in ``cupy`` (so ``adaptmg.backend.is_device_array`` and ``backend_of`` see
"device" arrays) with CuPy's ``get(out=)`` / ``set(arr, stream=)``; sparse matrices a SciPy
CSR subclass claiming ``cupyx.scipy.sparse`` with ``get()``; ``xp.cuda`` has streams, events,
pinned memory (a ``bytearray``) and one device.  The element-wise kernels and SpMV plans of
:mod:`adaptmg.device.kernels` dispatch on ``isinstance(x, numpy.ndarray)`` and so run their
NumPy twins.  What this exercises: the device-side bookkeeping of the distributed layer
(which arrays are moved, host staging of the halo exchange with its buffers, the device
smoothers restricted to owned rows, reductions of device vectors, device selection and the
transport choice), under a real ``mpiexec``.  What it cannot: anything CUDA itself does
(streams, asynchrony, cuSPARSE, NCCL) -- that needs the real GPU tests (``-m gpu``).
Used by ``mpi_cases.py solve-gpu OUT --fake`` (one device shared by the ranks: host staging)
and ``--fake-nccl`` (one device per rank and a stand-in for ``cupy.cuda.nccl`` whose
grouped ``send``/``recv`` of device addresses are carried out by MPI at ``groupEnd`` and
whose ``allReduce`` by an MPI ``Allreduce`` at once: the bookkeeping of the NCCL transport
and of the device reductions, not NCCL).  ``get`` counts device -> host copies
(:func:`device_to_host`), the NCCL stand-in its allreduces (:func:`nccl_allreduces`).  The serial *GPU* solve (CUDA graphs) is not
run under it.
"""
import types

import numpy as np
import scipy.sparse as sp


class ndarray(np.ndarray):
    """A NumPy array that reports itself as a CuPy array (``.data.ptr``: its address)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self, stream=None, order="C", out=None, blocking=True):
        _STATE["gets"] += 1                      # a device -> host copy
        _STATE["get_values"] += self.size
        host = self.view(np.ndarray)
        if out is None:
            return np.array(host, copy=True)
        if type(out) is not np.ndarray or out.shape != self.shape or out.dtype != self.dtype:
            raise TypeError("fake cupy: get(out=) needs a host numpy array of the same shape/dtype")
        np.copyto(out, host)
        return out

    def set(self, arr, stream=None):
        if type(arr) is not np.ndarray:
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("fake cupy: set() needs the same shape and dtype")
        self.view(np.ndarray)[...] = arr


ndarray.__module__ = "cupy._core.core"


def _dev(a):
    return a.view(ndarray) if isinstance(a, np.ndarray) else a


class csr_matrix(sp.csr_matrix):
    """A SciPy CSR matrix that reports itself as a cupyx one."""

    def get(self, stream=None):
        _STATE["get_values"] += self.nnz
        return sp.csr_matrix((np.asarray(self.data).view(np.ndarray).copy(),
                              np.asarray(self.indices).view(np.ndarray).copy(),
                              np.asarray(self.indptr).view(np.ndarray).copy()), shape=self.shape)


csr_matrix.__module__ = "cupyx.scipy.sparse._csr"


class coo_matrix(sp.coo_matrix):
    """A SciPy COO matrix that reports itself as a cupyx one (the device set-up's
    constrained products build one); ``tocsr`` gives the stand-in CSR."""

    def tocsr(self, copy=False):
        A = sp.coo_matrix.tocsr(self, copy=copy)
        return csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)


coo_matrix.__module__ = "cupyx.scipy.sparse._coo"


class _Stream:
    ptr = 0

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=0):
        pass

    def use(self):                          # as cupy.cuda.Stream: the current stream from now
        return self

    def synchronize(self):
        pass

    def wait_event(self, event):
        if not event.recorded:
            raise RuntimeError("fake cupy: wait_event on an event never recorded")
        _STATE["stream_waits"] += 1

    def is_capturing(self):
        return False


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = 0

    def record(self, stream=None):
        self.recorded += 1

    def synchronize(self):
        pass


class _Device:
    def __init__(self, i=None):
        self.id = (_STATE["device"] or 0) if i is None else int(i)
        self.pci_bus_id = f"0000:fake:{self.id:02d}"

    def use(self):
        _STATE["device"] = self.id

    def __enter__(self):                    # as cupy.cuda.Device: current device in the block
        self._prev = _STATE["device"]
        _STATE["device"] = self.id
        return self

    def __exit__(self, *exc):
        _STATE["device"] = self._prev
        return False

    def synchronize(self):
        pass


_STATE = {"device": None, "pinned": 0, "count": 1, "nccl_calls": 0, "stream_waits": 0, "gets": 0,
          "get_values": 0, "nccl_allreduces": 0, "world": None}


def _pinned(nbytes):
    _STATE["pinned"] += 1
    return bytearray(int(nbytes))


cuda = types.SimpleNamespace(
    get_current_stream=lambda: _Stream(), Event=_Event, Device=_Device,
    alloc_pinned_memory=_pinned, Stream=_Stream,
    runtime=types.SimpleNamespace(getDeviceCount=lambda: _STATE["count"]))


class _XP(types.ModuleType):
    """``numpy`` with the array constructors returning :class:`ndarray` and a ``cuda`` namespace."""

    ndarray = ndarray
    cuda = cuda

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asarray(a, dtype=None):
        if isinstance(a, ndarray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        src = a.view(np.ndarray) if isinstance(a, np.ndarray) else a
        return np.array(src, dtype=dtype, copy=True).view(ndarray)

    @staticmethod
    def asnumpy(a):
        return a.get() if isinstance(a, ndarray) else np.asarray(a)

    zeros = staticmethod(lambda *a, **k: _dev(np.zeros(*a, **k)))
    empty = staticmethod(lambda *a, **k: _dev(np.empty(*a, **k)))
    ones = staticmethod(lambda *a, **k: _dev(np.ones(*a, **k)))
    zeros_like = staticmethod(lambda a, *r, **k: _dev(np.zeros_like(a, *r, **k)))
    empty_like = staticmethod(lambda a, *r, **k: _dev(np.empty_like(a, *r, **k)))
    arange = staticmethod(lambda *a, **k: _dev(np.arange(*a, **k)))
    stack = staticmethod(lambda *a, **k: _dev(np.stack(*a, **k)))
    ascontiguousarray = staticmethod(lambda *a, **k: _dev(np.ascontiguousarray(*a, **k)))
    repeat = staticmethod(lambda *a, **k: _dev(np.repeat(*a, **k)))

    @staticmethod
    def take(a, indices, axis=None, out=None):
        if out is None:
            return _dev(np.take(a, indices, axis=axis))
        np.take(a.view(np.ndarray), np.asarray(indices).view(np.ndarray), axis=axis,
                out=out.view(np.ndarray))
        return out


def _cg_xr(p, q, rz, pq, x, r):
    a = rz[0] / pq[0] if pq[0] != 0 else 0.0
    x += a * p
    r -= a * q


def _cg_p(z, rznew, rzold, p):
    c = rznew[0] / rzold[0] if rzold[0] != 0 else 0.0
    p *= c
    p += z


#: NumPy twins of the CuPy element-wise kernels of adaptmg.linalg._vectorops that CG launches
_TWINS = {"adaptmg_krylov_cg_xr": _cg_xr, "adaptmg_krylov_cg_p": _cg_p}


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in, out, operation, name)`` by its name: the kernels of
    :data:`_TWINS` run their NumPy twins (arguments as CuPy passes them: inputs, then the
    outputs written in place); any other raises when launched."""

    def __init__(self, in_params, out_params, operation, name="", **kw):
        self.name = name

    def __call__(self, *args):
        f = _TWINS.get(self.name)
        if f is None:
            raise NotImplementedError(f"fake cupy: no NumPy twin of the kernel {self.name!r}")
        f(*args)


_XP.ElementwiseKernel = ElementwiseKernel
xp = _XP("cupy")
csp = types.ModuleType("cupyx.scipy.sparse")
csp.csr_matrix = csr_matrix
csp.coo_matrix = coo_matrix
csp.issparse = sp.issparse
csp.diags = lambda d, *a, **k: csr_matrix(sp.diags(np.asarray(d).view(np.ndarray), *a, **k).tocsr())


# ---------------------------------------------------------------- a stand-in for cupy.cuda.nccl
_NCCL_TYPES = {7: np.float64, 6: np.float32, 4: np.int64, 2: np.int32, 1: np.uint8}


def _at(ptr, count, dtype):
    """The ``count`` entries of ``dtype`` at address ``ptr`` as a NumPy array (no copy)."""
    import ctypes
    dt = np.dtype(dtype)
    buf = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dt, count=count)


class _NcclCommunicator:
    """ncclSend/ncclRecv inside a group, carried out by MPI on COMM_WORLD (a Dup) at groupEnd."""

    def __init__(self, ndev, commId, rank):
        from mpi4py import MPI
        assert len(commId) == 128 and MPI.COMM_WORLD.Get_size() == ndev
        assert MPI.COMM_WORLD.Get_rank() == rank
        # COMM_WORLD's Dup made by install() on the main thread: this constructor runs on the
        # library's NCCL init thread (adaptmg.distributed.nccl.start_nccl_communicator) beside
        # the main thread's collectives, and a Dup here (collective) raced them -- the ranks'
        # messages crossed (MPICH: 'Message truncated' in the first set-up's allreduce)
        self.mpi = _STATE["world"]
        self.rank, self.ndev = rank, ndev

    def send(self, sendbuf, count, datatype, peer, stream):
        _GROUP.append(("send", self, int(sendbuf), int(count), _NCCL_TYPES[datatype], int(peer)))

    def recv(self, recvbuf, count, datatype, peer, stream):
        _GROUP.append(("recv", self, int(recvbuf), int(count), _NCCL_TYPES[datatype], int(peer)))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        """ncclAllReduce (sum only), carried out at once by an MPI Allreduce."""
        if _GROUP:
            raise RuntimeError("fake nccl: allReduce inside a send/recv group")
        if op != nccl.NCCL_SUM:
            raise NotImplementedError(f"fake nccl: reduction op {op}")
        dt = _NCCL_TYPES[datatype]
        src = np.array(_at(int(sendbuf), int(count), dt))
        out = np.empty_like(src)
        self.mpi.Allreduce(src, out)
        _at(int(recvbuf), int(count), dt)[...] = out
        _STATE["nccl_allreduces"] += 1

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        """ncclAllGather, carried out at once by an MPI Allgather."""
        if _GROUP:
            raise RuntimeError("fake nccl: allGather inside a send/recv group")
        dt = _NCCL_TYPES[datatype]
        src = np.array(_at(int(sendbuf), int(count), dt))
        out = np.empty(int(count) * self.ndev, dtype=dt)
        self.mpi.Allgather(src, out)
        _at(int(recvbuf), int(count) * self.ndev, dt)[...] = out


_GROUP = []


def _group_start():
    if _GROUP:
        raise RuntimeError("fake nccl: nested or unfinished group")


def _group_end():
    from mpi4py import MPI
    reqs, land = [], []
    for kind, c, ptr, n, dt, peer in _GROUP:
        if kind == "recv":
            tmp = np.empty(n, dt)
            reqs.append(c.mpi.Irecv(tmp, source=peer, tag=11))
            land.append((ptr, n, dt, tmp))
        else:
            reqs.append(c.mpi.Isend(np.array(_at(ptr, n, dt)), dest=peer, tag=11))
    MPI.Request.Waitall(reqs)
    for ptr, n, dt, tmp in land:
        _at(ptr, n, dt)[...] = tmp
    _STATE["nccl_calls"] += len(_GROUP)
    _GROUP.clear()


nccl = types.ModuleType("cupy.cuda.nccl")
nccl.available = True
nccl.NCCL_FLOAT64, nccl.NCCL_FLOAT32, nccl.NCCL_INT64, nccl.NCCL_INT32, nccl.NCCL_UINT8 = 7, 6, 4, 2, 1
nccl.NCCL_SUM = 0
nccl.NcclCommunicator = _NcclCommunicator
nccl.get_unique_id = lambda: tuple(range(128))
nccl.groupStart = _group_start
nccl.groupEnd = _group_end


def install(devices=1, with_nccl=False, mesh=False):
    """Route ``adaptmg.backend``'s CuPy look-up to this module (this process only).  The
    Krylov solve, :func:`adaptmg.linalg.cg` on "device" vectors, launches its fused updates
    through :class:`ElementwiseKernel` (NumPy twins).  ``mesh``: also ``import cupy`` /
    ``import cupyx`` (its ``scatter_*`` by ``ufunc.at``, its sparse module this one's) for a
    mesh on the stand-in device, and no CUDA graphs in the serial solver."""
    import sys

    import adaptmg.backend as B
    B._cupy_status = lambda: (xp, csp, "")
    _STATE["count"] = int(devices)
    if mesh:
        import scipy.sparse.linalg as ssl
        from adaptmg.multilevel.solver import MultilevelSolver
        cx = types.ModuleType("cupyx")
        for name, uf in (("scatter_add", np.add), ("scatter_max", np.maximum), ("scatter_min", np.minimum)):
            setattr(cx, name, lambda out, idx, vals, uf=uf: uf.at(out.view(np.ndarray), idx, vals))
        cx.scipy = types.ModuleType("cupyx.scipy")
        cx.scipy.sparse = csp
        sys.modules.update({"cupy": xp, "cupyx": cx, "cupyx.scipy": cx.scipy, "cupyx.scipy.sparse": csp,
                            "cupyx.scipy.sparse.linalg": ssl})
        MultilevelSolver._capturable = lambda self: False
        xp.cuda.runtime.getDevice = lambda: _STATE["device"] or 0
    if with_nccl:       # ``from cupy.cuda import nccl`` finds the stand-in (this process only)
        from mpi4py import MPI        # collective: every rank installs at the same point
        _STATE["world"] = MPI.COMM_WORLD.Dup()      # the stand-in communicators' (shared)
        top, sub = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
        top.cuda, sub.nccl = sub, nccl
        # with ``mesh`` "cupy" stays this module (the device mesh imports it)
        sys.modules.update({**({} if mesh else {"cupy": top}), "cupy.cuda": sub, "cupy.cuda.nccl": nccl})
    return xp


def pinned_allocations():
    return _STATE["pinned"]


def nccl_calls():
    return _STATE["nccl_calls"]


def stream_waits():
    return _STATE["stream_waits"]


def device_to_host_values():
    """Entries (array elements, sparse nonzeros) copied by ``get`` so far."""
    return _STATE["get_values"]


def device_to_host():
    """Device -> host copies (``get``) of stand-in device arrays so far."""
    return _STATE["gets"]


def nccl_allreduces():
    return _STATE["nccl_allreduces"]


def selected_device():
    return _STATE["device"]
