"""A strict NumPy stand-in for CuPy: runs the device branches of the mesh code on the host
and refuses what CuPy refuses or what silently differs there.  Not a test module.

:func:`install` (with pytest's ``monkeypatch``) makes ``adaptmg.backend.get_backend("gpu")``
answer a backend whose ``xp`` is :data:`xp` below and routes ``import cupy`` / ``import
cupyx`` (``backend.repeat`` / ``scatter_*``) here.  Arrays are a NumPy subclass whose type
claims to live in ``cupy``.  Refused with ``TypeError``, as on the device (or because the
device would give another answer):

* ``numpy.<function>(device array)`` (call ``xp.<function>``) and ``ufunc.at``;
* mixing host (NumPy) and device arrays in an operation, an index or an ``xp`` call;
* ``take(out=, mode=)``, ``sort/argsort(kind=)``, ``.view`` of another item size, ``unique(axis=)``,
  ``repeat`` by an array of counts, ``lexsort`` of a tuple, iterating a device array,
  ``flags.writeable``;
* ``a[idx] = values`` with a repeated index and differing values (the device keeps an
  unspecified one of the writes).

It counts what comes to the host (``get``, ``tolist``, ``int``/``bool``/``float`` of an array):
:func:`host_values`.  What it cannot check: CUDA itself, CuPy's dtype rules in detail.
"""
import types

import numpy as np
import scipy.sparse as sp

_STATE = {"via": 0, "host_values": 0, "host_calls": 0}


def host_values():
    """(values, calls) copied device -> host so far."""
    return _STATE["host_values"], _STATE["host_calls"]


def _to_host(n):
    _STATE["host_values"] += int(n)
    _STATE["host_calls"] += 1


def _strict():
    return _STATE["via"] == 0


def _base(a):
    return a.view(np.ndarray) if isinstance(a, ndarray) else a


def _is_host(a):
    return type(a) is np.ndarray and a.ndim > 0


def _check_no_host(args, what):
    for a in args:
        items = a if isinstance(a, (list, tuple)) else (a,)
        for b in items:
            if _is_host(b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))):
                raise TypeError(f"strict cupy: {what} got a host array / nested list ({type(b).__name__})")


class _Flags:
    """CuPy's flags: no ``writeable`` (setting it raises AttributeError)."""
    __slots__ = ("c_contiguous",)

    def __init__(self, c):
        self.c_contiguous = c


