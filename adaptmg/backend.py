"""Array backends: NumPy/SciPy on the host, CuPy/cupyx on an NVIDIA GPU.

This is the only module of adaptmg that imports :mod:`cupy`.  Everything else
is written once against a :class:`Backend`, which bundles the array module
``xp`` (``numpy`` or ``cupy``), the sparse module ``sparse``
(``scipy.sparse`` or ``cupyx.scipy.sparse``) and helpers to move data.

``get_backend("auto")`` picks the GPU only when CuPy imports *and* sees at
least one CUDA device; ``get_backend("gpu")`` raises :class:`RuntimeError`
with the reason when that is not the case.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["Backend", "get_backend", "gpu_available", "backend_of", "is_device_array",
           "is_device_sparse", "is_device_linear_operator", "is_device_error", "is_sparse",
           "to_device", "to_host", "host_copies", "call_points", "stable_argsort", "CPU", "nccl_module",
           "scatter_max", "scatter_min", "scatter_add", "repeat", "segment_index", "segment_owner", "unique_first",
           "in_host_memory", "csr_from_arrays"]


@dataclass(frozen=True)
class Backend:
    """A pair (array module, sparse module) plus a name ("cpu" or "gpu")."""

    name: str
    xp: Any
    sparse: Any

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    def asarray(self, a, dtype=None):
        """Move/convert ``a`` onto this backend (no copy when already there)."""
        if self.is_gpu:
            return _upload(self.xp, a, dtype=dtype)
        return np.asarray(to_host(a), dtype=dtype)

    def asmatrix(self, A, dtype=None):
        """Move a sparse matrix onto this backend as CSR."""
        if self.is_gpu:
            return to_device_sparse(A, dtype=dtype)
        A = to_host(A)
        A = sp.csr_matrix(A) if not sp.issparse(A) else A.tocsr()
        return A.astype(dtype) if dtype is not None and A.dtype != dtype else A

    @property
    def linalg(self):
        """``scipy.sparse.linalg`` on the CPU, ``cupyx.scipy.sparse.linalg`` on the GPU."""
        if self.is_gpu:
            import cupyx.scipy.sparse.linalg as sla
            return sla
        import scipy.sparse.linalg as sla
        return sla

    def synchronize(self) -> None:
        if self.is_gpu:
            self.xp.cuda.Device().synchronize()

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


CPU = Backend("cpu", np, sp)


@functools.lru_cache(maxsize=None)
def _cupy_status() -> tuple[Any, Any, str]:
    """Return (cupy, cupyx.scipy.sparse, reason); modules are None if unusable."""
    try:
        import cupy  # noqa: F401
        import cupyx.scipy.sparse as csp
    except (ImportError, OSError, RuntimeError) as exc:  # not installed, or a broken CUDA install
        return None, None, f"CuPy could not be imported ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except RuntimeError as exc:   # cupy.cuda.runtime.CUDARuntimeError: no driver / no device
        return None, None, f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return None, None, "CuPy sees no CUDA device (device count 0)"
    # adaptmg's own kernel cache under CuPy's (compiled kernels found again in a process
    # whose CuPy cache is empty; see adaptmg.device.kernel_cache), the cubins the package
    # ships under both (adaptmg.device.kernel_bundle)
    import cupy.cuda.compiler as compiler
    from .device import kernel_bundle
    from .device.kernel_cache import install
    from .device.kernel_manifest import start_once
    install(compiler)
    kernel_bundle.install(compiler)
    start_once()       # a machine's first run: what the bundle lacks compiled ahead, in parallel processes
    return cupy, csp, ""


def gpu_available() -> bool:
    """True when CuPy imports and at least one CUDA device is visible."""
    return _cupy_status()[0] is not None


def get_backend(name: "str | Backend" = "auto") -> Backend:
    """Return the backend called ``name``: "auto", "cpu" or "gpu".

    "auto" gives the GPU when :func:`gpu_available`, else the CPU.
    A :class:`Backend` instance is returned unchanged.
    """
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str):
        raise TypeError(f"backend must be 'auto', 'cpu', 'gpu' or a Backend, got {type(name).__name__}")
    key = name.lower()
    if key == "cpu":
        return CPU
    if key in ("gpu", "cuda", "auto"):
        cupy, csp, reason = _cupy_status()
        if cupy is None:
            if key == "auto":
                return CPU
            raise RuntimeError(f"backend='gpu' requested but {reason}. "
                               "Install the 'gpu' extra (pip install adaptmg[gpu]) on a machine "
                               "with an NVIDIA GPU, or use backend='cpu'.")
        return Backend("gpu", cupy, csp)
    raise ValueError(f"backend must be 'auto', 'cpu' or 'gpu', got {name!r}")


def _module_of(a) -> str:
    """The module that defines the type of ``a`` ("" when the type names none)."""
    return getattr(type(a), "__module__", "") or ""


def _is_cupy_array(a) -> bool:
    return _module_of(a).startswith("cupy")


def _is_cupy_sparse(a) -> bool:
    return _module_of(a).startswith("cupyx.scipy.sparse")


def is_device_array(a) -> bool:
    """True for a CuPy array or cupyx sparse matrix (tested without importing CuPy)."""
    return a is not None and _is_cupy_array(a)


def in_host_memory(a) -> bool:
    """True for an array NumPy code runs on: a NumPy array, also the tests' NumPy-subclass
    stand-ins for CuPy arrays (``tests/mesh/strict_cupy.py``).  The dispatch of a custom
    kernel and its NumPy twin (:mod:`adaptmg.device`): the kernel for device memory, the twin
    here."""
    return isinstance(a, np.ndarray)


def is_device_sparse(a) -> bool:
    """True for a cupyx.scipy.sparse matrix."""
    return a is not None and _is_cupy_sparse(a)


def is_device_linear_operator(a) -> bool:
    """True for an object of ``cupyx.scipy.sparse.linalg`` (a cupyx ``LinearOperator``)."""
    return a is not None and _module_of(a).startswith("cupyx.scipy.sparse.linalg")


def is_device_error(exc: BaseException) -> bool:
    """True for an exception raised by CuPy (its class defined in ``cupy``, ``cupyx`` or
    ``cupy_backends``: out-of-memory, CUDA runtime, cuSPARSE/cuBLAS errors)."""
    return _module_of(exc).startswith("cupy")


def is_sparse(a) -> bool:
    """True for a SciPy or a cupyx sparse matrix."""
    return sp.issparse(a) or _is_cupy_sparse(a)


def backend_of(*arrays) -> Backend:
    """The backend that holds ``arrays`` (GPU if any of them is a CuPy object)."""
    for a in arrays:
        if a is not None and (_is_cupy_array(a) or _is_cupy_sparse(a)):
            return get_backend("gpu")
    return CPU


#: device -> host copies made by :func:`to_host` in this process (:func:`host_copies`)
_HOST_COPIES = [0]


def to_host(a):
    """Return ``a`` as a NumPy array / SciPy sparse matrix (no copy on the host).

    A device object is copied (one synchronisation of the current stream) and counted in
    :func:`host_copies`."""
    if a is None:
        return None
    if _is_cupy_sparse(a) or _is_cupy_array(a):
        _HOST_COPIES[0] += 1
        return a.get()
    return a


def host_copies() -> int:
    """How many device -> host copies :func:`to_host` made so far in this process (read it
    before and after a solve to count its host synchronisations; the Krylov solvers bring
    their scalars and norms to the host through :func:`to_host`)."""
    return _HOST_COPIES[0]


# user callables that raised TypeError on device arrays: evaluated on the host from then on
_HOST_ONLY: "weakref.WeakSet" = weakref.WeakSet()


def stable_argsort(a):
    """Indices that sort the 1-D array ``a`` stably (equal keys keep their order): NumPy's
    ``kind="stable"`` on the host, CuPy's argsort (a stable radix sort, its only kind) on the
    device."""
    return a.argsort() if _is_cupy_array(a) else np.argsort(a, kind="stable")


_UFUNC = {"add": "add", "max": "maximum", "min": "minimum"}


def _scatter(name, out, idx, vals):
    if _is_cupy_array(out):
        cupy = _cupy_status()[0]             # the module the device arrays come from
        at = getattr(getattr(cupy, _UFUNC[name], None), "at", None)
        if at is not None:                   # CuPy 14 deprecates cupyx.scatter_* for ufunc.at
            at(out, idx, vals)
        else:
            import cupyx
            getattr(cupyx, f"scatter_{name}")(out, idx, vals)
    else:
        getattr(np, _UFUNC[name]).at(out, idx, vals)
    return out


def scatter_max(out, idx, vals):
    """``out[idx[k]] = max(out[idx[k]], vals[k])`` for every k, repeated indices included
    (``np.maximum.at`` / ``cupy.maximum.at``, ``cupyx.scatter_max`` on older CuPy: a plain
    ``out[idx] = vals`` keeps an unspecified one of the repeated writes on the device);
    ``out`` returned."""
    return _scatter("max", out, idx, vals)


def scatter_min(out, idx, vals):
    """``out[idx[k]] = min(out[idx[k]], vals[k])`` for every k (see :func:`scatter_max`)."""
    return _scatter("min", out, idx, vals)


def scatter_add(out, idx, vals):
    """``out[idx[k]] += vals[k]`` for every k, repeated indices summed (see
    :func:`scatter_max`)."""
    return _scatter("add", out, idx, vals)


def unique_first(a):
    """``np.unique(a, return_index=True, return_inverse=True)`` of a 1-D array of either
    module: the sorted distinct values, the index of each one's *first* occurrence and the
    inverse.  CuPy's ``unique`` does not promise the first occurrence's index (its sort need
    not keep equal keys in order): there the index is a ``scatter_min`` of the positions."""
    if not _is_cupy_array(a):
        return np.unique(a, return_index=True, return_inverse=True)
    import cupy
    u, inv = cupy.unique(a, return_inverse=True)
    inv = inv.ravel()
    first = scatter_min(cupy.full(u.size, a.size, dtype=np.int64), inv, cupy.arange(a.size, dtype=np.int64))
    return u, first, inv


def segment_index(xp, counts, total):
    """``repeat(arange(m), counts)`` (``total = sum(counts)`` entries) with whole-array
    operations that CuPy has (its ``repeat`` takes no array of repeats): with the inclusive
    running sum ``e = cumsum(counts)`` (segment i covers ``[e_i - counts_i, e_i)``), entry p
    belongs to the first segment with ``e_i > p``, ``searchsorted(e, p, side="right")``;
    empty segments (``e_i = e_{i-1}``) are skipped by it.  Three launches (a scan, an arange
    and a binary search), no ``nonzero`` and so no synchronising read of its size."""
    ends = xp.cumsum(counts)
    if int(total) == 0:             # no entries (CuPy's searchsorted refuses an empty ``ends``)
        return xp.zeros(0, dtype=ends.dtype)
    return xp.searchsorted(ends, xp.arange(int(total), dtype=ends.dtype), side="right")


def repeat(a, counts, total=None, xp=None):
    """``np.repeat(a, counts)`` for a 1-D ``a`` and integer ``counts`` of its array module
    ``xp`` (default: CuPy for a CuPy ``a``, else NumPy): on the device :func:`segment_index`
    (CuPy's ``repeat`` takes no device array of counts); ``total``, the sum of ``counts`` if
    known, saves reading it back from the device."""
    if xp is None:
        if not _is_cupy_array(a):
            return np.repeat(a, counts)
        import cupy as xp
    elif xp is np:
        return np.repeat(a, counts)
    return a[segment_index(xp, counts, int(counts.sum()) if total is None else int(total))]


def segment_owner(counts, total=None, xp=None):
    """The segment of each of the ``total = sum(counts)`` entries of consecutive segments of
    lengths ``counts`` (int64: ``repeat(arange(len(counts)), counts)``, :func:`repeat`), on the
    array module ``xp`` (default: that of ``counts``)."""
    xp = backend_of(counts).xp if xp is None else xp
    return repeat(xp.arange(counts.shape[0], dtype=xp.int64), counts, total, xp=xp)


# small host constants already on a device: (module, device, dtype, shape, bytes) -> array
_CONSTANTS: dict = {}
CONSTANT_MAX_ENTRIES = 1 << 16


def constant(a, xp, dtype=None):
    """``xp.asarray(a, dtype)`` for a small host constant ``a`` (a reference table, quadrature
    weights, corner bits; at most :data:`CONSTANT_MAX_ENTRIES` entries): on the device made
    once per content and device and then shared -- every copy from pageable host memory is a
    synchronising transfer, and the set-up and estimators ask for the same tables on every
    level and step.  READ-ONLY: never write into the result.  On the host ``np.asarray``."""
    if xp is np or not _is_cupy_module(xp):
        return np.asarray(a, dtype=dtype)
    h = np.ascontiguousarray(a, dtype=dtype)
    if h.size > CONSTANT_MAX_ENTRIES:
        return xp.asarray(h)
    runtime = getattr(xp.cuda, "runtime", None)
    dev = runtime.getDevice() if hasattr(runtime, "getDevice") else 0
    key = (id(xp), dev, h.dtype.str, h.shape, h.tobytes())
    hit = _CONSTANTS.get(key)
    if hit is None:
        if len(_CONSTANTS) > 512:
            _CONSTANTS.clear()
        hit = _CONSTANTS[key] = xp.asarray(h)
    return hit


def _is_cupy_module(xp) -> bool:
    return getattr(xp, "__name__", "").startswith("cupy")


def call_points(fn, *args, xp=np, dtype=float):
    """``fn(*args)`` (a user callable of point arrays) as a float array of the array module ``xp``
    (of ``dtype``; None: the dtype ``fn`` returns, e.g. a predicate's bool).

    With ``xp = numpy`` this is ``np.asarray(fn(*args), dtype=dtype)``.  On the device the
    arguments are CuPy arrays (NumPy ufuncs and most NumPy functions dispatch to CuPy); if
    ``fn`` raises :class:`TypeError` on them, e.g. because it converts them with
    ``np.asarray`` or writes them into a NumPy array, it is called again with host copies
    (:func:`to_host`) and the result is copied to the device.  Such a callable is remembered
    and then called on the host directly (a copy both ways per call: write ``xp``-generic
    callables for speed)."""
    if xp is np:
        return np.asarray(fn(*args), dtype=dtype)
    if not _host_only(fn):
        try:
            return xp.asarray(fn(*args), dtype=dtype)
        except TypeError:
            try:
                _HOST_ONLY.add(fn)
            except TypeError:                  # not weak-referenceable: retried next time
                pass
    return xp.asarray(np.asarray(fn(*(to_host(a) for a in args)), dtype=dtype))


def _host_only(fn):
    try:
        return fn in _HOST_ONLY
    except TypeError:
        return False


# host arrays at least this large are page-locked for the copy (see _upload)
PIN_MIN_BYTES = 8 << 20


def _upload(cupy, a, dtype=None):
    """Copy a NumPy array to a new CuPy array.

    A plain copy from pageable memory goes through the driver's staging buffers:
    measured on the H100 host, 2--7 GB/s.  Large contiguous arrays are instead
    page-locked in place for the copy (``cudaHostRegister``, one DMA, unregister):
    75 MB in 5.8 ms instead of 38 ms.  Where registering fails (e.g. the pages
    are already registered) the plain copy is used.
    """
    if _is_cupy_array(a):
        return cupy.asarray(a, dtype=dtype)
    a = np.asarray(a, dtype=dtype)
    if a.nbytes < PIN_MIN_BYTES or not a.flags.c_contiguous:
        return cupy.asarray(a)
    out = cupy.empty(a.shape, dtype=a.dtype)
    rt = cupy.cuda.runtime
    ptr = a.ctypes.data
    try:
        rt.hostRegister(ptr, a.nbytes, 0)
    except rt.CUDARuntimeError:
        out.set(a)
        return out
    try:
        # on the current stream (where ``out`` was allocated), then wait: the pages must
        # stay locked until the copy is done
        stream = cupy.cuda.get_current_stream()
        rt.memcpyAsync(out.data.ptr, ptr, a.nbytes, rt.memcpyHostToDevice, stream.ptr)
        stream.synchronize()
    finally:
        rt.hostUnregister(ptr)
    return out


def nccl_module():
    """CuPy's NCCL bindings (``cupy.cuda.nccl``), or None where they cannot be imported or
    report themselves unavailable (CuPy without NCCL).  The distributed layer's device halo
    transport goes through this, so that CuPy stays imported here only."""
    try:
        from cupy.cuda import nccl
    except Exception:                 # ImportError, or a CUDA/NCCL library that fails to load
        return None
    if not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        return None
    return nccl


_INT32_MAX = np.iinfo(np.int32).max


def csr_from_arrays(sparse, data, indices, indptr, shape):
    """The CSR matrix ``(data, indices, indptr)`` of ``shape`` in the sparse module ``sparse``
    (``scipy.sparse``, ``cupyx.scipy.sparse`` or a stand-in: a backend's ``.sparse``), the
    arrays used as they are where their index dtype is kept.

    On the GPU without the constructor's read-back: cupyx's tuple constructor (CuPy 14) reads
    the index arrays' range to choose their dtype, a synchronisation -- on an H200 the host
    waited 80 ms there for a queued assembly instead of queueing the next level's set-up
    beside it.  Here the dtype is chosen as that constructor chooses it for valid arrays
    (indices below ``shape[1]``, ``indptr`` at most the entry count): int32 where the
    shape and the entry count fit, else int64; the arrays are cast (asynchronously) only
    where their dtype differs.  Where cupyx has no ``_from_parts`` (before CuPy 14.2), or
    on the host, the constructor (its checks and errors)."""
    make = getattr(sparse.csr_matrix, "_from_parts", None)
    if (make is None or not _is_cupy_array(data) or data.ndim != 1 or indices.ndim != 1 or indptr.ndim != 1
            or data.shape[0] != indices.shape[0] or indptr.shape[0] != int(shape[0]) + 1
            or data.dtype.char not in "?fdFD"):
        return sparse.csr_matrix((data, indices, indptr), shape=shape)
    it = np.int32 if max(int(shape[0]), int(shape[1]), data.shape[0]) <= _INT32_MAX else np.int64
    return make(data, indices.astype(it, copy=False), indptr.astype(it, copy=False), (int(shape[0]), int(shape[1])))


def to_device_sparse(A, dtype=None):
    cupy, csp, reason = _cupy_status()
    if cupy is None:
        raise RuntimeError(f"cannot move a matrix to the GPU: {reason}")
    if _is_cupy_sparse(A):
        A = A.tocsr()
        return A.astype(dtype) if dtype is not None and A.dtype != dtype else A
    A = sp.csr_matrix(A) if not sp.issparse(A) else A.tocsr()
    if dtype is not None:
        A = A.astype(dtype, copy=False)    # the upload copies anyway: no host copy of same-dtype data
    if not A.has_sorted_indices:
        A = A.sorted_indices()
    idx = A.indices.dtype
    return csr_from_arrays(csp, _upload(cupy, A.data), _upload(cupy, A.indices),
                           _upload(cupy, A.indptr.astype(idx, copy=False)), A.shape)


def to_device(a, dtype=None):
    """Move a NumPy array or SciPy sparse matrix to the GPU."""
    cupy, _, reason = _cupy_status()
    if cupy is None:
        raise RuntimeError(f"cannot move data to the GPU: {reason}")
    if sp.issparse(a) or _is_cupy_sparse(a):
        return to_device_sparse(a, dtype=dtype)
    return _upload(cupy, a, dtype=dtype)
