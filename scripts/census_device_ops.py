"""Census of the device operations of the adaptive L-shape loop, counted on the CPU.

A dev tool, not a test (issue 36).  On the GPU the L-shape loop's set-up is bound by kernel
launches, CuPy's per-call host overhead and synchronising reads, not by bandwidth; this runs
the loop with the mesh "on the device" under a stand-in for CuPy (``tests/distributed/
fake_cupy.py``'s arrays and SciPy-backed ``cupyx`` sparse matrices, as the ``fake`` fixture of
``tests/estimate/test_adaptive_device_mesh.py``) whose arrays record every operation that
would be a CuPy kernel launch or a synchronising read, with its call site: the innermost frame
inside ``adaptmg/`` (file:line) -- a ufunc call or reduction, an array method or ``xp``
function, a fancy get/setitem (a boolean mask read is a sync: its size), ``xp.asarray`` of
host data (a host -> device copy), a sparse operation, ``int()/float()/bool()/get()`` of a
device array (a read).  Nested work inside one recorded call (NumPy's own calls, SciPy's
sparse internals) is not counted again.

Each operation is weighted by a rough H200 cost (CuPy per-call overhead, launch, sync),
:data:`WEIGHTS`: nonzero / flatnonzero / unique / sort / argsort / a mask read 100 us,
reductions and scans 40 us, reads 50 us, host -> device copies 30 us, other launches 10 us,
allocations 3 us, sparse products 20 us (SpMV) / 150 us (SpGEMM: its nnz is read back),
COO -> CSR and sum_duplicates 100 us, ``tocsr()`` of a CSR matrix (cupyx returns it) 1 us.  The result is a *census*, not a timing: it says which
call sites a level or a step pays for most often.  The fused set-up and estimator kernels of
``adaptmg/device/index_kernels.py`` and ``device/cell_kernels.py``, the constrained matrix's
row kernels (``device/congruence_rows.py``) and the transfer's hanging rows (``device/forest_hanging.py``)
run their device path here, each kernel one launch (``kernel:<name>``, its result from the
host path, not counted).  (What it does not see: the
solver's fused ``ElementwiseKernel`` s run their NumPy twins here and count as their
operations, and the stand-in's SpMV runs on the host.)

    python scripts/census_device_ops.py --max-dofs 20000          # the loop to ~2e4 DoFs
    python scripts/census_device_ops.py --steps 6 --top 30 --by function

Prints the per-step table (DoFs, levels, operations and weighted ms per phase: set-up
(``solve`` less the multigrid solve), multigrid solve, estimate, error, refine) and the top
call sites of each phase, with their count and weighted ms per step and per level.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pathlib
import sys
import time
import types

import numpy as np
import scipy.sparse as sp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))            # this checkout's adaptmg
PKG = str(ROOT / "adaptmg") + os.sep

# weights in seconds by category
WEIGHTS = {"sync": 100e-6, "reduce": 40e-6, "read": 50e-6, "h2d": 30e-6, "launch": 10e-6,
           "alloc": 3e-6, "noop": 1e-6, "spmv": 20e-6, "spgemm": 150e-6, "spsort": 100e-6, "sparse": 10e-6}
SYNC = {"nonzero", "flatnonzero", "argwhere", "unique", "sort", "argsort", "lexsort", "compress",
        "extract", "count_nonzero", "partition", "argpartition", "unique_values"}
REDUCE = {"sum", "prod", "max", "min", "amax", "amin", "any", "all", "mean", "cumsum", "cumprod",
          "dot", "vdot", "inner", "argmax", "argmin", "nanmax", "nanmin", "norm", "diff_sum",
          "allclose", "array_equal"}
ALLOC = {"empty", "empty_like"}
NO_OP = {"shape", "ndim", "result_type", "dtype", "iinfo", "finfo", "broadcast_shapes", "can_cast",
         "promote_types", "isscalar", "issubdtype", "get_array_module", "asnumpy"}

_DEPTH = [0]
PHASE = ["other"]
RECORDS: "collections.Counter" = collections.Counter()     # (phase, site, category, name) -> count


def _site(by):
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(PKG):
            rel = fn[len(str(ROOT)) + 1:]
            return f"{rel}:{f.f_code.co_name}" if by == "function" else f"{rel}:{f.f_lineno}"
        f = f.f_back
    return "(outside adaptmg)"


BY = ["line"]


def _record(cat, name):
    if _DEPTH[0] == 0:
        RECORDS[(PHASE[0], _site(BY[0]), cat, name)] += 1


@contextlib.contextmanager
def _nested():
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1


def _base(a):
    if isinstance(a, np.ndarray) and type(a) is not np.ndarray:
        return a.view(np.ndarray)
    if isinstance(a, (list, tuple)):
        return type(a)(_base(b) for b in a)
    return a


def _dev(a):
    if isinstance(a, np.ndarray) and not isinstance(a, ndarray):
        return a.view(ndarray)
    if isinstance(a, np.generic):              # CuPy: a 0-d device array (int() of it: a read)
        return np.asarray(a).view(ndarray)
    if isinstance(a, tuple):
        return tuple(_dev(b) for b in a)
    if isinstance(a, list):
        return [_dev(b) for b in a]
    if sp.issparse(a):
        return _dev_sparse(a)
    return a


def _category(name):
    if name in SYNC:
        return "sync"
    if name in REDUCE:
        return "reduce"
    if name in ALLOC:
        return "alloc"
    return "launch"


def _fake():
    if str(ROOT / "tests" / "distributed") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "distributed"))
    import fake_cupy
    return fake_cupy


fake_cupy = _fake()


class ndarray(fake_cupy.ndarray):
    """fake_cupy's device array that records what it is asked to do."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        name = ufunc.__name__
        cat = "launch" if method == "__call__" else ("sync" if method == "at" else "reduce")
        _record(cat, name if method == "__call__" else f"{name}.{method}")
        out = kw.get("out")
        if out is not None:
            kw["out"] = tuple(_base(o) for o in out)
        with _nested():
            res = getattr(ufunc, method)(*(_base(x) for x in inputs), **kw)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _dev(res)

    def __array_function__(self, func, types_, args, kwargs):
        name = func.__name__
        if name not in NO_OP:
            _record(_category(name), name)
        with _nested():
            return _dev(func(*_base(args), **{k: _base(v) for k, v in kwargs.items()}))

    def __getitem__(self, key):
        keys = key if isinstance(key, tuple) else (key,)
        arrays = [k for k in keys if isinstance(k, np.ndarray) and k.ndim > 0]
        if arrays:
            mask = any(k.dtype == bool for k in arrays)
            _record("sync" if mask else "launch", "getitem[mask]" if mask else "getitem[gather]")
        with _nested():
            return _dev(super().__getitem__(key))

    def __setitem__(self, key, value):
        keys = key if isinstance(key, tuple) else (key,)
        mask = any(isinstance(k, np.ndarray) and k.dtype == bool for k in keys)
        _record("launch", "setitem[mask]" if mask else "setitem")
        with _nested():
            return super().__setitem__(key, value)

    def _method(name, cat=None):
        base = getattr(np.ndarray, name)

        def call(self, *a, **k):
            _record(cat or _category(name), name)
            with _nested():
                return _dev(base(self.view(np.ndarray), *_base(a), **{kk: _base(v) for kk, v in k.items()}))
        call.__name__ = name
        return call

    for _n in ("nonzero", "argsort", "sort", "cumsum", "cumprod", "take", "repeat", "astype", "copy",
               "flatten", "clip", "dot", "searchsorted", "fill", "argmax", "argmin", "sum", "max",
               "min", "any", "all", "mean", "prod"):
        locals()[_n] = _method(_n)
    del _n

    def _read(name):
        base = getattr(np.ndarray, name)

        def call(self, *a):
            _record("read", name)
            with _nested():
                return base(self.view(np.ndarray), *a)
        return call

    __int__ = _read("__int__")
    __index__ = _read("__index__")
    __float__ = _read("__float__")
    __bool__ = _read("__bool__")
    item = _read("item")
    tolist = _read("tolist")

    def get(self, *a, **k):
        _record("read", "get")
        with _nested():
            return super().get(*a, **k)


