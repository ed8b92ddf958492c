r"""Count the device -> host reads of a block of code (Python 3.12+, any thread).

The GPU set-up is meant to keep its O(cells) data on the device: the host runs O(levels)
Python and reads back only scalars (sizes, norms, flags).  :class:`HostReads` measures
that.  While the block runs, every Python-level call in the process -- all threads --
is seen through :mod:`sys.monitoring` (``CALL`` events carry the callable and its first
argument, also for calls into CuPy's compiled Cython methods, which cannot be patched);
the calls that copy device data to the host are recorded with their bytes and call site:

* the methods ``get``, ``item``, ``tolist``, ``__int__``, ``__float__``, ``__complex__``,
  ``__bool__``, ``__index__``, ``__array__``, ``__repr__``, ``__str__``, ``__format__``,
  ``__bytes__``, ``__reduce__`` of a device array (called as ``x.get()``, as
  ``f = x.get; f()`` or as ``cupy.ndarray.get(x)``): ``x.nbytes`` (``item``: one element);
* ``int(x)``, ``float(x)``, ``complex(x)``, ``str(x)``, ``repr(x)``, ``format(x)`` of a
  device array ``x``: ``x.nbytes`` (CuPy copies the whole array, then converts);
  ``bool(x)``: one element, and only for a one-element array (CuPy raises for more without
  copying); ``operator.index(x)``: ``x.nbytes``, and only for an array type that has an
  ``__index__`` (CuPy's has none: the ``TypeError`` copies nothing -- cupyx's ``isintlike``
  probes every array handed to a sparse constructor this way);
* NumPy conversions ``numpy.asarray / array / asanyarray / ascontiguousarray /
  asfortranarray (x)`` of a device array (CuPy refuses them with a ``TypeError``; the
  attempt is counted all the same: a caught one usually means a host fallback follows);
* ``runtime.memcpy``, ``memcpyAsync``, ``memcpy2D``, ``memcpy2DAsync`` of the backend
  (``cupy.cuda.runtime``) with kind device-to-host, or default kind into host memory:
  the bytes copied (these four are wrapped for the block, so they are seen where they are
  looked up at call time, ``rt.memcpyAsync(...)``).

Wrappers written in Python are not counted themselves -- what they call is:
``cupy.asnumpy(x)`` is its ``x.get()``, ``cupyx`` sparse ``A.get()`` the ``get`` of its
three arrays, adaptmg's ``to_host`` the ``get`` inside it.

What it cannot see (documented limits; all but the last are scalar reads):

* conversions the interpreter or C code makes implicitly, without a call instruction:
  ``if x:`` / ``while x`` / ``x and y`` (``__bool__``), ``range(x)``, ``a[x]`` or
  ``a[:x]`` with a device scalar ``x`` (``__index__``), f-strings and ``%`` formatting,
  ``print(x)``, ``math.floor(x)``, ``map(int, x)``;
* arguments after the first: only a call's first argument is visible, so
  ``numpy.asarray(a=x)`` (keyword) is missed;
* copies made inside compiled code: CuPy's own Cython reading a count to the host
  (``cupy.nonzero``, boolean-mask indexing, ``cupy.unique``'s sizes), cuSPARSE / cuSOLVER
  reading back an ``nnz`` or an ``info``, ``MemoryPointer.copy_to_host(_async)`` (its size
  is its second argument), a memcpy imported by name before the block
  (``from cupy.cuda.runtime import memcpy``).

So the count is a lower bound of the bytes read: exact for the forms above, blind to
O(1) scalar reads hidden in compiled code.  An O(cells) read through any listed form is
seen, which is what a test of the set-up needs.

``xp`` (default: the GPU backend's ``cupy``) may be a stand-in module with an ``ndarray``
type (and optionally ``cuda.runtime``): the CPU tests count the calls of a fake array
type that way.
"""
from __future__ import annotations

import operator
import sys
import threading
import types
from collections import defaultdict

import numpy as np

__all__ = ["HostReads", "count_host_reads", "available"]

