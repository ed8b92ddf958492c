"""Gauss-Seidel set-up on the matrix's backend (issue 36): a cupyx matrix gets its colour groups,
inverse (block) diagonal, l1 splitting and per-colour CSR row slices built on the device, with
no host copy of the matrix or of any array of size n.

Without a GPU the device branches run on the NumPy stand-in for CuPy
(``tests/distributed/fake_cupy.py``: arrays and matrices that claim to be CuPy's, so every
``be.is_gpu`` branch is taken) with the colouring's two row kernels as NumPy twins and the
Gauss-Seidel RawKernels' own CUDA source compiled by g++ and run on host threads
(``tests/host_cuda.py``, warp shuffles emulated with the block barrier).  The references are
SciPy's: ``A[rows]`` row slices and the colour update written out with them (the host plan of
before).  The ``gpu`` tests do the same on a real device.
"""
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.assemble.testing import tensor_q1_stiffness
from adaptmg.backend import CPU, to_host
from adaptmg.device import gs_kernels
from adaptmg.multilevel.aggregation import csr_row_reduce
from adaptmg.multilevel.coloring import color_graph
from adaptmg.multilevel.gauss_seidel import GaussSeidel, L1GaussSeidel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
import fake_cupy  # noqa: E402

EPS = np.finfo(np.float64).eps

# warp shuffle of the host-thread launcher: every thread of a block reaches the shuffles (the
# kernels guarantee it), so one barrier-separated exchange through a block-shared slot array
# is __shfl_down_sync (a lane past the segment's end keeps its own value, as on the device)
_SHFL = r"""
template <class T> static T __shfl_down_sync(unsigned, T v, int off, int width) {
    static T slot[1024];
    const int t = threadIdx.x;
    slot[t] = v;
    __syncthreads();
    const T r = (t % width) + off < width ? slot[t + off] : v;
    __syncthreads();
    return r;
}
"""


def lap2d(m, nine=False):
    K = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    if nine:
        M = sp.diags([np.ones(m - 1), 4 * np.ones(m), np.ones(m - 1)], [-1, 0, 1]) / 6
        return (sp.kron(K, M) + sp.kron(M, K)).tocsr()
    I = sp.identity(m)
    return (sp.kron(K, I) + sp.kron(I, K)).tocsr()


def vector_spd(m, c, seed=0):
    """Symmetric with c x c node blocks; the off-diagonal blocks are not symmetric (a kernel
    that transposed a block would be seen)."""
    rng = np.random.default_rng(seed)
    G, M = rng.standard_normal((c, c)), rng.standard_normal((c, c))
    U = sp.kron(sp.triu(lap2d(m, nine=True), 1), M)
    return sp.csr_matrix(sp.kron(lap2d(m), G @ G.T + c * np.eye(c))
                         + 0.1 * sp.kron(lap2d(m, nine=True), np.ones((c, c))) + 0.05 * (U + U.T))