ndarray.__module__ = "cupy._core.core"


def _wrap_fn(name, fn):
    def call(*args, **kwargs):
        if name not in NO_OP:
            _record(_category(name), name)
        with _nested():
            return _dev(fn(*_base(args), **{k: _base(v) for k, v in kwargs.items()}))
    call.__name__ = name
    return call


def _namespace(name, mod):
    """A module whose functions are ``mod``'s wrapped by :func:`_wrap_fn` (PEP 562 look-up)."""
    ns = types.ModuleType(name)

    def lookup(attr):
        obj = getattr(mod, attr)
        return obj if isinstance(obj, type) or not callable(obj) else _wrap_fn(attr, obj)
    ns.__getattr__ = lookup
    return ns


def _asarray(a, dtype=None, order=None):
    """``cupy.asarray``: a host -> device copy unless ``a`` is on the device already."""
    if isinstance(a, ndarray):
        if dtype is None or a.dtype == np.dtype(dtype):
            return a
        _record("launch", "asarray(astype)")
    else:
        _record("h2d", "asarray(host)" if np.ndim(a) > 0 else "asarray(scalar)")
    with _nested():
        return np.array(_base(a), dtype=dtype, copy=True).view(ndarray)


xp = _namespace("cupy", np)
xp.ndarray, xp.cuda, xp.ElementwiseKernel = ndarray, fake_cupy.cuda, fake_cupy.ElementwiseKernel
xp.linalg = _namespace("cupy.linalg", np.linalg)
xp.asarray = xp.array = _asarray
xp.asnumpy = lambda a: a.get() if isinstance(a, ndarray) else np.asarray(a)