class ndarray(np.ndarray):
    """A NumPy array that reports itself as a CuPy array and refuses NumPy-only uses."""

    def __array_function__(self, func, types_, args, kwargs):
        if _strict():
            raise TypeError(f"strict cupy: numpy.{func.__name__} called on a device array "
                            f"(call xp.{func.__name__})")
        return super().__array_function__(func, types_, args, kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if _strict():
            if method == "at":
                raise TypeError(f"strict cupy: numpy.{ufunc.__name__}.at on a device array "
                                "(use adaptmg.backend.scatter_*)")
            _check_no_host(inputs, f"ufunc {ufunc.__name__}")
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_base(o) for o in out)
        _STATE["via"] += 1
        try:
            res = getattr(ufunc, method)(*(_base(x) for x in inputs), **kwargs)
        finally:
            _STATE["via"] -= 1
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _dev(res)

    def _check_key(self, key):
        keys = key if isinstance(key, tuple) else (key,)
        for k in keys:
            if _is_host(k) and k.size > 1:
                raise TypeError("strict cupy: a device array indexed by a host array")

    def __getitem__(self, key):
        if _strict():
            self._check_key(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if _strict():
            self._check_key(key)
            if _is_host(value) and value.size > 1:
                raise TypeError("strict cupy: host values written into a device array")
            keys = key if isinstance(key, tuple) else (key,)
            fancy = any(isinstance(k, np.ndarray) and k.dtype.kind in "iu" for k in keys)
            if fancy and np.unique(_base(np.asarray(value))).size > 1:
                hits = np.zeros(self.shape, dtype=np.int64)
                np.add.at(hits, tuple(_base(k) for k in keys), 1)
                if hits.max(initial=0) > 1:
                    raise TypeError("strict cupy: a scatter with repeated indices and differing "
                                    "values (the device keeps an unspecified write)")
        _STATE["via"] += 1
        try:
            return super().__setitem__(key, value)
        finally:
            _STATE["via"] -= 1

    def take(self, indices, axis=None, out=None, mode=None):
        if _strict() and (out is not None or mode is not None):
            raise TypeError("strict cupy: take(out=, mode=) is NumPy's only")
        return super().take(indices, axis=axis, out=out, mode="raise" if mode is None else mode)

    def sort(self, axis=-1, kind=None, order=None, **kw):
        if _strict() and kind is not None:
            raise TypeError("strict cupy: sort(kind=)")
        return super().sort(axis=axis, kind=kind, order=order, **kw)

    def argsort(self, axis=-1, kind=None, order=None, **kw):
        if _strict() and kind is not None:
            raise TypeError("strict cupy: argsort(kind=) (CuPy's sorts are stable)")
        return super().argsort(axis=axis, kind=kind, order=order, **kw)

    def view(self, *args, **kw):
        dt = args[0] if args else kw.get("dtype")
        if (_strict() and dt is not None and not (isinstance(dt, type) and issubclass(dt, np.ndarray))
                and np.dtype(dt).itemsize != self.itemsize):
            raise TypeError("strict cupy: .view() of another item size")
        return super().view(*args, **kw)

    def __iter__(self):
        if _strict():
            raise TypeError("strict cupy: iterating a device array")
        return super().__iter__()

    @property
    def flags(self):
        if not _strict():
            return super().flags
        return _Flags(self.view(np.ndarray).flags.c_contiguous)

    def get(self, stream=None):
        _to_host(self.size)
        return np.array(self.view(np.ndarray), copy=True)

    def tolist(self):
        _to_host(self.size)
        return self.view(np.ndarray).tolist()

    def item(self, *a):
        _to_host(1)
        return self.view(np.ndarray).item(*a)

    def __int__(self):
        _to_host(self.size)
        return int(self.view(np.ndarray))

    __index__ = __int__

    def __bool__(self):
        _to_host(self.size)
        return bool(self.view(np.ndarray))

    def __float__(self):
        _to_host(self.size)
        return float(self.view(np.ndarray))


ndarray.__module__ = "cupy._core.core"


def _dev(out):
    if isinstance(out, np.ndarray) and not isinstance(out, ndarray):
        return out.view(ndarray)
    if isinstance(out, tuple):
        return tuple(_dev(o) for o in out)
    if isinstance(out, list):
        return [_dev(o) for o in out]
    return out


def _wrap(name, fn):
    def call(*args, **kwargs):
        if name not in ("asarray", "array"):
            _check_no_host(args, f"xp.{name}")
        _STATE["via"] += 1
        try:
            return _dev(fn(*args, **kwargs))
        finally:
            _STATE["via"] -= 1
    call.__name__ = name
    return call


def _refuse(cond, msg):
    if cond:
        raise TypeError(f"strict cupy: {msg}")


class _Namespace(types.ModuleType):
    """NumPy's functions through :func:`_wrap` (results as device arrays)."""

    def __init__(self, name, np_module):
        super().__init__(name)
        self._np = np_module

    def __getattr__(self, name):
        obj = getattr(self._np, name)
        if isinstance(obj, type) or not callable(obj):
            return obj
        return _wrap(name, obj)


class _XP(_Namespace):
    ndarray = ndarray

    def __init__(self):
        super().__init__("cupy", np)
        self.linalg = _Namespace("cupy.linalg", np.linalg)
        dev = types.SimpleNamespace(synchronize=lambda: None)
        self.cuda = types.SimpleNamespace(Device=lambda *a: dev)

    def asarray(self, a, dtype=None):
        if isinstance(a, ndarray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return np.array(_base(a), dtype=dtype, copy=True).view(ndarray)

    def unique(self, a, *args, axis=None, **kw):
        _refuse(axis is not None, "unique(axis=)")
        return _wrap("unique", np.unique)(a, *args, **kw)

    def repeat(self, a, repeats, axis=None):
        _refuse(isinstance(repeats, np.ndarray) and repeats.ndim > 0, "repeat by an array of counts")
        return _wrap("repeat", np.repeat)(a, repeats, axis=axis)

    def lexsort(self, keys):
        _refuse(not isinstance(keys, ndarray), "lexsort takes one 2-D device array")
        return _wrap("lexsort", np.lexsort)(keys)

    def take(self, a, indices, axis=None, out=None, mode=None):
        _refuse(out is not None or mode is not None, "take(out=, mode=)")
        return _wrap("take", np.take)(a, indices, axis=axis)

    def argsort(self, a, axis=-1, kind=None):
        _refuse(kind is not None, "argsort(kind=)")
        return _wrap("argsort", np.argsort)(a, axis=axis, kind="stable")

    def sort(self, a, axis=-1, kind=None):
        _refuse(kind is not None, "sort(kind=)")
        return _wrap("sort", np.sort)(a, axis=axis)


xp = _XP()


def _scatter(ufunc):
    def scatter(out, idx, vals):
        _refuse(not isinstance(out, ndarray), "cupyx.scatter_* into a host array")
        ufunc.at(out.view(np.ndarray), _base(idx), _base(vals))
    return scatter


cupyx = types.ModuleType("cupyx")
cupyx.scatter_add, cupyx.scatter_max, cupyx.scatter_min = (_scatter(np.add), _scatter(np.maximum),
                                                            _scatter(np.minimum))


def _host_arg(a):
    if isinstance(a, tuple):
        return tuple(_host_arg(b) for b in a)
    return _base(a)


class _Sparse:
    """cupyx.scipy.sparse's data-type rule on SciPy matrices that report themselves as cupyx
    ones (``get`` counted)."""

    def get(self, stream=None):
        _to_host(self.nnz)
        return getattr(sp, type(self).__name__)(self.copy())


def _sparse_class(name):
    base = getattr(sp, name)

    def __init__(self, arg1, shape=None, dtype=None, copy=False, **kw):
        base.__init__(self, _host_arg(arg1), shape=shape, dtype=dtype, copy=copy, **kw)
        _refuse(self.dtype.char not in "?fdFD", f"cupyx sparse holds no {self.dtype} values")

    cls = type(name, (_Sparse, base), {"__init__": __init__})
    cls.__module__ = "cupyx.scipy.sparse._" + name[:3]
    return cls


csp = types.ModuleType("cupyx.scipy.sparse")
csp.csr_matrix, csp.coo_matrix, csp.csc_matrix = (_sparse_class("csr_matrix"), _sparse_class("coo_matrix"),
                                                  _sparse_class("csc_matrix"))
csp.issparse = sp.issparse


def install(monkeypatch):
    """Route adaptmg's CuPy look-up here for one test (``monkeypatch`` undoes it)."""
    import sys

    import adaptmg.backend as B
    monkeypatch.setattr(B, "_cupy_status", lambda: (xp, csp, ""))
    monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    return xp
