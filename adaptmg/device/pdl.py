"""Programmatic dependent launch (PDL) of the kernels recorded in a CUDA graph.

In a graph, a kernel that depends on the previous one normally starts only after
that one has finished and its writes are flushed; at small sizes this gap is a
large part of a multigrid cycle (a CUDA-graph CG iteration at 66,049 DoFs is 15
dependent kernels, ~66 us on an H100).  On Hopper and later, a kernel launched with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may be scheduled while its
predecessor still runs; its threads run until ``griddepcontrol.wait``, which returns
once the predecessor grid has completed and its memory is visible.  So the launch
and whatever a kernel does before that wait -- loads of data no kernel of the graph
writes, such as the CSR structure and diagonals -- overlap the predecessor's tail.

Contract of a kernel launched this way: every thread executes ``ADAPTMG_GRID_WAIT()``
before it reads memory that an earlier kernel writes and before it writes anything
(``tests/device/test_pdl.py`` reads it off the sources of adaptmg's kernels).  Then the
ordering is transitive (a grid completes only after its own wait returned), and a
kernel launched normally after it waits as usual.  Without the attribute (eager
launches, older GPUs) the wait is a no-op.

:func:`module` compiles CUDA source into a module whose kernels all obey the contract:
it inserts ``ADAPTMG_GRID_WAIT();`` at the top of every ``__global__`` function that
does not call it itself (a kernel that calls it later does so deliberately, after its
prologue loads).  Its kernels launch with PDL only while :func:`capturing` is active
(``adaptmg.device.cudagraph.capture`` sets it for the recorded run; the eager reference
run it is checked against launches normally), on a device of compute capability >= 9.0,
unless ``ADAPTMG_PDL=0``.  Arguments other than device arrays and NumPy scalars, or a
driver without ``cuLaunchKernelEx``, fall back to the normal launch, which is always
correct.

Measured on an H100 (device time of one CUDA-graph CG iteration, Q1 Poisson, the
"graph" column of ``scripts/bench_solve_latency.py``; two interleaved runs each of the
code before and after, one machine): 2-D 16,641 DoFs 38 -> 34 us, 66,049 DoFs 68 -> 61
us, 3-D 35,937 DoFs 59-61 -> 57 us; at 1.05M (2-D) and 2.15M (3-D) DoFs the cycle
is unchanged within 3 %.  (Reading the first entry of each row before the wait too
gained nothing more at these sizes and cost 3-5 % at 1.05M DoFs in 2-D.)

Why one kernel per step rather than one persistent kernel for the small levels:
``scripts/bench_launch_chain.py`` chains 14 dependent SpMV phases both ways on the same
data; on an H100 a phase costs 2.0-2.3 us (961-16k rows) and 3.0 us (65k rows) as a graph
kernel launched with PDL, against 3.6-4.0 and 4.5-5.6 us between the software grid barriers
of one persistent kernel (1.5-1.9x).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading

import numpy as np

__all__ = ["module", "capturing", "enabled", "kernels", "with_grid_wait", "PDLUnavailable",
           "GRID_WAIT_SOURCE"]

GRID_WAIT_SOURCE = r"""
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define ADAPTMG_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define ADAPTMG_GRID_WAIT() do { } while (0)
#endif
"""

_KERNEL_HEAD = re.compile(r'extern\s+"C"\s+__global__\s+void[^{;]*\{')

# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6

_state = threading.local()
_lock = threading.Lock()
_driver = {}          # "fn": the driver's cuLaunchKernelEx, or None
_usable = {}          # device id -> PDL used on it


class PDLUnavailable(RuntimeError):
    """The driver refused a programmatic launch; PDL is off for the rest of the process
    (:func:`adaptmg.device.cudagraph.capture` then records the graph again without it)."""


def kernels(src: str):
    """``(head, start, end)`` of every ``extern "C" __global__`` function of ``src``: its
    head up to the opening brace and the span ``src[start:end]`` of its body (from after
    that brace to before the matching closing one)."""
    for m in _KERNEL_HEAD.finditer(src):
        depth, j = 1, m.end()
        while depth and j < len(src):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        yield m.group(0), m.end(), j - 1


def with_grid_wait(src: str) -> str:
    """``src`` with the wait macro defined and called first in every kernel that does not
    call it itself."""
    out, pos = [], 0
    for _, start, end in kernels(src):
        out.append(src[pos:start])
        if "ADAPTMG_GRID_WAIT()" not in src[start:end]:
            out.append("\n    ADAPTMG_GRID_WAIT();")
        pos = start
    out.append(src[pos:])
    return GRID_WAIT_SOURCE + "".join(out)


@contextlib.contextmanager
def capturing():
    """Launch the kernels of :func:`module` with PDL inside this block (this thread)."""
    old = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = old


def _cu_launch_kernel_ex():
    with _lock:
        if "fn" not in _driver:
            fn = None
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                fn = lib.cuLaunchKernelEx
                fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):   # pragma: no cover - no driver / too old
                fn = None
            _driver["fn"] = fn
        return _driver["fn"]


def enabled(cp) -> bool:
    """PDL is used on the current device: compute capability >= 9.0, a driver with
    ``cuLaunchKernelEx`` and ``ADAPTMG_PDL`` not "0"."""
    if os.environ.get("ADAPTMG_PDL", "1") == "0":
        return False
    dev = cp.cuda.Device().id
    ok = _usable.get(dev)
    if ok is None:
        cc = int(cp.cuda.Device().compute_capability)
        ok = _usable[dev] = cc >= 90 and _cu_launch_kernel_ex() is not None
    return ok


class _Value(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int), ("p", ctypes.c_void_p)]


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _Value)]


class _Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("nattrs", ctypes.c_uint)]


_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def _marshal(cp, args):
    """ctypes values of the kernel arguments, or None if one is not a device array or a
    NumPy scalar of a known type (the caller then launches normally)."""
    vals = []
    for a in args:
        if isinstance(a, cp.ndarray):
            vals.append(ctypes.c_void_p(a.data.ptr))
        elif isinstance(a, np.generic) and a.dtype in _CTYPES:
            vals.append(_CTYPES[a.dtype](a.item()))
        else:
            return None
    return vals


def _dims(d):
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


class _Kernel:
    """A kernel of :func:`module`: called like a CuPy RawKernel (``k(grid, block, args,
    shared_mem=0)``); launched with PDL while :func:`capturing` is on."""

    def __init__(self, cp, raw):
        self.cp, self.raw = cp, raw

    def __call__(self, grid, block, args, shared_mem=0):
        cp = self.cp
        if getattr(_state, "on", False) and enabled(cp):
            vals = _marshal(cp, args)
            if vals is not None:
                params = (ctypes.c_void_p * max(len(vals), 1))(
                    *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
                attr = _Attribute()
                attr.id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.i = 1
                cfg = _Config(*_dims(grid), *_dims(block), int(shared_mem),
                              cp.cuda.get_current_stream().ptr, ctypes.pointer(attr), 1)
                rc = _cu_launch_kernel_ex()(ctypes.byref(cfg), self.raw.kernel.ptr, params, None)
                if rc != 0:       # not supported here: never again in this process
                    _usable[cp.cuda.Device().id] = False
                    raise PDLUnavailable(f"cuLaunchKernelEx with programmatic stream "
                                         f"serialization failed (CUresult {rc})")
                return
        self.raw(grid, block, args, shared_mem=shared_mem)


class _Module:
    def __init__(self, cp, src, **kw):
        self.cp = cp
        self.raw = cp.RawModule(code=with_grid_wait(src), **kw)
        self._kernels = {}

    def get_function(self, name):
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = _Kernel(self.cp, self.raw.get_function(name))
        return k


def module(cp, src, **kw):
    """``cupy.RawModule(code=src)`` whose kernels wait for their predecessor grid first and
    launch with PDL inside :func:`capturing` (see the module docstring)."""
    return _Module(cp, src, **kw)