# ------------------------------------------------------------------ sparse (cupyx.scipy.sparse)
_SPARSE_COST = {"__matmul__": "spmv", "__rmatmul__": "spmv", "dot": "spmv", "__mul__": "spmv",
                "tocsr": "spsort", "tocsc": "spsort", "sum_duplicates": "spsort", "sort_indices": "spsort",
                "sorted_indices": "spsort", "transpose": "spsort"}
_SPARSE_METHODS = ("__matmul__", "__rmatmul__", "__mul__", "__rmul__", "dot", "__add__", "__radd__",
                   "__sub__", "__rsub__", "__neg__", "multiply", "transpose", "tocsr", "tocsc", "tocoo",
                   "sum_duplicates", "eliminate_zeros", "sort_indices", "sorted_indices", "diagonal",
                   "copy", "astype", "sum", "__getitem__", "maximum", "power", "setdiag", "get", "__truediv__")


def _sparse_fields(names):
    def prop(f):
        def getter(self):
            v = self.__dict__[f]
            return _dev(v) if _DEPTH[0] == 0 else v

        def setter(self, v):
            self.__dict__[f] = _base(v)
        return property(getter, setter)
    return {f: prop(f) for f in names}


def _sparse_class(base, fields):
    def __init__(self, *a, **k):
        _record("sparse", f"{base.__name__}()")
        with _nested():
            base.__init__(self, *_base(a), **{kk: _base(v) for kk, v in k.items()})

    ns = {"__init__": __init__, **_sparse_fields(fields)}

    def method(name):
        fn = getattr(base, name)

        def call(self, *a, **k):
            cat = _SPARSE_COST.get(name, "sparse")
            if name in ("__matmul__", "dot", "__mul__", "__rmatmul__") and a and sp.issparse(a[0]):
                cat = "spgemm"
            if name == "get":
                cat = "read"
            if name == "tocsr" and self.format == "csr" and not k.get("copy", a[0] if a else False):
                cat = "noop"                   # cupyx: returns self
            _record(cat, f"sparse.{name}")
            with _nested():
                res = fn(self, *_base(a), **{kk: _base(v) for kk, v in k.items()})
            return res if name == "get" else _dev(res)
        call.__name__ = name
        return call
    for n in _SPARSE_METHODS:
        if hasattr(base, n):
            ns[n] = method(n)
    ns["T"] = property(lambda self: self.transpose())

    def nnz(self):                         # cupyx: the size of ``data``, no read
        with _nested():
            return base.nnz.fget(self)
    ns["nnz"] = property(nnz)
    cls = type(base.__name__, (base,), ns)
    cls.__module__ = base.__module__
    return cls


