"""adaptmg.device.host_reads: the device -> host read counter, on a stand-in device array.

``Dev`` is a NumPy array whose type claims to live in CuPy and whose ``get``/``item``/
``tolist``/string methods are written in Python without calling one another (as CuPy's
compiled methods are invisible to each other); ``xp`` a stand-in module with it and a
``cuda.runtime`` whose copies do nothing.  Each known device -> host form is run inside a
block and must be counted exactly once with its bytes; host arrays and device arithmetic
must count nothing; the forms the module docstring lists as invisible must stay
invisible (the docstring must say what the counter misses).  The event tests need
Python 3.12's sys.monitoring; the routing tests feed the callback what the interpreter
delivers and run on any version.
"""
import operator
import sys
import threading
import types

import numpy as np
import pytest

from adaptmg.backend import to_host
from adaptmg.device.host_reads import HostReads, available, count_host_reads

needs_monitoring = pytest.mark.skipif(not available(), reason="needs sys.monitoring (Python 3.12+)")


class Dev(np.ndarray):
    """A stand-in device array (see the module docstring)."""

    def get(self, stream=None, order="C", out=None, blocking=True):
        host = self.view(np.ndarray)
        if out is None:
            return np.array(host, copy=True)
        np.copyto(out, host)
        return out

    def __iter__(self):                 # as CuPy: 0-d device arrays, not host scalars
        return (self[i:i + 1].reshape(()) for i in range(self.shape[0]))

    def item(self):
        return self.view(np.ndarray).item()

    def tolist(self):
        return self.view(np.ndarray).tolist()

    def __repr__(self):
        return repr(self.view(np.ndarray))

    def __str__(self):
        return str(self.view(np.ndarray))

    def __format__(self, spec):
        return format(self.view(np.ndarray), spec)


Dev.__module__ = "cupy._core.core"

D2H, H2D, DEFAULT = 2, 1, 4


class _Runtime:
    """Copies that do nothing; device pointers are those registered in ``device``."""
    memcpyHostToDevice, memcpyDeviceToHost, memcpyDefault = H2D, D2H, DEFAULT

    def __init__(self):
        self.device, self.copies = set(), 0

    def memcpy(self, dst, src, size, kind):
        self.copies += 1

    def memcpyAsync(self, dst, src, size, kind, stream):
        self.copies += 1

    def memcpy2D(self, dst, dpitch, src, spitch, width, height, kind):
        self.copies += 1

    def pointerGetAttributes(self, ptr):
        return types.SimpleNamespace(type=2 if ptr in self.device else 1)


class _NoIndex(Dev):
    """A device array type without ``__index__``, as CuPy's."""
    __index__ = None


def _xp():
    rt = _Runtime()
    return types.SimpleNamespace(ndarray=Dev, asnumpy=lambda a: a.get(),
                                 cuda=types.SimpleNamespace(runtime=rt))


def dev(a):
    return np.array(a).view(Dev)


X = dev(np.arange(12.0))             # 96 bytes
X1 = dev(np.array(2.5))              # 8 bytes, 0-d
I0 = dev(np.array(3, dtype=np.int32))   # 4 bytes, 0-d integer


