"""The lean device pattern (adaptmg/assemble/_device.py): the pattern by row blocks and the
one-thread-per-row sums, against the host Pattern and the sort-based SortedDevicePattern --
integers equal, sums equal bit for bit (the same additions in the same order) -- on NumPy;
the CUDA kernel against its twin under ``gpu``."""
import numpy as np
import pytest

from adaptmg import assemble as asm
from adaptmg.assemble import _device, forms
from adaptmg.assemble._device import DevicePattern
from adaptmg.assemble._device_sorted import SortedDevicePattern
from adaptmg.backend import CPU
from adaptmg.fe.sparsity import Pattern

from test_assemble import _adaptive_mesh, _pattern_tables, space


def _tables():
    """The test tables of test_assemble and a fan: 40 cells at node 0 (more than the 16 lists
    the row kernels merge by heads), one with node 0 twice, rectangular columns."""
    fan = np.array([[0, i + 1, i + 2, 50 + i] for i in range(40)] + [[0, 0, 1, 2]])
    fan_cols = (fan[:, [1, 0, 3]] * 7) % 61
    return _pattern_tables() + [("fan", fan, fan, 90, 90, False), ("fan-rect", fan, fan_cols, 90, 61, False)]


def _entries(P, seed):
    """Element entries of the pattern's cells with many cancellations (sums depend on order)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(P.cell_shape) * 10.0 ** rng.integers(-8, 9, P.cell_shape)


@pytest.mark.parametrize("block", [7, 1 << 27])
def test_pattern_and_sums_equal_host_and_sorted_patterns(block, monkeypatch):
    """Row blocks of any size: indptr/indices of the host Pattern; the sums of all entries at
    once, and of cell chunks added in ascending order, np.add.at's bit for bit (Q1/Q2, 2-D/3-D,
    hanging nodes, rectangular transfer tables, a random table)."""
    monkeypatch.setattr(_device, "PATTERN_CHUNK_ENTRIES", block)
    for name, rows, cols, nrows, ncols, _ in _tables():
        P = Pattern(rows, cols, nrows, ncols)
        D = DevicePattern(CPU, rows, cols, nrows, ncols)
        S = SortedDevicePattern(CPU, rows, cols, nrows, ncols)
        assert D.nnz == P.nnz and D.shape == P.shape, name
        assert np.array_equal(D.indptr, P.indptr) and np.array_equal(D.indices, P.indices), name
        K = _entries(P, 1)
        ref = np.zeros(P.nnz)
        P.add(ref, slice(0, K.shape[0]), K)
        assert np.array_equal(D.sum(K.reshape(-1)), ref), name
        assert np.array_equal(S.sum(K.reshape(-1)), ref), name
        nc = K.shape[0]
        for step in (1, 3, nc // 2 + 1):
            data = D.zeros()
            for c0 in range(0, nc, step):
                D.add(data, c0, K[c0:c0 + step].reshape(min(step, nc - c0), -1))
            assert np.array_equal(data, ref), (name, step)


def test_twin_search_in_small_steps(monkeypatch):
    """The twin's entry chunks (_NP_TWIN_ENTRIES) do not change its sums."""
    name, rows, cols, nrows, ncols, _ = _pattern_tables()[5]            # adaptive 3-D Q2
    D = DevicePattern(CPU, rows, cols, nrows, ncols)
    K = _entries(D, 2).reshape(-1)
    ref = D.sum(K)
    monkeypatch.setattr(_device, "_NP_TWIN_ENTRIES", 100)
    assert np.array_equal(D.sum(K), ref)