csr_matrix = _sparse_class(fake_cupy.csr_matrix, ("data", "indices", "indptr"))
coo_matrix = _sparse_class(fake_cupy.coo_matrix, ("data", "coords"))


def _dev_sparse(A):
    if isinstance(A, (csr_matrix, coo_matrix)):
        return A
    with _nested():
        if A.format == "coo":
            return coo_matrix((A.data, (A.row, A.col)), shape=A.shape)
        A = A.tocsr()
        return csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)


csp = types.ModuleType("cupyx.scipy.sparse")
csp.csr_matrix, csp.coo_matrix, csp.issparse = csr_matrix, coo_matrix, sp.issparse
csp.diags = _wrap_fn("diags", lambda d, *a, **k: csr_matrix(sp.diags(d, *a, **k).tocsr()))


def _scatter(ufunc):
    def scatter(out, idx, vals):
        _record("launch", f"scatter_{ufunc.__name__}")
        with _nested():
            ufunc.at(out.view(np.ndarray), _base(idx), _base(vals))
    return scatter


class _Direct:
    """What :func:`install` needs of pytest's ``monkeypatch``, for good (this process)."""

    @staticmethod
    def setattr(obj, name, value, raising=True):
        setattr(obj, name, value)

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def install(monkeypatch=None):
    """Route adaptmg's CuPy look-up here, as the ``fake`` fixture does: for good, or for one
    test with pytest's ``monkeypatch``."""
    import scipy.sparse.linalg as ssl

    import adaptmg.backend as B
    from adaptmg.estimate import evaluation
    from adaptmg.multilevel.solver import MultilevelSolver
    mp = monkeypatch or _Direct
    cx = types.ModuleType("cupyx")
    cx.scatter_add, cx.scatter_max, cx.scatter_min = _scatter(np.add), _scatter(np.maximum), _scatter(np.minimum)
    cx.scipy = types.ModuleType("cupyx.scipy")
    cx.scipy.sparse = csp
    mp.setattr(B, "_cupy_status", lambda: (xp, csp, ""))
    mp.setattr(B, "PIN_MIN_BYTES", 1 << 62)                   # no page-locked uploads
    for name, mod in (("cupy", xp), ("cupyx", cx), ("cupyx.scipy", cx.scipy), ("cupyx.scipy.sparse", csp),
                      ("cupyx.scipy.sparse.linalg", ssl)):
        mp.setitem(sys.modules, name, mod)
    mp.setattr(fake_cupy.cuda.runtime, "getDevice", lambda: 0, raising=False)
    mp.setattr(MultilevelSolver, "_capturable", lambda self: False)          # no CUDA graphs
    mp.setattr(evaluation, "_DEVICE_TABLES", {})
    # the fused index kernels: their device path, each kernel one launch (its NumPy twin inside)
    from adaptmg.device import index_kernels
    mp.setattr(index_kernels, "in_host_memory", lambda a: type(a) is np.ndarray)
    mp.setattr(index_kernels, "_kernel", _fused_kernel)
    # the cell kernels (hanging-node search, DoF owners) likewise
    from adaptmg.device import cell_kernels
    mp.setattr(cell_kernels, "in_host_memory", lambda a: type(a) is np.ndarray)
    mp.setattr(cell_kernels, "_kernel", _cell_kernel)
    # the constrained matrix's row kernels likewise
    from adaptmg.device import congruence_rows
    mp.setattr(congruence_rows, "in_host_memory", lambda a: type(a) is np.ndarray)
    mp.setattr(congruence_rows, "_module", lambda xp: _CongruenceModule())
    # the transfer's rows with a hanging coarse parent likewise
    from adaptmg.device import forest_hanging
    mp.setattr(forest_hanging, "available", lambda H, codes: H is not None and B.is_device_sparse(H))
    mp.setattr(forest_hanging, "_module", lambda xp: _ForestHangModule())
    # the device pattern's row kernels and row-walk sums likewise
    from adaptmg.assemble import _device
    mp.setattr(_device, "in_host_memory", lambda a: type(a) is np.ndarray)
    mp.setattr(_device, "_kernel", _pattern_kernel)