def _forms(xp):
    """(what, call, kind, bytes) of the known device -> host forms."""
    rt = xp.cuda.runtime
    rt.device.add(1000)
    g = X.get
    return [
        ("x.get()", lambda: X.get(), "get", 96),
        ("bound x.get", lambda: g(), "get", 96),
        ("Dev.get(x)", lambda: Dev.get(X), "get", 96),
        ("x.get(out=)", lambda: X.get(out=np.empty(12)), "get", 96),
        ("x.item()", lambda: X1.item(), "item", 8),
        ("x.tolist()", lambda: X.tolist(), "tolist", 96),
        ("int(x)", lambda: int(X1), "int", 8),
        ("float(x)", lambda: float(X1), "float", 8),
        ("complex(x)", lambda: complex(X1), "complex", 8),
        ("bool(x)", lambda: bool(X1), "bool", 8),
        ("operator.index(x)", lambda: operator.index(I0), "index", 4),
        ("x.__int__()", lambda: X1.__int__(), "__int__", 8),
        ("x.__float__()", lambda: X1.__float__(), "__float__", 8),
        ("str(x)", lambda: str(X), "str", 96),
        ("repr(x)", lambda: repr(X), "repr", 96),
        ("format(x)", lambda: format(X1, "g"), "format", 8),
        ("numpy.asarray(x)", lambda: np.asarray(X), "numpy.asarray", 96),
        ("numpy.array(x)", lambda: np.array(X), "numpy.array", 96),
        ("numpy.ascontiguousarray(x)", lambda: np.ascontiguousarray(X), "numpy.ascontiguousarray", 96),
        ("xp.asnumpy(x)", lambda: xp.asnumpy(X), "get", 96),
        ("adaptmg to_host(x)", lambda: to_host(X), "get", 96),
        ("memcpy D2H", lambda: rt.memcpy(1, 1000, 40, D2H), "runtime.memcpy", 40),
        ("memcpyAsync D2H", lambda: rt.memcpyAsync(1, 1000, 12, D2H, 0), "runtime.memcpyAsync", 12),
        ("memcpy default to host", lambda: rt.memcpy(1, 1000, 24, DEFAULT), "runtime.memcpy", 24),
        ("memcpy2D D2H", lambda: rt.memcpy2D(1, 64, 1000, 64, 16, 3, D2H), "runtime.memcpy2D", 48),
    ]


@needs_monitoring
def test_every_known_form_is_counted_once_with_its_bytes():
    xp = _xp()
    for what, call, kind, nbytes in _forms(xp):
        with count_host_reads(xp) as reads:
            call()
        got = [(k, n) for k, n, _, _ in reads.records]
        assert got == [(kind, nbytes)], f"{what}: counted {got}, expected [({kind!r}, {nbytes})]"
    assert xp.cuda.runtime.copies == 4                   # the wrapped copies still ran


@needs_monitoring
def test_host_data_and_device_arithmetic_count_nothing():
    xp = _xp()
    rt = xp.cuda.runtime
    rt.device.add(1000)
    h = np.arange(12.0)
    with count_host_reads(xp) as reads:
        y = X * 2 + 1                                    # stays a "device" array
        X[3:].reshape(3, 3)
        n = len(X) + X.shape[0] + X.size + X.nbytes
        h.tolist(), h[:1].item(), int(h[0]), float(h[1]), np.asarray(h), str(h)
        to_host(h)
        rt.memcpy(1000, 1, 40, H2D)                      # host -> device
        rt.memcpy(1000, 1000, 40, DEFAULT)               # device -> device
    assert type(y) is Dev and n == 132
    assert reads.calls == 0 and reads.bytes == 0, reads.report()


@needs_monitoring
def test_the_documented_blind_spots_stay_blind():
    """Implicit conversions without a call instruction are not seen (module docstring);
    if a Python version starts delivering them, the docstring must change."""
    xp = _xp()
    with count_host_reads(xp) as reads:
        if X1:
            pass
        list(range(I0))
        f"{X1}"
        X[I0]
        sorted(map(int, X))
    assert reads.calls == 0, reads.report()


@needs_monitoring
def test_threads_loops_sites_and_nesting():
    xp = _xp()
    with count_host_reads(xp) as outer:
        t = threading.Thread(target=lambda: X.get())     # another thread: counted too
        t.start()
        t.join()
        with count_host_reads(xp) as inner:
            vals = [int(v) for v in dev(np.arange(5))]   # per element: 5 reads of 8 bytes
            xp.cuda.runtime.memcpy(1, 1000, 16, D2H)     # through both blocks' wrappers
        line = sys._getframe().f_lineno + 1
        X.tolist()
    assert vals == [0, 1, 2, 3, 4]
    assert (inner.calls, inner.bytes) == (6, 56)
    assert (outer.calls, outer.bytes) == (8, 96 + 56 + 96)
    site, kind, calls, nbytes = [s for s in outer.sites() if s[1] == "tolist"][0]
    assert site.startswith(f"{__file__}:{line} ") and (calls, nbytes) == (1, 96)
    assert all(s.startswith(__file__) for s, *_ in outer.sites()), outer.report()
    assert "248 bytes in 8 device -> host reads" in outer.report()