def test_bad_tables_and_chunks_raise():
    rows = np.array([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="outside a 2 x 3 matrix"):
        DevicePattern(CPU, rows, rows, 2, 3)
    with pytest.raises(ValueError, match="outside a 3 x 3 matrix"):
        DevicePattern(CPU, rows, rows - 1, 3, 3)
    with pytest.raises(ValueError, match="differ in length"):
        DevicePattern(CPU, rows, rows[:1], 3, 3)
    D = DevicePattern(CPU, rows, rows, 3, 3)
    with pytest.raises(ValueError, match="do not fit 2 cells"):
        D.add(D.zeros(), 1, np.ones((2, 4)))
    with pytest.raises(ValueError, match="do not fit 2 cells"):
        D.add(D.zeros(), 0, np.ones((1, 3)))
    with pytest.raises(ValueError, match="expected 2 x 2 x 2"):
        D.sum(np.ones(7))
    assert _device.chunk_cells(64, 1 << 20) == 2048 and _device.chunk_cells(10 ** 9, 1) == 1


@pytest.mark.parametrize("d", [2, 3])
def test_chunked_device_elements_equal_the_sorted_path(d, monkeypatch):
    """scalar_form's device-element path (run on NumPy): with the default budget the same bits
    as before (every element matrix into one (E,) array, summed by the sort-based pattern:
    the geometry chunks are unchanged); with chunks of 5 cells the same matrices to a few ulps
    (a GEMM of other row counts may round differently), summed chunk by chunk."""
    from adaptmg.assemble import on_device
    from adaptmg.fe import Space
    eps = np.finfo(np.float64).eps
    monkeypatch.setattr(forms, "_assembly_device", lambda device, info, per: CPU if device == "np" else None)
    monkeypatch.setattr(forms, "_keep_backend", lambda name, device, keep, info=None: CPU if keep else None)
    kw = dict(mass=1.5, diffusion=0.3, convection=np.arange(1.0, d + 1), return_mass=True)
    for s in (space(d, 1, "distorted"), Space(_adaptive_mesh(d), 2, 1)):
        with monkeypatch.context() as mp:          # the earlier path: all E entries, then sorted sums
            mp.setattr(forms, "get_device_pattern", lambda be, r, c, nr, nc: SortedDevicePattern(be, r, c, nr, nc))

            def sums(device, pat, info, xi, w, factor, T_full, extra, elements=None):
                nent = info.num_cells * T_full.shape[1]
                out, out_e = np.empty(nent), np.empty(nent) if extra is not None else None
                on_device.element_entries_on_device(device, info, xi, w, factor, T_full, out,
                                                    extra=None if extra is None else (*extra, out_e))
                return pat.sum(out, on_device=True), None if extra is None else pat.sum(out_e, on_device=True)
            mp.setattr(forms, "device_element_sums", sums)
            A0, M0 = asm.scalar_form(s, device="np", keep_on_device=True, **kw)
        monkeypatch.setattr(forms, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
        A1, M1 = asm.scalar_form(s, device="np", keep_on_device=True, **kw)
        nloc = s.cell_dofs.shape[1]
        calls = []
        add = DevicePattern.add
        with monkeypatch.context() as mp:
            mp.setattr(_device, "ASSEMBLY_CHUNK_BYTES", 8 * 2 * nloc * nloc * 5)      # 5 cells
            mp.setattr(DevicePattern, "add", lambda self, data, c0, K: calls.append(K.shape[0])
                       or add(self, data, c0, K))
            A2, M2 = asm.scalar_form(s, device="np", keep_on_device=True, **kw)
        assert max(calls) == 5 and sum(calls) == 2 * s.mesh.num_cells
        for X, Y, Z in ((A0, A1, A2), (M0, M1, M2)):
            for W in (Y, Z):
                assert np.array_equal(X.indptr, W.indptr) and np.array_equal(X.indices, W.indices)
            assert np.array_equal(X.data, Y.data)
            assert np.max(np.abs(X.data - Z.data)) <= 8 * eps * np.max(np.abs(X.data))


def test_fields_added_together_equal_each_alone():
    """add() of nf fields into (nnz, nf) data: each column the bits of its field summed alone."""
    name, rows, cols, nrows, ncols, _ = _pattern_tables()[4]            # adaptive 3-D Q1
    D = DevicePattern(CPU, rows, cols, nrows, ncols)
    K = np.stack([_entries(D, s) for s in range(3)])                     # (3, nc, nr, ncl)
    data = np.zeros((D.nnz, 3))
    nc = K.shape[1]
    for c0 in range(0, nc, 11):
        D.add(data, c0, K[:, c0:c0 + 11])
    for f in range(3):
        assert np.array_equal(data[:, f], D.sum(K[f].reshape(-1))), f
    with pytest.raises(ValueError, match="C-contiguous float64"):
        D.add(np.zeros((3, D.nnz)).T, 0, K)
    with pytest.raises(ValueError, match=r"\(3 field\(s\)\)"):
        D.add(np.zeros((D.nnz, 3)), 0, K[:2])


@pytest.mark.parametrize("dim, degree", [(2, 2), (3, 1)])
def test_elasticity_windows_equal_one_sweep(dim, degree, monkeypatch):
    """elasticity's device fields (run on NumPy) in windows of a few chunks: the bits of one
    window over all cells (the same chunks of elasticity_entries, sums in cell order)."""
    from adaptmg.assemble import on_device, vector_forms as vf
    from adaptmg.fe import Space
    from test_elasticity_device import _hanging_mesh
    monkeypatch.setattr(vf, "_assembly_device", lambda device, info, per: CPU if device == "xp" else None)
    monkeypatch.setattr(vf, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    s = Space(_hanging_mesh(dim, True), degree, components=dim)
    lam = np.linspace(1.0, 3.0, s.mesh.num_cells)
    L = s.cell_dofs.shape[1] ** 2
    monkeypatch.setattr(on_device, "DEVICE_CHUNK_CELLS", 7)             # elasticity_entries' chunks
    X = asm.elasticity(s, lam, 2.0, format="fields", return_mass=True, device="xp")
    calls = []
    add = DevicePattern.add
    monkeypatch.setattr(DevicePattern, "add", lambda self, data, c0, K: calls.append(c0) or add(self, data, c0, K))
    monkeypatch.setattr(_device, "ASSEMBLY_CHUNK_BYTES", 8 * (dim * dim + 1) * L * 20)   # 2 chunks
    Y = asm.elasticity(s, lam, 2.0, format="fields", return_mass=True, device="xp")
    assert calls == list(range(0, s.mesh.num_cells, 14))
    for a, b in zip(X, Y):
        assert np.array_equal(a, b)


def test_device_csr_above_int32_needs_64_bit_sparse(monkeypatch):
    """A matrix of more than 2^31 - 1 entries cannot become a cupyx CSR before CuPy 14.3 (it
    would cast the indices to int32): a clear ValueError instead of wrapped indices."""
    from types import SimpleNamespace
    rows = np.array([[0, 1], [1, 2]])
    D = DevicePattern(CPU, rows, rows, 3, 3)
    monkeypatch.setattr(_device, "_INT32_MAX", 5)
    for version in ("14.2.0", "13.6.0"):
        D.backend = SimpleNamespace(xp=SimpleNamespace(__version__=version), sparse=None)
        with pytest.raises(ValueError, match="64-bit CSR indices.*from CuPy 14.3"):
            D.device_csr(np.zeros(D.nnz))
    assert _device._int64_sparse(SimpleNamespace(__version__="14.3.0"))
    assert not _device._int64_sparse(SimpleNamespace(__version__="14.2.1"))


_HOST_CPP = r"""
typedef int P; typedef int C; typedef int I; typedef int J;
template <class T> T atomicAdd(T* a, T v) { T o = *a; *a += v; return o; }
extern "C" {
void inc_count(const C* node_a, long long nrows, long long* cnt, long long n) {
  for (long long i = 0; i < n; ++i) { const C node = node_a[i];
%s
  } }
void inc_scatter(const C* node_a, const long long* inc_ptr, long long nrows, int* fill, P* inc, long long n) {
  for (long long i = n - 1; i >= 0; --i) { const C node = node_a[i];     // atomics in another order
%s
  } }
void inc_sort(const long long* inc_ptr, P* inc, long long n) {
  for (long long i = 0; i < n; ++i) {
%s
  } }
void sortc(const C* cols, int ncl, C* out, long long n) {
  for (long long i = 0; i < n; ++i) {
%s
  } }
void count(const P* inc, const long long* inc_ptr, const C* scols, int nr, int ncl, long long* cnt_a, long long n) {
  for (long long i = 0; i < n; ++i) { long long& cnt = cnt_a[i];
%s
  } }
void fill(const P* inc, const long long* inc_ptr, const C* scols, const I* ip, int nr, int ncl, I* ind, long long n) {
  for (long long i = 0; i < n; ++i) {
%s
  } }
void walk(const P* inc, const long long* inc_ptr, const I* ip, const J* ind, const C* cols, const double* K,
          long long c0, long long c1, int nr, int ncl, int nf, long long kfld, long long dpos, long long dfld,
          double* data, long long n) {
  for (long long i = 0; i < n; ++i) {
%s
  } }
}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    """The CUDA kernel bodies compiled as host C++ (the ElementwiseKernel loop over i
    written out, raw arrays as pointers, every index type int32): a ctypes library."""
    import ctypes
    import shutil
    import subprocess
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("kernels")
    S = _device._SPECS
    (d / "k.cpp").write_text(_HOST_CPP % tuple(S[k][2] for k in (
        "incidence_count", "incidence_scatter", "incidence_sort", "sorted_cell_columns", "row_columns_count",
        "row_columns_fill", "row_walk_sum")))
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.cpp")], check=True)
    return ctypes.CDLL(str(d / "k.so"))


def _p(a):
    import ctypes
    assert a.flags.c_contiguous and a.dtype in (np.int32, np.int64, np.float64), a.dtype
    return a.ctypes.data_as(ctypes.c_void_p)


def test_kernel_sources_compiled_for_the_host(host_kernels):
    """The kernel bodies run on the CPU against the twins on every test table: the same
    pattern integers and the same sums, bit for bit (two fields, chunks of 5 cells)."""
    from ctypes import c_longlong as L
    lib = host_kernels
    for name, rows, cols, nrows, ncols, _ in _tables():
        D = DevicePattern(CPU, rows, cols, nrows, ncols)
        flat = np.ascontiguousarray(D._row_cells, dtype=np.int32).reshape(-1)
        cnt = np.zeros(nrows, dtype=np.int64)
        lib.inc_count(_p(flat), L(nrows), _p(cnt), L(flat.size))
        inc_ptr = np.concatenate([[0], np.cumsum(cnt)])
        inc = np.empty(flat.size, dtype=np.int32)
        lib.inc_scatter(_p(flat), _p(inc_ptr), L(nrows), _p(np.zeros(nrows, dtype=np.int32)), _p(inc), L(flat.size))
        lib.inc_sort(_p(inc_ptr), _p(inc), L(nrows))
        assert np.array_equal(inc_ptr, D.inc_ptr) and np.array_equal(inc, D.inc), name
        cc = np.ascontiguousarray(D._col_cells, dtype=np.int32)
        sc = np.empty_like(cc)
        lib.sortc(_p(cc), cc.shape[1], _p(sc), L(cc.shape[0]))
        assert np.array_equal(sc, np.sort(cc, axis=1)), name
        nc, nr, ncl = D.cell_shape
        cnt = np.empty(nrows, dtype=np.int64)
        lib.count(_p(inc), _p(D.inc_ptr), _p(sc), nr, ncl, _p(cnt), L(nrows))
        ip = np.zeros(nrows + 1, dtype=np.int32)
        ip[1:] = np.cumsum(cnt)
        ind = np.full(int(ip[-1]), -1, dtype=np.int32)
        lib.fill(_p(inc), _p(D.inc_ptr), _p(sc), _p(ip), nr, ncl, _p(ind), L(nrows))
        assert np.array_equal(ip, D.indptr) and np.array_equal(ind, D.indices), name
        K = _entries(D, 4)
        K2 = np.stack([K, 3.0 * K])
        data = np.zeros((D.nnz, 2))
        for c0 in range(0, nc, 5):
            Kc = np.ascontiguousarray(K2[:, c0:c0 + 5])
            m = Kc.shape[1]
            lib.walk(_p(inc), _p(D.inc_ptr), _p(ip), _p(ind), _p(cc), _p(Kc), L(c0), L(c0 + m),
                     nr, ncl, 2, L(m * nr * ncl), L(2), L(1), _p(data), L(nrows))
        assert np.array_equal(data[:, 0], D.sum(K.reshape(-1))), name
        assert np.array_equal(data[:, 1], D.sum(3.0 * K.reshape(-1))), name


def test_device_branch_with_host_compiled_kernels(host_kernels, monkeypatch):
    """DevicePattern's device branch (count kernel, running sum, the one read, fill kernel;
    row_walk_sum's arguments) with the host-compiled kernels in place of CuPy's: the twin's
    pattern and sums, bit for bit; out-of-range tables still a ValueError."""
    from ctypes import c_longlong as L
    lib = host_kernels

    def kernel(name):
        def inc_count(node, nrows, cnt):
            lib.inc_count(_p(node), L(nrows), _p(cnt), L(node.size))

        def inc_scatter(node, inc_ptr, nrows, fill, inc):
            lib.inc_scatter(_p(node), _p(inc_ptr), L(nrows), _p(fill), _p(inc), L(node.size))

        def inc_sort(inc_ptr, inc, size):
            lib.inc_sort(_p(inc_ptr), _p(inc), L(size))

        def sortc(cc, ncl, out, size):
            lib.sortc(_p(cc), int(ncl), _p(out), L(size))

        def count(inc, inc_ptr, cc, nr, ncl, out):
            lib.count(_p(inc), _p(inc_ptr), _p(cc), int(nr), int(ncl), _p(out), L(out.size))
            return out

        def fill(inc, inc_ptr, cc, ip, nr, ncl, ind, size):
            lib.fill(_p(inc), _p(inc_ptr), _p(cc), _p(ip), int(nr), int(ncl), _p(ind), L(size))

        def walk(inc, inc_ptr, ip, ind, cc, K, c0, c1, nr, ncl, nf, kfld, dpos, dfld, data, size):
            lib.walk(_p(inc), _p(inc_ptr), _p(ip), _p(ind), _p(cc), _p(K), L(c0), L(c1), int(nr), int(ncl),
                     int(nf), L(kfld), L(dpos), L(dfld), _p(data), L(size))
        return {"incidence_count": inc_count, "incidence_scatter": inc_scatter, "incidence_sort": inc_sort,
                "sorted_cell_columns": sortc, "row_columns_count": count, "row_columns_fill": fill,
                "row_walk_sum": walk}[name]
    for name, rows, cols, nrows, ncols, _ in _tables():
        H = DevicePattern(CPU, rows, cols, nrows, ncols)
        K = _entries(H, 6)
        with monkeypatch.context() as mp:
            mp.setattr(_device, "in_host_memory", lambda a: False)
            mp.setattr(_device, "_kernel", kernel)
            G = DevicePattern(CPU, rows.astype(np.int32), cols.astype(np.int32), nrows, ncols)
            assert G.nnz == H.nnz, name
            assert np.array_equal(G.indptr, H.indptr) and np.array_equal(G.indices, H.indices), name
            data = G.zeros()
            for c0 in range(0, K.shape[0], 4):
                G.add(data, c0, K[c0:c0 + 4])
            d2 = np.zeros((G.nnz, 2))
            G.add(d2, 0, np.stack([K, -K]))
            if name == "random":
                with pytest.raises(ValueError, match="outside a 29 x 11 matrix"):
                    DevicePattern(CPU, rows.astype(np.int32), cols.astype(np.int32), 29, 11)
        ref = H.sum(K.reshape(-1))
        assert np.array_equal(data, ref) and np.array_equal(d2, np.stack([ref, -ref], axis=1)), name


@pytest.mark.gpu
def test_row_walk_kernel_equals_twin():
    """adaptmg_row_walk_sum on the device: the pattern's integers and the sums (whole and in
    chunks) bit for bit those of the NumPy twin, on every test table."""
    import cupy
    for name, rows, cols, nrows, ncols, _ in _tables():
        H = DevicePattern(CPU, rows, cols, nrows, ncols)
        G = DevicePattern("gpu", cupy.asarray(rows), cupy.asarray(cols), nrows, ncols)
        assert np.array_equal(H.indptr, G.indptr) and np.array_equal(H.indices, G.indices), name
        K = _entries(H, 3)
        ref = H.sum(K.reshape(-1))
        assert np.array_equal(G.sum(cupy.asarray(K.reshape(-1))), ref), name
        data = G.zeros()
        for c0 in range(0, K.shape[0], 5):
            G.add(data, c0, cupy.asarray(K[c0:c0 + 5]))
        assert np.array_equal(data.get(), ref), name
        K3 = np.stack([K, -K, 2.0 * K])                       # three fields at once
        d3 = cupy.zeros((G.nnz, 3))
        for c0 in range(0, K.shape[0], 7):
            G.add(d3, c0, cupy.asarray(K3[:, c0:c0 + 7]))
        assert np.array_equal(d3.get(), np.stack([ref, -ref, H.sum(2.0 * K.reshape(-1))], axis=1)), name