#: device array methods that copy to the host; the value: bytes of one call (None: nbytes)
_METHODS = {"get": None, "item": "itemsize", "tolist": None, "__int__": None, "__float__": None,
            "__complex__": None, "__bool__": None, "__index__": None, "__array__": None,
            "__repr__": None, "__str__": None, "__format__": None, "__bytes__": None,
            "__reduce__": None}
#: builtins that convert their first argument
_BUILTINS = (int, float, complex, bool, operator.index, str, repr, format)
#: builtins that copy only in some cases: ``bool(x)`` one element of a one-element array
#: (CuPy raises for more without a copy), ``operator.index(x)`` only for a type with an
#: ``__index__`` (CuPy's ndarray has none: TypeError, no copy -- SciPy-style ``isintlike``
#: probes call it on whole arrays)
_BUILTIN_UNITS = {bool: "scalar", operator.index: "index"}
#: NumPy's conversions (C functions; one written in Python is not counted, its inner call is)
_NUMPY = ("asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray")
#: runtime copies: name -> (position of ``kind``, positions of the sizes whose product is the bytes)
_MEMCPY = {"memcpy": (3, (2,)), "memcpyAsync": (3, (2,)),
           "memcpy2D": (6, (4, 5)), "memcpy2DAsync": (6, (4, 5))}
_BOUND = (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)


def available() -> bool:
    """True where :mod:`sys.monitoring` exists (Python 3.12+)."""
    return hasattr(sys, "monitoring")


def _default_xp():
    from ..backend import get_backend
    return get_backend("gpu").xp


def _array_base(xp):
    """The class of ``xp.ndarray``'s hierarchy that defines ``get`` (CuPy: ``_ndarray_base``)."""
    T = getattr(xp, "ndarray", None)
    if not isinstance(T, type):
        raise TypeError(f"HostReads: xp must have an ndarray type, got {type(xp).__name__}")
    for c in T.__mro__:
        if "get" in vars(c):
            return c
    raise TypeError(f"HostReads: {T.__name__} has no get() method: not a device array type")