@pytest.fixture
def device(monkeypatch, tmp_path):
    """``get_backend("gpu")`` answers the stand-in device; its RawModules run on host threads."""
    import adaptmg.backend as B
    from host_cuda import HAVE_GXX, HostXP
    if not HAVE_GXX:
        pytest.skip("needs g++ (C++20)")
    monkeypatch.setattr(B, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    host = HostXP(tmp_path)
    monkeypatch.setattr(fake_cupy.xp, "RawModule", lambda code: host.RawModule(_SHFL + code),
                        raising=False)
    # CuPy's argsort is a stable radix sort (the stand-in's NumPy default is not stable)
    monkeypatch.setattr(fake_cupy.ndarray, "argsort",
                        lambda a, *r, **k: np.argsort(a.view(np.ndarray), kind="stable"), raising=False)
    for name, uf, dt in (("adaptmg_csr_rowmax", np.maximum, np.int64),
                         ("adaptmg_csr_rowor", np.bitwise_or, np.uint64)):
        def twin(indptr, vals, init, out, uf=uf, dt=dt):
            out[...] = csr_row_reduce(CPU, np.asarray(indptr), np.asarray(vals), np.asarray(init),
                                      uf, None, dt)
        monkeypatch.setitem(fake_cupy._TWINS, name, twin)
    gs_kernels._gs_module.cache_clear()
    yield B.get_backend("gpu")
    gs_kernels._gs_module.cache_clear()


_SETUP_MODULES = ("adaptmg.multilevel.coloring", "adaptmg.multilevel.aggregation",
                  "adaptmg.multilevel.gauss_seidel", "adaptmg.multilevel.smoother_base",
                  "adaptmg.device.gs_kernels")


def record_host_reads(monkeypatch):
    """Sizes of what the set-up modules copy to the host (their ``to_host``), and on the
    stand-in every ``get()`` of a device array or matrix (matrices: their stored entries)."""
    sizes = []

    def size(a):
        return int(getattr(a, "nnz", None) or getattr(a, "size", 1))

    def wrap(f):
        return lambda a, *r, **k: (sizes.append(size(a)), f(a, *r, **k))[1]

    for name in _SETUP_MODULES:
        mod = sys.modules[name]
        if hasattr(mod, "to_host"):
            monkeypatch.setattr(mod, "to_host", wrap(mod.to_host))
    for cls in (fake_cupy.ndarray, fake_cupy.csr_matrix):
        monkeypatch.setattr(cls, "get", wrap(cls.get))
    return sizes


def colour_bound(A, c, l1=False, kw=None):
    """The longest host read the set-up may make: the colour counts of the Jones-Plassmann
    colouring (before iterated greedy reduces them) plus one -- far below ``n``."""
    if l1:
        A = L1GaussSeidel(A, **kw)._Ain
    bound = int(color_graph(A, c, passes=0).max()) + 2
    assert bound < A.shape[0] / 4
    return bound


def reference_rows(A, groups, c):
    """SciPy's slices: the rows of each colour and ``A[rows]`` (the host plan of before)."""
    out = []
    for g in groups:
        g = np.asarray(to_host(g), dtype=np.int64)
        rows = g if c == 1 else (g[:, None] * c + np.arange(c)).ravel()
        out.append((rows, sp.csr_matrix(A)[rows]))
    return out


def reference_sweep(A, groups, inv, c, omega, order, x, b):
    """The colour updates x_C += omega D_CC^{-1} (b_C - A_C x) with SciPy row slices."""
    inv = to_host(inv)
    for k in order:
        rows, S = reference_rows(A, [groups[k]], c)[0]
        r = b[rows] - S @ x
        if c == 1:
            r = inv[rows] * r
        else:
            r = np.einsum("mkl,ml->mk", inv[np.asarray(to_host(groups[k]))], r.reshape(-1, c)).ravel()
        x[rows] += omega * r
    return x


def _with_empty_rows(A):
    """``A`` with two isolated unknowns (rows holding only their diagonal) and one unsorted row."""
    A = sp.block_diag([A, sp.identity(2)], format="csr")
    A.indices[A.indptr[3]:A.indptr[4]] = A.indices[A.indptr[3]:A.indptr[4]][::-1].copy()
    return A


CASES = {"point-9": (lambda: lap2d(11, nine=True), 1), "point-27": (lambda: tensor_q1_stiffness(5, 3), 1),
         "block-3": (lambda: vector_spd(6, 3), 3), "block-2": (lambda: vector_spd(7, 2, 1), 2)}


# --------------------------------------------------------------------------- the slices
@pytest.mark.parametrize("where", ["host", "stand_in_device"])
@pytest.mark.parametrize("case", ["point-9", "block-3", "point-empty-rows"])
def test_colour_slices_equal_scipy_row_slices(request, case, where):
    """One gather of every entry into colour order, one view per colour: row pointers and
    column indices exactly SciPy's ``A[rows]``, values too (a gather does no arithmetic)."""
    if case == "point-empty-rows":
        A, c = _with_empty_rows(lap2d(6)), 1
    else:
        make, c = CASES[case]
        A = make()
    be = request.getfixturevalue("device") if where != "host" else CPU
    rng = np.random.default_rng(2)
    perm = rng.permutation(A.shape[0] // c)
    groups = [np.sort(g) for g in np.array_split(perm, 4)]
    Ad = be.asmatrix(A)
    got = gs_kernels.colour_slices(Ad, [be.asarray(g) for g in groups], c)
    for (rows, ptr, idx, dat), (rref, S) in zip(got, reference_rows(A, groups, c)):
        np.testing.assert_array_equal(to_host(rows), rref)
        np.testing.assert_array_equal(to_host(ptr), S.indptr)
        assert np.dtype(ptr.dtype) == np.int32
        np.testing.assert_array_equal(to_host(idx), S.indices)
        np.testing.assert_array_equal(to_host(dat), S.data)


@pytest.mark.parametrize("where", ["host", "stand_in_device"])
@pytest.mark.parametrize("case", ["block-3", "block-2"])
def test_colour_blocks_equal_scipy_bsr_of_the_row_slices(request, case, where):
    """The BSR layout of each colour's node rows: block row pointers, block columns and the
    c x c blocks exactly those of SciPy's ``A[rows].tobsr((c, c))``."""
    make, c = CASES[case]
    A = make()
    be = request.getfixturevalue("device") if where != "host" else CPU
    perm = np.random.default_rng(3).permutation(A.shape[0] // c)
    groups = [np.sort(g) for g in np.array_split(perm, 3)]
    got = gs_kernels.colour_blocks(be.asmatrix(A), [be.asarray(g) for g in groups], c)
    for g, (nodes, bptr, bcol, bval), (_, S) in zip(groups, got, reference_rows(A, groups, c)):
        B = S.tobsr(blocksize=(c, c))
        B.sort_indices()
        np.testing.assert_array_equal(to_host(nodes), g)
        np.testing.assert_array_equal(to_host(bptr), B.indptr)
        np.testing.assert_array_equal(to_host(bcol), B.indices)
        np.testing.assert_array_equal(to_host(bval), B.data.reshape(-1))
        assert np.dtype(bptr.dtype) == np.dtype(bcol.dtype) == np.int32


# --------------------------------------------------------------------------- device = host
def _launch_slices(plan):
    """The (row pointer, columns, values) each colour launch of the GPU plan reads."""
    return [tuple(to_host(a) for a in sl) for sl in plan.slices]


@pytest.mark.parametrize("case", list(CASES) + ["l1", "complex"])
def test_device_setup_equals_host_setup_and_reads_no_array_of_size_n(device, monkeypatch, case):
    """GaussSeidel of a device matrix on the stand-in device: the same colour groups (exactly),
    inverse diagonal (within 4 eps), colour slices (exactly SciPy's ``A[rows]``) as the host
    set-up; no host read longer than the colour counts during the set-up; the sweeps
    (the RawKernels' source on host threads, ``tpr`` threads a row) equal the SciPy colour
    updates within 100 eps.  Block cases with the CSR layout (the BSR one: its own tests)."""
    monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", "csr")
    if case == "l1":
        A, c, cls, kw = lap2d(14, nine=True), 1, L1GaussSeidel, {"partition_rows": 50}
    elif case == "complex":           # no complex RawKernel: the xp twin with device slices
        A, c, cls, kw = (lap2d(8, nine=True) * (1 + 0.5j)).tocsr(), 1, GaussSeidel, {}
    else:
        make, c = CASES[case]
        A, cls, kw = make(), GaussSeidel, ({"block_size": c} if c > 1 else {})
    host = cls(A, sweep="symmetric", **kw)
    Ad = device.asmatrix(A)
    with pytest.MonkeyPatch.context() as mp:
        sizes = record_host_reads(mp)
        dev = cls(Ad, sweep="symmetric", backend=device, **kw)
    assert dev.ncolors == host.ncolors
    assert max(sizes, default=0) <= colour_bound(A, c, case == "l1", kw), sorted(sizes)[-5:]
    for g, h in zip(dev._groups, host._groups):
        np.testing.assert_array_equal(to_host(g), h)
    inv, ref = to_host(dev._inv), host._inv
    assert np.abs(inv - ref).max() <= 4 * EPS * np.abs(ref).max()
    Aref = host._Ain if case == "l1" else host._Acsr
    slices = (_launch_slices(dev._plan) if case != "complex" else
              [(M.indptr, M.indices, M.data) for M in map(to_host, dev._plan._A)])
    for (ptr, idx, dat), (_, S) in zip(slices, reference_rows(Aref, host._groups, c)):
        np.testing.assert_array_equal(ptr, S.indptr)
        np.testing.assert_array_equal(idx, S.indices)
        np.testing.assert_array_equal(dat, S.data)


@pytest.mark.parametrize("case", ["point-27", "block-3", "block-3-indexed", "block-3-bsr", "block-2-bsr", "l1"])
def test_device_sweep_equals_the_scipy_colour_updates(device, case, monkeypatch):
    """The forward / symmetric sweeps of the device plan (kernel source on host threads: 8 to
    32 threads a row with the shuffle reduction, and one; the CSR and the BSR block kernels)
    equal the colour updates written with SciPy row slices, within 100 eps; the l1 sweep
    equals the host smoother's."""
    if case == "l1":
        A = lap2d(12, nine=True)
        host = L1GaussSeidel(A, sweep="forward", partition_rows=40)
        dev = L1GaussSeidel(device.asmatrix(A), sweep="forward", partition_rows=40, backend=device)
        rng = np.random.default_rng(5)
        x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
        xh, xd = x0.copy(), device.asarray(x0)
        host.smooth(xh, b, 2)
        dev.smooth(xd, device.asarray(b), 2)
        assert np.abs(to_host(xd) - xh).max() <= 100 * EPS * np.abs(xh).max()
        return
    layout = "bsr" if case.endswith("-bsr") else "csr"
    monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", layout)
    monkeypatch.setattr(gs_kernels, "SLICED", not case.endswith("-indexed"))    # rows read from A
    make, c = CASES[case.removesuffix("-bsr").removesuffix("-indexed")]
    A = make()
    kw = {"block_size": c} if c > 1 else {}
    rng = np.random.default_rng(4)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    for tpr in (None, 1):
        if tpr:
            monkeypatch.setattr(gs_kernels, "gs_threads_per_row", lambda nnz, rows=None: tpr)
        for sweep, omega in (("forward", 1.0), ("symmetric", 1.3)):
            dev = GaussSeidel(device.asmatrix(A), sweep=sweep, omega=omega, backend=device, **kw)
            assert dev._plan.sliced == gs_kernels.SLICED or layout == "bsr"
            assert (set(dev._plan.lanes) == {1}) == (tpr == 1)
            assert dev._plan.layout == (layout if c > 1 else "csr")
            xd = device.asarray(x0)
            dev.smooth(xd, device.asarray(b), 1)
            ref = reference_sweep(A, dev._groups, dev._inv, c, omega, dev._orders(sweep, 1), x0.copy(), b)
            assert np.abs(to_host(xd) - ref).max() <= 100 * EPS * np.abs(ref).max(), (tpr, sweep)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("where", ["host", "stand_in_device"])
def test_bad_matrices_get_the_same_errors_on_both_backends(request, where):
    """Zero diagonal (row named), singular node block (node named), non-finite block, a
    complex matrix with node blocks, an l1 diagonal that is not positive: the host's errors,
    also when the matrix lives on the device."""
    be = request.getfixturevalue("device") if where != "host" else CPU
    M = lambda d: be.asmatrix(sp.csr_matrix(np.diag(d)))                    # noqa: E731
    kw = {"backend": be}
    with pytest.raises(ValueError, match=r"zero or non-finite diagonal entry in row 2 \(2 rows in all\)"):
        GaussSeidel(M([1.0, 2.0, 0.0, np.nan]), **kw)
    with pytest.raises(ValueError, match=r"diagonal block of node 1 \(rows 2..3\) is singular"):
        GaussSeidel(M([1.0, 2.0, 0.0, 0.0]), block_size=2, **kw)
    with pytest.raises(ValueError, match="node 0 is not finite"):
        GaussSeidel(M([np.inf, 2.0, 1.0, 1.0]), block_size=2, singular="pinv", **kw)
    with pytest.raises(TypeError, match="block_size > 1 needs a real matrix"):
        GaussSeidel(be.asmatrix(vector_spd(3, 2).astype(complex)), block_size=2, **kw)
    with pytest.raises(ValueError, match=r"l1 diagonal is not positive in row 1 \(-2.0; 1 rows"):
        L1GaussSeidel(M([1.0, -2.0, 1.0, 1.0]), **kw)
    sm = GaussSeidel(M([1.0, 2.0, 0.0, 4.0]), singular="pinv", **kw)          # pyamg: row left alone
    np.testing.assert_array_equal(to_host(sm._inv), [1.0, 0.5, 0.0, 0.25])


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES) + ["l1"])
def test_gpu_setup_equals_host_setup_without_host_copies(case, monkeypatch):
    """On a real device: the set-up of a cupyx matrix equals the host one (groups exactly,
    inverses within 4 eps, each colour's slice exactly ``A[rows]``), its host reads are no longer
    than the colour counts, and the device sweep equals the SciPy updates within 1e3 eps.
    Block cases with the CSR layout (the BSR one: test_gpu_bsr_block_layout_equals_the_csr_layout)."""
    monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", "csr")
    import cupy
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    if case == "l1":
        A, c, cls, kw = tensor_q1_stiffness(10, 3), 1, L1GaussSeidel, {"partition_rows": 200}
    else:
        make, c = CASES[case]
        A, cls, kw = make(), GaussSeidel, ({"block_size": c} if c > 1 else {})
    host = cls(A, **kw)
    Ad = gpu.asmatrix(A)
    with pytest.MonkeyPatch.context() as mp:
        sizes = record_host_reads(mp)
        dev = cls(Ad, backend=gpu, **kw)
    assert max(sizes, default=0) <= colour_bound(A, c, case == "l1", kw), sorted(sizes)[-5:]
    for g, h in zip(dev._groups, host._groups):
        assert isinstance(g, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(g), h)
    inv = cupy.asnumpy(dev._inv)
    assert np.abs(inv - host._inv).max() <= 4 * EPS * np.abs(host._inv).max()
    Aref = host._Ain if case == "l1" else host._Acsr
    for (ptr, idx, dat), (_, S) in zip(_launch_slices(dev._plan), reference_rows(Aref, host._groups, c)):
        np.testing.assert_array_equal(ptr, S.indptr)
        np.testing.assert_array_equal(idx, S.indices)
        np.testing.assert_array_equal(dat, S.data)
    if case != "l1":
        rng = np.random.default_rng(4)
        x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
        xd = gpu.asarray(x0)
        dev.smooth(xd, gpu.asarray(b), 1)
        ref = reference_sweep(A, host._groups, host._inv, c, 1.0, dev._orders("symmetric", 1), x0.copy(), b)
        assert np.abs(cupy.asnumpy(xd) - ref).max() <= 1e3 * EPS * np.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e3 * EPS), (np.float32, 1e3 * np.finfo(np.float32).eps)])