def _row_candidates(inc, inc_ptr, cols, nr, ncl):
    """(rows, columns) of every candidate of the device pattern's rows, host arrays: incidence
    t of row r is p = inc[t] = c*nr + i, its candidates cols[c, :]."""
    rows = np.repeat(np.arange(inc_ptr.size - 1), np.diff(inc_ptr))
    c = inc.astype(np.int64) // nr
    return np.repeat(rows, ncl), cols.reshape(-1, ncl)[c].reshape(-1)


def _pattern_kernel(name):
    """A stand-in for :mod:`adaptmg.assemble._device`'s kernel ``name``: one launch, its result
    from host code (the distinct sorted columns of each row; the sums by np.add.at in (c, i, j)
    order), not counted."""
    def launch(*args, size=None):
        _record("launch", f"kernel:{name}")
        with _nested():
            host = [_base(a) for a in args]
            if name == "incidence_count":
                node, nrows, cnt = host[0], int(host[1]), host[-1]
                ok = (node >= 0) & (node < nrows)
                cnt += np.bincount(node[ok], minlength=nrows)
                return None
            if name == "incidence_scatter":                      # the sorted rows at once
                node, inc = host[0], host[-1]
                inc[...] = np.argsort(node, kind="stable")
                return None
            if name == "incidence_sort":
                return None
            if name == "sorted_cell_columns":
                host[-1][...] = np.sort(host[0], axis=1)
                return None
            if name in ("row_columns_count", "row_columns_fill"):
                inc, inc_ptr, cols, nr, ncl = host[:3] + [int(host[3 if name == "row_columns_count" else 4]),
                                                          int(host[4 if name == "row_columns_count" else 5])]
                r, s = _row_candidates(inc, inc_ptr, cols, nr, ncl)
                key = np.unique(r * (int(cols.max()) + 1) + s)
                ur, us = np.divmod(key, int(cols.max()) + 1)
                if name == "row_columns_count":
                    host[-1][...] = np.bincount(ur, minlength=inc_ptr.size - 1)
                    return args[-1]
                host[-1][...] = us
                return None
            if name == "row_walk_sum":
                from adaptmg.fe.csr_ops import row_positions
                inc, inc_ptr, ip, ind, cols, K = host[:6]
                c0, c1, nr, ncl, nf = (int(v) for v in host[6:11])
                data = host[-1].reshape(-1, nf)
                row_of = np.empty(inc.size, dtype=np.int64)          # incidence p -> its row
                row_of[inc] = np.repeat(np.arange(inc_ptr.size - 1), np.diff(inc_ptr))
                p = np.arange(c0 * nr, c1 * nr)                      # the chunk's incidences, (c, i) order
                r = np.repeat(row_of[p], ncl)
                s = cols.reshape(-1, ncl)[p // nr].reshape(-1)
                pos = row_positions(np, ip, ind, s, rows=r)
                for f in range(nf):                                  # loop over fields only
                    np.add.at(data[:, f], pos, K.reshape(nf, -1)[f])
                return None
            raise NotImplementedError(f"census: no stand-in of the device pattern kernel {name!r}")
    return launch


class _CongruenceModule:
    """A stand-in for :mod:`adaptmg.device.congruence_rows`' RawModule: each kernel one launch,
    its outputs from the twin (SciPy's products), not counted."""

    def get_function(self, name):
        def launch(grid, block, args):
            _record("launch", f"kernel:{name}")
            with _nested():
                from adaptmg.device import congruence_rows
                host = [_base(a) for a in args]
                # (m, row map, mapped, H^T's rows, A, H, z, outputs...)
                rows = host[1] if int(host[2]) else None
                z = host[12]
                N = z.size
                csr = lambda ip, ind, val: sp.csr_matrix((val, ind, ip), shape=(ip.size - 1, N))
                A, H = csr(*host[6:9]), csr(*host[9:12])
                if name == "adaptmg_congruence_count":
                    K, _ = congruence_rows.twin(A, H, z, rows=rows)
                    r = np.arange(N) if rows is None else rows
                    host[-2][...] = np.diff(K.indptr)
                    host[-1][...] = np.where(z[r], np.abs((H.T @ A @ H).diagonal()[r]), 0.0)
                else:
                    K, _ = congruence_rows.twin(A, H, z, rows=rows, scale=lambda d, m: float(host[-3]))
                    host[-2][...], host[-1][...] = K.indices, K.data
        return launch


class _ForestHangModule:
    """A stand-in for :mod:`adaptmg.device.forest_hanging`'s RawModule: each kernel one launch,
    its outputs from the host path it replaces (``transfer._hanging_parent_rows``), not counted."""

    def get_function(self, name):
        def launch(grid, block, args):
            _record("launch", f"kernel:{name}")
            with _nested():
                from adaptmg.backend import CPU
                from adaptmg.multilevel import transfer
                host = [_base(a) for a in args]
                n, W, codes, kind, hang, ncn, hp, hi, hv, cf, use = host[:11]
                ncn = int(ncn)
                H = sp.csr_matrix((hv, hi, hp), shape=(hp.size - 1, hp.size - 1))
                rows = np.flatnonzero(hang)
                cd = codes.reshape(int(n), int(W))
                hanging = np.unique(cd[cd > ncn]) - (ncn + 1)
                rows_c, C = transfer._hanging_parent_rows(
                    CPU, [(rows, cd[rows], np.ldexp(1.0, -kind[rows].astype(np.int32)))], H, hanging, ncn,
                    cf if int(use) else None)
                if name == "adaptmg_forest_hang_count":
                    host[-1][rows_c] = np.diff(C.indptr)
                    return
                cnt, ip, c, indices, data = host[11:]
                transfer._write_hanging_entries(np, C, rows_c, ip, cnt, int(c), indices.dtype.type, indices, data)
        return launch


def _cell_kernel(name):
    """A stand-in for :mod:`adaptmg.device.cell_kernels`' kernel ``name``: one launch whose
    outputs are the twin's (run on the host arrays, not counted)."""
    from adaptmg.device import cell_kernels

    def launch(*args, size=None):
        _record("launch", f"kernel:{name}")
        with _nested():
            host = [_base(a) for a in args]
            if name == "cells_vertex_hit":
                cells, mask, _, hit = host
                hit[...] = cell_kernels.cells_vertex_hit(cells, mask)
                return None
            if name == "cell_scatter":
                cells, val, _, ops, lo, hi = host
                cell_kernels.scatter_cells(cells, val, lo if int(ops) & 1 else None, hi if int(ops) & 2 else None)
                return None
            if name == "cells_on_boundary":
                ids, _, rows, has_rows, hit = host
                hit[...] = cell_kernels.cells_on_boundary(ids, rows if int(has_rows) else None)
                return None
            if name == "cell_votes":
                parent, rank, size, votes, bad = host
                ok = (rank >= 0) & (rank < int(size))
                bad[0] = int(not ok.all())
                np.add.at(votes, parent[ok] * int(size) + rank[ok], 1)
                return None
            if name == "majority":
                votes, size, best = host
                best[...] = votes.reshape(-1, int(size)).argmax(axis=1)
                return None
            if name == "parent_positions":
                act, loc, parent, child0, pos, child, pos_c, child_c, bad = host
                r = cell_kernels.parent_positions(act, loc, parent, child0, pos_c.dtype)
                pos[...], child[...], pos_c[...], child_c[...] = r[:4]
                bad[0] = int(not r[4])
                return None
            raise NotImplementedError(f"census: no stand-in of the cell kernel {name!r}")
    return launch


def _fused_kernel(name):
    """A stand-in for :mod:`adaptmg.device.index_kernels`' kernel ``name``: one launch whose
    output mask is the twin's result (the twin runs on the host arrays, not counted)."""
    from adaptmg.backend import CPU
    from adaptmg.device import index_kernels

    def launch(*args, size=None):
        _record("launch", f"kernel:{name}")
        with _nested():
            host = [_base(a) for a in args]
            if name == "registry_midpoints":
                K, ent, ne, _, keys, _, vals, seen, jump = host
                return index_kernels.registry_midpoints(K, ent, keys, vals, seen, jump).ravel().view(ndarray)
            if name == "face_corners":
                Vs, W, par, cor, _, _, _, ok, R = host
                R[...], ok[...] = index_kernels.face_corners(Vs, W, par, cor, cor.astype(np.int64))
                return None
            if name == "grouped_table_product":
                tab, B, tid, _, _, _, out = host
                out[...] = np.einsum("jrk,lkj->lrj", tab[tid], B)
                return None
            if name == "csr_row_entries":
                ptr, start, col, val, _, ind, dat = host
                ind[...], dat[...] = index_kernels.csr_row_entries(ptr, start, col, val, ind.size)
                return None
            if name in ("constrained_csr_count", "constrained_csr_fill"):
                z, ip, col, val = host[:4]
                K = index_kernels.constrained_csr(sp.csr_matrix((val, col, ip), shape=(z.size, z.size)), z,
                                                  host[6] if len(host) > 6 else 1.0)
                if name == "constrained_csr_count":
                    return np.diff(K.indptr).astype(np.int64).view(ndarray)
                host[-2][...], host[-1][...] = K.indices, K.data
                return None
            if name == "weight_rows_count":
                h, W = host[0], host[1]
                cnt = np.ones(h.size, dtype=np.int64)
                cnt[h >= 0] = (W[h[h >= 0]] != 0).sum(1)
                return cnt.view(ndarray)
            if name == "weight_rows_fill":
                h, W, cols = host[0], host[1], host[2]
                hanging = np.flatnonzero(h >= 0)
                hanging = hanging[np.argsort(h[hanging])]
                H = index_kernels.weight_rows_csr(CPU, h.size, h >= 0, hanging, cols, W)
                host[-2][...], host[-1][...] = H.indices, H.data
                return None
            if name == "q1_forest_rows":
                fid, cmap, nkind, npar, colmap, free, use_free, _, ncn, W = host[:10]
                outs = index_kernels.q1_forest_rows(fid, cmap, nkind, npar, colmap,
                                                    free if int(use_free) else None, int(ncn),
                                                    int(W).bit_length() - 1)
                for dst, src in zip(host[10:], outs):
                    dst[...] = src
                return None
            if name == "q1_forest_fill":
                cnt, kind, hang, codes, ip, _, c, indices, data = host
                index_kernels.q1_forest_fill(cnt, kind, hang, codes, ip, int(c), indices, data)
                return None
            raise NotImplementedError(f"census: no stand-in of the fused kernel {name!r}")
    return launch


# ------------------------------------------------------------------ the loop, by phases
@contextlib.contextmanager
def _phase(name):
    prev, PHASE[0] = PHASE[0], name
    try:
        yield
    finally:
        PHASE[0] = prev


def _phased(name, fn):
    def call(*a, **k):
        with _phase(name):
            return fn(*a, **k)
    return call


def run_loop(max_dofs, steps):
    """The L-shape loop (residual estimator, Doerfler 0.5, mesh on the stand-in device) with
    per-step snapshots of the records: list of (dofs, levels, Counter of the step)."""
    from adaptmg.mesh import mesh as meshmod
    from adaptmg.multilevel.solver import MultilevelSolver
    try:
        from adaptmg_problems import lshape
    except ImportError:
        sys.path.insert(0, str(ROOT))
        from problems import lshape
    prob = lshape.problem
    steps_out = []

    def problem(*a, **k):
        p = prob(*a, **k)
        solve, est, err = p.solve, p.estimate, p.error

        def s(mesh, backend):
            before = RECORDS.copy()
            with _phase("setup"):
                res = solve(mesh, backend)
            steps_out.append([res[0].num_dofs, res[2]["levels"], before])
            return res
        return type(p)(p.name, p.mesh, s, _phased("estimate", est), _phased("error", err), p.fields)

    orig_refine, orig_solve = meshmod.Mesh.refine, MultilevelSolver.solve
    meshmod.Mesh.refine = lambda self, *a, **k: _phased("refine", orig_refine)(self, *a, **k)
    MultilevelSolver.solve = lambda self, *a, **k: _phased("mg-solve", orig_solve)(self, *a, **k)
    lshape.problem = problem
    try:
        lshape.run(steps=steps, max_dofs=max_dofs, backend="gpu", quiet=True, tie_rtol=1e-8)
    finally:
        lshape.problem, meshmod.Mesh.refine, MultilevelSolver.solve = prob, orig_refine, orig_solve
    out = []
    for k, (dofs, levels, before) in enumerate(steps_out):
        after = steps_out[k + 1][2] if k + 1 < len(steps_out) else RECORDS
        out.append((dofs, levels, after - before))
    return out


PHASES = ("setup", "mg-solve", "estimate", "error", "refine", "other")


def _cost(counter):
    return sum(n * WEIGHTS[key[2]] for key, n in counter.items())


def report(steps, top):
    print(f"{'step':>4} {'DoFs':>9} {'lev':>3} " + " ".join(f"{p + ' ops/ms':>17}" for p in PHASES)
          + f" {'setup ms/level':>14}")
    tot = collections.Counter()
    for k, (dofs, lev, c) in enumerate(steps):
        tot += c
        cells = []
        for p in PHASES:
            cp = collections.Counter({key: n for key, n in c.items() if key[0] == p})
            cells.append(f"{sum(cp.values()):>8d}/{1e3 * _cost(cp):>8.1f}")
        su = _cost(collections.Counter({key: n for key, n in c.items() if key[0] == "setup"}))
        print(f"{k:>4} {dofs:>9} {lev:>3} " + " ".join(f"{x:>17}" for x in cells) + f" {1e3 * su / lev:>14.1f}")
    nsteps, nlev = len(steps), sum(s[1] for s in steps)
    print(f"total weighted {1e3 * _cost(tot):.1f} ms over {nsteps} steps, {nlev} levels; by phase: "
          + ", ".join(f"{p} {1e3 * _cost(collections.Counter({k: n for k, n in tot.items() if k[0] == p})):.1f}"
                      for p in PHASES))
    cats = collections.Counter()
    for key, n in tot.items():
        cats[key[2]] += n
    print("by category (count, weighted ms): " + ", ".join(
        f"{c} {n} {1e3 * n * WEIGHTS[c]:.1f}" for c, n in cats.most_common()))
    for p in PHASES:
        sites = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
        for (ph, site, cat, name), n in tot.items():
            if ph == p:
                s = sites[site]
                s[0] += n
                s[1] += n * WEIGHTS[cat]
                s[2][name] += n
        if not sites:
            continue
        per = nlev if p == "setup" else nsteps
        print(f"\n[{p}] top sites (count, weighted ms in all; per {'level' if p == 'setup' else 'step'}):")
        for site, (n, w, names) in sorted(sites.items(), key=lambda kv: -kv[1][1])[:top]:
            what = ", ".join(f"{nm} {c}" for nm, c in names.most_common(4))
            print(f"  {1e3 * w:8.1f} ms {n:6d}  {1e3 * w / per:6.2f} ms {n / per:6.1f}  {site}  ({what})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-dofs", type=int, default=20_000, help="stop the loop at this many DoFs")
    ap.add_argument("--steps", type=int, default=200, help="at most this many refinement steps")
    ap.add_argument("--top", type=int, default=25, help="call sites shown per phase")
    ap.add_argument("--by", choices=("line", "function"), default="line", help="call site granularity")
    args = ap.parse_args(argv)
    BY[0] = args.by
    install()
    t = time.perf_counter()
    steps = run_loop(args.max_dofs, args.steps)
    print(f"L-shape loop on the stand-in device: {len(steps)} steps to {steps[-1][0]:,} DoFs "
          f"({time.perf_counter() - t:.1f} s on the host)")
    report(steps, args.top)


if __name__ == "__main__":
    main()