class HostReads:
    """Device -> host reads during a ``with`` block (see the module docstring).

    Attributes after (and during) the block: ``calls``, ``bytes``, ``records`` (a list of
    ``(kind, bytes, code, offset)``); :meth:`sites` groups them by call site, :meth:`report`
    prints the largest.  One instance counts one block at a time; blocks may nest (each
    takes its own monitoring tool id)."""

    def __init__(self, xp=None):
        self.xp = _default_xp() if xp is None else xp
        self.base = _array_base(self.xp)
        self.records = []
        self._tool = None
        self._saved = {}
        routes = {}
        self._keep = []                                  # the routed objects, alive (ids stay valid)

        def route(obj, kind, unit):
            if obj is not None:
                routes[id(obj)] = (kind, unit)
                self._keep.append(obj)
        for name, unit in _METHODS.items():
            route(getattr(self.base, name, None), name, unit)
        for f in _BUILTINS:
            route(f, getattr(f, "__name__", str(f)), _BUILTIN_UNITS.get(f))
        for name in _NUMPY:
            f = getattr(np, name, None)
            if f is not None and not hasattr(f, "__code__"):
                route(f, f"numpy.{name}", None)
        self._routes = routes
        self._lock = threading.Lock()

    # -------------------------------------------------------------- the block
    def __enter__(self):
        if not available():
            raise RuntimeError("HostReads needs sys.monitoring (Python 3.12+); this is Python "
                               f"{sys.version.split()[0]}")
        if self._tool is not None:
            raise RuntimeError("HostReads: this counter is already counting a block")
        mon = sys.monitoring
        for tool in (4, 3, 2, 1, 0, 5):
            if mon.get_tool(tool) is None:
                break
        else:
            raise RuntimeError("HostReads: all sys.monitoring tool ids are in use")
        mon.use_tool_id(tool, "adaptmg.device.host_reads")
        self._tool = tool
        mon.register_callback(tool, mon.events.CALL, self._on_call)
        self._wrap_memcpy()
        mon.set_events(tool, mon.events.CALL)
        return self

    def __exit__(self, *exc):
        mon = sys.monitoring
        mon.set_events(self._tool, 0)
        mon.register_callback(self._tool, mon.events.CALL, None)
        mon.free_tool_id(self._tool)
        self._tool = None
        self._unwrap_memcpy()
        return False

    # -------------------------------------------------------------- counting
    def _on_call(self, code, offset, fn, arg0):
        """sys.monitoring CALL callback: record ``fn(arg0, ...)`` when it reads device data."""
        r = self._routes.get(id(fn))
        if r is not None:                                # unbound method, builtin, numpy
            if isinstance(arg0, self.base):
                self._add(r, arg0, code, offset)
            return
        if type(fn) in _BOUND:                           # x.get bound first, then called
            recv = fn.__self__
            if isinstance(recv, self.base):
                unit = _METHODS.get(getattr(fn, "__name__", ""), False)
                if unit is not False:
                    self._add((fn.__name__, unit), recv, code, offset)

    def _add(self, route, x, code, offset):
        kind, unit = route
        if unit == "scalar" and x.size != 1:
            return                                       # raises before any copy
        if unit == "index" and getattr(type(x), "__index__", None) is None:
            return                                       # TypeError, nothing copied
        n = int(x.itemsize if unit in ("itemsize", "scalar") else x.nbytes)
        self.records.append((kind, n, code, offset))     # list.append: atomic across threads

    def _wrap_memcpy(self):
        rt = getattr(getattr(self.xp, "cuda", None), "runtime", None)
        if rt is None:
            return
        d2h, default = getattr(rt, "memcpyDeviceToHost", 2), getattr(rt, "memcpyDefault", 4)

        def host_dst(ptr):
            try:
                return int(rt.pointerGetAttributes(ptr).type) in (0, 1)   # unregistered, host
            except Exception:                               # noqa: BLE001 -- unknown: a host copy
                return True

        for name, (at, size) in _MEMCPY.items():
            f = getattr(rt, name, None)
            if f is None:
                continue

            def wrapped(*args, _f=f, _name=name, _at=at, _size=size, **kw):
                k = args[_at] if len(args) > _at else kw.get("kind")
                if k == d2h or (k == default and host_dst(args[0])):
                    frame = sys._getframe(1)
                    while frame.f_code.co_filename == __file__:    # a nested block's wrapper
                        frame = frame.f_back
                    n = int(np.prod([args[i] for i in _size]))
                    self.records.append((f"runtime.{_name}", n, frame.f_code, frame.f_lasti))
                return _f(*args, **kw)
            self._saved[name] = f
            setattr(rt, name, wrapped)

    def _unwrap_memcpy(self):
        rt = self.xp.cuda.runtime if self._saved else None
        for name, f in self._saved.items():
            setattr(rt, name, f)
        self._saved = {}

    # -------------------------------------------------------------- results
    @property
    def calls(self) -> int:
        return len(self.records)

    @property
    def bytes(self) -> int:
        return sum(r[1] for r in self.records)

    def sites(self):
        """``[(site, kind, calls, bytes)]`` grouped by call site (``file:line (function)``) and
        kind, the most bytes first."""
        agg = defaultdict(lambda: [0, 0])
        for kind, n, code, offset in list(self.records):
            a = agg[(_where(code, offset), kind)]
            a[0] += 1
            a[1] += n
        return sorted(((s, k, c, b) for (s, k), (c, b) in agg.items()), key=lambda r: (-r[3], r[0]))

    def report(self, top=15) -> str:
        """The ``top`` call sites with the most bytes, one line each."""
        rows = self.sites()
        lines = [f"{self.bytes} bytes in {self.calls} device -> host reads at {len(rows)} sites"]
        lines += [f"{b:>12} B {c:>6} x {k:<16} {s}" for s, k, c, b in rows[:top]]
        return "\n".join(lines)


def _where(code, offset):
    """``file:line (function)`` of the instruction at ``offset`` of ``code``."""
    line = code.co_firstlineno
    for start, end, ln in code.co_lines():
        if start <= offset < end and ln is not None:
            line = ln
            break
    return f"{code.co_filename}:{line} ({code.co_qualname})"


def count_host_reads(xp=None) -> HostReads:
    """``with count_host_reads() as reads: ...`` -- a :class:`HostReads` for the block;
    ``reads.bytes``, ``reads.calls``, ``reads.report()`` afterwards."""
    return HostReads(xp)