@needs_monitoring
def test_the_block_leaves_nothing_behind():
    xp = _xp()
    rt = xp.cuda.runtime
    copy = rt.memcpy
    reads = HostReads(xp)
    with reads:
        assert rt.memcpy is not copy
        with pytest.raises(RuntimeError, match="already counting"):
            reads.__enter__()
    assert rt.memcpy == copy
    X.get()
    rt.memcpy(1, 1000, 40, D2H)
    assert reads.calls == 0
    with reads:                                          # reusable, keeps counting
        X.get()
    assert reads.calls == 1


@needs_monitoring
def test_a_deliberate_fine_vector_read_breaks_a_small_bound():
    """The control of the GPU tests, on the stand-in: scalar reads stay under a bound of a
    few bytes per step, one read of an O(n) vector does not."""
    xp = _xp()
    big = dev(np.ones(10_000))
    with count_host_reads(xp) as reads:
        for _ in range(20):
            float(dev(np.array(1.0)))
    assert reads.bytes == 160
    with count_host_reads(xp) as reads:
        for _ in range(20):
            float(dev(np.array(1.0)))
        big.get()
    assert reads.bytes == 160 + 80_000


# ---------------------------------------------------------------- any Python version
def test_routing_of_what_the_interpreter_delivers():
    """The callback on the (callable, first argument) pairs that CALL events carry: an
    unbound method with its receiver, a bound method with no argument, a builtin or NumPy
    conversion with the array; other receivers and callables count nothing."""
    reads = HostReads(_xp())
    code = test_routing_of_what_the_interpreter_delivers.__code__
    missing = object()
    h = np.arange(3.0)
    cases = [(Dev.get, X, ("get", 96)), (X.get, missing, ("get", 96)),
             (Dev.item, X1, ("item", 8)), (X1.item, missing, ("item", 8)),
             (Dev.tolist, X, ("tolist", 96)), (X1.__float__, missing, ("__float__", 8)),
             (int, X1, ("int", 8)), (bool, X1, ("bool", 8)), (np.asarray, X, ("numpy.asarray", 96)),
             (Dev.get, h, None), (int, h[:1], None), (np.asarray, h, None), (h.tolist, missing, None),
             # CuPy copies nothing for these: bool of a many-element array raises first, and its
             # ndarray has no __index__ (cupyx's isintlike probes whole arrays with it)
             (bool, X, None), (operator.index, X.view(_NoIndex), None), (operator.index, I0, ("index", 4)),
             (len, X, None), (X.reshape, missing, None), ({}.get, X, None), (print, X, None)]
    for fn, arg0, want in cases:
        reads.records.clear()
        reads._on_call(code, 0, fn, arg0)
        got = [(k, n) for k, n, _, _ in reads.records]
        assert got == ([want] if want else []), (fn, got)


def test_memcpy_wrapping_counts_device_to_host_copies_only():
    xp = _xp()
    rt = xp.cuda.runtime
    rt.device.add(1000)
    reads = HostReads(xp)
    reads._wrap_memcpy()
    try:
        rt.memcpy(1, 1000, 40, D2H)
        rt.memcpyAsync(1, 1000, 12, D2H, 0)
        rt.memcpy2D(1, 64, 1000, 64, 16, 3, D2H)
        rt.memcpy(1, 1000, 24, DEFAULT)
        rt.memcpy(1000, 1, 40, H2D)
        rt.memcpy(1000, 1000, 40, DEFAULT)
    finally:
        reads._unwrap_memcpy()
    assert [(k, n) for k, n, _, _ in reads.records] == [
        ("runtime.memcpy", 40), ("runtime.memcpyAsync", 12), ("runtime.memcpy2D", 48), ("runtime.memcpy", 24)]
    assert rt.copies == 6
    assert rt.memcpy.__func__ is _Runtime.memcpy


def test_bad_xp_and_old_python_say_so():
    with pytest.raises(TypeError, match="ndarray type"):
        HostReads(types.SimpleNamespace())
    with pytest.raises(TypeError, match="no get"):
        HostReads(types.SimpleNamespace(ndarray=np.ndarray))
    if not available():
        with pytest.raises(RuntimeError, match="Python 3.12"):
            with HostReads(_xp()):
                pass