def test_gpu_bsr_block_layout_equals_the_csr_layout(dtype, tol, monkeypatch):
    """On a real device: block GS with the node rows as c x c blocks (BLOCK_LAYOUT "bsr") gives
    SciPy's BSR of each colour's rows and the same sweeps as the CSR layout (c = 2, 3, 6)."""
    import cupy
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    for c in (2, 3, 6):
        A = vector_spd(9, c, seed=c)
        rng = np.random.default_rng(c)
        x0, b = rng.standard_normal(A.shape[0]).astype(dtype), rng.standard_normal(A.shape[0]).astype(dtype)
        out = {}
        for layout in ("csr", "bsr"):
            monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", layout)
            sm = GaussSeidel(gpu.asmatrix(A), block_size=c, backend=gpu, dtype=dtype)
            assert sm._plan.layout == layout
            x = gpu.asarray(x0)
            sm.smooth(x, gpu.asarray(b), 2)
            out[layout] = cupy.asnumpy(x)
        for (bptr, bcol, bval), (_, S) in zip(_launch_slices(sm._plan), reference_rows(A, sm._groups, c)):
            B = S.astype(dtype).tobsr(blocksize=(c, c))
            B.sort_indices()
            np.testing.assert_array_equal(bptr, B.indptr)
            np.testing.assert_array_equal(bcol, B.indices)
            np.testing.assert_array_equal(bval, B.data.reshape(-1))
        assert np.abs(out["bsr"] - out["csr"]).max() <= tol * np.abs(out["csr"]).max(), c
